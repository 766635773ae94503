"""The VM tier's pure parts (tests/qemu.py, tests/vm/conftest.py): QEMU's command line for
a shape, the emulator flake told from the serial console, why ssh lost the guest, and
which machine a test is handed (as it is, a snapshot restored, another shape)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import cast

import pytest

from tests.qemu import (
    BootFailed,
    Consoles,
    Flake,
    PoolFile,
    Shape,
    Vm,
    flake_in,
    pool_file,
    qemu_argv,
    retry_for,
    why_lost,
)
from tests.vm.conftest import BASELINE, Booted, Machines, set_up

OOPS = (
    "[   41.113342] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n"
    "[   41.113871] RIP: 0010:hrtimer_start_range_ns+0x2f/0x3c0\n"
)


def argv(shape: Shape) -> list[str]:
    return qemu_argv(shape, Path("/o.qcow2"), 40022, Path("/serial"), Path("/mon"))


def test_two_numa_nodes_split_the_cpus_and_memory() -> None:
    a = argv(Shape(cpus=8, numa_nodes=2, memory_mb=2048))
    nodes = [a[i + 1] for i, arg in enumerate(a) if arg == "-numa"]
    assert nodes == ["node,nodeid=0,cpus=0-3,memdev=mem0", "node,nodeid=1,cpus=4-7,memdev=mem1"]
    assert "memory-backend-ram,id=mem1,size=1024M" in a


def test_one_node_has_no_numa_options_and_ssh_only_on_loopback() -> None:
    a = argv(Shape())
    assert "-numa" not in a
    assert a[a.index("-smp") + 1] == "4"
    netdevs = [a[i + 1] for i, arg in enumerate(a) if arg == "-netdev"]
    assert netdevs == ["user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:40022-:22",
                       "user,id=n1,restrict=on"]  # fmt: skip


def test_uneven_nodes_refused() -> None:
    with pytest.raises(ValueError, match="evenly"):
        argv(Shape(cpus=6, numa_nodes=4))


def test_the_flake_is_told_from_the_console() -> None:
    assert flake_in("[    1.0] booting\n" + OOPS) == OOPS.splitlines()[0].strip()
    assert flake_in("[    1.0] booting\nvm login: ") is None


def test_ssh_losing_the_guest_is_said_with_its_cause() -> None:
    assert why_lost("[  300.0] random: crng\n" + OOPS, None).startswith("the emulator flake")
    assert "Oops: int3" in why_lost(OOPS, None)
    assert why_lost("", -9) == "QEMU exited (-9)"
    quiet = why_lost("[  300.0] e1000e: link up\n", None)
    assert "no flake" in quiet and "e1000e: link up" in quiet


def test_the_guard_leaves_out_only_what_the_vm_tiers_image_build_holds() -> None:
    from tests.machine_state import not_the_vm_tiers

    cache = Path("/var/cache/latencyd-test/vm")
    lines = [
        "/dev/loop0: [64769]:1836 (/var/cache/latencyd-test/vm/build.a1/disk.raw), offset 1048576",
        "/dev/loop1: [64769]:77 (/tmp/latencyd-measure-x/disk.img)",
        "/dev/loop0 /var/cache/latencyd-test/vm/build.a1/mnt ext4 rw,relatime 0 0",
        "/dev/loop2 /var/cache/latencyd-test/vm-other/mnt ext4 rw 0 0",  # not the cache
    ]
    assert not_the_vm_tiers(lines, cache) == [lines[1], lines[3]]


def test_the_monitors_answer_is_told_from_its_echo_of_the_command() -> None:
    from tests.qemu import monitor_reply

    # as QEMU 7.2's monitor sent them (the redraw shortened)
    failed = (
        b"d\x1b[K\x1b[Dde\x1b[K\x1b[D\x1b[Ddevice_add e1000e,netdev=nope,id=x\x1b[K\r\n"
        b"Error: No 'PCI' bus found for device 'e1000e'\r\n(qemu) "
    )
    assert monitor_reply(failed) == "Error: No 'PCI' bus found for device 'e1000e'"
    added = b"n\x1b[K\x1b[Dnetdev_add user,id=hot0,restrict=on\x1b[K\r\n(qemu) "
    assert monitor_reply(added) == ""


def test_a_starved_guest_is_slow_not_hung() -> None:
    from tests.qemu import IDLE_STALL, STALL, STALL_CPU, HostTime, stalled

    starved = HostTime(ran=STALL_CPU / 10, waited=STALL / 2)
    assert not stalled(silent_seconds=STALL / 2, had=starved)
    assert stalled(silent_seconds=STALL_CPU / 2, had=HostTime(STALL_CPU, 0.0))  # had the CPUs
    assert stalled(silent_seconds=STALL, had=starved)  # given up in the end, whatever it had
    # Idle: QEMU neither ran nor waited to, the console silent, no ssh: given up after
    # IDLE_STALL, not STALL; a guest that ran while silent (a boot's quiet work) is not.
    assert stalled(silent_seconds=IDLE_STALL, had=HostTime(ran=2.0, waited=1.0))
    assert not stalled(silent_seconds=IDLE_STALL / 2, had=HostTime(ran=1.0, waited=0.5))
    assert not stalled(silent_seconds=IDLE_STALL, had=HostTime(ran=IDLE_STALL / 2, waited=0.0))


def test_a_process_host_time_is_read_over_its_threads() -> None:
    import threading

    from tests.qemu import HostTime, host_time

    spun, leave = threading.Event(), threading.Event()

    def spin() -> None:  # CPU in another thread, read while that thread lives
        ran = time.thread_time()
        while time.thread_time() - ran < 0.2:
            pass
        spun.set()
        leave.wait()

    before, main_before = host_time(os.getpid()), time.thread_time()
    worker = threading.Thread(target=spin)
    worker.start()
    spun.wait()
    had, main_ran = host_time(os.getpid()) - before, time.thread_time() - main_before
    leave.set()
    worker.join()
    assert had.ran - main_ran >= 0.15  # the other thread's 0.2 s counted (a tick or so late)
    assert had.waited >= 0
    assert host_time(2**22 + 1) == HostTime(0.0, 0.0)  # above pid_max's limit: no process


# A guest's console as the tier records it: a boot, then what a test's commands printed.
BOOTED = (
    "[    0.000000] Linux version 6.12.117+deb12-amd64\n"
    "[   38.902114] e1000e 0000:00:03.0 ens3: NIC Link is Up 1000 Mbps Full Duplex\n"
    "vm login: "
)
# A real oops (a fault, as a kernel or driver bug gives): not the emulator's.
REAL_OOPS = (
    "[  212.551203] BUG: kernel NULL pointer dereference, address: 0000000000000008\n"
    "[  212.551870] Oops: Oops: 0000 [#1] PREEMPT SMP NOPTI\n"
    "[  212.552301] RIP: 0010:cpuset_attach_task+0x2b/0x90\n"
)


def test_a_failed_test_is_retried_only_when_its_guest_died_of_the_flake() -> None:
    # after the login prompt, on its line (the prompt has no newline)
    assert retry_for(True, BOOTED + OOPS) == "vm login: " + OOPS.splitlines()[0].strip()
    assert retry_for(False, BOOTED + OOPS) is None  # passed: nothing to retry
    assert retry_for(True, BOOTED) is None  # the test's own failure
    assert retry_for(True, BOOTED + REAL_OOPS) is None  # a kernel bug is a real failure
    # what a command echoed to the console is not the kernel's oops line
    assert retry_for(True, BOOTED + "sh: echo Oops: int3 is the flake\n") is None


def test_a_flake_a_retried_boot_met_is_not_the_tests(tmp_path: Path) -> None:
    """The consoles as one stream: a flake that a reboot's retry met (a reset, the same
    console file) and one on a power-on's console set aside are left out; one after them,
    while the test ran, is not."""
    consoles = Consoles(tmp_path / "serial.log")
    consoles.path.write_text(BOOTED)
    test_began = consoles.position()
    with consoles.path.open("a") as f:
        f.write(OOPS)  # a reboot in the test dies: its retry (a reset) meets it
    consoles.flake_met()
    with consoles.path.open("a") as f:
        f.write(BOOTED)
    assert retry_for(True, consoles.since(test_began)) is None
    with consoles.path.open("a") as f:
        f.write(OOPS)  # then the guest dies while the test runs
    assert "Oops: int3" in str(retry_for(True, consoles.since(test_began)))
    set_aside_at = consoles.position()
    consoles.aside("serial-1.log")  # a power-on's flake, met by a fresh power-on
    consoles.path.write_text(BOOTED)
    assert consoles.since(test_began) == BOOTED
    assert (tmp_path / "serial-1.log").read_text().endswith(OOPS)
    consoles.keep()  # the VM stopped: its directory goes, its console stays readable
    consoles.path.unlink()
    assert consoles.since(set_aside_at) == BOOTED
    assert consoles.position() == set_aside_at + len(BOOTED)


class ScriptedReboots(Vm):
    """A Vm whose guest is a script: each boot dies of the flake or comes up, in turn;
    what would reach the guest or QEMU's monitor is recorded instead."""

    def __init__(self, tmp_path: Path, boots_die: list[bool]) -> None:  # no QEMU, no image
        self.serial = tmp_path / "serial.log"
        self.serial.write_text(BOOTED)
        self.consoles, self.flakes = Consoles(self.serial), []
        self.boots_die, self.ran = boots_die, []

    def ssh(self, command: str, **_: object) -> subprocess.CompletedProcess[str]:
        if command != "cat /proc/sys/kernel/random/boot_id":
            self.ran.append(command)
        return subprocess.CompletedProcess([], 0, "a boot id\n", "")

    def _monitor(self, command: str, timeout: float = 60) -> str:
        self.ran.append(f"(qemu) {command}")
        return ""

    def _wait_up(self, serial_from: int, old_boot_id: str | None) -> None:
        if self.boots_die.pop(0):
            raise Flake("Oops: int3")


