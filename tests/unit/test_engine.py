"""The engine: journal-first transactions, incremental switches, rollback, recovery, verify.

Real writeback and sysctl plugins run on a fake /proc tree; `FakePlugin` (settings
stored as files under the same tree) raises the refusals a real kernel would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from latencyd.plugins.sysctl import Sysctl, SysctlPlugin
from latencyd.plugins.writeback import DirtyLimit, VmKnob, WritebackPlugin

from latencyd.core import engine as engine_module
from latencyd.core.capabilities import RemembersInStep, SharesWithUser, StartsAfresh, declares
from latencyd.core.engine import SECTION, Engine, Plan, Refused, Section, plan, section_schemas
from latencyd.core.journal import Journal, JournalState
from latencyd.core.plugin import (
    Expansion,
    Options,
    Plugin,
    Target,
    Value,
    decode_target,
    target_kinds,
)
from latencyd.core.profile import ProfileLibrary
from latencyd.core.sharing import read_then_write
from latencyd.cpuset import CpuSet
from latencyd.errors import ApplyFailed, Cancelled, KernelRefused, LatencydError, NotApplicable
from latencyd.kernel.system import Machine, System
from tests.unit.fakesys import (
    KernelLikeSystem,
    RefusingSystem,
    make_fake_root,
    read_sysctl,
    sysctl_values,
    write_sysctl,
)

FAKE_KEYS = {f"fake/{k}": "0" for k in ("a", "b", "c", "d", "bad", "na", "stuck")}


@dataclass(frozen=True)
class Knob(Target):
    """A file /proc/sys/fake/<name>; the kernel refusing one fails the profile."""

    kind: ClassVar[str] = "knob"
    name: str


@dataclass(frozen=True)
class SoftKnob(Target):
    """The same kind of file, but a refusal means "not applicable here"."""

    kind: ClassVar[str] = "soft"
    refusal_means: ClassVar[str | None] = "this knob cannot be set here"
    name: str


class Crash(BaseException):
    """Stands in for SIGKILL: nothing in latencyd may catch it."""


class FakePlugin(Plugin[Knob | SoftKnob, None, Options]):
    """Settings are files /proc/sys/fake/<name>; chosen ones misbehave like a kernel can."""

    name = "fake"
    summary = "test double with programmable refusals"
    targets = (Knob, SoftKnob)

    def __init__(self, system: System, journal: Journal | None = None) -> None:
        super().__init__(system)
        self.journal = journal
        # name, or (name, value) to refuse only that value
        self.refuse_write: dict[str | tuple[str, Any], Exception] = {}
        self.refuse_read: dict[str, Exception] = {}
        self.crash_on: set[str] = set()
        self.stuck: set[str] = set()  # writes "succeed" but the value stays
        self.gone: set[str] = set()
        self.writes: list[tuple[str, Any]] = []
        self.journal_at_write: dict[str, Any] = {}

    def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion:
        return Expansion({Knob(k): str(v) for k, v in options.items()})

    def read(self, target: Knob | SoftKnob) -> Any:
        if target.name in self.refuse_read:
            raise self.refuse_read[target.name]
        return self.system.read(f"proc/sys/fake/{target.name}")

    def write(self, target: Knob | SoftKnob, value: Any) -> None:
        name = target.name
        if self.journal is not None:
            state = self.journal.load()
            originals = decoded(state, {"fake": self}) if state else {}
            self.journal_at_write[name] = originals.get(("fake", target))
        self.writes.append((name, value))
        if name in self.crash_on:
            raise Crash(name)
        for refused in (name, (name, value)):
            if refused in self.refuse_write:
                raise self.refuse_write[refused]
        if name not in self.stuck:
            self.system.write(f"proc/sys/fake/{name}", str(value))

    def exists(self, target: Knob | SoftKnob) -> bool:
        return target.name not in self.gone

    def describe(self, target: Knob | SoftKnob, value: Any) -> str:
        return f"{target.name} = {value}"


def decoded(state: JournalState, plugins: Mapping[str, Plugin[Any, Any, Any]]) -> dict[Any, Any]:
    """A journal's originals with their targets decoded, as the engine reads them (for
    the plugins given)."""
    return {
        (p, decode_target(target_kinds(plugins[p]), json.loads(key))): value
        for (p, key), value in state.originals.items()
        if p in plugins
    }


class Rig:
    """A fake machine, its plugins, a journal in a temp dir, and an engine over them."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = make_fake_root(tmp_path, sysctls=FAKE_KEYS)
        self.state_dir = tmp_path / "run" / "latencyd"
        self.original = sysctl_values(self.root)
        self.engine = self.new_engine()

    def new_engine(self) -> Engine:
        """A fresh engine on the same machine and state dir (as after a restart)."""
        self.system = KernelLikeSystem(self.root)
        self.journal = Journal(self.state_dir)
        self.fake = FakePlugin(self.system, self.journal)
        self.plugins: dict[str, Plugin[Any, Any, Any]] = {
            "writeback": WritebackPlugin(self.system),
            "sysctl": SysctlPlugin(self.system),
            "fake": self.fake,
        }
        return Engine(self.plugins, self.journal)

    def values(self) -> dict[str, str]:
        return sysctl_values(self.root)

    def changed(self) -> dict[str, str]:
        """Files that differ from the originals, with their current values."""
        now = self.values()
        return {k: v for k, v in now.items() if self.original[k] != v}

    def journal_on_disk(self) -> tuple[dict[Any, Any], str | None] | None:
        state = Journal(self.state_dir).load()
        return None if state is None else (decoded(state, self.plugins), state.profile)

    def reset_writes(self) -> None:
        self.system.writes.clear()
        self.fake.writes.clear()


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


SWAP, STAT = Sysctl("vm.swappiness"), Sysctl("vm.stat_interval")
DIRTY, BACKGROUND = DirtyLimit("dirty"), DirtyLimit("dirty_background")
EXPIRE = VmKnob("dirty_expire_centisecs")
KA, KB, KC = Knob("a"), Knob("b"), Knob("c")

