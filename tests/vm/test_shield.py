"""The shield on a machine with systemd as PID 1 on cgroup v2: kept by systemd's
AllowedCPUs= (mechanism `cpuset-systemd`), and the kernel then refuses a service's task
the isolated CPUs."""

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