def test_a_reboot_into_an_entry_the_flake_killed_is_made_again_after_the_reset(
    tmp_path: Path,
) -> None:
    """GRUB clears a one-boot entry (grub-reboot) as it reads it, so the boot the flake
    killed had used it up and the reset boots the default kernel (a fresh-clone run of
    2026-11-30: the PREEMPT_RT test found itself on the generic kernel): the machine is
    rebooted into the entry once more. A plain reboot's reset is the whole retry."""
    into = ScriptedReboots(tmp_path, [True, False, False])
    into.reboot(into="gnulinux-rt")
    assert into.ran == ["grub-reboot gnulinux-rt", "systemctl reboot", "(qemu) system_reset",
                        "grub-reboot gnulinux-rt", "systemctl reboot",
                        "systemctl is-system-running --wait"]  # fmt: skip
    assert into.flakes == ["reboot: Oops: int3"]
    plain = ScriptedReboots(tmp_path, [True, False])
    plain.reboot()
    assert plain.ran == ["systemctl reboot", "(qemu) system_reset",
                         "systemctl is-system-running --wait"]  # fmt: skip
    calm = ScriptedReboots(tmp_path, [False])
    calm.reboot(into="gnulinux-rt")
    assert calm.ran == ["grub-reboot gnulinux-rt", "systemctl reboot",
                        "systemctl is-system-running --wait"]  # fmt: skip
    twice = ScriptedReboots(tmp_path, [True, False, True])
    with pytest.raises(BootFailed, match="the emulator flake twice"):
        twice.reboot(into="gnulinux-rt")