A = {
    ("sysctl", SWAP): "10",
    ("sysctl", STAT): "10",
    ("writeback", DIRTY): {"bytes": 64 << 20},
    ("writeback", EXPIRE): 1000,
    ("fake", KA): "1",
    ("fake", KB): "1",
}
B = {
    ("sysctl", SWAP): "10",  # same as A
    ("sysctl", STAT): "5",  # differs
    ("writeback", DIRTY): {"bytes": 64 << 20},  # same
    ("writeback", BACKGROUND): {"ratio": 3},  # new
    ("fake", KA): "1",  # same
    ("fake", KC): "2",  # new
    # only in A: dirty_expire_centisecs, fake b
}
A_FILES = {
    "vm/swappiness": "10",
    "vm/stat_interval": "10",
    "vm/dirty_bytes": str(64 << 20),
    "vm/dirty_ratio": "0",
    "vm/dirty_expire_centisecs": "1000",
    "fake/a": "1",
    "fake/b": "1",
}
A_ORIGINALS = {
    ("sysctl", SWAP): "60",
    ("sysctl", STAT): "1",
    ("writeback", DIRTY): {"ratio": 20},
    ("writeback", EXPIRE): 3000,
    ("fake", KA): "0",
    ("fake", KB): "0",
}


# -- plan ----------------------------------------------------------------------


def test_plan_is_a_pure_diff() -> None:
    same, diff, gone, new, other = Knob("same"), Knob("diff"), Knob("gone"), Knob("new"), Knob("o")
    applied = {("p", same): 1, ("p", diff): 1, ("p", gone): 1, ("q", other): 1}
    wanted = {("p", same): 1, ("p", diff): 2, ("p", new): 3}
    snapshot = (dict(applied), dict(wanted))
    result = plan(applied, wanted)
    assert result == Plan(
        restore=[("q", other), ("p", gone)],  # newest first, as off gives them back
        apply={("p", diff): 2, ("p", new): 3},
        keep=[("p", same)],
    )
    assert (applied, wanted) == snapshot
    # Out-of-scope settings are left alone, not restored, unless named.
    assert plan(applied, wanted, scope=["p"]).restore == [("p", gone)]
    assert plan(applied, {}, scope=[]).restore == []
    assert plan(applied, {}, scope=[], restore=[("q", other)]).restore == [("q", other)]
    assert plan({}, {}) == Plan()


# -- first switch ----------------------------------------------------------------


def test_first_switch_applies_and_journals_originals(rig: Rig) -> None:
    report = rig.engine.switch(A, "A")
    assert (report.applied, report.restored, report.unchanged) == (6, 0, 0)
    assert report.not_applicable == {}
    assert rig.changed() == A_FILES
    assert rig.engine.applied == A
    assert rig.engine.profile == "A"
    assert rig.engine.last_step is report
    assert rig.journal_on_disk() == (A_ORIGINALS, "A")


def test_journal_keys_are_targets_in_canonical_json(rig: Rig) -> None:
    rig.engine.switch({("fake", KA): "1", ("writeback", DIRTY): {"ratio": 5}}, "A")
    state = Journal(rig.state_dir).load()
    assert state is not None
    assert set(state.originals) == {
        ("fake", '{"kind":"knob","name":"a"}'),
        ("writeback", '{"kind":"dirty_limit","pair":"dirty"}'),
    }


def test_originals_are_on_disk_before_the_first_write(rig: Rig) -> None:
    rig.engine.switch({("fake", KA): "1", ("fake", KB): "2"}, "A")
    # At the moment each write ran, the journal file already held that target's original.
    assert rig.fake.journal_at_write == {"a": "0", "b": "0"}


def test_setting_already_as_wanted_is_not_written(rig: Rig) -> None:
    report = rig.engine.switch({("sysctl", SWAP): "60", ("fake", KA): "1"}, "A")
    assert (report.applied, report.unchanged) == (1, 1)
    assert rig.system.writes == [("proc/sys/fake/a", "1")]
    rig.reset_writes()
    assert rig.engine.off() == []
    assert rig.values() == rig.original


# -- incremental switch ------------------------------------------------------------


