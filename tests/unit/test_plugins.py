"""The writeback and sysctl plugins and the System facade, against a fake /proc + /sys."""

from __future__ import annotations

from pathlib import Path

import pytest
from latencyd.plugins.sysctl import SysctlPlugin, normalize, sysctl_path
from latencyd.plugins.writeback import WritebackPlugin

from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused
from latencyd.plugin import Plugin, discover, load_plugins
from latencyd.schema import SchemaError, validate
from latencyd.system import System
from tests.unit.fakesys import (
    KernelLikeSystem,
    make_fake_root,
    read_sysctl,
    sysctl_values,
    write_sysctl,
)

# -- System ------------------------------------------------------------------


def test_system_machine_facts(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, cpus="0-2,5", mem_kb=2048)
    system = System(root)
    assert system.online_cpus() == CpuSet([0, 1, 2, 5])
    assert system.mem_total_bytes() == 2048 * 1024
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


def test_writeback_expand_pairs_name_their_mode(fake_root: Path, machine) -> None:
    plugin = WritebackPlugin(System(fake_root))
    options = validate(
        plugin.schema,
        {"dirty_bytes": "64M", "dirty_background_ratio": 5, "dirty_expire_centisecs": 1000},
        machine,
    )
    assert plugin.expand(options) == {
        "dirty": {"bytes": 64 << 20},
        "dirty_background": {"ratio": 5},
        "dirty_expire_centisecs": 1000,
    }
    assert plugin.expand({}) == {}


def test_writeback_capture_detects_mode(fake_root: Path) -> None:
    plugin = WritebackPlugin(System(fake_root))
    assert plugin.capture("dirty") == {"ratio": 20}
    assert plugin.capture("dirty_background") == {"ratio": 10}
    assert plugin.capture("dirty_expire_centisecs") == 3000
    write_sysctl(fake_root, "vm/dirty_bytes", "1048576")
    write_sysctl(fake_root, "vm/dirty_ratio", "0")
    assert plugin.capture("dirty") == {"bytes": 1048576}
    # dirty_bytes non-zero means bytes mode whatever dirty_ratio says.
    write_sysctl(fake_root, "vm/dirty_ratio", "20")
    assert plugin.capture("dirty") == {"bytes": 1048576}


def test_writeback_apply_writes_the_file_of_the_mode(fake_root: Path) -> None:
    plugin = WritebackPlugin(System(fake_root))
    before = sysctl_values(fake_root)
    plugin.apply("dirty", {"bytes": 4096})
    plugin.apply("dirty_background", {"ratio": 3})
    plugin.apply("dirty_writeback_centisecs", 100)
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
    plugin.restore("dirty", {"ratio": 20})
    assert read_sysctl(fake_root, "vm/dirty_ratio") == "20"
    plugin.restore("dirty_background", {"bytes": 8192})
    assert read_sysctl(fake_root, "vm/dirty_background_bytes") == "8192"


def test_writeback_round_trip_on_kernel_like_tree(fake_root: Path) -> None:
    # With the kernel's exclusivity emulated, capture -> apply -> restore comes back exactly.
    plugin = WritebackPlugin(KernelLikeSystem(fake_root))
    original = sysctl_values(fake_root)
    saved = plugin.capture("dirty")
    plugin.apply("dirty", {"bytes": 1 << 20})
    assert plugin.capture("dirty") == {"bytes": 1 << 20}
    assert read_sysctl(fake_root, "vm/dirty_ratio") == "0"
    plugin.restore("dirty", saved)
    assert plugin.capture("dirty") == {"ratio": 20}
    assert sysctl_values(fake_root) == original


def test_writeback_describe(fake_root: Path) -> None:
    plugin = WritebackPlugin(System(fake_root))
    assert plugin.describe("dirty", {"bytes": 5}) == "vm.dirty_bytes = 5"
    assert plugin.describe("dirty_background", {"ratio": 5}) == "vm.dirty_background_ratio = 5"
    assert plugin.describe("dirty_expire_centisecs", 9) == "vm.dirty_expire_centisecs = 9"


