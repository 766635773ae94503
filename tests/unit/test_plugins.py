"""The writeback and sysctl plugins and the System facade, against a fake /proc + /sys."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from latencyd.plugins.kthread import KthreadPlugin, Workqueue
from latencyd.plugins.shield import ShieldPlugin
from latencyd.plugins.sysctl import Sysctl, SysctlPlugin, key_parts, normalize, sysctl_path
from latencyd.plugins.writeback import DirtyLimit, VmKnob, WritebackPlugin

from latencyd.core.capabilities import (
    ActsAtBoot,
    FindsDeviceFiles,
    FollowsDevices,
    FollowsTasks,
    HoldsResources,
    PlacesApplications,
    ProvidesNoiseWatch,
    RemembersInStep,
    ReportsGrouped,
    SharesWithUser,
    StartsAfresh,
    TookOver,
    declares,
    files_to_watch,
)
from latencyd.core.engine import ENGINE_OPTIONS, Engine, plugin_options, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import (
    Expansion,
    Follows,
    Monitor,
    Options,
    Plugin,
    Target,
    TaskEvent,
    decode_target,
    discover,
    encode_target,
    load_plugins,
    target_kinds,
)
from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import SchemaError, validate
from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, PermissionDenied
from latencyd.kernel.system import Machine, System
from latencyd.service import daemon as daemon_module
from latencyd.service.daemon import Caller, Daemon
from tests.unit.fakesys import (
    KernelLikeSystem,
    make_fake_root,
    put,
    read_sysctl,
    sysctl_values,
    tree_values,
    write_sysctl,
)
from tests.unit.pluginrig import swap_daemon

ROOT_ONLY_KEYS = {
    "kernel/core_pattern": "core",
    "kernel/usermodehelper/bset": "4294967295\t63",
    "fs/binfmt_misc/register": "",
}

# -- System ------------------------------------------------------------------


def test_system_machine_facts(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, cpus="0-2,5", mem_kb=2048)
    system = System(root)
    assert system.online_cpus() == CpuSet([0, 1, 2, 5])
    assert system.mem_total_bytes() == 2048 * 1024
    assert system.machine() == Machine(CpuSet([0, 1, 2, 5]), 2048 * 1024)
    assert not system.is_real and System().is_real
    assert system.path("/proc/sys/vm") == root / "proc/sys/vm"


def test_system_read_write(fake_root: Path) -> None:
    system = System(fake_root)
    assert system.read("proc/sys/vm/swappiness") == "60"
    system.write("/proc/sys/vm/swappiness", "10")
    assert (fake_root / "proc/sys/vm/swappiness").read_text() == "10"
    assert system.exists("proc/sys/vm/swappiness") and not system.exists("proc/sys/vm/nope")
    assert "swappiness" in system.listdir("proc/sys/vm")
    assert system.listdir("proc/sys/nope") == []


def test_system_errors_are_kernel_refused(fake_root: Path) -> None:
    system = System(fake_root)
    with pytest.raises(KernelRefused) as info:
        system.read("proc/sys/vm/nope")
    assert info.value.what == "reading /proc/sys/vm/nope"
    assert info.value.reason == "No such file or directory (ENOENT)"
    with pytest.raises(KernelRefused) as info:
        system.write("proc/sys/vm/nope", "1")
    assert str(info.value) == (
        "writing '1' to /proc/sys/vm/nope: No such file or directory (ENOENT)"
    )
    (fake_root / "proc/meminfo").write_text("MemFree: 1 kB\n")
    with pytest.raises(KernelRefused, match="no MemTotal line"):
        system.mem_total_bytes()


# -- writeback -----------------------------------------------------------------


def test_writeback_expand_pairs_name_their_mode(fake_root: Path, machine: Machine) -> None:
    plugin = WritebackPlugin(System(fake_root))
    options = validate(
        plugin.schema,
        {"dirty_bytes": "64M", "dirty_background_ratio": 5, "dirty_expire_centisecs": 1000},
        machine,
    )
    assert plugin.expand(plugin.options_of(options), {}) == Expansion(
        {
            DirtyLimit("dirty"): {"bytes": 64 << 20},
            DirtyLimit("dirty_background"): {"ratio": 5},
            VmKnob("dirty_expire_centisecs"): 1000,
        }
    )
    assert plugin.expand(plugin.options_of({}), {}) == Expansion()


def test_writeback_schema_keeps_a_pair_to_one_mode(fake_root: Path, machine: Machine) -> None:
    """One pair is one setting: asking for both ratio and bytes is a profile error."""
    plugin = WritebackPlugin(System(fake_root))
    with pytest.raises(SchemaError):
        validate(plugin.schema, {"dirty_ratio": 5, "dirty_bytes": "64M"}, machine)


def test_writeback_read_detects_mode(fake_root: Path) -> None:
    plugin = WritebackPlugin(System(fake_root))
    assert plugin.read(DirtyLimit("dirty")) == {"ratio": 20}
    assert plugin.read(DirtyLimit("dirty_background")) == {"ratio": 10}
    assert plugin.read(VmKnob("dirty_expire_centisecs")) == 3000
    write_sysctl(fake_root, "vm/dirty_bytes", "1048576")
    write_sysctl(fake_root, "vm/dirty_ratio", "0")
    assert plugin.read(DirtyLimit("dirty")) == {"bytes": 1048576}
    # dirty_bytes non-zero means bytes mode whatever dirty_ratio says.
    write_sysctl(fake_root, "vm/dirty_ratio", "20")
    assert plugin.read(DirtyLimit("dirty")) == {"bytes": 1048576}


def test_writeback_write_writes_the_file_of_the_mode(fake_root: Path) -> None:
    plugin = WritebackPlugin(System(fake_root))
    before = sysctl_values(fake_root)
    plugin.write(DirtyLimit("dirty"), {"bytes": 4096})
    plugin.write(DirtyLimit("dirty_background"), {"ratio": 3})
    plugin.write(VmKnob("dirty_writeback_centisecs"), 100)
    after = sysctl_values(fake_root)
    changed = {k: v for k, v in after.items() if before[k] != v}
    assert changed == {
        "vm/dirty_bytes": "4096",
        "vm/dirty_background_ratio": "3",
        "vm/dirty_writeback_centisecs": "100",
    }


def test_writeback_restore_of_ratio_writes_dirty_ratio(fake_root: Path) -> None:
    plugin = WritebackPlugin(System(fake_root))
    write_sysctl(fake_root, "vm/dirty_ratio", "7")
    plugin.write(DirtyLimit("dirty"), {"ratio": 20})
    assert read_sysctl(fake_root, "vm/dirty_ratio") == "20"
    plugin.write(DirtyLimit("dirty_background"), {"bytes": 8192})
    assert read_sysctl(fake_root, "vm/dirty_background_bytes") == "8192"


def test_writeback_round_trip_on_kernel_like_tree(fake_root: Path) -> None:
    # With the kernel's exclusivity emulated, read -> write -> restore comes back exactly.
    plugin = WritebackPlugin(KernelLikeSystem(fake_root))
    original = sysctl_values(fake_root)
    saved = plugin.read(DirtyLimit("dirty"))
    plugin.write(DirtyLimit("dirty"), {"bytes": 1 << 20})
    assert plugin.read(DirtyLimit("dirty")) == {"bytes": 1 << 20}
    assert read_sysctl(fake_root, "vm/dirty_ratio") == "0"
    plugin.write(DirtyLimit("dirty"), saved)
    assert plugin.read(DirtyLimit("dirty")) == {"ratio": 20}
    assert sysctl_values(fake_root) == original


def test_writeback_describe(fake_root: Path) -> None:
    plugin = WritebackPlugin(System(fake_root))
    assert plugin.describe(DirtyLimit("dirty"), {"bytes": 5}) == "vm.dirty_bytes = 5"
    assert (
        plugin.describe(DirtyLimit("dirty_background"), {"ratio": 5})
        == "vm.dirty_background_ratio = 5"
    )
    assert plugin.describe(VmKnob("dirty_expire_centisecs"), 9) == "vm.dirty_expire_centisecs = 9"


def test_writeback_read_of_missing_file_is_refused(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, defaults=False, sysctls={"vm/dirty_ratio": "20"})
    with pytest.raises(KernelRefused, match="reading /proc/sys/vm/dirty_bytes"):
        WritebackPlugin(System(root)).read(DirtyLimit("dirty"))


def test_writeback_and_sysctl_refusals_fail_the_profile() -> None:
    """No refusal_means: a kernel refusing a writeback or sysctl value is an error."""
    assert DirtyLimit.refusal_means is None
    assert VmKnob.refusal_means is None
    assert Sysctl.refusal_means is None


# -- sysctl ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "path"),
    [
        ("vm.swappiness", "proc/sys/vm/swappiness"),
        ("net.ipv4.conf.all.rp_filter", "proc/sys/net/ipv4/conf/all/rp_filter"),
        ("net/ipv4/conf/eth0.100/rp_filter", "proc/sys/net/ipv4/conf/eth0.100/rp_filter"),
        ("/vm/swappiness/", "proc/sys/vm/swappiness"),
    ],
)
def test_sysctl_path(key: str, path: str) -> None:
    assert sysctl_path(key) == path


@pytest.mark.parametrize(
    ("key", "parts"),
    [
        ("kernel.core_pattern", ["kernel", "core_pattern"]),
        ("kernel/core_pattern", ["kernel", "core_pattern"]),
        ("/kernel/usermodehelper/bset/", ["kernel", "usermodehelper", "bset"]),
        ("net/ipv4/conf/eth0.100/rp_filter", ["net", "ipv4", "conf", "eth0.100", "rp_filter"]),
        ("kernel//core_pattern", None),
        ("kernel/./core_pattern", None),
        ("kernel..core_pattern", None),
        ("kernel.core_pattern.", None),
        (".kernel.core_pattern", None),
        ("kernel/../kernel/core_pattern", None),
    ],
)
def test_sysctl_key_parts(key: str, parts: list[str] | None) -> None:
    """One spelling per file: a key that could reach a file under another name is refused."""
    assert key_parts(key) == parts


def test_sysctl_normalize_and_same(fake_root: Path) -> None:
    plugin = SysctlPlugin(System(fake_root))
    assert normalize("4096\t131072  6291456\n") == "4096 131072 6291456"
    assert normalize(10) == "10"
    rmem = Sysctl("net.ipv4.tcp_rmem")
    assert plugin.same(rmem, "4096 131072 6291456", "4096\t131072\t6291456")
    assert not plugin.same(Sysctl("vm.swappiness"), "10", "60")
    assert plugin.read(rmem) == "4096 131072 6291456"


def test_sysctl_expand_write_read(fake_root: Path) -> None:
    plugin = SysctlPlugin(System(fake_root))
    assert plugin.expand({"vm.swappiness": 10, "net.ipv4.tcp_rmem": "1  2 3"}, {}) == Expansion(
        {Sysctl("vm.swappiness"): "10", Sysctl("net.ipv4.tcp_rmem"): "1 2 3"}
    )
    plugin.write(Sysctl("vm.swappiness"), "10")
    assert read_sysctl(fake_root, "vm/swappiness") == "10"
    assert plugin.read(Sysctl("vm.swappiness")) == "10"
    plugin.write(Sysctl("net/core/busy_read"), "50")
    assert read_sysctl(fake_root, "net/core/busy_read") == "50"
    assert plugin.describe(Sysctl("vm.swappiness"), "10") == "sysctl vm.swappiness = 10"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("vm.nope", "unknown sysctl 'vm.nope': /proc/sys/vm/nope does not exist on this kernel"),
        ("vm", "sysctl 'vm' is a directory, not a setting"),
        ("../../proc/meminfo", "sysctl key '../../proc/meminfo' is not a plain key"),
        ("vm/../vm/swappiness", "sysctl key 'vm/../vm/swappiness' is not a plain key"),
    ],
)
def test_sysctl_schema_checks_keys_against_the_tree(
    fake_root: Path, machine: Machine, key: str, message: str
) -> None:
    plugin = SysctlPlugin(System(fake_root))
    with pytest.raises(SchemaError) as info:
        validate(plugin.schema, {key: 1}, machine)
    assert info.value.message == message
    assert info.value.path == (key,)


def test_a_sysctl_marked_optional_is_not_applicable_where_the_kernel_lacks_it(
    fake_root: Path, machine: Machine
) -> None:
    """sysctl.d(5)'s "-": a key for kernels built with it (kernel.numa_balancing) loads
    where it is missing and is *not applicable* there, with the file it looked for; where
    it exists it is an ordinary setting. Without the "-" a missing key stays an error."""
    plugin = SysctlPlugin(System(fake_root))
    options = validate(plugin.schema, {"-vm.nope": 0, "-vm.swappiness": 10}, machine)
    expansion = plugin.expand(options, {})
    assert expansion.settings == {Sysctl("vm.swappiness"): "10"}
    assert expansion.refused == {"vm.nope": "this kernel has no /proc/sys/vm/nope"}
    with pytest.raises(SchemaError, match=r"unknown sysctl 'vm\.nope'"):
        validate(plugin.schema, {"vm.nope": 0}, machine)
    assert plugin.root_only({"-kernel.core_pattern": "core"}) is not None


def test_sysctl_schema_values(fake_root: Path, machine: Machine) -> None:
    plugin = SysctlPlugin(System(fake_root))
    out = validate(plugin.schema, {"vm.swappiness": "10", "net.ipv4.tcp_rmem": "1 2 3"}, machine)
    assert out == {"vm.swappiness": 10, "net.ipv4.tcp_rmem": "1 2 3"}
    with pytest.raises(SchemaError, match=r"^vm.swappiness: expected an integer, got \[1\]"):
        validate(plugin.schema, {"vm.swappiness": [1]}, machine)


# -- sysctls only root may set -----------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "pattern"),
    [
        ("kernel.core_pattern", "kernel.core_pattern"),
        ("kernel.usermodehelper.bset", "kernel.usermodehelper.*"),
        ("fs.binfmt_misc.register", "fs.binfmt_misc.*"),
        ("kernel/core_pattern", "kernel.core_pattern"),
    ],
)
def test_sysctl_root_only(fake_root: Path, key: str, pattern: str) -> None:
    plugin = SysctlPlugin(System(fake_root))
    assert plugin.root_only({key: "x"}) == (
        f"sysctl {key!r} can hand out root (matches {pattern!r})"
    )


def test_sysctl_ordinary_keys_are_not_root_only(fake_root: Path) -> None:
    plugin = SysctlPlugin(System(fake_root))
    assert plugin.root_only({"vm.swappiness": 10}) is None
    assert plugin.root_only({"net/core/busy_read": 50, "kernel.timer_migration": 0}) is None
    assert plugin.root_only({}) is None
    # One root-only key makes the whole section root-only, wherever it is.
    reason = plugin.root_only({"vm.swappiness": 10, "kernel.core_pattern": "core"})
    assert reason is not None and "kernel.core_pattern" in reason


@pytest.mark.parametrize(
    "key",
    [
        "kernel//core_pattern",
        "kernel/./core_pattern",
        "kernel..core_pattern",
        "kernel.core_pattern.",
        ".kernel.core_pattern",
    ],
)
def test_sysctl_root_only_cannot_be_dodged_by_spelling(
    tmp_path: Path, machine: Machine, key: str
) -> None:
    """Another spelling of the same file must be refused or be root-only, not a way around."""
    root = make_fake_root(tmp_path, sysctls=ROOT_ONLY_KEYS)
    plugin = SysctlPlugin(System(root))
    try:
        options = validate(plugin.schema, {key: "|/tmp/x"}, machine)
    except SchemaError:
        return  # refused as a key: fine
    assert plugin.system.path(sysctl_path(key)) == root / "proc/sys/kernel/core_pattern"
    assert plugin.root_only(options) is not None


def test_other_plugins_are_never_root_only(fake_root: Path) -> None:
    system = System(fake_root)
    for plugin, section in (
        (WritebackPlugin(system), {"dirty_ratio": 5}),
        (KthreadPlugin(system), {"writeback_cpumask": CpuSet([1])}),
        (ShieldPlugin(system), {"cpus": CpuSet([1])}),
    ):
        assert plugin.root_only(plugin.options_of(section)) is None


def test_daemon_applies_root_only_sections_only_for_root(tmp_path: Path, machine: Machine) -> None:
    """An admin_group member cannot point core dumps at a program; root can."""
    root = make_fake_root(tmp_path, sysctls=ROOT_ONLY_KEYS)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "core.toml").write_text('[sysctl]\n"kernel.core_pattern" = "|/usr/bin/x %p"\n')
    (pdir / "swap.toml").write_text('[sysctl]\n"vm.swappiness" = 10\n')
    system = System(root)
    plugins: dict[str, Plugin[Any, Any, Any]] = {"sysctl": SysctlPlugin(system)}
    library = ProfileLibrary([pdir], section_schemas(plugins), machine)
    daemon = Daemon(system, plugins, library, Engine(plugins, Journal(tmp_path / "state")))
    admin = Caller(uid=1000, name="alice")
    with pytest.raises(PermissionDenied, match=r"\[sysctl\] sysctl 'kernel.core_pattern'"):
        daemon.switch("core", admin)
    assert read_sysctl(root, "kernel/core_pattern") == "core"
    daemon.switch("swap", admin)
    assert read_sysctl(root, "vm/swappiness") == "10"
    daemon.switch("core")
    assert read_sysctl(root, "kernel/core_pattern") == "|/usr/bin/x %p"
    assert daemon.off() == []
    assert read_sysctl(root, "kernel/core_pattern") == "core"


def test_the_switched_profile_is_resumed_by_every_later_start_a_reboots_included(
    tmp_path: Path, machine: Machine
) -> None:
    """`switch` and `off` are kept in the keep directory (/var/lib/latencyd), as `tuned-adm
    profile` is: a restart, a crash, a stop and a reboot (which empties the journal's /run)
    all resume the choice; an explicit --profile wins; a noted profile that no longer loads
    gives way to the default. Issue 51: a boot into arguments a switch wrote started the
    default profile, which took them out again."""
    root = make_fake_root(tmp_path)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "default.toml").write_text('[sysctl]\n"vm.swappiness" = 10\n')
    (pdir / "other.toml").write_text('[sysctl]\n"vm.swappiness" = 20\n')
    system = System(root)
    state, keep = tmp_path / "run/latencyd", tmp_path / "var/lib/latencyd"

    def new_daemon() -> Daemon:
        plugins: dict[str, Plugin[Any, Any, Any]] = {"sysctl": SysctlPlugin(system)}
        library = ProfileLibrary([pdir], section_schemas(plugins), machine)
        return Daemon(system, plugins, library, Engine(plugins, Journal(state, keep)))

    first = new_daemon()
    first.start("default", resume=True)
    first.switch("other")
    first.stop(restore=False)  # a restart: the tuning stays, so does the choice
    second = new_daemon()
    second.start("default", resume=True)
    assert second.active is not None and second.active.name == "other"
    assert read_sysctl(root, "vm/swappiness") == "20"
    third = new_daemon()  # a crash: nothing was stopped
    third.start("default", resume=False)  # an explicit --profile wins over the resume
    assert third.active is not None and third.active.name == "default"
    third.off()
    third.stop(restore=False)
    fourth = new_daemon()
    fourth.start("default", resume=True)  # switched off before the restart: stays off
    assert fourth.active is None
    fourth.switch("other")
    fourth.stop()  # a shutdown: every original back, the choice kept
    assert read_sysctl(root, "vm/swappiness") == "60"
    shutil.rmtree(state)  # the reboot: /run is empty again
    fifth = new_daemon()
    fifth.start("default", resume=True)
    assert fifth.active is not None and fifth.active.name == "other"
    assert read_sysctl(root, "vm/swappiness") == "20"
    fifth.stop()
    (pdir / "other.toml").unlink()  # the noted profile is gone: the default instead
    sixth = new_daemon()
    sixth.start("default", resume=True)
    assert sixth.active is not None and sixth.active.name == "default"
    sixth.stop()
    assert read_sysctl(root, "vm/swappiness") == "60"


# -- drift detection: the files each target lives in -------------------------------------------

WORKQUEUE_FILES = (
    "sys/devices/virtual/workqueue/writeback/cpumask",
    "sys/devices/virtual/workqueue/cpumask",
)


def kthread_plugin(system: System) -> KthreadPlugin:
    for rel in WORKQUEUE_FILES:
        put(system.root, rel, "f")
    return KthreadPlugin(system)


@pytest.mark.parametrize(
    ("make", "section"),
    [
        (
            SysctlPlugin,
            {"vm.swappiness": 10, "net/core/busy_read": 50, "net.ipv4.tcp_rmem": "1 2 3"},
        ),
        (
            WritebackPlugin,
            {
                "dirty_bytes": "64M",
                "dirty_background_ratio": 5,
                "dirty_expire_centisecs": 1000,
                "dirty_writeback_centisecs": 100,
            },
        ),
        (WritebackPlugin, {"dirty_ratio": 15, "dirty_background_bytes": "16M"}),
        (kthread_plugin, {"writeback_cpumask": "0", "unbound_cpumask": "0,2-3"}),
    ],
    ids=["sysctl", "writeback-bytes", "writeback-ratio", "kthread"],
)
def test_watch_files_exist_and_cover_every_change(
    fake_root: Path,
    machine: Machine,
    make: Callable[[System], Plugin[Any, Any, Any]],
    section: dict[str, Any],
) -> None:
    """inotify drift detection: each target's watched files exist, its own write touches no
    other file, and someone else writing any of them changes what the target reads."""
    system = KernelLikeSystem(fake_root)
    plugin = make(system)
    options = plugin.options_of(validate(plugin.schema, section, machine))
    settings = plugin.expand(options, {}).settings
    assert settings
    for target, value in settings.items():
        files = files_to_watch(plugin, target)
        assert files, target
        for rel in files:
            assert not rel.startswith("/") and (fake_root / rel).is_file(), (target, rel)
        before = tree_values(fake_root)
        plugin.write(target, value)
        after = tree_values(fake_root)
        assert {k for k in after if after[k] != before[k]} <= set(files), target
        assert plugin.same(target, value, plugin.read(target))
        for rel in files:
            KernelLikeSystem(fake_root).write(rel, "7")  # another tool, behind our back
            assert not plugin.same(target, value, plugin.read(target)), (target, rel)
            plugin.write(target, value)


# -- targets and the engine's own options ------------------------------------------------------


def test_targets_round_trip_through_the_journal_form(fake_root: Path) -> None:
    """The journal stores targets as JSON; each must come back as the same target."""
    system = System(fake_root)
    cases: list[tuple[Plugin[Any, Any, Any], Target]] = [
        (SysctlPlugin(system), Sysctl("net/ipv4/conf/eth0.100/rp_filter")),
        (WritebackPlugin(system), DirtyLimit("dirty_background")),
        (WritebackPlugin(system), VmKnob("dirty_expire_centisecs")),
        (KthreadPlugin(system), Workqueue("unbound")),
    ]
    for plugin, target in cases:
        assert decode_target(target_kinds(plugin), encode_target(target)) == target
    assert encode_target(DirtyLimit("dirty")) == {"kind": "dirty_limit", "pair": "dirty"}
    with pytest.raises(ValueError, match="not a known target"):
        decode_target(target_kinds(SysctlPlugin(system)), {"kind": "vm", "name": "x"})
    with pytest.raises(ValueError, match="key is not a str"):
        decode_target(target_kinds(SysctlPlugin(system)), {"kind": "sysctl", "key": 1})


def test_on_drift_is_the_engines_option_in_every_section(fake_root: Path, machine: Machine) -> None:
    """Every section may say on_drift; the plugins never see it."""
    plugins = load_plugins(System(fake_root))
    schemas = section_schemas(plugins)
    assert [o.name for o in ENGINE_OPTIONS] == ["on_drift"]
    for name, plugin in plugins.items():
        assert plugin.schema.option("on_drift") is None, name
        option = schemas[name].option("on_drift")
        assert option is not None and option.default == "reapply", name
    section = validate(schemas["writeback"], {"dirty_ratio": 5, "on_drift": "report"}, machine)
    assert section["on_drift"] == "report"
    assert plugin_options(section) == {"dirty_ratio": 5}
    with pytest.raises(SchemaError):
        validate(schemas["writeback"], {"on_drift": "ignore"}, machine)


# -- plugin registry -----------------------------------------------------------------


def test_builtin_plugins_are_found_in_the_plugins_package(fake_root: Path) -> None:
    found = discover()
    assert found["writeback"] is WritebackPlugin
    assert found["sysctl"] is SysctlPlugin
    assert found["kthread"] is KthreadPlugin
    plugins = load_plugins(System(fake_root))
    assert isinstance(plugins["sysctl"], SysctlPlugin)
    assert plugins["writeback"].system.root == fake_root


def test_plugin_defaults(fake_root: Path) -> None:
    @dataclass(frozen=True)
    class Knob(Target):
        kind: ClassVar[str] = "knob"
        name: str

    class Minimal(Plugin[Knob, None, Options]):
        name = "minimal"
        summary = "records writes"
        targets = (Knob,)

        def __init__(self, system: System) -> None:
            super().__init__(system)
            self.writes: list[tuple[Knob, object]] = []

        def write(self, target: Knob, value: object) -> None:
            self.writes.append((target, value))

    plugin = Minimal(System(fake_root))
    k = Knob("k")
    plugin.write(k, 3)
    assert plugin.writes == [(k, 3)]
    assert plugin.same(k, 1, 1) and not plugin.same(k, 1, "1")
    assert plugin.exists(k)
    assert files_to_watch(plugin, k) == ()  # polled
    assert plugin.root_only({"x": 1}) is None
    assert plugin.follows == Follows()
    # A capability is declared, never inherited: the engine and the daemon ask none of these.
    capabilities = (FollowsTasks, FollowsDevices, SharesWithUser, ReportsGrouped,
                    ProvidesNoiseWatch, ActsAtBoot, PlacesApplications, RemembersInStep,
                    FindsDeviceFiles, TookOver, HoldsResources, StartsAfresh)  # fmt: skip
    assert not any(declares(plugin, c) for c in capabilities)
    hooks = {m for c in capabilities for m in vars(c) if not m.startswith("_")}
    assert hooks and not any(hasattr(plugin, hook) for hook in hooks)
    assert not plugin.changed(None)
    assert plugin.monitor(None) == Monitor()
    assert plugin.rescan_interval_s == 60.0
    assert Knob.refusal_means is None
    for required in (
        lambda: plugin.read(k),
        lambda: plugin.describe(k, 2),
        lambda: plugin.expand({}, {}),
    ):
        with pytest.raises(NotImplementedError):
            required()


def test_entry_point_specs_reads_installed_metadata_first_wins(tmp_path: Path) -> None:
    from latencyd.core.plugin import entry_point_specs

    first, second = tmp_path / "a", tmp_path / "b"
    for base, dist, body in (
        (
            first,
            "thirdparty-1.0.dist-info",
            "[latencyd.plugins]\nnic = thirdparty.nic:NicPlugin\n[console_scripts]\nx = y:z\n",
        ),
        (
            second,
            "other-2.0.dist-info",
            "[latencyd.plugins]\nnic = other:Shadowed\n# comment\nrtc = other.rtc : RtcPlugin\n",
        ),
    ):
        (base / dist).mkdir(parents=True)
        (base / dist / "entry_points.txt").write_text(body)
    specs = entry_point_specs("latencyd.plugins", [str(first), str(second), str(tmp_path / "no")])
    assert specs == {"nic": "thirdparty.nic:NicPlugin", "rtc": "other.rtc : RtcPlugin"}


def test_events_kept_for_a_long_change_are_bounded(tmp_path: Path, machine: Machine) -> None:
    """Issue 37: a fork storm while a change runs a slice at a time keeps at most
    MAX_DEFERRED events; past that, every section is re-expanded once the change is over
    (what the events would have done, as after lost events)."""
    root, daemon = swap_daemon(tmp_path, machine)
    daemon.switch("swap")
    ran: list[int] = []
    daemon.busy = "switch to swap"
    for n in range(3 * daemon_module.MAX_DEFERRED):
        assert daemon.deferred(lambda n=n: ran.append(n))  # type: ignore[misc]
    assert len(daemon._deferred) <= daemon_module.MAX_DEFERRED
    write_sysctl(root, "vm/swappiness", "60")  # what a lost event would have put right
    daemon.busy = None
    daemon.run_deferred()
    assert len(ran) < daemon_module.MAX_DEFERRED
    assert read_sysctl(root, "vm/swappiness") == "10"
    assert daemon.off() == []


def test_task_events_kept_for_a_long_change_are_one_bounded_list(
    tmp_path: Path, machine: Machine
) -> None:
    """Issue 50: batches of task events arriving while a change runs (a rename flood
    during a long switch) wait as one list, one event per task and kind, at most
    MAX_DEFERRED, not as a kept batch each (MAX_DEFERRED batches of 256)."""
    _, daemon = swap_daemon(tmp_path, machine)
    daemon.switch("swap")
    daemon.busy = "switch to swap"
    for _ in range(3):  # the same task renamed over and over: one event waits
        daemon.on_task_events([TaskEvent("comm", 7, 7)] * 256)
    assert len(daemon._deferred) == 1 and daemon._waiting_tasks == [TaskEvent("comm", 7, 7)]
    for batch in range(3 * daemon_module.MAX_DEFERRED // 256):  # distinct tasks
        daemon.on_task_events([TaskEvent("comm", 1000 + 256 * batch + n, 1) for n in range(256)])
    assert len(daemon._deferred) == 1
    assert daemon._waiting_tasks == [TaskEvent("lost", 0, 0, lost=True)]  # a rescan after
    daemon.busy = None
    daemon.run_deferred()
    assert daemon._waiting_tasks == [] and daemon._deferred == []
    assert daemon.off() == []
