"""The sysfs plugin on a fake /sys whose files behave like sysfs attributes (SysfsLikeSystem):
paths, globs, bracketed choices, refusals, exact restore, root-only, and devices that come
and go."""

from __future__ import annotations

import copy
import textwrap
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.sysfs import ROOT_ONLY, SysfsFile, SysfsPlugin, SysfsRules, bracketed

from latencyd.core.capabilities import files_to_watch
from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import DeviceEvent, Plugin
from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import SchemaError
from latencyd.errors import ApplyFailed, KernelRefused, PermissionDenied, ProfileError
from latencyd.service.daemon import Caller, Daemon
from tests.unit.fakesys import SysfsLikeSystem, make_fake_root, put
from tests.unit.pluginrig import PluginRig

THP = "sys/kernel/mm/transparent_hugepage/enabled"
EPB = "sys/devices/system/cpu/cpu{}/power/energy_perf_bias"
SCHEDULERS = "[mq-deadline] kyber bfq none"


def add_disk(root: Path, name: str, schedulers: str = SCHEDULERS) -> str:
    """A disk as sysfs shows it: the device under /sys/devices, /sys/block/NAME and
    /sys/class/block/NAME linking to it. Returns the device's real path under root."""
    device = f"sys/devices/pci0000:00/0000:00:05.0/virtio2/block/{name}"
    put(root, f"{device}/queue/scheduler", schedulers)
    put(root, f"{device}/queue/read_ahead_kb", "128")
    for cls in ("sys/block", "sys/class/block"):
        (root / cls).mkdir(parents=True, exist_ok=True)
        (root / cls / name).symlink_to(root / device)
    return device


def remove_disk(root: Path, name: str) -> None:
    for cls in ("sys/block", "sys/class/block"):
        (root / cls / name).unlink()
    device = root / f"sys/devices/pci0000:00/0000:00:05.0/virtio2/block/{name}"
    for f in sorted(device.rglob("*"), reverse=True):
        f.unlink() if f.is_file() else f.rmdir()
    device.rmdir()


class Rig(PluginRig):
    def __init__(self, tmp_path: Path) -> None:
        root = make_fake_root(tmp_path, cpus="0-3")
        put(root, THP, "always [madvise] never")
        put(root, "sys/kernel/mm/transparent_hugepage/defrag",
            "always defer defer+madvise [madvise] never")  # fmt: skip
        for cpu in range(4):
            put(root, EPB.format(cpu), "6")
        self.sda = add_disk(root, "sda")
        system = SysfsLikeSystem(root)
        super().__init__(tmp_path, root, "sysfs", system, SysfsPlugin(system))

    def library(self, **profiles: str) -> ProfileLibrary:
        pdir = self.tmp_path / "profiles"
        pdir.mkdir(exist_ok=True)
        for name, text in profiles.items():
            (pdir / f"{name}.toml").write_text(textwrap.dedent(text).lstrip("\n"))
        plugins: dict[str, Plugin[Any, Any, Any]] = {"sysfs": self.plugin}
        return ProfileLibrary([pdir], section_schemas(plugins), self.machine)

    def daemon(self, **profiles: str) -> Daemon:
        plugins: dict[str, Plugin[Any, Any, Any]] = {"sysfs": self.plugin}
        return Daemon(self.system, plugins, self.library(**profiles), self.engine())

    def text(self, rel: str) -> str:
        return (self.root / rel).read_text()


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


