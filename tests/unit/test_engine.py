"""The engine: journal-first transactions, incremental switches, rollback, recovery, verify.

Real writeback and sysctl plugins run on a fake /proc tree; `FakePlugin` (settings
stored as files under the same tree) raises the refusals a real kernel would.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.sysctl import SysctlPlugin
from latencyd.plugins.writeback import WritebackPlugin

from latencyd.cpuset import CpuSet
from latencyd.engine import Drift, Engine, Plan, plan
from latencyd.errors import ApplyFailed, KernelRefused, LatencydError, NotApplicable
from latencyd.journal import Journal, JournalState
from latencyd.plugin import Plugin
from latencyd.profile import ProfileLibrary
from latencyd.schema import Machine
from latencyd.system import System
from tests.unit.fakesys import (
    KernelLikeSystem,
    make_fake_root,
    read_sysctl,
    sysctl_values,
    write_sysctl,
)

FAKE_KEYS = {f"fake/{k}": "0" for k in ("a", "b", "c", "d", "bad", "na", "stuck")}


class Crash(BaseException):
    """Stands in for SIGKILL: nothing in latencyd may catch it."""


class FakePlugin(Plugin):
    """Settings are files /proc/sys/fake/<key>; chosen keys misbehave like a kernel can."""

    name = "fake"
    summary = "test double with programmable refusals"

    def __init__(self, system: System, journal: Journal | None = None) -> None:
        super().__init__(system)
        self.journal = journal
        # key, or (key, value) to refuse only that value
        self.refuse_apply: dict[str | tuple[str, Any], Exception] = {}
        self.refuse_capture: dict[str, Exception] = {}
        self.crash_on: set[str] = set()
        self.stuck: set[str] = set()  # writes "succeed" but the value stays
        self.optional_keys: set[str] = set()
        self.gone: set[str] = set()
        self.writes: list[tuple[str, Any]] = []
        self.journal_at_apply: dict[str, Any] = {}

    def expand(self, options: Mapping[str, Any]) -> dict[str, Any]:
        return {k: str(v) for k, v in options.items()}

    def capture(self, key: str) -> Any:
        if key in self.refuse_capture:
            raise self.refuse_capture[key]
        return self.system.read(f"proc/sys/fake/{key}")

    def apply(self, key: str, value: Any) -> None:
        if self.journal is not None:
            state = self.journal.load()
            self.journal_at_apply[key] = state and state.originals.get(("fake", key))
        self.writes.append((key, value))
        if key in self.crash_on:
            raise Crash(key)
        for refused in (key, (key, value)):
            if refused in self.refuse_apply:
                raise self.refuse_apply[refused]
        if key not in self.stuck:
            self.system.write(f"proc/sys/fake/{key}", str(value))

    def optional(self, key: str) -> bool:
        return key in self.optional_keys

    def exists(self, key: str) -> bool:
        return key not in self.gone


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
        plugins: dict[str, Plugin] = {
            "writeback": WritebackPlugin(self.system),
            "sysctl": SysctlPlugin(self.system),
            "fake": self.fake,
        }
        return Engine(plugins, self.journal)

    def values(self) -> dict[str, str]:
        return sysctl_values(self.root)

    def changed(self) -> dict[str, str]:
        """Files that differ from the originals, with their current values."""
        now = self.values()
        return {k: v for k, v in now.items() if self.original[k] != v}

    def journal_on_disk(self) -> JournalState | None:
        return Journal(self.state_dir).load()

    def reset_writes(self) -> None:
        self.system.writes.clear()
        self.fake.writes.clear()


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


A = {
    ("sysctl", "vm.swappiness"): "10",
    ("sysctl", "vm.stat_interval"): "10",
    ("writeback", "dirty"): {"bytes": 64 << 20},
    ("writeback", "dirty_expire_centisecs"): 1000,
    ("fake", "a"): "1",
    ("fake", "b"): "1",
}
B = {
    ("sysctl", "vm.swappiness"): "10",  # same as A
    ("sysctl", "vm.stat_interval"): "5",  # differs
    ("writeback", "dirty"): {"bytes": 64 << 20},  # same
    ("writeback", "dirty_background"): {"ratio": 3},  # new
    ("fake", "a"): "1",  # same
    ("fake", "c"): "2",  # new
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


# -- plan ----------------------------------------------------------------------


def test_plan_is_a_pure_diff() -> None:
    applied = {("p", "same"): 1, ("p", "diff"): 1, ("p", "gone"): 1, ("q", "gone"): 1}
    wanted = {("p", "same"): 1, ("p", "diff"): 2, ("p", "new"): 3}
    snapshot = (dict(applied), dict(wanted))
    result = plan(applied, wanted)
    assert result == Plan(
        restore=[("p", "gone"), ("q", "gone")],
        apply={("p", "diff"): 2, ("p", "new"): 3},
        keep=[("p", "same")],
    )
    assert (applied, wanted) == snapshot
    # Out-of-scope settings are left alone, not restored.
    assert plan(applied, wanted, scope=["p"]).restore == [("p", "gone")]
    assert plan(applied, {}, scope=[]).restore == []
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
    assert rig.journal_on_disk() == JournalState(
        {
            ("sysctl", "vm.swappiness"): "60",
            ("sysctl", "vm.stat_interval"): "1",
            ("writeback", "dirty"): {"ratio": 20},
            ("writeback", "dirty_expire_centisecs"): 3000,
            ("fake", "a"): "0",
            ("fake", "b"): "0",
        },
        "A",
    )


def test_originals_are_on_disk_before_the_first_write(rig: Rig) -> None:
    rig.engine.switch({("fake", "a"): "1", ("fake", "b"): "2"}, "A")
    # At the moment each apply ran, the journal file already held that key's original.
    assert rig.fake.journal_at_apply == {"a": "0", "b": "0"}


def test_setting_already_as_wanted_is_not_written(rig: Rig) -> None:
    report = rig.engine.switch({("sysctl", "vm.swappiness"): "60", ("fake", "a"): "1"}, "A")
    assert report.applied == 1
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
    state = rig.journal_on_disk()
    assert state is not None and state.profile == "B"
    # The journal keeps the true originals (not A's values) for exactly B's settings.
    assert state.originals == {
        ("sysctl", "vm.swappiness"): "60",
        ("sysctl", "vm.stat_interval"): "1",
        ("writeback", "dirty"): {"ratio": 20},
        ("writeback", "dirty_background"): {"ratio": 10},
        ("fake", "a"): "0",
        ("fake", "c"): "0",
    }


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
    report = rig.engine.switch({("sysctl", "vm.swappiness"): "20"}, "A", scope=["sysctl"])
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
        ("sysctl", "vm.swappiness"): "20",
    }


# -- off / recover -------------------------------------------------------------------


def test_recover_after_a_crash_restores_originals(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    rig.engine.switch(B, "B")
    # The daemon dies here; a new one starts on the same state dir.
    engine = rig.new_engine()
    assert engine.recover() == []
    assert rig.values() == rig.original
    assert not rig.journal.path.exists()
    assert engine.recover() is None  # a clean state: nothing to do


def test_recover_after_a_crash_in_the_middle_of_a_step(rig: Rig) -> None:
    rig.fake.crash_on.add("c")
    wanted = {("sysctl", "vm.swappiness"): "10", ("writeback", "dirty"): {"bytes": 4096}}
    with pytest.raises(Crash):
        rig.engine.switch({**wanted, ("fake", "c"): "5"}, "A")
    assert rig.changed() == {"vm/swappiness": "10", "vm/dirty_bytes": "4096", "vm/dirty_ratio": "0"}
    engine = rig.new_engine()
    assert engine.recover() == []
    assert rig.values() == rig.original  # dirty is back in ratio mode: 20, bytes 0
    assert not rig.journal.path.exists()


def test_recover_reports_plugins_that_are_gone(rig: Rig) -> None:
    rig.engine.switch({("fake", "a"): "1", ("sysctl", "vm.swappiness"): "1"}, "A")
    engine = Engine({"sysctl": SysctlPlugin(System(rig.root))}, Journal(rig.state_dir))
    assert engine.recover() == ["[fake] a: plugin not installed, cannot restore"]
    assert read_sysctl(rig.root, "vm/swappiness") == "60"


def test_off_skips_targets_that_vanished_and_reports_failures(rig: Rig) -> None:
    rig.engine.switch({("fake", "a"): "1", ("fake", "b"): "1", ("fake", "c"): "1"}, "A")
    rig.fake.gone.add("a")
    rig.fake.refuse_apply["b"] = KernelRefused("writing fake/b", "Device busy (EBUSY)")
    problems = rig.engine.off()
    assert problems == ["[fake] restoring b: writing fake/b: Device busy (EBUSY)"]
    assert rig.changed() == {"fake/a": "1", "fake/b": "1"}
    assert not rig.journal.path.exists()


# -- failures and rollback ---------------------------------------------------------------


def test_mid_step_failure_rolls_back_everything(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    after_a = rig.values()
    journal_a = rig.journal_on_disk()
    rig.fake.refuse_apply["bad"] = KernelRefused(
        "writing 'x' to /proc/sys/fake/bad", "Invalid argument (EINVAL)"
    )
    failing = {**B, ("fake", "bad"): "x"}  # bad comes last: everything else ran first
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
    rig.fake.refuse_apply["bad"] = KernelRefused("writing", "Operation not permitted (EPERM)")
    with pytest.raises(ApplyFailed, match="Nothing was changed"):
        rig.engine.switch({**A, ("fake", "bad"): "1"}, "A")
    assert rig.values() == rig.original
    assert rig.engine.applied == {} and rig.engine.originals == {}
    assert rig.engine.profile is None
    assert not rig.journal.path.exists()


def test_kernel_refusal_without_plugin_prefix_names_the_setting(rig: Rig) -> None:
    rig.fake.refuse_apply["bad"] = KernelRefused("writing", "EPERM")
    with pytest.raises(ApplyFailed) as info:
        rig.engine.switch({("fake", "bad"): "7"}, "A")
    assert str(info.value).startswith("[fake] bad = 7: writing: EPERM. Nothing was changed")


def test_write_accepted_but_value_kept_is_a_failure(rig: Rig) -> None:
    rig.fake.stuck.add("stuck")
    with pytest.raises(ApplyFailed) as info:
        rig.engine.switch({("sysctl", "vm.swappiness"): "1", ("fake", "stuck"): "9"}, "A")
    assert str(info.value) == (
        "[fake] stuck = 9: the kernel accepted the write but kept '0'. "
        "Nothing was changed: the step was rolled back."
    )
    assert rig.values() == rig.original
    assert not rig.journal.path.exists()


def test_plugin_bug_mid_step_still_rolls_back(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    after_a = rig.values()
    rig.fake.refuse_apply["bad"] = RuntimeError("plugin bug")
    with pytest.raises(ApplyFailed, match="plugin bug"):
        rig.engine.switch({**B, ("fake", "bad"): "1"}, "B")
    assert rig.values() == after_a
    assert rig.engine.applied == A


def test_unreadable_original_fails_before_anything_is_written(rig: Rig) -> None:
    rig.fake.refuse_capture["bad"] = KernelRefused("reading /proc/sys/fake/bad", "EIO")
    with pytest.raises(ApplyFailed) as info:
        rig.engine.switch({("fake", "a"): "5", ("fake", "bad"): "1"}, "A")
    assert str(info.value) == (
        "[fake] cannot read bad before changing it: reading /proc/sys/fake/bad: EIO"
    )
    assert rig.fake.writes == []
    assert rig.values() == rig.original
    assert not rig.journal.path.exists()
    # Someone else changes `a`; a later step must journal that value as the original,
    # not the one read before the failed step.
    write_sysctl(rig.root, "fake/a", "7")
    del rig.fake.refuse_capture["bad"]
    rig.engine.switch({("fake", "a"): "5"}, "A")
    state = rig.journal_on_disk()
    assert state is not None and state.originals == {("fake", "a"): "7"}
    rig.engine.off()
    assert read_sysctl(rig.root, "fake/a") == "7"


# -- not applicable ----------------------------------------------------------------------


def test_not_applicable_is_recorded_not_failed(rig: Rig) -> None:
    rig.fake.refuse_apply["na"] = NotApplicable("IRQ 24 is kernel-managed")
    rig.fake.refuse_capture["d"] = NotApplicable("no such queue on this NIC")
    rig.fake.refuse_apply["bad"] = KernelRefused("writing", "Operation not supported")
    rig.fake.optional_keys.add("bad")
    rig.fake.stuck.add("stuck")
    rig.fake.optional_keys.add("stuck")
    wanted = {
        ("fake", "a"): "1",
        ("fake", "na"): "1",
        ("fake", "d"): "1",
        ("fake", "bad"): "1",
        ("fake", "stuck"): "1",
    }
    report = rig.engine.switch(wanted, "A")
    assert report.applied == 1
    assert report.not_applicable == {
        ("fake", "na"): "IRQ 24 is kernel-managed",
        ("fake", "d"): "no such queue on this NIC",
        ("fake", "bad"): "Operation not supported",
        ("fake", "stuck"): "the kernel accepted the write but kept '0'",
    }
    assert rig.engine.not_applicable == report.not_applicable
    # `d` (refused when reading its original) was never written; `stuck` was put back.
    assert [k for k, _ in rig.fake.writes] == ["a", "na", "bad", "stuck", "stuck"]
    assert rig.changed() == {"fake/a": "1"}
    assert rig.engine.applied == {("fake", "a"): "1"}
    state = rig.journal_on_disk()
    assert state is not None and state.originals == {("fake", "a"): "0"}
    # Not-applicable settings are not drift.
    assert rig.engine.verify() == []


def test_not_applicable_after_a_write_puts_the_original_back(rig: Rig) -> None:
    class RefusesOnReadback(FakePlugin):
        def capture(self, key: str) -> Any:
            value = super().capture(key)
            if key == "na" and value != "0":
                raise NotApplicable("driver ignores it")
            return value

    rig.engine.plugins["fake"] = plugin = RefusesOnReadback(rig.system)  # type: ignore[index]
    report = rig.engine.switch({("fake", "na"): "3"}, "A")
    assert report.not_applicable == {("fake", "na"): "driver ignores it"}
    assert plugin.writes == [("na", "3"), ("na", "0")]
    assert rig.values() == rig.original


def test_setting_that_becomes_not_applicable_is_not_left_behind(rig: Rig) -> None:
    rig.engine.switch({("fake", "a"): "1", ("fake", "b"): "1"}, "A")
    rig.fake.refuse_apply[("a", "2")] = NotApplicable("not on this hardware")
    report = rig.engine.switch({("fake", "a"): "2", ("fake", "b"): "2"}, "B")
    assert report.not_applicable == {("fake", "a"): "not on this hardware"}
    # B does not get `a`: it goes back to its original, not stay at A's value untracked.
    assert rig.changed() == {"fake/b": "2"}
    assert rig.engine.applied == {("fake", "b"): "2"}
    state = rig.journal_on_disk()
    assert state is not None and state.originals == {("fake", "b"): "0"}
    rig.engine.off()
    assert rig.values() == rig.original


def test_rollback_reapplies_a_setting_dropped_as_not_applicable(rig: Rig) -> None:
    rig.engine.switch({("fake", "a"): "1", ("fake", "b"): "1"}, "A")
    after_a = rig.values()
    rig.fake.refuse_apply[("a", "2")] = NotApplicable("not on this hardware")
    rig.fake.refuse_apply["bad"] = KernelRefused("writing bad", "EINVAL")
    with pytest.raises(ApplyFailed):
        rig.engine.switch({("fake", "a"): "2", ("fake", "bad"): "1"}, "B")
    assert rig.values() == after_a
    assert rig.engine.applied == {("fake", "a"): "1", ("fake", "b"): "1"}


def test_not_applicable_kept_for_out_of_scope_plugins(rig: Rig) -> None:
    rig.fake.refuse_apply["na"] = NotApplicable("kernel-managed")
    rig.engine.switch({("fake", "na"): "1", ("sysctl", "vm.swappiness"): "1"}, "A")
    rig.engine.switch({("sysctl", "vm.swappiness"): "2"}, "A", scope=["sysctl"])
    assert rig.engine.not_applicable == {("fake", "na"): "kernel-managed"}
    rig.engine.switch({("sysctl", "vm.swappiness"): "2"}, "A")
    assert rig.engine.not_applicable == {}


# -- verify ------------------------------------------------------------------------------


def test_verify_reports_drift_and_reapply_fixes_it(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    assert rig.engine.verify() == []
    write_sysctl(rig.root, "vm/swappiness", "30")
    write_sysctl(rig.root, "vm/dirty_ratio", "20")
    write_sysctl(rig.root, "vm/dirty_bytes", "0")
    write_sysctl(rig.root, "fake/b", "9")
    drifts = rig.engine.verify()
    assert drifts == [
        Drift("sysctl", "vm.swappiness", "10", "30"),
        Drift("writeback", "dirty", {"bytes": 64 << 20}, {"ratio": 20}),
        Drift("fake", "b", "1", "9"),
    ]
    assert rig.engine.verify(scope=["fake"]) == [Drift("fake", "b", "1", "9")]
    assert rig.engine.reapply(drifts) == []
    assert rig.engine.verify() == []
    assert rig.changed() == A_FILES


def test_verify_normalises_multi_field_sysctls(rig: Rig) -> None:
    rig.engine.switch({("sysctl", "net.ipv4.tcp_rmem"): "4096 87380 6291456"}, "A")
    write_sysctl(rig.root, "net/ipv4/tcp_rmem", "4096\t87380\t6291456")
    assert rig.engine.verify() == []


def test_verify_drops_vanished_targets_and_flags_unreadable_ones(rig: Rig) -> None:
    rig.engine.switch({("fake", "a"): "1", ("fake", "b"): "1"}, "A")
    rig.fake.refuse_capture["a"] = KernelRefused("reading a", "ENOENT")
    rig.fake.gone.add("a")
    rig.fake.refuse_capture["b"] = KernelRefused("reading b", "EIO")
    assert rig.engine.verify() == [Drift("fake", "b", "1", "<unreadable: reading b: EIO>")]
    assert rig.engine.applied == {("fake", "b"): "1"}
    assert rig.engine.originals == {("fake", "b"): "0"}


def test_reapply_reports_refusals(rig: Rig) -> None:
    rig.engine.switch({("fake", "a"): "1"}, "A")
    rig.fake.refuse_apply["a"] = KernelRefused("writing a", "EBUSY")
    assert rig.engine.reapply([Drift("fake", "a", "1", "0")]) == [
        "[fake] re-applying a: writing a: EBUSY"
    ]


# -- from a profile ----------------------------------------------------------------------


def test_wanted_from_a_loaded_profile(rig: Rig, tmp_path: Path) -> None:
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "p.toml").write_text(
        '[writeback]\ndirty_bytes = "1%"\ndirty_expire_centisecs = 500\n'
        '[sysctl]\n"vm.swappiness" = 5\n"net.ipv4.tcp_rmem" = "1  2 3"\n'
    )
    schemas = {n: p.schema for n, p in rig.engine.plugins.items() if n != "fake"}
    library = ProfileLibrary([pdir], schemas, Machine(CpuSet.from_list("0-3"), 8 << 30))
    profile = library.load("p")
    wanted = rig.engine.wanted(profile)
    assert wanted == {
        ("writeback", "dirty"): {"bytes": int((8 << 30) / 100)},
        ("writeback", "dirty_expire_centisecs"): 500,
        ("sysctl", "vm.swappiness"): "5",
        ("sysctl", "net.ipv4.tcp_rmem"): "1 2 3",
    }
    assert rig.engine.wanted(profile, only=["sysctl", "irq"]) == {
        ("sysctl", "vm.swappiness"): "5",
        ("sysctl", "net.ipv4.tcp_rmem"): "1 2 3",
    }
    rig.engine.switch(wanted, profile.name)
    assert rig.changed() == {
        "vm/dirty_bytes": str(int((8 << 30) / 100)),
        "vm/dirty_ratio": "0",
        "vm/dirty_expire_centisecs": "500",
        "vm/swappiness": "5",
        "net/ipv4/tcp_rmem": "1 2 3",
    }


def test_wanted_wraps_expand_errors(rig: Rig) -> None:
    class Broken(FakePlugin):
        def expand(self, options: Mapping[str, Any]) -> dict[str, Any]:
            raise KernelRefused("listing IRQs", "EACCES")

    rig.engine.plugins["fake"] = Broken(rig.system)  # type: ignore[index]
    from latencyd.profile import Profile

    profile = Profile("p", rig.root / "p.toml", "", {"fake": {"x": 1}}, {})
    with pytest.raises(ApplyFailed, match=r"^\[fake\]: listing IRQs: EACCES$"):
        rig.engine.wanted(profile)


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
    state = rig.journal_on_disk()
    assert state is not None and state.originals[("sysctl", "vm.swappiness")] == "60"


def test_journal_is_written_again_after_off(rig: Rig) -> None:
    rig.engine.switch(A, "A")
    rig.engine.off()
    assert not rig.journal.path.exists()
    rig.engine.switch(A, "A")
    state = rig.journal_on_disk()
    assert state is not None and state.profile == "A" and len(state.originals) == len(A)
    assert rig.fake.journal_at_apply == {"a": "0", "b": "0"}
