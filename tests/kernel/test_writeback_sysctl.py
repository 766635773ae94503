"""writeback and sysctl plugins, and the engine, on the real kernel (restored afterwards)."""

from __future__ import annotations

from pathlib import Path

import pytest
from latencyd.plugins.sysctl import Sysctl, SysctlPlugin
from latencyd.plugins.writeback import DirtyLimit, VmKnob, WritebackPlugin

from latencyd.core.engine import Engine
from latencyd.core.journal import Journal
from latencyd.errors import ApplyFailed, KernelRefused
from latencyd.kernel.system import System

DIRTY = DirtyLimit("dirty")

VM = Path("/proc/sys/vm")

pytestmark = pytest.mark.usefixtures("kernel_guard")


def vm(name: str) -> str:
    return (VM / name).read_text().strip()


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    system = System("/")
    return Engine(
        {"writeback": WritebackPlugin(system), "sysctl": SysctlPlugin(system)},
        Journal(tmp_path / "state"),
    )


def test_kernel_keeps_only_one_of_ratio_and_bytes_and_restore_brings_back_the_mode() -> None:
    plugin = WritebackPlugin(System("/"))
    original = plugin.read(DIRTY)
    plugin.write(DIRTY, {"bytes": 32 << 20})
    try:
        assert vm("dirty_bytes") == str(32 << 20)
        assert vm("dirty_ratio") == "0"
        assert plugin.read(DIRTY) == {"bytes": 32 << 20}
    finally:
        plugin.write(DIRTY, original)
    assert plugin.read(DIRTY) == original


def test_percent_of_ram_resolves_to_bytes_on_the_real_kernel(engine: Engine) -> None:
    total = System("/").mem_total_bytes()
    wanted = {("writeback", DirtyLimit("dirty_background")): {"bytes": total * 3 // 100}}
    engine.switch(wanted, "t")
    assert int(vm("dirty_background_bytes")) == total * 3 // 100
    assert vm("dirty_background_ratio") == "0"
    engine.off()


def test_engine_round_trip_restores_exact_originals(engine: Engine) -> None:
    before = {
        n: vm(n) for n in ("dirty_ratio", "dirty_bytes", "swappiness", "dirty_expire_centisecs")
    }
    engine.switch(
        {
            ("writeback", DIRTY): {"bytes": 48 << 20},
            ("writeback", VmKnob("dirty_expire_centisecs")): 1234,
            ("sysctl", Sysctl("vm.swappiness")): "13",
        },
        "t",
    )
    assert vm("swappiness") == "13" and vm("dirty_expire_centisecs") == "1234"
    assert engine.verify() == []
    assert engine.off() == []
    assert {n: vm(n) for n in before} == before
    assert not engine.journal.path.exists()


def test_refused_sysctl_is_a_clear_error_and_rolls_back_the_step(engine: Engine) -> None:
    before = vm("stat_interval")
    with pytest.raises(ApplyFailed) as err:
        engine.switch(
            {
                ("sysctl", Sysctl("vm.stat_interval")): "9",
                ("sysctl", Sysctl("vm.swappiness")): "500",
            },
            "t",
        )
    message = str(err.value)
    assert "vm.swappiness" in message and "Invalid argument (EINVAL)" in message
    assert "rolled back" in message
    assert vm("stat_interval") == before
    assert engine.applied == {}
    assert not engine.journal.path.exists()


def test_system_write_error_names_errno() -> None:
    with pytest.raises(KernelRefused) as err:
        System("/").write("proc/sys/vm/dirty_bytes", "1")  # below the kernel's 2-page minimum
    assert "EINVAL" in err.value.reason


def test_multi_field_sysctl_compares_field_by_field(engine: Engine) -> None:
    key = "net.ipv4.ip_local_port_range"
    plugin = SysctlPlugin(System("/"))
    current = plugin.read(Sysctl(key))
    low, high = current.split()
    engine.switch({("sysctl", Sysctl(key)): f"{int(low) + 1}   {high}"}, "t")
    assert Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split() == [
        str(int(low) + 1),
        high,
    ]
    assert engine.verify() == []
    engine.off()
    assert plugin.read(Sysctl(key)) == current


def test_measure_puts_back_limits_in_bytes_that_tuneds_rollback_zeroes() -> None:
    """TuneD's rollback writes back the vm.dirty_*ratio it read: 0 on a machine whose limits
    are in bytes, which zeroes the bytes too. `measure` puts the limits back."""
    from latencyd.tools.measure.tuned import DirtyLimits

    plugin = WritebackPlugin(System("/"))
    background = DirtyLimit("dirty_background")
    original = {t: plugin.read(t) for t in (DIRTY, background)}
    try:
        plugin.write(DIRTY, {"bytes": 48 << 20})
        plugin.write(background, {"bytes": 24 << 20})
        limits = DirtyLimits(System("/"))
        before = limits.read()
        for name, tuned in (("dirty_ratio", "10"), ("dirty_background_ratio", "3")):
            (VM / name).write_text(tuned)  # TuneD applies its ratios...
        for name in ("dirty_ratio", "dirty_background_ratio"):
            (VM / name).write_text("0")  # ...and rolls back to the ratio it read
        assert vm("dirty_bytes") == vm("dirty_background_bytes") == "0"
        done = limits.put_back(before)
        assert vm("dirty_bytes") == str(48 << 20) and vm("dirty_background_bytes") == str(24 << 20)
        assert done == [
            f"vm.dirty_ratio = 0 -> vm.dirty_bytes = {48 << 20}",
            f"vm.dirty_background_ratio = 0 -> vm.dirty_background_bytes = {24 << 20}",
        ]
        assert limits.put_back(before) == []  # nothing left to put back
    finally:
        for target, value in original.items():
            plugin.write(target, value)


def test_a_ratio_of_0_is_written_over_bytes() -> None:
    """In bytes mode the ratio reads 0 and the kernel ignores an unchanged ratio: restoring
    "no limit" (ratio 0, bytes 0, as TuneD's rollback leaves a machine in bytes mode) must
    still zero the bytes."""
    plugin = WritebackPlugin(System("/"))
    original = plugin.read(DIRTY)
    try:
        plugin.write(DIRTY, {"bytes": 48 << 20})
        plugin.write(DIRTY, {"ratio": 0})
        assert (vm("dirty_ratio"), vm("dirty_bytes")) == ("0", "0")
        assert plugin.read(DIRTY) == {"ratio": 0}
    finally:
        plugin.write(DIRTY, original)
