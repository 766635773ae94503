"""The net plugin on a real driver with interrupt coalescing: the VM's e1000e, and one
hot-plugged through QEMU's monitor while a profile is in force."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from tests.qemu import Vm, guest_profile
from tests.vm.profiles import DEFAULT_PROFILE, E1000E_PER_PACKET

FIND_E1000E = (
    "for n in /sys/class/net/*; do "
    '[ "$(basename "$(readlink -f "$n/device/driver")")" = e1000e ] && basename "$n"; '
    "done; true"
)
HOT = "hot0"  # QEMU's id of the hot-plugged NIC and of its network back-end
DRIVER_DEFAULT = 3  # e1000e's rx-usecs as the driver sets it (3: dynamic conservative)


def e1000e_nics(vm: Vm) -> list[str]:
    return vm.ssh(FIND_E1000E).stdout.split()


def rx_usecs(vm: Vm, nic: str) -> int:
    found = re.search(r"^rx-usecs:\s+(\d+)$", vm.ssh(f"ethtool -c {nic}").stdout, re.MULTILINE)
    assert found, f"ethtool -c {nic} shows no rx-usecs"
    return int(found.group(1))


def test_e1000e_coalescing_set_read_back_and_restored(vm: Vm) -> None:
    nics = e1000e_nics(vm)
    assert len(nics) == 1, f"e1000e NICs: {nics}"
    nic = nics[0]
    original = rx_usecs(vm, nic)
    assert original == DRIVER_DEFAULT  # not 0, else no change to see
    guest_profile(vm, "vm-e1000e", E1000E_PER_PACKET)
    try:
        vm.ssh("latencyctl switch vm-e1000e")
        assert rx_usecs(vm, nic) == 0
        assert f"{nic} coalesce rx-usecs = 0" in vm.ssh("latencyctl status").stdout
        vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")  # a profile without it: given back
        assert rx_usecs(vm, nic) == original
        vm.ssh("latencyctl switch vm-e1000e")
        assert rx_usecs(vm, nic) == 0
        vm.ssh("latencyctl off")
        assert rx_usecs(vm, nic) == original
    finally:
        vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")


def wait_for(what: str, probe: Callable[[], object], timeout: float = 300) -> None:
    """Polls `probe()` until it holds; fails saying `what`."""
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(3)


def test_a_hot_plugged_e1000e_is_tuned_then_given_back(vm: Vm) -> None:
    present = set(e1000e_nics(vm))
    guest_profile(vm, "vm-e1000e", E1000E_PER_PACKET)
    vm.ssh("latencyctl switch vm-e1000e")
    try:
        vm.monitor(f"netdev_add user,id={HOT},restrict=on")
        vm.monitor(f"device_add e1000e,netdev={HOT},id={HOT}")
        wait_for("a second e1000e in the guest", lambda: set(e1000e_nics(vm)) - present)
        (new,) = set(e1000e_nics(vm)) - present
        # the daemon tunes it as udev announces it (and renames it): no command asked for it
        wait_for(f"{new} tuned", lambda: rx_usecs(vm, new) == 0)
        assert f"{new} coalesce rx-usecs = 0" in vm.ssh("latencyctl status").stdout
        vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")
        assert rx_usecs(vm, new) == DRIVER_DEFAULT  # what it had when it appeared
    finally:
        vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")
        vm.monitor(f"device_del {HOT}")  # the guest ejects it (ACPI), then it is gone
        wait_for("the hot-plugged NIC gone", lambda: set(e1000e_nics(vm)) == present)
        vm.monitor(f"netdev_del {HOT}")