# -- keys ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("/sys/../etc/shadow", "is outside /sys (it resolves to '/etc/shadow')"),
        ("/sys/kernel/../../proc/sys/kernel/core_pattern", "resolves to '/proc/sys/kernel/core"),
        ("/sys/*/../../etc/passwd", "resolves to '/etc/passwd'"),
        ("/proc/sys/vm/swappiness", "is outside /sys"),
        ("/sys", "is outside /sys"),
        ("/sysfs/x", "is outside /sys"),
        ("sys/kernel/mm/transparent_hugepage/enabled", "is not an absolute path"),
        ("/sys/kernel/\0x", "contains a NUL character"),
        ("/sys/" + "x" * 5000, "characters long"),
    ],
)
def test_keys_outside_sys_are_rejected_when_the_profile_loads(
    rig: Rig, key: str, message: str
) -> None:
    with pytest.raises(SchemaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        rig.section({key: "x"})


def test_a_key_outside_sys_names_the_file_and_line(rig: Rig) -> None:
    library = rig.library(
        bad="""
        [sysfs]
        "/sys/kernel/mm/transparent_hugepage/enabled" = "never"
        "/sys/kernel/../../etc/shadow" = "x"
        """
    )
    with pytest.raises(ProfileError) as err:
        library.load("bad")
    assert str(err.value).startswith(f"{rig.tmp_path / 'profiles' / 'bad.toml'}:3: ")
    assert "is outside /sys (it resolves to '/etc/shadow')" in str(err.value)


def test_values_are_integers_or_strings(rig: Rig) -> None:
    assert rig.section({"/sys/a": 6, "/sys/b": "x y"}) == {
        "/sys/a": 6,
        "/sys/b": "x y",
        "on_drift": "reapply",
    }
    with pytest.raises(SchemaError):
        rig.section({"/sys/a": [1, 2]})


# -- paths and globs -------------------------------------------------------------------------------


def test_a_path(rig: Rig) -> None:
    raw = {f"/{THP}": "never"}
    assert rig.expand(raw).settings == {SysfsFile(f"/{THP}"): "never"}
    engine = rig.engine()
    before = rig.snapshot()
    engine.apply(rig.profile(raw))
    assert rig.text(THP) == "always madvise [never]\n"
    assert engine.verify() == []
    assert engine.off() == []
    assert rig.snapshot() == before


def test_a_glob_names_every_match_and_integers_are_written_as_text(rig: Rig) -> None:
    raw = {"/sys/devices/system/cpu/cpu*/power/energy_perf_bias": 4}
    exp = rig.expand(raw)
    assert exp.settings == {SysfsFile(f"/{EPB.format(n)}"): "4" for n in range(4)}
    assert exp.notes[SysfsFile(f"/{EPB.format(2)}")] == (
        "from /sys/devices/system/cpu/cpu*/power/energy_perf_bias"
    )
    assert exp.rules == SysfsRules(
        tuple(raw), frozenset((next(iter(raw)), EPB.format(n)) for n in range(4))
    )
    rig.round_trip(raw)


def test_a_file_is_known_by_its_real_path_and_later_keys_win(rig: Rig) -> None:
    raw = {
        "/sys/block/sda/queue/scheduler": "none",
        "/sys/class/block/*/queue/scheduler": "kyber",
    }
    exp = rig.expand(raw)
    target = SysfsFile(f"/{rig.sda}/queue/scheduler")
    assert exp.settings == {target: "kyber"}
    assert exp.notes == {target: "from /sys/class/block/*/queue/scheduler"}
    rig.round_trip(raw)


def test_links_that_lead_out_of_sys_are_not_followed(rig: Rig) -> None:
    put(rig.root, "etc/secret", "x")
    (rig.root / "sys/kernel/escape").symlink_to(rig.root / "etc/secret")
    assert rig.plugin.matches("/sys/kernel/escape") == []
    assert rig.plugin.matches("/sys/kernel/esc*") == []
    assert rig.expand({"/sys/kernel/escape": "y"}).settings == {}


def test_whitespace_is_compared_word_by_word(rig: Rig) -> None:
    put(rig.root, "sys/module/x/parameters/range", "1\t2")
    target = SysfsFile("/sys/module/x/parameters/range")
    assert rig.plugin.read(target) == "1\t2"  # as shown: a restore writes back exactly that
    assert rig.plugin.same(target, "1   2", "1 2")
    rig.round_trip({"/sys/module/x/parameters/range": "3  4"})


# -- bracketed choices --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("always [madvise] never", (("always", "madvise", "never"), "madvise")),
        ("[mq-deadline] kyber bfq none", (("mq-deadline", "kyber", "bfq", "none"), "mq-deadline")),
        ("always defer defer+madvise [madvise] never",
         (("always", "defer", "defer+madvise", "madvise", "never"), "madvise")),
        ("[never]", None),  # one word: a value, not a choice
        ("[a] [b]", None),
        ("128", None),
        ("", None),
    ],
)  # fmt: skip
def test_bracketed(text: str, parsed: Any) -> None:
    assert bracketed(text) == parsed


