"""latencyd installed as a user installs it (`make install` + `make install-system` from
a checkout), on a machine like theirs: systemd as PID 1 on cgroup v2, then rebooted."""

from __future__ import annotations

from tests.qemu import Vm
from tests.vm.profiles import DEFAULT_PROFILE


def test_the_machine_is_like_a_users(vm: Vm) -> None:
    assert vm.ssh("stat -fc %T /sys/fs/cgroup").stdout.strip() == "cgroup2fs"
    assert vm.ssh("ps -o comm= -p 1").stdout.strip() == "systemd"
    assert "cpuset" in vm.ssh("cat /sys/fs/cgroup/cgroup.controllers").stdout.split()
    assert vm.ssh("nproc").stdout.strip() == "4"
    # ssh's shells stay tasks of ssh.service (no libpam-systemd), as a service's commands do
    assert vm.ssh("cat /proc/self/cgroup").stdout.strip() == "0::/system.slice/ssh.service"


def test_started_at_boot_with_the_default_profile(vm: Vm) -> None:
    assert vm.ssh("systemctl is-enabled latencyd").stdout.strip() == "enabled"
    assert vm.ssh("systemctl is-active latencyd").stdout.strip() == "active"
    # started by this boot: its start is in this boot's journal
    assert "Started" in vm.ssh("journalctl -b -o cat -u latencyd --no-pager").stdout
    assert vm.ssh("latencyctl active").stdout.strip() == DEFAULT_PROFILE


def test_status_as_root_and_as_a_plain_user(vm: Vm) -> None:
    as_root = vm.ssh("latencyctl status").stdout
    as_user = vm.as_user("alice", "latencyctl status").stdout
    for out in (as_root, as_user):
        assert f"active profile: {DEFAULT_PROFILE}" in out
