"""Boot arguments through their lifecycle on a machine with GRUB: written at run time,
then a reboot. Issue 51, finding 4a."""

from __future__ import annotations

import pytest

from tests.qemu import Vm, guest_profile
from tests.vm.profiles import REALTIME_WRITTEN

ARGUMENTS = ("nohz_full=2-3", "rcu_nocbs=2-3", "isolcpus=managed_irq,domain,2-3")


@pytest.mark.leaves_boot_changed
@pytest.mark.xfail(
    strict=True,
    reason="seen in the tier at 411524b: the arguments were booted (nohz_full read 2-3), but "
    "latencyd was not running after that reboot (verify: the name has no owner): not yet "
    "understood",
)
def test_switch_to_a_written_profile_then_reboot(vm: Vm) -> None:
    assert not set(ARGUMENTS) & set(vm.ssh("cat /proc/cmdline").stdout.split())
    guest_profile(vm, "vm-realtime-written", REALTIME_WRITTEN)
    vm.ssh("latencyctl switch vm-realtime-written")
    grub_cfg = vm.ssh("cat /boot/grub/grub.cfg").stdout
    assert all(arg in grub_cfg for arg in ARGUMENTS), "update-grub did not take the arguments"
    vm.reboot()
    booted = vm.ssh("cat /proc/cmdline").stdout.split()
    assert set(ARGUMENTS) <= set(booted), f"booted without them: {booted}"
    assert vm.ssh("cat /sys/devices/system/cpu/nohz_full").stdout.strip() == "2-3"
    assert vm.ssh("latencyctl verify", check=False).returncode == 0
