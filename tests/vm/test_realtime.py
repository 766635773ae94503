"""The `realtime` profile on Debian's PREEMPT_RT kernel (the image's second GRUB entry):
its FIFO rules on the threads only that kernel has (ktimers, rcuc) and on ksoftirqd, read
back from the kernel, and the threads' own policies given back on switching away."""

from __future__ import annotations

from tests.qemu import Vm, guest_profile
from tests.vm.profiles import DEFAULT_PROFILE, REALTIME

# The id of the PREEMPT_RT kernel's GRUB entry (grub-mkconfig's, without submenus).
RT_ENTRY = (
    "v=$(cd /boot && ls vmlinuz-*-rt-amd64); v=${v#vmlinuz-}; "
    'grep -o "gnulinux-$v-advanced-[0-9a-f-]*" /boot/grub/grub.cfg | head -1'
)
# name -> "rt_priority policy", fields 40 and 41 of /proc/PID/stat (policy 0: SCHED_OTHER,
# 1: SCHED_FIFO), of every ktimers/N, ksoftirqd/N and rcuc/N thread.
THREADS = (
    "for d in /proc/[0-9]*; do c=$(cat $d/comm 2>/dev/null) || continue; "
    'case $c in ktimers/*|ksoftirqd/*|rcuc/*) echo "$c $(cut -d" " -f40,41 $d/stat)";; esac; '
    "done"
)
WANTED = {"ktimers": "2 1", "ksoftirqd": "2 1", "rcuc": "4 1"}  # profiles/realtime.toml


def threads(vm: Vm) -> dict[str, str]:
    lines = (line.split(" ", 1) for line in vm.ssh(THREADS).stdout.splitlines())
    return {name: sched for name, sched in lines}


def test_realtime_fifo_rules_on_the_preempt_rt_kernel(vm: Vm) -> None:
    entry = vm.ssh(RT_ENTRY).stdout.strip()
    assert entry, "no PREEMPT_RT entry in grub.cfg"
    vm.reboot(into=entry)  # this next boot only
    assert vm.ssh("uname -r").stdout.strip().endswith("-rt-amd64")
    assert vm.ssh("cat /sys/kernel/realtime").stdout.strip() == "1"
    before = threads(vm)
    kinds = {name.split("/")[0] for name in before}
    assert kinds == set(WANTED), f"PREEMPT_RT's per-CPU threads: {sorted(before)}"
    assert len(before) == 3 * 4  # one of each per vCPU
    guest_profile(vm, "vm-realtime", REALTIME)
    vm.ssh("latencyctl switch vm-realtime")
    tuned = threads(vm)
    assert tuned == {name: WANTED[name.split("/")[0]] for name in before}
    vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")
    assert threads(vm) == before
    # No reboot back to the generic kernel: booted on another kernel, the machine no longer
    # reads as set up, and the next test gets its snapshot restored (tests/vm/conftest.py).