def test_incremental_switch_touches_only_what_differs(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    rig.reset_writes()
    report = rig.engine.switch(B, "B")
    assert (report.applied, report.restored, report.unchanged) == (3, 2, 3)
    assert sorted(rig.system.writes) == sorted(
        [
            ("proc/sys/vm/stat_interval", "5"),
            ("proc/sys/vm/dirty_background_ratio", "3"),
            ("proc/sys/fake/c", "2"),
            ("proc/sys/vm/dirty_expire_centisecs", "3000"),  # only in A: restored
            ("proc/sys/fake/b", "0"),  # only in A: restored
        ]
    )
    assert rig.changed() == {
        "vm/swappiness": "10",
        "vm/stat_interval": "5",
        "vm/dirty_bytes": str(64 << 20),
        "vm/dirty_ratio": "0",
        "vm/dirty_background_ratio": "3",
        "fake/a": "1",
        "fake/c": "2",
    }
    assert rig.engine.applied == B
    # The journal keeps the true originals (not A's values) for exactly B's settings.
    assert rig.journal_on_disk() == (
        {
            ("sysctl", SWAP): "60",
            ("sysctl", STAT): "1",
            ("writeback", DIRTY): {"ratio": 20},
            ("writeback", BACKGROUND): {"ratio": 10},
            ("fake", KA): "0",
            ("fake", KC): "0",
        },
        "B",
    )


def test_switch_back_and_off_restore_the_originals(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    rig.engine.switch(B, "B")
    rig.engine.switch(A, "A")
    assert rig.changed() == A_FILES
    rig.reset_writes()
    assert rig.engine.off() == []
    assert rig.values() == rig.original
    assert not rig.journal.path.exists()
    assert rig.engine.applied == {} and rig.engine.profile is None
    assert len(rig.system.writes) == len(A)  # one restore per applied setting


def test_switch_to_nothing_restores_and_clears_the_journal(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    report = rig.engine.switch({}, None)
    assert report.restored == len(A)
    assert rig.values() == rig.original
    assert not rig.journal.path.exists()


def test_scoped_switch_leaves_other_plugins_alone(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    rig.reset_writes()
    report = rig.engine.switch({("sysctl", SWAP): "20"}, "A", scope=["sysctl"])
    assert (report.applied, report.restored) == (1, 1)
    assert sorted(rig.system.writes) == [
        ("proc/sys/vm/stat_interval", "1"),
        ("proc/sys/vm/swappiness", "20"),
    ]
    expected = {**A_FILES, "vm/swappiness": "20"}
    del expected["vm/stat_interval"]
    assert rig.changed() == expected
    assert rig.engine.applied == {
        **{sid: v for sid, v in A.items() if sid[0] != "sysctl"},
        ("sysctl", SWAP): "20",
    }


def test_update_of_one_device_gives_back_only_what_it_names(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    rig.reset_writes()
    wanted = {("fake", KA): "1", ("fake", KC): "3"}
    report = rig.engine.update("fake", wanted, [("fake", KB)], [("fake", KA)])
    assert (report.applied, report.restored, report.unchanged) == (1, 1, 1)
    assert sorted(rig.fake.writes) == [("b", "0"), ("c", "3")]
    assert rig.engine.applied == {
        **{sid: v for sid, v in A.items() if sid != ("fake", KB)},
        ("fake", KC): "3",
    }


# -- restart: adopt, not revert -----------------------------------------------------------


def test_restart_with_the_same_profile_writes_nothing(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    engine = rig.new_engine()  # the daemon died; a new one starts on the same state dir
    state = engine.adopt()
    assert state is not None and state.profile == "A"
    report = engine.switch(A, "A")
    assert rig.system.writes == [] and rig.fake.writes == []
    assert (report.applied, report.restored, report.unchanged) == (0, 0, len(A))
    assert rig.changed() == A_FILES
    # The originals are still the true ones: off brings the machine back.
    assert engine.off() == []
    assert rig.values() == rig.original


def test_restart_with_another_profile_changes_only_the_differences(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    engine = rig.new_engine()
    engine.adopt()
    report = engine.switch(B, "B")
    assert sorted(rig.system.writes) == sorted(
        [
            ("proc/sys/vm/stat_interval", "5"),
            ("proc/sys/vm/dirty_background_ratio", "3"),
            ("proc/sys/fake/c", "2"),
            ("proc/sys/vm/dirty_expire_centisecs", "3000"),
            ("proc/sys/fake/b", "0"),
        ]
    )
    assert (report.applied, report.restored) == (3, 2)
    assert rig.journal_on_disk() is not None
    engine.off()
    assert rig.values() == rig.original


def test_adopted_settings_that_drifted_meanwhile_are_put_right(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    write_sysctl(rig.root, "vm/swappiness", "33")  # changed while no daemon ran
    engine = rig.new_engine()
    engine.adopt()
    engine.switch(A, "A")
    assert rig.system.writes == [("proc/sys/vm/swappiness", "10")]
    engine.off()
    assert read_sysctl(rig.root, "vm/swappiness") == "60"  # the true original


def test_adopt_then_off_restores_everything(rig: Rig) -> None:
    rig.fake.crash_on.add("c")
    with pytest.raises(Crash):  # the daemon is killed half-way through a step
        rig.engine.switch(
            {("sysctl", SWAP): "10", ("writeback", DIRTY): {"bytes": 4096}, ("fake", KC): "5"}, "A"
        )
    assert rig.changed() == {"vm/swappiness": "10", "vm/dirty_bytes": "4096", "vm/dirty_ratio": "0"}
    engine = rig.new_engine()
    assert engine.adopt() is not None
    assert engine.off() == []
    assert rig.values() == rig.original  # dirty is back in ratio mode: 20, bytes 0
    assert not rig.journal.path.exists()
    assert rig.new_engine().adopt() is None  # a clean state: nothing to adopt


def test_adopt_skips_entries_of_plugins_that_are_gone(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    rig.engine.switch({("fake", KA): "1", ("sysctl", SWAP): "1"}, "A")
    engine = Engine({"sysctl": SysctlPlugin(System(rig.root))}, Journal(rig.state_dir))
    engine.adopt()
    assert list(engine.applied) == [("sysctl", SWAP)]
    assert "journal entry cannot be restored: [fake]" in caplog.text
    engine.off()
    assert read_sysctl(rig.root, "vm/swappiness") == "60"


def test_an_unreadable_journal_is_set_aside(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    rig.state_dir.mkdir(parents=True)
    rig.journal.path.write_text("{not json\n")
    assert rig.engine.adopt() is None
    assert not rig.journal.path.exists()
    aside = list(rig.state_dir.glob("journal.jsonl.unreadable-*"))
    assert len(aside) == 1 and aside[0].read_text() == "{not json\n"
    assert "moved it to" in caplog.text


def test_off_skips_targets_that_vanished_and_reports_failures(rig: Rig) -> None:
    rig.engine.switch({("fake", KA): "1", ("fake", KB): "1", ("fake", KC): "1"}, "A")
    rig.fake.gone.add("a")  # and so cannot be written
    rig.fake.refuse_write["a"] = KernelRefused("writing fake/a", "No such file (ENOENT)")
    rig.fake.refuse_write["b"] = KernelRefused("writing fake/b", "Device busy (EBUSY)")
    problems = rig.engine.off()
    assert problems == ["[fake] restoring b = 0: writing fake/b: Device busy (EBUSY)"]
    assert rig.changed() == {"fake/a": "1", "fake/b": "1"}
    assert not rig.journal.path.exists()


# -- failures and rollback ---------------------------------------------------------------


def test_mid_step_failure_rolls_back_everything(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    after_a = rig.values()
    journal_a = rig.journal_on_disk()
    rig.fake.refuse_write["bad"] = KernelRefused(
        "writing 'x' to /proc/sys/fake/bad", "Invalid argument (EINVAL)"
    )
    failing = {**B, ("fake", Knob("bad")): "x"}  # bad comes last: everything else ran first
    with pytest.raises(ApplyFailed) as info:
        rig.engine.switch(failing, "B")
    assert str(info.value) == (
        "[fake] bad = x: writing 'x' to /proc/sys/fake/bad: Invalid argument (EINVAL). "
        "Nothing was changed: the step was rolled back."
    )
    assert rig.values() == after_a
    assert rig.engine.applied == A
    assert rig.engine.profile == "A"
    assert rig.journal_on_disk() == journal_a
    # ... and the engine still works from there.
    rig.engine.switch(B, "B")
    rig.engine.off()
    assert rig.values() == rig.original


def test_failure_in_the_first_step_leaves_nothing_behind(rig: Rig) -> None:
    rig.fake.refuse_write["bad"] = KernelRefused("writing", "Operation not permitted (EPERM)")
    with pytest.raises(ApplyFailed, match="Nothing was changed"):
        rig.engine.switch({**A, ("fake", Knob("bad")): "1"}, "A")
    assert rig.values() == rig.original
    assert rig.engine.applied == {} and rig.engine.originals == {}
    assert rig.engine.profile is None
    assert not rig.journal.path.exists()


def test_kernel_refusal_without_plugin_prefix_names_the_setting(rig: Rig) -> None:
    rig.fake.refuse_write["bad"] = KernelRefused("writing", "EPERM")
    with pytest.raises(ApplyFailed) as info:
        rig.engine.switch({("fake", Knob("bad")): "7"}, "A")
    assert str(info.value).startswith("[fake] bad = 7: writing: EPERM. Nothing was changed")


def test_write_accepted_but_value_kept_is_a_failure(rig: Rig) -> None:
    rig.fake.stuck.add("stuck")
    with pytest.raises(ApplyFailed) as info:
        rig.engine.switch({("sysctl", SWAP): "1", ("fake", Knob("stuck")): "9"}, "A")
    assert str(info.value) == (
        "[fake] stuck = 9: the kernel accepted the write but kept '0'. "
        "Nothing was changed: the step was rolled back."
    )
    assert rig.values() == rig.original
    assert not rig.journal.path.exists()


def test_plugin_bug_mid_step_still_rolls_back(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    after_a = rig.values()
    rig.fake.refuse_write["bad"] = RuntimeError("plugin bug")
    with pytest.raises(ApplyFailed, match="plugin bug"):
        rig.engine.switch({**B, ("fake", Knob("bad")): "1"}, "B")
    assert rig.values() == after_a
    assert rig.engine.applied == A


def test_unreadable_original_fails_before_anything_is_written(rig: Rig) -> None:
    rig.fake.refuse_read["bad"] = KernelRefused("reading /proc/sys/fake/bad", "EIO")
    with pytest.raises(ApplyFailed) as info:
        rig.engine.switch({("fake", KA): "5", ("fake", Knob("bad")): "1"}, "A")
    assert str(info.value) == (
        "[fake] cannot read bad = 1 before changing it: reading /proc/sys/fake/bad: EIO"
    )
    assert rig.fake.writes == []
    assert rig.values() == rig.original
    assert not rig.journal.path.exists()
    # Someone else changes `a`; a later step must journal that value as the original,
    # not the one read before the failed step.
    write_sysctl(rig.root, "fake/a", "7")
    del rig.fake.refuse_read["bad"]
    rig.engine.switch({("fake", KA): "5"}, "A")
    assert rig.journal_on_disk() == ({("fake", KA): "7"}, "A")
    rig.engine.off()
    assert read_sysctl(rig.root, "fake/a") == "7"


# -- not applicable ----------------------------------------------------------------------


def test_refusal_is_not_applicable_only_for_kinds_that_say_so(rig: Rig) -> None:
    """The target kind declares what a refusal means; the engine says it, with the reason."""
    rig.fake.refuse_write["na"] = NotApplicable("IRQ 24 is kernel-managed")
    rig.fake.refuse_read["d"] = NotApplicable("no such queue on this NIC")
    rig.fake.refuse_write["bad"] = KernelRefused("writing", "Operation not supported")
    rig.fake.stuck.add("stuck")
    wanted = {
        ("fake", KA): "1",
        ("fake", Knob("na")): "1",  # NotApplicable is always not applicable
        ("fake", Knob("d")): "1",
        ("fake", SoftKnob("bad")): "1",  # a refusal, on a kind where that means n/a
        ("fake", SoftKnob("stuck")): "1",
    }
    report = rig.engine.switch(wanted, "A")
    assert report.applied == 1
    soft = "this knob cannot be set here: "
    assert report.not_applicable == {
        ("fake", Knob("na")): Refused("1", "IRQ 24 is kernel-managed"),
        ("fake", Knob("d")): Refused("1", "no such queue on this NIC"),
        ("fake", SoftKnob("bad")): Refused("1", soft + "Operation not supported"),
        ("fake", SoftKnob("stuck")): Refused(
            "1", soft + "the kernel accepted the write but kept '0'"
        ),
    }
    assert rig.engine.not_applicable == report.not_applicable
    # `d` (refused when reading its original) was never written; `stuck` kept its
    # original, so there was nothing to put back.
    assert [k for k, _ in rig.fake.writes] == ["a", "na", "bad", "stuck"]
    assert rig.changed() == {"fake/a": "1"}
    assert rig.engine.applied == {("fake", KA): "1"}
    assert rig.journal_on_disk() == ({("fake", KA): "0"}, "A")
    # Not-applicable settings are not drift.
    assert rig.engine.verify() == []


def test_restoring_writes_nothing_where_the_original_is_already_there(rig: Rig) -> None:
    rig.engine.switch({("fake", KA): "1", ("fake", KB): "1"}, "A")
    write_sysctl(rig.root, "fake/a", "0")  # someone put `a` back already
    rig.reset_writes()
    assert rig.engine.off() == []
    assert rig.fake.writes == [("b", "0")]
    assert rig.values() == rig.original


def test_a_vanished_target_is_dropped_without_a_reason(rig: Rig) -> None:
    rig.fake.refuse_write["b"] = KernelRefused("writing", "No such process (ESRCH)")
    rig.fake.gone.add("b")
    report = rig.engine.switch({("fake", KA): "1", ("fake", KB): "1"}, "A")
    assert report.applied == 1 and report.not_applicable == {}
    assert rig.engine.applied == {("fake", KA): "1"}


def test_not_applicable_after_a_write_puts_the_original_back(rig: Rig) -> None:
    class RefusesOnReadback(FakePlugin):
        def read(self, target: Knob | SoftKnob) -> Any:
            value = super().read(target)
            if target.name == "na" and value != "0":
                raise NotApplicable("driver ignores it")
            return value

    rig.plugins["fake"] = plugin = RefusesOnReadback(rig.system)
    report = rig.engine.switch({("fake", Knob("na")): "3"}, "A")
    assert report.not_applicable == {("fake", Knob("na")): Refused("3", "driver ignores it")}
    assert plugin.writes == [("na", "3"), ("na", "0")]
    assert rig.values() == rig.original


def test_setting_that_becomes_not_applicable_is_not_left_behind(rig: Rig) -> None:
    rig.engine.switch({("fake", KA): "1", ("fake", KB): "1"}, "A")
    rig.fake.refuse_write[("a", "2")] = NotApplicable("not on this hardware")
    report = rig.engine.switch({("fake", KA): "2", ("fake", KB): "2"}, "B")
    assert report.not_applicable == {("fake", KA): Refused("2", "not on this hardware")}
    # B does not get `a`: it goes back to its original, not stay at A's value untracked.
    assert rig.changed() == {"fake/b": "2"}
    assert rig.engine.applied == {("fake", KB): "2"}
    assert rig.journal_on_disk() == ({("fake", KB): "0"}, "B")
    rig.engine.off()
    assert rig.values() == rig.original


def test_rollback_reapplies_a_setting_dropped_as_not_applicable(rig: Rig) -> None:
    rig.engine.switch({("fake", KA): "1", ("fake", KB): "1"}, "A")
    after_a = rig.values()
    rig.fake.refuse_write[("a", "2")] = NotApplicable("not on this hardware")
    rig.fake.refuse_write["bad"] = KernelRefused("writing bad", "EINVAL")
    with pytest.raises(ApplyFailed):
        rig.engine.switch({("fake", KA): "2", ("fake", Knob("bad")): "1"}, "B")
    assert rig.values() == after_a
    assert rig.engine.applied == {("fake", KA): "1", ("fake", KB): "1"}


def test_not_applicable_kept_for_out_of_scope_plugins(rig: Rig) -> None:
    rig.fake.refuse_write["na"] = NotApplicable("kernel-managed")
    rig.engine.switch({("fake", Knob("na")): "1", ("sysctl", SWAP): "1"}, "A")
    rig.engine.switch({("sysctl", SWAP): "2"}, "A", scope=["sysctl"])
    assert rig.engine.not_applicable == {("fake", Knob("na")): Refused("1", "kernel-managed")}
    rig.engine.switch({("sysctl", SWAP): "2"}, "A")
    assert rig.engine.not_applicable == {}


# -- verify and drift --------------------------------------------------------------------


def test_verify_reports_drift_and_handle_drift_puts_it_back(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    assert rig.engine.verify() == []
    write_sysctl(rig.root, "vm/swappiness", "30")
    write_sysctl(rig.root, "vm/dirty_ratio", "20")
    write_sysctl(rig.root, "vm/dirty_bytes", "0")
    write_sysctl(rig.root, "fake/b", "9")
    drifts = rig.engine.verify()
    assert [(d.plugin, d.target, d.wanted, d.actual) for d in drifts] == [
        ("sysctl", SWAP, "10", "30"),
        ("writeback", DIRTY, {"bytes": 64 << 20}, {"ratio": 20}),
        ("fake", KB, "1", "9"),
    ]
    assert drifts[0].text == "sysctl vm.swappiness = 10"
    assert rig.engine.verify([("fake", KB)]) == [drifts[2]]
    records = rig.engine.handle_drift(drifts)  # no section options: the default, reapply
    assert [r["action"] for r in records] == ["reapplied"] * 3
    assert records[0]["target"] == {"kind": "sysctl", "key": "vm.swappiness"}
    assert rig.engine.verify() == []
    assert rig.changed() == A_FILES


def test_on_drift_report_leaves_the_value_and_says_so(rig: Rig) -> None:
    rig.engine.switch({("fake", KA): "1"}, "A")
    rig.engine.sections["fake"] = Section({"on_drift": "report"})
    write_sysctl(rig.root, "fake/a", "5")
    records = rig.engine.handle_drift(rig.engine.verify())
    assert [(r["action"], r["actual"]) for r in records] == [("reported", "5")]
    assert read_sysctl(rig.root, "fake/a") == "5"


def test_drift_that_cannot_be_put_back_says_why(rig: Rig) -> None:
    rig.engine.switch({("fake", KA): "1"}, "A")
    write_sysctl(rig.root, "fake/a", "0")
    rig.fake.refuse_write["a"] = KernelRefused("writing a", "EBUSY")
    records = rig.engine.handle_drift(rig.engine.verify())
    assert [r["action"] for r in records] == ["failed: writing a: EBUSY"]


def test_verify_normalises_multi_field_sysctls(rig: Rig) -> None:
    rig.engine.switch({("sysctl", Sysctl("net.ipv4.tcp_rmem")): "4096 87380 6291456"}, "A")
    write_sysctl(rig.root, "net/ipv4/tcp_rmem", "4096\t87380\t6291456")
    assert rig.engine.verify() == []


def test_verify_drops_vanished_targets_and_flags_unreadable_ones(rig: Rig) -> None:
    rig.engine.switch({("fake", KA): "1", ("fake", KB): "1"}, "A")
    rig.fake.refuse_read["a"] = KernelRefused("reading a", "ENOENT")
    rig.fake.gone.add("a")
    rig.fake.refuse_read["b"] = KernelRefused("reading b", "EIO")
    drifts = rig.engine.verify()
    assert [(d.target, d.actual) for d in drifts] == [(KB, "<unreadable: reading b: EIO>")]
    assert rig.engine.applied == {("fake", KB): "1"}
    assert rig.engine.originals == {("fake", KB): "0"}


# -- from a profile ----------------------------------------------------------------------


def library_for(rig: Rig, pdir: Path) -> ProfileLibrary:
    plugins = {n: p for n, p in rig.plugins.items() if n != "fake"}
    return ProfileLibrary(
        [pdir], section_schemas(plugins), Machine(CpuSet.from_list("0-3"), 8 << 30)
    )


def test_apply_a_loaded_profile_and_keep_its_sections(rig: Rig, tmp_path: Path) -> None:
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "p.toml").write_text(
        '[writeback]\ndirty_bytes = "1%"\ndirty_expire_centisecs = 500\non_drift = "report"\n'
        '[sysctl]\n"vm.swappiness" = 5\n"net.ipv4.tcp_rmem" = "1  2 3"\n'
    )
    profile = library_for(rig, pdir).load("p")
    expansions = rig.engine.expand(profile)
    # The engine's own option is not the plugin's business (sysctl would take it for a key).
    assert {n: e.settings for n, e in expansions.items()} == {
        "writeback": {DIRTY: {"bytes": int((8 << 30) / 100)}, EXPIRE: 500},
        "sysctl": {SWAP: "5", Sysctl("net.ipv4.tcp_rmem"): "1 2 3"},
    }
    assert set(rig.engine.expand(profile, only=["sysctl", "irq"])) == {"sysctl"}
    rig.engine.apply(profile)
    assert rig.changed() == {
        "vm/dirty_bytes": str(int((8 << 30) / 100)),
        "vm/dirty_ratio": "0",
        "vm/dirty_expire_centisecs": "500",
        "vm/swappiness": "5",
        "net/ipv4/tcp_rmem": "1 2 3",
    }
    assert rig.engine.on_drift("writeback") == "report"
    assert rig.engine.on_drift("sysctl") == "reapply"  # the default, in every section
    assert set(rig.engine.sections) == {"writeback", "sysctl"}


def test_a_rejected_profile_leaves_the_sections_of_the_applied_one(
    rig: Rig, tmp_path: Path
) -> None:
    """The rules a section keeps for later targets are committed only with the profile."""
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "good.toml").write_text('[sysctl]\n"vm.swappiness" = 5\n')
    (pdir / "bad.toml").write_text('[sysctl]\n"vm.swappiness" = 6\n"vm.stat_interval" = 9\n')
    library = library_for(rig, pdir)
    rig.engine.apply(library.load("good"))
    before = dict(rig.engine.sections)
    system = RefusingSystem(rig.root)
    system.refuse["proc/sys/vm/stat_interval"] = "the kernel refused it: EINVAL"
    rig.plugins["sysctl"].system = system
    with pytest.raises(ApplyFailed):
        rig.engine.apply(library.load("bad"))
    assert rig.engine.sections == before
    assert read_sysctl(rig.root, "vm/swappiness") == "5"


def test_expand_errors_fail_the_profile_and_not_applicable_refuses_the_section(
    rig: Rig,
) -> None:
    class Broken(FakePlugin):
        def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion:
            if options.get("x") == "na":
                raise NotApplicable("no cpufreq on this machine")
            raise KernelRefused("listing IRQs", "EACCES")

    rig.plugins["fake"] = Broken(rig.system)
    from latencyd.core.profile import Profile

    profile = Profile("p", rig.root / "p.toml", "", {"fake": {"x": 1}}, {})
    with pytest.raises(ApplyFailed, match=r"^\[fake\]: listing IRQs: EACCES$"):
        rig.engine.expand(profile)
    profile = Profile("p", rig.root / "p.toml", "", {"fake": {"x": "na"}}, {})
    rig.engine.apply(profile)
    assert rig.engine.sections["fake"].expansion.refused == {SECTION: "no cpufreq on this machine"}


def test_nothing_is_written_when_the_journal_cannot_be(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    rig.engine.journal = Journal(blocker / "state")  # cannot be created under a file
    with pytest.raises(LatencydError, match="journal"):
        rig.engine.switch(A, "A")
    assert rig.system.writes == []
    assert rig.values() == rig.original
    assert rig.engine.applied == {} and rig.engine.profile is None


def test_recheck_reapplies_kept_settings_the_kernel_lost(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    write_sysctl(rig.root, "vm/swappiness", "60")  # e.g. reset by someone else
    rig.reset_writes()
    report = rig.engine.switch(A, "A")
    assert (report.applied, report.unchanged, rig.system.writes) == (0, len(A), [])
    report = rig.engine.switch(A, "A", recheck=True)
    assert rig.system.writes == [("proc/sys/vm/swappiness", "10")]
    assert (report.applied, report.unchanged) == (1, len(A) - 1)
    assert rig.changed() == A_FILES
    journal = rig.journal_on_disk()
    assert journal is not None and journal[0][("sysctl", SWAP)] == "60"


def test_journal_is_written_again_after_off(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    rig.engine.off()
    assert not rig.journal.path.exists()
    rig.engine.switch(A, "A")
    assert rig.journal_on_disk() == (A_ORIGINALS, "A")
    assert rig.fake.journal_at_write == {"a": "0", "b": "0"}


def test_a_step_gives_control_back_every_slice_and_ends_as_switch_does(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19: a long step yields its progress (the daemon answers D-Bus meanwhile)."""
    monkeypatch.setattr(engine_module, "SLICE_S", 0.0)  # every setting is a slice
    steps = rig.engine.switch_steps(A, "A")
    progress = []
    with pytest.raises(StopIteration) as end:
        while True:
            progress.append(next(steps))
    report = end.value.value
    assert report.applied == len(A) and rig.engine.applied == A
    # the diff, then reading the originals, then writing: each setting counted once per pass
    assert [p.done for p in progress] == list(range(2 * len(A) + 1))
    assert {p.total for p in progress} == {2 * len(A)}
    assert rig.changed() == A_FILES


@pytest.mark.parametrize("after", [1, 4, 7])  # reading originals, restoring, applying
def test_a_cancelled_step_is_rolled_back_like_a_failed_one(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, after: int
) -> None:
    rig.engine.switch(A, "A")
    after_a, journal_a = rig.values(), rig.journal_on_disk()
    monkeypatch.setattr(engine_module, "SLICE_S", 0.0)
    steps = rig.engine.switch_steps(B, "B")
    for _ in range(after):
        next(steps)
    with pytest.raises(ApplyFailed, match=r"^cancelled by off\. Nothing was changed"):
        steps.throw(Cancelled("cancelled by off"))
    assert rig.values() == after_a
    assert rig.engine.applied == A and rig.engine.profile == "A"
    assert rig.journal_on_disk() == journal_a
    rig.engine.off()
    assert rig.values() == rig.original


def test_a_drift_of_a_task_is_named_only_to_who_may_see_tasks() -> None:
    """Verify for a caller who may only read: a task's drift keeps its plugin and kind,
    not its pid, name or CPUs (hidepid's promise, as in Status)."""
    from latencyd.plugins.kthread import ThreadAffinity

    from latencyd.core.engine import Drift

    text = "thread 4242 (secret-job): CPUs 0"
    task = Drift("kthread", ThreadAffinity(4242, 99), "0", "0-1", text)
    sysctl = Drift("sysctl", Sysctl("vm.swappiness"), "10", "60", "vm.swappiness = 10")
    assert task.as_json()["target"]["pid"] == 4242
    hidden = json.dumps(task.as_json(show_tasks=False))
    assert "4242" not in hidden and "secret-job" not in hidden and "0-1" not in hidden
    assert task.as_json(show_tasks=False)["plugin"] == "kthread"
    assert sysctl.as_json(show_tasks=False) == sysctl.as_json()


# -- a plan: what a switch would do, nothing written ---------------------------------


def _profile(name: str, sections: dict[str, dict[str, Any]]) -> Any:
    from latencyd.core.profile import Profile

    return Profile(name, Path(f"/nowhere/{name}.toml"), "", sections, {})


def _planned(switch_plan: Any) -> dict[tuple[str, Target], tuple[str, str, Any, Any]]:
    return {
        (s.plugin, s.target): (s.action, s.step, s.now, s.would_be) for s in switch_plan.settings
    }


def _written(report: Any) -> dict[tuple[str, Target], Any]:
    return {(p, t): after for p, changes in report.changes.items() for t, _, after in changes}


def test_a_plan_writes_nothing_and_lists_what_the_switch_then_does(rig: Rig) -> None:
    """From nothing and from another profile: every setting the plan says would change
    is what the switch then writes, with the value it writes; the rest unchanged or not
    applicable alike; the plan itself writes nothing and journals nothing."""
    a = _profile("a", {"sysctl": {"vm.swappiness": 10, "vm.stat_interval": 10},
                       "fake": {"a": "1", "b": "1", "d": "0"}})  # fmt: skip
    b = _profile("b", {"sysctl": {"vm.swappiness": 10, "vm.stat_interval": 5},
                       "fake": {"a": "1", "c": "2", "na": "4"}})  # fmt: skip
    rig.plugins["fake"].refuse_read["na"] = NotApplicable("no such knob here")
    for first, then in ((None, a), (a, b), (b, a)):
        if first is not None:
            rig.engine.apply(first)
        journal = (rig.state_dir / "journal.jsonl").read_bytes() if first else None
        before = rig.values()
        rig.reset_writes()
        switch_plan = rig.engine.plan_profile(then)
        assert rig.system.writes == [] and rig.fake.writes == []
        assert rig.values() == before
        if journal is not None:
            assert (rig.state_dir / "journal.jsonl").read_bytes() == journal
        assert switch_plan.profile == then.name
        assert switch_plan.current == (first.name if first else None)
        planned = _planned(switch_plan)
        report = rig.engine.apply(then)
        changes = {sid: p[3] for sid, p in planned.items() if p[0] == "change"}
        assert changes == _written(report), (first, then)
        assert {sid for sid, p in planned.items() if p[0] == "not applicable"} == set(
            report.not_applicable
        )
        unchanged = [sid for sid, p in planned.items() if p[0] == "unchanged"]
        assert len(unchanged) == report.unchanged + sum(
            1 for p in planned.values() if p[:2] == ("unchanged", "restore")
        )
    # From a to b: swappiness is kept, stat_interval 10 -> 5, b given back, d was as wanted.
    rig.engine.apply(a)
    planned = _planned(rig.engine.plan_profile(b))
    assert planned[("sysctl", SWAP)] == ("unchanged", "keep", "10", "10")
    assert planned[("sysctl", STAT)] == ("change", "apply", "10", "5")
    assert planned[("fake", KB)] == ("change", "restore", "1", "0")
    assert planned[("fake", Knob("d"))] == ("unchanged", "restore", "0", "0")
    assert planned[("fake", KC)] == ("change", "apply", "0", "2")
    assert planned[("fake", Knob("na"))] == ("not applicable", "apply", None, "4")


def test_a_plan_from_the_same_profile_would_change_nothing(rig: Rig) -> None:
    a = _profile("a", {"sysctl": {"vm.swappiness": 10}, "fake": {"a": "1"}})
    rig.engine.apply(a)
    switch_plan = rig.engine.plan_profile(a)
    assert switch_plan.changes == 0
    assert {s.action for s in switch_plan.settings} == {"unchanged"}


def test_a_plan_hides_tasks_from_who_may_not_see_them(rig: Rig) -> None:
    from latencyd.plugins.shield import TaskAffinity

    from latencyd.core.planning import PlannedSetting, SwitchPlan

    task = TaskAffinity(4242, 7, 4242)
    switch_plan = SwitchPlan("p", None, [
        PlannedSetting("shield", task, "change", "apply", "0-1", "0"),
        PlannedSetting("sysctl", SWAP, "change", "apply", "60", "10"),
    ])  # fmt: skip

    class Shield(FakePlugin):
        def describe(self, target: Any, value: Any) -> str:
            return f"pid {target.pid} on {value}"

    plugins: dict[str, Plugin[Any, Any, Any]] = {"shield": Shield(rig.system), **rig.plugins}
    shown = switch_plan.as_json(plugins, show_tasks=True)
    assert [r["plugin"] for r in shown["settings"]] == ["shield", "sysctl"]
    assert shown["would_change"] == 2 and shown["hidden"] == {}
    hidden = switch_plan.as_json(plugins, show_tasks=False)
    assert [r["plugin"] for r in hidden["settings"]] == ["sysctl"]
    assert hidden["would_change"] == 2 and hidden["hidden"] == {"shield": 1}
    assert "4242" not in json.dumps(hidden)


@dataclass(frozen=True)
class UsersChoice:
    """A Handover: the value "user" is its user's to keep (data, no plugin state)."""

    def theirs(self, target: Knob | SoftKnob, actual: Value) -> str | None:
        return "the user set it" if actual == "user" else None


class SharedKnobs(FakePlugin, SharesWithUser[Knob | SoftKnob, None]):
    """Knobs their user may set too: `pinned` ones are set to "user" by their user right
    between the engine's judging and its write (as `taskset -c 1 app` after an exec)."""

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.pinned: set[str] = set()
        self.calls: list[str] = []  # the plugin's hooks and verbs, in the order asked

    def handover(self, rules: None) -> UsersChoice:
        self.calls.append("handover")
        return UsersChoice()

    def write_unless_changed(self, target: Knob | SoftKnob, value: Value, judged: Value) -> Any:
        self.calls.append(f"write_unless_changed {target.name}")
        if target.name in self.pinned:
            self.system.write(f"proc/sys/fake/{target.name}", "user")
        return read_then_write(self, target, value, judged)

    def write(self, target: Knob | SoftKnob, value: Any) -> None:
        self.calls.append(f"write {target.name}")
        super().write(target, value)


def test_a_shared_setting_is_judged_by_a_handover_made_before_any_write(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 53: a plugin sharing its settings with their user (SharesWithUser) gives the
    engine its rule of what is theirs once per step, before anything is written; inside
    the writes the engine reaches the plugin only through its verbs. What the user set
    between the judging and the write stays theirs, unowned, and `off` leaves it."""
    root = make_fake_root(tmp_path, sysctls=FAKE_KEYS)
    plugin = SharedKnobs(KernelLikeSystem(root))
    plugin.pinned = {"b"}
    engine = Engine({"fake": plugin}, Journal(tmp_path / "state"))
    wanted = {("fake", Knob("a")): "1", ("fake", Knob("b")): "1"}
    with caplog.at_level("INFO"):
        report = engine.switch(wanted, "p")
    assert report.applied == 1 and ("fake", Knob("b")) not in engine.applied
    assert read_sysctl(root, "fake/a") == "1" and read_sysctl(root, "fake/b") == "user"
    assert "b = user: left as it is, the user set it" in caplog.text
    first_write = next(i for i, c in enumerate(plugin.calls) if c.startswith("write"))
    assert "handover" in plugin.calls[:first_write]
    assert "handover" not in plugin.calls[first_write:]
    assert engine.off() == []
    assert read_sysctl(root, "fake/a") == "0" and read_sysctl(root, "fake/b") == "user"


class LooksShared(FakePlugin):
    """The methods of SharesWithUser and ReportsGrouped, neither of them declared."""

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.asked: list[str] = []

    def handover(self, rules: None) -> UsersChoice:
        self.asked.append("handover")
        return UsersChoice()

    def write_unless_changed(self, target: Knob | SoftKnob, value: Value, judged: Value) -> Any:
        self.asked.append("write_unless_changed")
        return read_then_write(self, target, value, judged)

    def starts_afresh(self, options: Options, owned: Mapping[Target, Value]) -> bool:
        self.asked.append("starts_afresh")
        return False

    def report(self, changes: list[tuple[Knob | SoftKnob, Value, Value]]) -> None:
        self.asked.append("report")

    def group(self, target: Knob | SoftKnob) -> None:
        self.asked.append("group")

    def describe_group(self, targets: list[Knob | SoftKnob], value: Value) -> str:
        self.asked.append("describe_group")
        return ""


def test_a_capability_is_asked_only_of_a_plugin_that_declares_it(tmp_path: Path) -> None:
    """Issue 53: the engine finds a capability among the plugin's bases, not by the names
    of its methods. A plugin whose own methods happen to be named as a capability's is
    owned as latencyd's alone, and asked none of them: what its look-alike handover
    would call the user's is drift, planned to be given back, and given back at off."""
    root = make_fake_root(tmp_path, sysctls=FAKE_KEYS)
    plugin = LooksShared(KernelLikeSystem(root))
    engine = Engine({"fake": plugin}, Journal(tmp_path / "state"))
    report = engine.apply(_profile("p", {"fake": {"a": "1", "b": "user"}}))
    assert report.applied == 2 and read_sysctl(root, "fake/b") == "user"
    write_sysctl(root, "fake/a", "user")
    assert [(d.target, d.actual) for d in engine.verify()] == [(Knob("a"), "user")]
    planned = _planned(engine.plan_profile(_profile("q", {})))
    assert planned[("fake", Knob("a"))] == ("change", "restore", "user", "0")
    assert engine.off() == [] and read_sysctl(root, "fake/a") == read_sysctl(root, "fake/b") == "0"
    assert plugin.asked == []


class SharedKnobsCountingSteps(SharedKnobs, RemembersInStep):
    """SharedKnobs that say which step of theirs (begin_step to end_step: the engine
    begins one after each turn of the main loop) a setting was judged and described in."""

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.step = 0
        self.judged_in: dict[str, int] = {}
        self.words_fail = False

    def begin_step(self) -> None:
        self.step += 1

    def end_step(self) -> None:
        pass

    def write_unless_changed(self, target: Knob | SoftKnob, value: Value, judged: Value) -> Any:
        self.judged_in[target.name] = self.step
        return super().write_unless_changed(target, value, judged)

    def describe(self, target: Knob | SoftKnob, value: Any) -> str:
        if self.words_fail:
            raise RuntimeError("a plugin's bug in its words")
        return f"{target.name} = {value} (described in step {self.step})"


def test_what_is_left_to_its_user_is_said_before_the_turn_it_was_judged_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A setting left to its user is said in the plugin's words before the main loop's
    next turn, as it was said where it was judged before the shared ownership became a
    strategy (issue 53): after the turn its pid may be another task's, whose name the
    words would show. A plugin's words that fail are logged, and fail nothing."""
    monkeypatch.setattr(engine_module, "SLICE_S", 0.0)  # every setting is a slice
    root = make_fake_root(tmp_path, sysctls=FAKE_KEYS)
    plugin = SharedKnobsCountingSteps(KernelLikeSystem(root))
    plugin.pinned = {"a", "b"}
    engine = Engine({"fake": plugin}, Journal(tmp_path / "state"))
    wanted = {("fake", Knob(k)): "1" for k in ("a", "b", "c")}
    with caplog.at_level("INFO"):
        report = engine.switch(wanted, "p")
    assert report.applied == 1 and set(engine.applied) == {("fake", Knob("c"))}
    assert plugin.judged_in["a"] < plugin.judged_in["b"] < plugin.step
    for name in ("a", "b"):
        said = f"{name} = user (described in step {plugin.judged_in[name]}): left as it is"
        assert said in caplog.text
    # Words that fail: logged, and the check is done even so, what it let go let go.
    plugin.words_fail = True
    write_sysctl(root, "fake/c", "user")
    caplog.clear()
    assert engine.verify() == [] and engine.applied == {}
    assert "[fake] saying what was left to its user" in caplog.text
    assert engine.off() == [] and read_sysctl(root, "fake/c") == "user"


class AfreshKnobs(FakePlugin, StartsAfresh[Options]):
    """FakePlugin whose settings are given back before its section is expanded again, and
    which shares nothing with their user: StartsAfresh is a capability of its own."""

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.owned_at_expand: list[dict[str, Value]] = []

    def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion:
        self.owned_at_expand.append({str(t): v for t, v in owned.items()})
        return super().expand(options, owned)

    def starts_afresh(self, options: Options, owned: Mapping[Target, Value]) -> bool:
        return bool(owned)


def test_a_plugin_that_starts_afresh_without_sharing_has_its_settings_given_back_first(
    tmp_path: Path,
) -> None:
    """Issue 53: StartsAfresh apart from SharesWithUser. A plugin that declares only it
    expands its section again with nothing owned (what it set was given back first), and
    the settings end as the new section says: set, given back, set anew."""
    root = make_fake_root(tmp_path, sysctls=FAKE_KEYS)
    system = KernelLikeSystem(root)
    plugin = AfreshKnobs(system)
    engine = Engine({"fake": plugin}, Journal(tmp_path / "state"))
    for value in ("1", "2"):
        engine.apply(_profile("p", {"fake": {"a": value}}))
    assert not declares(plugin, SharesWithUser)
    assert plugin.owned_at_expand[0] == {} and plugin.owned_at_expand[-1] == {}
    assert [w for w in plugin.writes if w[0] == "a"] == [("a", "1"), ("a", "0"), ("a", "2")]
    assert (root / "proc/sys/fake/a").read_text().strip() == "2"
    assert engine.verify() == []