def test_writeback_capture_of_missing_file_is_refused(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, defaults=False, sysctls={"vm/dirty_ratio": "20"})
    with pytest.raises(KernelRefused, match="reading /proc/sys/vm/dirty_bytes"):
        WritebackPlugin(System(root)).capture("dirty")


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


def test_sysctl_normalize_and_same(fake_root: Path) -> None:
    plugin = SysctlPlugin(System(fake_root))
    assert normalize("4096\t131072  6291456\n") == "4096 131072 6291456"
    assert normalize(10) == "10"
    assert plugin.same("net.ipv4.tcp_rmem", "4096 131072 6291456", "4096\t131072\t6291456")
    assert not plugin.same("vm.swappiness", "10", "60")
    assert plugin.capture("net.ipv4.tcp_rmem") == "4096 131072 6291456"


def test_sysctl_expand_apply_capture(fake_root: Path) -> None:
    plugin = SysctlPlugin(System(fake_root))
    assert plugin.expand({"vm.swappiness": 10, "net.ipv4.tcp_rmem": "1  2 3"}) == {
        "vm.swappiness": "10",
        "net.ipv4.tcp_rmem": "1 2 3",
    }
    plugin.apply("vm.swappiness", "10")
    assert read_sysctl(fake_root, "vm/swappiness") == "10"
    assert plugin.capture("vm.swappiness") == "10"
    plugin.apply("net/core/busy_read", "50")
    assert read_sysctl(fake_root, "net/core/busy_read") == "50"
    assert plugin.describe("vm.swappiness", "10") == "sysctl vm.swappiness = 10"


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
    fake_root: Path, machine, key: str, message: str
) -> None:
    plugin = SysctlPlugin(System(fake_root))
    with pytest.raises(SchemaError) as info:
        validate(plugin.schema, {key: 1}, machine)
    assert info.value.message == message
    assert info.value.path == (key,)


def test_sysctl_schema_values(fake_root: Path, machine) -> None:
    plugin = SysctlPlugin(System(fake_root))
    out = validate(plugin.schema, {"vm.swappiness": "10", "net.ipv4.tcp_rmem": "1 2 3"}, machine)
    assert out == {"vm.swappiness": 10, "net.ipv4.tcp_rmem": "1 2 3"}
    with pytest.raises(SchemaError, match=r"^vm.swappiness: expected an integer, got \[1\]"):
        validate(plugin.schema, {"vm.swappiness": [1]}, machine)


# -- plugin registry -----------------------------------------------------------------


def test_builtin_plugins_are_registered_through_entry_points(fake_root: Path) -> None:
    found = discover()
    assert found["writeback"] is WritebackPlugin
    assert found["sysctl"] is SysctlPlugin
    plugins = load_plugins(System(fake_root))
    assert isinstance(plugins["sysctl"], SysctlPlugin)
    assert plugins["writeback"].system.root == fake_root


def test_plugin_defaults(fake_root: Path) -> None:
    class Minimal(Plugin):
        name = "minimal"
        summary = "records applies"

        def __init__(self, system: System) -> None:
            super().__init__(system)
            self.writes: list[tuple[str, object]] = []

        def apply(self, key: str, value: object) -> None:
            self.writes.append((key, value))

    plugin = Minimal(System(fake_root))
    plugin.restore("k", 3)  # restore defaults to apply
    assert plugin.writes == [("k", 3)]
    assert plugin.same("k", 1, 1) and not plugin.same("k", 1, "1")
    assert not plugin.optional("k") and plugin.exists("k")
    assert plugin.describe("k", 2) == "k = 2"
    assert plugin.status() == {}
    with pytest.raises(NotImplementedError):
        plugin.capture("k")
    with pytest.raises(NotImplementedError):
        plugin.expand({})


def test_entry_point_specs_reads_installed_metadata_first_wins(tmp_path: Path) -> None:
    from latencyd.plugin import entry_point_specs

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


def test_installed_entry_points_name_every_builtin_plugin() -> None:
    from latencyd.plugin import ENTRY_POINT_GROUP, entry_point_specs

    specs = entry_point_specs(ENTRY_POINT_GROUP)
    assert {"sysctl", "writeback", "cstate", "irq", "kthread"} <= set(specs)
    assert specs["irq"] == "latencyd.plugins.irq:IrqPlugin"
