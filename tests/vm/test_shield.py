"""The shield on a machine with systemd as PID 1 on cgroup v2: kept by systemd's
AllowedCPUs= (mechanism `cpuset-systemd`), and the kernel then refuses a service's task
the isolated CPUs; latencyd.slice made an isolated partition (issue 51, finding 3)."""

from __future__ import annotations

import json

from tests.qemu import Vm, guest_profile
from tests.vm.profiles import DEFAULT_PROFILE, PARTITIONING

UNITS = ("init.scope", "system.slice", "user.slice", "latencyd.slice")


def allowed_cpus(vm: Vm) -> dict[str, str]:
    return {u: vm.ssh(f"systemctl show -P AllowedCPUs {u}").stdout.strip() for u in UNITS}


def test_cpu_partitioning_shields_through_systemd(vm: Vm) -> None:
    guest_profile(vm, "vm-partitioning", PARTITIONING)
    before = allowed_cpus(vm)
    vm.ssh("latencyctl switch vm-partitioning")
    try:
        status = vm.ssh("latencyctl status --json").stdout
        assert '"cpuset-systemd"' in status, json.loads(status)
        assert allowed_cpus(vm) == {
            "init.scope": "0-1", "system.slice": "0-1", "user.slice": "0-1",
            "latencyd.slice": "2-3",
        }  # fmt: skip
        effective = vm.ssh("cat /sys/fs/cgroup/system.slice/cpuset.cpus.effective").stdout
        assert effective.strip() == "0-1"
        # this shell is a task of ssh.service: the kernel refuses it the isolated CPUs
        refused = vm.ssh("taskset -pc 2 $$", check=False)
        assert refused.returncode != 0
        assert "Invalid argument" in refused.stderr
        assert vm.ssh("taskset -pc $$").stdout.strip().endswith(": 0,1")
    finally:
        vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")
    assert allowed_cpus(vm) == before


PARTITION = "/sys/fs/cgroup/latencyd.slice/cpuset.cpus.partition"
ISOLATED = "/sys/fs/cgroup/cpuset.cpus.isolated"
# The scheduler domains a CPU is in (/proc/schedstat's domain lines under it): none on a
# CPU the kernel isolates, so no load balancing reaches it.
DOMAINS = (
    "awk '/^cpu/ {c = $1} /^domain/ && c == \"cpu%d\" {n++} END {print n + 0}' /proc/schedstat"
)


def domains(vm: Vm, cpu: int) -> int:
    return int(vm.ssh(DOMAINS % cpu).stdout)


def test_the_shielded_cpus_are_an_isolated_partition_given_back_after(vm: Vm) -> None:
    guest_profile(vm, "vm-partitioning", PARTITIONING)
    isolated = vm.ssh(f"cat {ISOLATED}").stdout
    assert domains(vm, 2) > 0
    vm.ssh("latencyctl switch vm-partitioning")
    try:
        assert vm.ssh(f"cat {PARTITION}").stdout.strip() == "isolated"
        assert vm.ssh(f"cat {ISOLATED}").stdout.strip() == "2-3"
        assert (domains(vm, 0), domains(vm, 2), domains(vm, 3)) != (0, 0, 0)
        assert (domains(vm, 2), domains(vm, 3)) == (0, 0)
        shield = json.loads(vm.ssh("latencyctl status --json").stdout)["plugins"]["shield"]
        table = next(t for t in shield["tables"] if t["title"].startswith("Isolated partition"))
        adds = dict(map(tuple, table["rows"]))["adds here"]
        assert adds.startswith("CPUs 2-3 isolated by the kernel: no load balancing"), table
        # systemd has no setting for the file: a reload of its units keeps it
        vm.ssh("systemctl daemon-reload")
        assert vm.ssh(f"cat {PARTITION}").stdout.strip() == "isolated"
        assert vm.ssh("latencyctl verify", check=False).returncode == 0
    finally:
        vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")
    assert vm.ssh(f"cat {ISOLATED}").stdout == isolated
    assert domains(vm, 2) > 0
    assert vm.ssh("test -e /sys/fs/cgroup/latencyd.slice", check=False).returncode == 1
