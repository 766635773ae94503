"""The net plugin on a real driver with interrupt coalescing: the VM's e1000e."""

from __future__ import annotations

import re

from tests.qemu import Vm, guest_profile
from tests.vm.profiles import DEFAULT_PROFILE, E1000E_PER_PACKET

FIND_E1000E = (
    "for n in /sys/class/net/*; do "
    '[ "$(basename "$(readlink -f "$n/device/driver")")" = e1000e ] && basename "$n"; '
    "done; true"
)


def rx_usecs(vm: Vm, nic: str) -> int:
    found = re.search(r"^rx-usecs:\s+(\d+)$", vm.ssh(f"ethtool -c {nic}").stdout, re.MULTILINE)
    assert found, f"ethtool -c {nic} shows no rx-usecs"
    return int(found.group(1))


def test_e1000e_coalescing_set_read_back_and_restored(vm: Vm) -> None:
    nics = vm.ssh(FIND_E1000E).stdout.split()
    assert len(nics) == 1, f"e1000e NICs: {nics}"
    nic = nics[0]
    original = rx_usecs(vm, nic)
    assert original != 0  # the driver's default (3: dynamic conservative), else no change to see
    guest_profile(vm, "vm-e1000e", E1000E_PER_PACKET)
    try:
        vm.ssh("latencyctl switch vm-e1000e")
        assert rx_usecs(vm, nic) == 0
        assert f"{nic} coalesce rx-usecs = 0" in vm.ssh("latencyctl status").stdout
        vm.ssh("latencyctl off")
        assert rx_usecs(vm, nic) == original
    finally:
        vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")