def test_a_bracketed_choice_reads_as_the_chosen_word(rig: Rig) -> None:
    target = SysfsFile(f"/{THP}")
    assert rig.plugin.read(target) == "madvise"
    rig.plugin.write(target, "always")
    assert rig.text(THP) == "[always] madvise never\n"
    assert rig.plugin.read(target) == "always"


def test_a_choice_the_file_does_not_offer_is_refused_with_its_choices(rig: Rig) -> None:
    add_disk(rig.root, "vdb", "[none] mq-deadline")  # a virtio disk without bfq
    raw = {f"/{THP}": "sometimes", "/sys/block/*/queue/scheduler": "bfq"}
    exp = rig.expand(raw)
    assert exp.settings == {SysfsFile(f"/{rig.sda}/queue/scheduler"): "bfq"}
    vdb = rig.sda.replace("/sda", "/vdb")
    assert exp.refused == {
        f"/{THP} = sometimes (from /{THP})": "not one of its choices: always, madvise, never",
        f"/{vdb}/queue/scheduler = bfq (from /sys/block/*/queue/scheduler)": (
            "not one of its choices: none, mq-deadline"
        ),
    }
    rig.round_trip({"/sys/block/*/queue/scheduler": "bfq"})


# -- refusals ----------------------------------------------------------------------------------


def test_a_glob_that_matches_nothing_is_refused_not_an_error(rig: Rig) -> None:
    raw = {
        "/sys/block/nvme*/queue/scheduler": "none",
        "/sys/kernel/mm/ksm/run": 0,
        f"/{THP}": "never",
    }
    engine = rig.engine()
    report = engine.apply(rig.profile(raw))
    assert report.applied == 1
    assert engine.sections["sysfs"].expansion.refused == {
        "/sys/block/nvme*/queue/scheduler = none": "matches no file on this machine",
        "/sys/kernel/mm/ksm/run = 0": "no such file on this machine",
    }
    assert engine.off() == []


def test_files_that_cannot_be_set_and_given_back_are_refused(rig: Rig) -> None:
    write_only = put(rig.root, "sys/bus/pci/drivers/virtio-pci/unbind", "")
    read_only = put(rig.root, "sys/kernel/mm/transparent_hugepage/hpage_pmd_size", "2097152")
    write_only.chmod(0o200)
    read_only.chmod(0o444)
    (rig.root / "sys/kernel/mm/hugepages").mkdir(parents=True)
    exp = rig.expand(
        {
            "/sys/bus/pci/drivers/virtio-pci/unbind": "0000:00:05.0",
            "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size": 4096,
            "/sys/kernel/mm/hugepages": 1,  # a directory: matches no file
        }
    )
    assert exp.settings == {}
    assert exp.refused == {
        "/sys/bus/pci/drivers/virtio-pci/unbind = 0000:00:05.0 (from "
        "/sys/bus/pci/drivers/virtio-pci/unbind)": "write-only (an action, not a setting): "
        "there is nothing to read back or restore",
        "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size = 4096 (from "
        "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size)": "read-only",
        "/sys/kernel/mm/hugepages = 1": "no such file on this machine",
    }


