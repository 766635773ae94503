"""The shield on 8 vCPUs over 2 NUMA nodes (CPUs 0-3 and 4-7), isolating CPUs on both:
each node keeps housekeeping CPUs, and what the kernel and systemd then hold is read back."""

from __future__ import annotations

from tests.qemu import Vm, guest_profile
from tests.vm.profiles import DEFAULT_PROFILE, PARTITIONING_TWO_NODES
from tests.vm.test_shield import UNITS, allowed_cpus


def cpus_of(text: str) -> set[int]:
    """A CPU list as the kernel ("0-1,4-5") or systemd ("0-1 4-5") writes it."""
    found: set[int] = set()
    for part in text.replace(",", " ").split():
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


HOUSEKEEPING, ISOLATED = {0, 1, 4, 5}, {2, 3, 6, 7}


def test_isolated_cpus_on_both_numa_nodes(vm_numa: Vm) -> None:
    vm = vm_numa
    nodes = vm.ssh("cat /sys/devices/system/node/node*/cpulist").stdout.split()
    assert nodes == ["0-3", "4-7"]
    guest_profile(vm, "vm-two-nodes", PARTITIONING_TWO_NODES)
    before = allowed_cpus(vm)
    vm.ssh("latencyctl switch vm-two-nodes")
    try:
        allowed = {unit: cpus_of(cpus) for unit, cpus in allowed_cpus(vm).items()}
        assert allowed == {u: ISOLATED if u == "latencyd.slice" else HOUSEKEEPING for u in UNITS}
        for cgroup, wanted in (("system.slice", HOUSEKEEPING), ("latencyd.slice", ISOLATED)):
            effective = vm.ssh(f"cat /sys/fs/cgroup/{cgroup}/cpuset.cpus.effective").stdout
            assert cpus_of(effective) == wanted, cgroup
        # unbound workqueues on each node's housekeeping CPUs (a hexadecimal mask)
        mask = int(vm.ssh("cat /sys/devices/virtual/workqueue/cpumask").stdout.strip(), 16)
        assert {cpu for cpu in range(8) if mask >> cpu & 1} == HOUSEKEEPING
        # this shell is a task of ssh.service: neither node's isolated CPUs are its to take
        for cpu in (3, 6):
            refused = vm.ssh(f"taskset -pc {cpu} $$", check=False)
            assert "Invalid argument" in refused.stderr, (cpu, refused.stderr)
    finally:
        vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")
    assert allowed_cpus(vm) == before