def test_the_package_test_samples_the_profiles_settings_not_services_coming_and_going() -> None:
    """What the package test samples through an upgrade: files the profile changed and
    those of latencyd.slice (the application's slice, and the application's cgroup in it);
    not the files of a service that started since (latencyd.service itself, stopped for a
    restart's gap); kernel threads whose affinity it changed."""
    from tests.vm.test_package import made_by_profile

    slice_, service = "/sys/fs/cgroup/latencyd.slice", "/sys/fs/cgroup/system.slice"
    untuned: dict[str, object] = {
        "files": {"/proc/sys/vm/stat_interval": "1", f"{service}/cpuset.cpus": "",
                  "/proc/irq/24/smp_affinity_list": "0-3"},
        "kthreads": {"2:kthreadd": "[0, 1, 2, 3] policy=0 prio=0",
                     "9:ksoftirqd/0": "[0] policy=0 prio=0"},
    }  # fmt: skip
    tuned: dict[str, object] = {
        "files": {"/proc/sys/vm/stat_interval": "10", f"{service}/cpuset.cpus": "0-1",
                  "/proc/irq/24/smp_affinity_list": "0-3",
                  f"{slice_}/cpuset.cpus": "2-3",
                  f"{slice_}/vm-app.service/cpuset.cpus.effective": "2-3",
                  f"{service}/latencyd.service/cpuset.cpus.effective": "0-1",
                  f"{service}/systemd-hostnamed.service/cpuset.cpus.effective": "0-1"},
        "kthreads": {"2:kthreadd": "[0, 1] policy=0 prio=0",
                     "9:ksoftirqd/0": "[0] policy=0 prio=0",
                     "300:kworker/u8:2": "[0, 1] policy=0 prio=0"},
    }  # fmt: skip
    files, kthreads = made_by_profile(untuned, tuned)
    assert files == [
        "/proc/sys/vm/stat_interval",
        f"{service}/cpuset.cpus",
        f"{slice_}/cpuset.cpus",
        f"{slice_}/vm-app.service/cpuset.cpus.effective",
    ]
    assert kthreads == [2]