def test_an_unreadable_file_is_refused(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    put(rig.root, "sys/kernel/secret", "1")
    real_read = rig.system.read

    def read(rel: str) -> str:
        if rel == "sys/kernel/secret":
            raise KernelRefused("reading /sys/kernel/secret", "Permission denied (EACCES)")
        return real_read(rel)

    monkeypatch.setattr(rig.system, "read", read)
    assert rig.expand({"/sys/kernel/secret": 2}).refused == {
        "/sys/kernel/secret = 2 (from /sys/kernel/secret)": "cannot be read, so its original "
        "could not be restored: Permission denied (EACCES)"
    }


def test_a_value_the_kernel_refuses_fails_and_rolls_back(rig: Rig) -> None:
    rig.system.refuse[EPB.format(3)] = 22  # EINVAL
    before = rig.snapshot()
    engine = rig.engine()
    with pytest.raises(ApplyFailed) as err:
        engine.apply(
            rig.profile(
                {f"/{THP}": "never", "/sys/devices/system/cpu/cpu*/power/energy_perf_bias": 99}
            )
        )
    message = str(err.value)
    assert f"[sysfs] /{EPB.format(3)} = 99" in message and "(EINVAL)" in message
    assert "rolled back" in message
    assert rig.snapshot() == before
    assert engine.applied == {}


def test_a_write_the_kernel_keeps_its_value_for_fails(rig: Rig) -> None:
    put(rig.root, "sys/module/x/parameters/p", "1")
    rig.system.shown = lambda rel, value: "1"  # type: ignore[method-assign]  # ignores writes
    with pytest.raises(ApplyFailed, match="the kernel accepted the write but kept '1'"):
        rig.engine().apply(rig.profile({"/sys/module/x/parameters/p": 2}))
    assert rig.text("sys/module/x/parameters/p") == "1\n"


# -- the engine around it -------------------------------------------------------------------------


def test_drift_is_seen_in_the_file_and_put_back(rig: Rig) -> None:
    engine = rig.engine()
    engine.apply(rig.profile({f"/{THP}": "never"}))
    target = SysfsFile(f"/{THP}")
    assert files_to_watch(rig.plugin, target) == (THP,)
    rig.system.write(THP, "always")  # an admin, behind latencyd's back
    (drift,) = engine.verify()
    assert (drift.wanted, drift.actual, drift.text) == ("never", "always", f"/{THP} = never")
    engine.handle_drift([drift])
    assert rig.plugin.read(target) == "never"
    assert engine.off() == []
    assert rig.text(THP) == "always [madvise] never\n"


def test_restart_adopts_the_journal_and_restores_every_file(rig: Rig) -> None:
    before = rig.snapshot()
    raw = {f"/{THP}": "never", "/sys/block/*/queue/read_ahead_kb": 4096}
    rig.engine().apply(rig.profile(raw))
    after_restart = Engine({"sysfs": SysfsPlugin(rig.system)}, Journal(rig.tmp_path / "state"))
    assert after_restart.adopt() is not None
    assert len(after_restart.applied) == 2
    assert after_restart.off() == []
    assert rig.snapshot() == before


def test_expand_stores_nothing_on_the_plugin(rig: Rig) -> None:
    first = {f"/{THP}": "never", "/sys/block/*/queue/scheduler": "none"}
    second = {"/sys/devices/system/cpu/cpu[0-1]/power/energy_perf_bias": 0, "/sys/nothing*": 1}
    state = {k: v if k == "system" else copy.deepcopy(v) for k, v in vars(rig.plugin).items()}
    files = rig.snapshot()
    expanded = rig.expand(first)
    rig.expand(second)
    assert {k: v if k == "system" else copy.deepcopy(v) for k, v in vars(rig.plugin).items()} == (
        state
    )
    assert rig.expand(first) == expanded
    assert rig.snapshot() == files and rig.system.writes == []


# -- devices that come and go --------------------------------------------------------------------


def test_changed_when_the_globs_match_other_files(rig: Rig) -> None:
    exp = rig.expand({"/sys/block/*/queue/scheduler": "none", "/sys/block/sdz/queue/x": 1})
    assert not rig.plugin.changed(exp.rules)
    sdb = add_disk(rig.root, "sdb")
    assert rig.plugin.changed(exp.rules)
    again = rig.expand({"/sys/block/*/queue/scheduler": "none", "/sys/block/sdz/queue/x": 1})
    assert SysfsFile(f"/{sdb}/queue/scheduler") in again.settings
    assert not rig.plugin.changed(again.rules)
    remove_disk(rig.root, "sda")
    assert rig.plugin.changed(again.rules)
    assert not rig.plugin.changed(None)  # a section refused as a whole follows nothing


def test_follows_device_events_and_expands_the_section_again(rig: Rig) -> None:
    udev = rig.plugin.follows.udev
    assert {"block", "net", "pci", "usb", "scsi_host", "cpu"} <= set(udev)
    assert {"add", "remove", "bind", "unbind"} <= udev["block"]
    assert rig.plugin.on_device(None, DeviceEvent("block", "add", "sdb"), {}) is None


def test_the_daemon_tunes_a_disk_that_appears_and_forgets_one_that_goes(rig: Rig) -> None:
    pristine = rig.snapshot()
    daemon = rig.daemon(
        p="""
        [sysfs]
        "/sys/kernel/mm/transparent_hugepage/enabled" = "never"
        "/sys/block/*/queue/scheduler" = "none"
        """
    )
    daemon.switch("p")
    assert rig.text(f"{rig.sda}/queue/scheduler") == "mq-deadline kyber bfq [none]\n"
    sdb = add_disk(rig.root, "sdb")
    daemon.on_device_events([DeviceEvent("block", "add", "sdb")])
    assert rig.text(f"{sdb}/queue/scheduler") == "mq-deadline kyber bfq [none]\n"
    assert ("sysfs", SysfsFile(f"/{sdb}/queue/scheduler")) in daemon.engine.applied
    remove_disk(rig.root, "sdb")
    daemon.on_device_events([DeviceEvent("block", "remove", "sdb")])
    assert ("sysfs", SysfsFile(f"/{sdb}/queue/scheduler")) not in daemon.engine.applied
    assert ("sysfs", SysfsFile(f"/{sdb}/queue/scheduler")) not in daemon.engine.originals
    assert daemon.last_error is None
    assert daemon.stop() == []
    assert rig.snapshot() == pristine


# -- root only -----------------------------------------------------------------------------------


def test_the_section_is_root_only(rig: Rig) -> None:
    assert rig.plugin.root_only(rig.section({f"/{THP}": "never"})) == ROOT_ONLY
    assert "uevent_helper" in ROOT_ONLY
    assert rig.plugin.root_only({"on_drift": "report"}) is None


def test_admin_group_members_cannot_apply_it(rig: Rig) -> None:
    put(rig.root, "sys/kernel/uevent_helper", "")
    daemon = rig.daemon(
        helper="""
        [sysfs]
        "/sys/kernel/uevent_helper" = "/tmp/x"
        """
    )
    admin = Caller(uid=1000, name="alice")
    with pytest.raises(PermissionDenied, match=r"\[sysfs\] any file under /sys can hand out root"):
        daemon.switch("helper", admin)
    assert rig.text("sys/kernel/uevent_helper") == "\n"
    daemon.switch("helper")
    assert rig.text("sys/kernel/uevent_helper") == "/tmp/x\n"
    assert daemon.off() == []
    assert rig.text("sys/kernel/uevent_helper") == "\n"


def test_describe_and_exists(rig: Rig) -> None:
    target = SysfsFile(f"/{THP}")
    assert rig.plugin.describe(target, "never") == f"/{THP} = never"
    assert rig.plugin.exists(target)
    assert not rig.plugin.exists(SysfsFile("/sys/block/sdq/queue/scheduler"))
