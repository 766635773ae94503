"""Boot arguments through their whole lifecycle on a machine with GRUB (issue 51, finding
4): written at run time, booted, then taken out by a switch away or `off`, each followed
by a reboot; and a write cut short by kill -9 while update-grub runs, which the restart
systemd makes undoes. Afterwards the boot configuration reads byte for byte as before
the first write. One test: every reboot costs ~60 s (minutes on a loaded machine), and
the `off` leg starts from a snapshot of the machine booted in the first."""

from __future__ import annotations

import json

import pytest

from tests.qemu import Vm, as_a_debian_machine, guest_profile
from tests.vm.profiles import DEFAULT_PROFILE, REALTIME_WRITTEN

ARGUMENTS = ("nohz_full=2-3", "rcu_nocbs=2-3", "isolcpus=managed_irq,domain,2-3")
WRITTEN = "vm-realtime-written"
BOOTED_WRITTEN = "booted-with-the-arguments"  # the snapshot (Vm.save) steps 1 and 2 share
# The boot configuration latencyd may change, every file with its mode and contents.
BOOT_CONFIGURATION = (
    "find /etc/default/grub.d /boot/grub/grub.cfg -printf '%p %M %s\\n' | sort; "
    "find /etc/default/grub.d /boot/grub/grub.cfg -type f -exec sha256sum {} + | sort"
)
# What update-grub runs as (it execs grub-mkconfig), for a kill while it runs.
UPDATE_GRUB = "pgrep -x 'update-grub|grub-mkconfig'"


def only_the_arguments_added(before: str, after: str) -> None:
    """grub.cfg as update-grub writes it from a root shell, but for the arguments on each
    kernel's line. latencyd runs update-grub inside its service's sandbox: with the disk
    closed to it, grub-probe read no file system UUID and grub-mkconfig wrote root=/dev/vda1,
    no `search --fs-uuid` and other menu entry ids, so the administrator's GRUB_DEFAULT
    named no entry and GRUB booted the first, the PREEMPT_RT kernel."""
    old, new = before.splitlines(), after.splitlines()
    assert len(old) == len(new), "grub.cfg has other lines than update-grub's from a shell"
    changed = [(a, b) for a, b in zip(old, new, strict=True) if a != b]
    assert changed, "no kernel line got the arguments"
    for a, b in changed:
        added = set(b.split()) - set(a.split())
        assert [w for w in b.split() if w not in added] == a.split(), (a, b)  # only added
        assert set(ARGUMENTS) <= added, b


def booted_args(vm: Vm) -> set[str]:
    return set(vm.ssh("cat /proc/cmdline").stdout.split())


def written_and_booted(vm: Vm, kernel: str) -> None:
    """The machine rebooted into the arguments: on /proc/cmdline, the kernel isolating
    CPUs 2-3 as they ask, latencyd resumed the profile that wrote them (not the default,
    which would take them out again) and verifies clean; status reads every booted
    feature as CPUs 2-3's, none as a mismatch (finding 4c: booted rcu_nocbs=2-3 once read
    as a mismatch for CPUs 0-1)."""
    assert set(ARGUMENTS) <= booted_args(vm), vm.ssh("cat /proc/cmdline").stdout
    assert vm.ssh("uname -r").stdout.strip() == kernel  # the default kernel, as before
    assert vm.ssh("cat /sys/devices/system/cpu/nohz_full").stdout.strip() == "2-3"
    assert vm.ssh("systemctl is-active latencyd", check=False).stdout.strip() == "active", vm.ssh(
        "journalctl -b -u latencyd --no-pager -o cat", check=False
    ).stdout[-3000:]
    assert vm.ssh("latencyctl active").stdout.strip() == WRITTEN
    verify = vm.ssh("latencyctl verify", check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    findings = json.loads(vm.ssh("latencyctl status --json").stdout)["boot"]["findings"]
    assert {(f["feature"], f["cpus"], f["state"]) for f in findings} == {
        (feature, "2-3", "booted")
        for feature in ("tick", "rcu callbacks", "managed IRQs", "scheduler domains")
    }, findings


def as_before(vm: Vm, before: str) -> None:
    """The boot configuration byte for byte as before the first write, and no record."""
    assert vm.ssh(BOOT_CONFIGURATION).stdout == before
    assert vm.ssh("test -e /var/lib/latencyd/bootcmdline", check=False).returncode == 1


def gone_after_a_reboot(vm: Vm, before: str) -> None:
    """As before the first write, kept so through a reboot (a stop at shutdown puts
    nothing back), and the boot without the arguments."""
    as_before(vm, before)
    vm.reboot()
    assert not set(ARGUMENTS) & booted_args(vm)
    as_before(vm, before)
    verify = vm.ssh("latencyctl verify", check=False)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.leaves_boot_changed
def test_kernel_arguments_written_booted_and_taken_out_again(vm: Vm) -> None:
    assert not set(ARGUMENTS) & booted_args(vm)
    kernel = as_a_debian_machine(vm)
    before = vm.ssh(BOOT_CONFIGURATION).stdout
    guest_profile(vm, WRITTEN, REALTIME_WRITTEN)
    # 1. switch to the profile, reboot into it, switch away (finding 4b: after the reboot
    # the arguments are latencyd's own, not the machine's originals), reboot out of it.
    grub_cfg = vm.ssh("cat /boot/grub/grub.cfg").stdout
    vm.ssh(f"latencyctl switch {WRITTEN}")
    only_the_arguments_added(grub_cfg, vm.ssh("cat /boot/grub/grub.cfg").stdout)
    assert vm.ssh("latencyctl verify", check=False).returncode == 5  # reboot pending
    vm.reboot()
    written_and_booted(vm, kernel)
    vm.save(BOOTED_WRITTEN)
    vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")
    gone_after_a_reboot(vm, before)
    # 2. The same through `off`, from the machine booted with the arguments in step 1: its
    # snapshot restored (a write and a reboot less than writing them again).
    vm.restore(BOOTED_WRITTEN)
    written_and_booted(vm, kernel)
    vm.ssh("latencyctl off")
    gone_after_a_reboot(vm, before)
    # 3. kill -9 of the daemon while update-grub writes the arguments: the record says a
    # write was under way; systemd restarts latencyd, which resumes the profile in force
    # before the switch (the default: the switch never finished) and so undoes the write.
    vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")
    killed = vm.ssh(
        f"(latencyctl switch {WRITTEN} >/dev/null 2>&1 &); "
        f"until {UPDATE_GRUB} >/dev/null; do sleep 0.1; done; "
        "kill -9 $(systemctl show -P MainPID latencyd); cat /var/lib/latencyd/bootcmdline"
    )
    assert "# writing: " in killed.stdout, killed.stdout
    vm.ssh(
        "until [ $(systemctl show -P NRestarts latencyd) -ge 1 ] "
        "&& [ $(systemctl is-active latencyd) = active ]; do sleep 1; done",
        timeout=900,
    )
    assert vm.ssh("latencyctl active").stdout.strip() == DEFAULT_PROFILE
    as_before(vm, before)