def test_the_package_test_tells_latencyds_cgroups_from_services_coming_and_going() -> None:
    """After a remove or a purge: a service's cgroup that came or went since the snapshot
    before the install is no change; latencyd.service's still there, latencyd.slice's
    still there, and a slice's AllowedCPUs= left set are."""
    from tests.vm.test_package import changed

    def snap(files: dict[str, str | None]) -> dict[str, object]:
        return {"files": files, "kthreads": {}, "nics": {}, "task_cpusets": {},
                "pm_qos_holders": [], "netns": [], "loop_devices": "", "mounts": [],
                "run_systemd": [], "cgroups": {}}  # fmt: skip

    root = "/sys/fs/cgroup"
    before = snap({f"{root}/system.slice/cpuset.cpus": "",
                   f"{root}/system.slice/apt-daily.service/cpuset.cpus": ""})  # fmt: skip
    assert changed(before, snap({
        f"{root}/system.slice/cpuset.cpus": "",
        f"{root}/system.slice/systemd-hostnamed.service/cpuset.cpus": "",
        f"{root}/user.slice/user-1000.slice/session-3.scope/cpuset.cpus": "",
    })) == []  # fmt: skip
    left = changed(before, snap({
        f"{root}/system.slice/cpuset.cpus": "0-1",
        f"{root}/system.slice/latencyd.service/cpuset.cpus": "",
        f"{root}/latencyd.slice/cpuset.cpus": "2-3",
    }))  # fmt: skip
    assert [d.split(":")[0] for d in left] == [
        f"{root}/latencyd.slice/cpuset.cpus",
        f"{root}/system.slice/cpuset.cpus",
        f"{root}/system.slice/latencyd.service/cpuset.cpus",
    ]


