"""What measure reads and writes of the kernel goes through the System it is handed, so it
runs here on a fake root: what TuneD's rollback leaves (a workqueue mask, the vm dirty
limits) is put back."""

from __future__ import annotations

from pathlib import Path

from latencyd.tools.measure.tuned import RollbackLeftovers, workqueue_masks
from tests.unit.fakesys import KernelLikeSystem, make_fake_root, put

WQ = "sys/devices/virtual/workqueue"
LIMITS = {
    "vm/dirty_ratio": "0",
    "vm/dirty_bytes": str(48 << 20),
    "vm/dirty_background_ratio": "0",
    "vm/dirty_background_bytes": str(24 << 20),
}


def test_what_tuneds_rollback_leaves_is_put_back(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, sysctls=LIMITS)
    for rel in ("cpumask", "writeback/cpumask", "kblockd/cpumask"):
        put(root, f"{WQ}/{rel}", "f")
    (root / WQ / "power").mkdir()  # a directory without a mask of its own
    system = KernelLikeSystem(root)
    leftovers = RollbackLeftovers(system)
    assert workqueue_masks(system) == {
        f"/{WQ}/cpumask": "f",
        f"/{WQ}/kblockd/cpumask": "f",
        f"/{WQ}/writeback/cpumask": "f",
    }
    put(root, f"{WQ}/writeback/cpumask", "1")  # its rollback restores one path of two
    for name in ("dirty_ratio", "dirty_background_ratio"):
        system.write(f"proc/sys/vm/{name}", "10")  # TuneD applies its ratios...
        system.write(f"proc/sys/vm/{name}", "0")  # ...and rolls back to the ratio it read
    assert (root / "proc/sys/vm/dirty_bytes").read_text().strip() == "0"
    assert leftovers.put_back() == [
        f"/{WQ}/writeback/cpumask: 1 -> f",
        f"vm.dirty_ratio = 0 -> vm.dirty_bytes = {48 << 20}",
        f"vm.dirty_background_ratio = 0 -> vm.dirty_background_bytes = {24 << 20}",
    ]
    assert (root / WQ / "writeback/cpumask").read_text().strip() == "f"
    assert (root / "proc/sys/vm/dirty_bytes").read_text().strip() == str(48 << 20)
    assert leftovers.put_back() == []  # nothing left to put back