def test_the_guest_sampler_sees_a_flip_and_leaves_an_exited_thread_out(tmp_path: Path) -> None:
    """tests/vm/guest_sampler.py, run here as in the guest: marks its start, sees a file
    that changes while it samples with both values, samples the application's affinity
    and cgroup each time, and samples no more a thread that has exited (no setting
    flipped)."""
    import json
    import re
    import subprocess
    import sys
    import time

    from tests.harness import REPO

    setting, out = tmp_path / "setting", tmp_path / "samples.json"
    setting.write_text("before\n")
    gone = subprocess.Popen(["true"])
    gone.wait()
    app = subprocess.Popen(["sleep", "60"])
    sampler = subprocess.Popen(
        [sys.executable, str(REPO / "tests/vm/guest_sampler.py"), str(out),
         str(tmp_path / "stop"), str(app.pid)],
        stdin=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert sampler.stdin is not None
        sampler.stdin.write(json.dumps({"files": [str(setting)], "kthreads": [gone.pid]}))
        sampler.stdin.close()
        deadline = time.monotonic() + 60
        while not Path(f"{out}.started").exists():
            assert sampler.poll() is None and time.monotonic() < deadline, "never started"
            time.sleep(0.01)
        new = tmp_path / "setting.new"  # replaced whole, as a kernel file reads
        new.write_text("after\n")
        new.rename(setting)
        (tmp_path / "stop").touch()  # the sampler's last sample is taken once it sees it
        assert sampler.wait(timeout=60) == 0
    finally:
        for process in (sampler, app):
            process.kill()
            process.wait()
    sampled = json.loads(out.read_text())
    seen = sampled["seen"]
    assert sampled["samples"] > 0
    assert set(seen[str(setting)]) == {"before", "after"}
    # The application's affinity and cgroup, each sample's (not their values: on this
    # machine a shield test beside may move every task while it runs).
    assert sum(seen["app"].values()) == sum(seen["app cgroup"].values()) == sampled["samples"]
    assert all(re.fullmatch(r"[0-9]+(,[0-9]+)*", cpus) for cpus in seen["app"]), seen["app"]
    assert f"kthread {gone.pid}" not in seen


def test_a_snapshot_is_started_from_only_when_asked() -> None:
    started = qemu_argv(Shape(), Path("/o.qcow2"), 1, Path("/s"), Path("/m"), loadvm="set-up")
    assert started[started.index("-loadvm") + 1] == "set-up"
    assert "-loadvm" not in argv(Shape())


class FakeMachine:
    """What Machines._reuse asks of a Vm: the baseline it reads (one string standing for
    the machine's state), its snapshots, and what it was told to do, in order."""

    def __init__(self, shape: Shape, state: str) -> None:
        self.shape, self.state = shape, state
        self.snapshots: dict[str, tuple[Shape, str]] = {}
        self.done: list[str] = []
        self.boot_seconds: list[float] = []  # what Machines.close reports
        self.flakes: list[str] = []
        self.snapshot_seconds: list[str] = []
        self.restore_fails = False

    def ssh(self, command: str, **_: object) -> subprocess.CompletedProcess[str]:
        assert command == BASELINE
        return subprocess.CompletedProcess([], 0, self.state, "")

    def save(self, tag: str) -> None:
        self.snapshots[tag] = (self.shape, self.state)
        self.done.append(f"save {tag}")

    def restore(self, tag: str) -> None:
        if self.restore_fails:
            raise BootFailed("no ssh after a restore")
        self.shape, self.state = self.snapshots[tag]
        self.done.append(f"restore {tag}")

    def stop(self) -> None:
        self.done.append("stop")

    def power_cycle(self, shape: Shape) -> None:
        self.shape = shape
        self.done.append(f"power-cycle {shape.cpus}")


def reuse(machine: FakeMachine, baselines: dict[Shape, str], shape: Shape) -> object:
    return Machines._reuse(Booted(cast(Vm, machine), baselines, installed=True), shape)


def test_a_machine_that_still_reads_as_set_up_is_handed_out_as_it_is() -> None:
    machine = FakeMachine(Shape(), "set up")
    machine.save(set_up(Shape()))
    assert reuse(machine, {Shape(): "set up"}, Shape()) is machine
    assert machine.done == ["save set-up-4cpus-1nodes-2048mb"]


def test_a_changed_machine_gets_its_set_up_snapshot_restored() -> None:
    machine = FakeMachine(Shape(), "set up")
    machine.save(set_up(Shape()))
    machine.state = "booted on the RT kernel"
    assert reuse(machine, {Shape(): "set up"}, Shape()) is machine
    assert machine.done[1:] == ["restore set-up-4cpus-1nodes-2048mb"]
    assert machine.state == "set up"


def test_another_shape_is_powered_on_from_the_set_up_state_and_saved_then_restored() -> None:
    numa = Shape(cpus=8, numa_nodes=2)
    machine = FakeMachine(Shape(), "set up")
    machine.save(set_up(Shape()))
    machine.state = "a profile switched"
    baselines = {Shape(): "set up"}
    assert reuse(machine, baselines, numa) is machine
    assert machine.done[1:] == [
        "restore set-up-4cpus-1nodes-2048mb",  # not the changed state on the NUMA machine
        "power-cycle 8",
        "save set-up-8cpus-2nodes-2048mb",
    ]
    assert baselines[numa] == "set up"
    machine.state = "changed on the NUMA machine"
    machine.done.clear()
    assert reuse(machine, baselines, Shape()) is machine  # back: a restore, no boot
    assert machine.done == ["restore set-up-4cpus-1nodes-2048mb"]
    assert (machine.shape, machine.state) == (Shape(), "set up")


def test_a_restore_that_reads_otherwise_is_refused() -> None:
    machine = FakeMachine(Shape(), "set up")
    machine.save(set_up(Shape()))
    machine.snapshots[set_up(Shape())] = (Shape(), "saved otherwise")
    machine.state = "changed"
    with pytest.raises(BootFailed, match="as set up it read"):
        reuse(machine, {Shape(): "set up"}, Shape())


def test_a_machine_without_a_snapshot_is_not_reused() -> None:
    machine = FakeMachine(Shape(), "changed")
    assert reuse(machine, {Shape(): "set up"}, Shape()) is None
    assert machine.done == []


def test_a_package_file_apt_would_fetch_is_read_with_the_hash_apt_printed() -> None:
    uri = "file:/srv/debian/deb.debian.org/debian/pool/main/g/gi/libgi_1.74.0-3_amd64.deb"
    line = f"'{uri}' libgi_1.74.0-3_amd64.deb 100664 MD5Sum:096aaa08bb9cda8d3cf17233af90a379"
    assert pool_file(line) == PoolFile(
        uri, "libgi_1.74.0-3_amd64.deb", "md5", "096aaa08bb9cda8d3cf17233af90a379"
    )
    assert pool_file(f"'{uri}' x.deb 1 SHA256:ab") == PoolFile(uri, "x.deb", "sha256", "ab")
    assert pool_file("'file:/root/latencyd_1_all.deb' latencyd_1_all.deb 0") is None
    with pytest.raises(ValueError, match="not known"):
        pool_file(f"'{uri}' x.deb 1 Blake3:ab")


def test_a_package_file_is_served_where_apt_reads_its_escaped_uri() -> None:
    # apt prints a version's "+" as "%2b" in the URI and opens the file named with "+".
    pool = "/srv/debian/deb.debian.org/debian/pool/main/p/pygobject"
    found = pool_file(f"'file:{pool}/python3-gi_3.42.2-3%2bb1_amd64.deb' x.deb 219 MD5Sum:ab")
    assert found is not None
    assert found.guest_path == f"{pool}/python3-gi_3.42.2-3+b1_amd64.deb"


def machines_with(machine: FakeMachine, installed: bool = True) -> Machines:
    machines = Machines()
    machines.current = Booted(cast(Vm, machine), {machine.shape: "set up"}, installed)
    return machines


def test_a_guest_dead_of_the_flake_is_restored_as_set_up_for_the_second_run() -> None:
    machine = FakeMachine(Shape(), "set up")
    machine.save(set_up(Shape()))
    machine.state = "dead: Oops: int3"
    machines = machines_with(machine)
    machines.after_flake()
    assert machine.done[-1] == "restore set-up-4cpus-1nodes-2048mb"
    assert machine.state == "set up"
    assert machines.current is not None and machines.current.vm is cast(Vm, machine)


def test_a_guest_dead_of_the_flake_without_a_snapshot_is_powered_off() -> None:
    machine = FakeMachine(Shape(), "dead: Oops: int3")  # fresh_vm's: never saved
    machines = machines_with(machine, installed=False)
    machines.after_flake()
    assert machine.done == ["stop"]
    assert machines.current is None


def test_a_guest_dead_of_the_flake_that_cannot_be_restored_is_powered_off() -> None:
    machine = FakeMachine(Shape(), "set up")
    machine.save(set_up(Shape()))
    machine.restore_fails = True
    machines = machines_with(machine)
    machines.after_flake()
    assert machine.done[-1] == "stop"
    assert machines.current is None
    assert "not restored after the flake: no ssh after a restore" in machines.log[0]


def test_the_package_test_compares_irq_masks_by_handler_across_a_reboot() -> None:
    """IRQ numbers follow probe order: after a reboot virtio's vectors were three numbers
    apart. Keyed by their handlers' names (as the guest's /proc/interrupts lists them,
    read by latencyd's decoder), the same masks compare equal; a mask that did change is
    still found, and an IRQ without a handler, or with a name another IRQ has too, keeps
    its number."""
    from latencyd.kernel.procstat import parse_interrupts
    from tests.vm.test_package import changed, irq_names

    def names(interrupts: str) -> dict[str, str]:  # as snapshot() does it in the guest
        irqs = parse_interrupts("           CPU0       CPU1\n" + interrupts, False)[1]
        return irq_names({str(i.number): list(i.actions) for i in irqs})

    def snap(masks: dict[int, str], interrupts: str) -> dict[str, object]:
        files = {f"/proc/irq/{n}/smp_affinity_list": m for n, m in masks.items()}
        return {"files": files, "kthreads": {}, "nics": {}, "task_cpusets": {},
                "pm_qos_holders": [], "netns": [], "loop_devices": "", "mounts": [],
                "run_systemd": [], "cgroups": {}, "irq_names": names(interrupts)}  # fmt: skip

    def virtio(first: int) -> str:
        chip = "PCI-MSIX-0000:00:04.0"
        return (f" {first}:  5  0  {chip}  1-edge  virtio0-input.0\n"
                f" {first + 1}:  0  7  {chip}  2-edge  virtio0-output.0\n")  # fmt: skip

    assert names(virtio(25) + "  9:   0   0   IO-APIC   9-fasteoi   acpi\n") == {
        "25": "virtio0-input.0", "26": "virtio0-output.0", "9": "acpi"}  # fmt: skip
    shared = (" 24:  0  0  PCI-MSI 16384-edge      PCIe PME\n"
              " 25:  0  0  PCI-MSI 18432-edge      PCIe PME\n"
              " 26:  3  0  PCI-MSI 512000-edge      ahci[0000:00:1f.2]\n"
              " 27:  0  0  PCI-MSI 20480-edge      PCIe PME, aerdrv\n"
              " 28:  0  0  PCI-MSI 22528-edge\n")  # fmt: skip
    assert names(shared) == {"26": "ahci[0000:00:1f.2]", "27": "PCIe PME,aerdrv"}
    before = snap({25: "0", 26: "1", 40: "0-3"}, virtio(25))
    after = snap({28: "0", 29: "1", 40: "0-3"}, virtio(28))
    assert changed(before, after) == []
    moved = snap({28: "0", 29: "0-3", 40: "1"}, virtio(28))
    assert changed(before, moved) == [
        "/proc/irq/40/smp_affinity_list: '0-3' -> '1'",
        "IRQ virtio0-output.0 smp_affinity_list: '1' -> '0-3'",
    ]
