"""The VM tier's machines: one Debian VM at a time (the development machines have 2 CPUs),
latencyd installed in it as a user installs it, then rebooted, so every test starts on a
machine where systemd started latencyd at boot with its default profile.

A machine so set up is saved (QEMU's savevm, a snapshot in its disk's overlay). A test may
change the machine (a profile, the boot configuration, another kernel booted); the next
test that asks for a machine gets it as it is only if it still reads as it did when set
up (`BASELINE`), else the snapshot restored, in seconds, where a fresh machine costs a
boot, the install and a reboot. A test asking for another shape (8 vCPUs on 2 NUMA nodes)
gets the same disk powered on as that shape, which costs a boot, not an install, and is
saved as that shape too. Tests that leave boot arguments behind still run last
(`pytest_collection_modifyitems`). A test that installs latencyd its own way (the Debian
package) asks for `fresh_vm`: the image as it boots, without `make install`, powered off
after it; such tests run first.

A test whose guest died of the emulator flake (tests/qemu.py: `Oops: int3` on its serial
console while the test ran, not met by a retried boot) is run again on its machine as set
up (the snapshot restored; a fresh machine where there is none), up to FLAKE_RETRIES
times, and said: a line as it happens, a warning, and the run's summary. A failure
without it is never run again (pytest_runtest_protocol).
"""

from __future__ import annotations

import subprocess
import warnings
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from _pytest.runner import runtestprotocol

from tests.conftest import in_vm_tier
from tests.qemu import (
    CACHE,
    BootFailed,
    GuestCommandFailed,
    Shape,
    Vm,
    emulator_version,
    install_latencyd,
    retry_for,
)

# What a machine reads right after its first boot with latencyd, once systemd has finished
# starting it: the kernel's arguments, the boot configuration, the service and its profile.
BASELINE = (
    "systemctl is-system-running --wait >/dev/null; "
    "cat /proc/cmdline; ls -A /etc/default/grub.d; sha256sum /boot/grub/grub.cfg; "
    "systemctl is-active latencyd || true; latencyctl active || true"
)
NUMA = Shape(cpus=8, numa_nodes=2, memory_mb=2048)


@dataclass
class Booted:
    vm: Vm
    baselines: dict[Shape, str]  # each shape set up on its disk: what it read then
    installed: bool  # latencyd put in by make install (else the image as built)


def set_up(shape: Shape) -> str:
    """The tag of the snapshot (Vm.save) of a machine of `shape` as it was set up."""
    return f"set-up-{shape.cpus}cpus-{shape.numa_nodes}nodes-{shape.memory_mb}mb"


class Machines:
    """Hands out one VM of a shape, with latencyd installed by `make install` or as the
    image boots (`installed=False`), reused while its baseline holds; a machine installed
    is saved as set up (a snapshot in its overlay, per shape), and a test that changed
    it hands the next one that snapshot restored: seconds, where a fresh machine costs a
    boot, the install and a reboot (6 min), and another shape a boot."""

    def __init__(self) -> None:
        self.current: Booted | None = None
        self.log: list[str] = []  # what each machine cost, for the run's summary
        self.vms: list[Vm] = []  # every machine powered on, in order (console_since)

    def get(self, shape: Shape, installed: bool = True) -> Vm:
        if self.current is not None and self.current.installed == installed:
            try:
                if (vm := self._reuse(self.current, shape)) is not None:
                    return vm
            except (BootFailed, GuestCommandFailed) as failed:  # say it, then a fresh machine
                self.log.append(f"{shape}: the machine set up could not be had again: {failed}")
        self.close()
        vm = Vm(shape)
        self.vms.append(vm)
        try:
            vm.boot()
            if installed:
                install_latencyd(vm)
                vm.reboot()  # systemd starts latencyd at boot, as on a user's server
            vm.ssh("useradd --create-home alice")  # a plain user
            # Which kernel the tests start on, in the run's summary: the RT entry was seen
            # booted where the generic one was meant (test_bootloader's set-up).
            self.log.append(f"{shape}: tests start on Linux {vm.ssh('uname -r').stdout.strip()}")
            self.current = Booted(vm, {shape: vm.ssh(BASELINE).stdout}, installed)
        except BaseException:
            self.log.append(f"{shape}: failed; console tail:\n{vm.console()[-3000:]}")
            vm.stop()
            raise
        if installed:  # a fresh_vm is never handed out again
            try:
                vm.save(set_up(shape))
            except (BootFailed, GuestCommandFailed) as failed:  # the tier goes on without
                self.log.append(f"{shape}: not saved, so replaced when changed: {failed}")
        return vm

    @staticmethod
    def _reuse(booted: Booted, shape: Shape) -> Vm | None:
        """The machine of `booted` as set up in `shape`: as it is if it still reads so; its
        snapshot of that shape restored; or, a shape its disk has not had yet, powered on
        as that shape from the set-up state (restored first if a test changed it) and
        saved so. None if it cannot be had so (no snapshot: a machine not installed)."""
        vm = booted.vm
        if (
            vm.shape == shape
            and vm.ssh(BASELINE, check=False, lost_ok=True).stdout == (booted.baselines[shape])
        ):
            return vm
        if shape in booted.baselines:
            if set_up(shape) not in vm.snapshots:
                return None
            vm.restore(set_up(shape))
        else:
            if set_up(vm.shape) not in vm.snapshots:
                return None
            if vm.ssh(BASELINE, check=False, lost_ok=True).stdout != booted.baselines[vm.shape]:
                vm.restore(set_up(vm.shape))
            baseline = booted.baselines[vm.shape]
            vm.power_cycle(shape)  # the same disk as another machine: no new install
            booted.baselines[shape] = baseline
        read = vm.ssh(BASELINE, check=False, lost_ok=True).stdout
        if read != booted.baselines[shape]:
            raise BootFailed(f"as set up it read {booted.baselines[shape]!r}, now {read!r}")
        if set_up(shape) not in vm.snapshots:
            vm.save(set_up(shape))
        return vm

    def after_flake(self) -> None:
        """The machine whose guest died of the emulator flake made ready for the test's
        second run: its set-up snapshot restored (seconds: the dead guest's memory and
        disk replaced by the saved ones), or, a machine without one (fresh_vm's) or one
        that cannot be restored, powered off for a fresh machine."""
        if self.current is not None and set_up(self.current.vm.shape) in self.current.vm.snapshots:
            vm = self.current.vm
            try:
                vm.restore(set_up(vm.shape))
                self.log.append(f"{vm.shape}: restored as set up after the flake")
                return
            except (BootFailed, GuestCommandFailed) as failed:
                self.log.append(f"{vm.shape}: not restored after the flake: {failed}")
        self.close()

    def close(self) -> None:
        if self.current is not None:
            vm = self.current.vm
            boots = ", ".join(f"{s:.0f} s" for s in vm.boot_seconds)
            self.log.append(f"{vm.shape}: boots to ssh {boots}; flakes retried: {vm.flakes or 0}")
            if vm.snapshot_seconds:
                self.log.append(f"{vm.shape}: snapshots: {', '.join(vm.snapshot_seconds)}")
            vm.stop()
            self.current = None

    def mark(self) -> tuple[int, int]:
        """Where the machines' consoles stand now (for console_since): the last machine
        powered on, and its console's position."""
        if not self.vms:
            return 0, 0
        return len(self.vms) - 1, self.vms[-1].consoles.position()

    def console_since(self, mark: tuple[int, int]) -> str:
        """What the consoles said since `mark`: that machine's since then, and all of each
        powered on after it (Consoles.since leaves out the flakes retried boots met)."""
        first, position = mark
        return "".join(
            vm.consoles.since(position if n == first else 0)
            for n, vm in enumerate(self.vms[first:], start=first)
        )


MACHINES = Machines()


@pytest.fixture(scope="session")
def machines() -> Iterator[Machines]:
    try:
        yield MACHINES
    finally:
        MACHINES.close()
        leftover = subprocess.run(["losetup", "--list", "--noheadings", "--output", "BACK-FILE"],
                                  capture_output=True, text=True).stdout  # fmt: skip
        assert str(CACHE) not in leftover, f"loop devices left on the VM cache: {leftover}"


@pytest.fixture
def vm(machines: Machines) -> Vm:
    """A 4-vCPU VM with latencyd installed and started at boot (default profile)."""
    return machines.get(Shape())


@pytest.fixture
def vm_numa(machines: Machines) -> Vm:
    """An 8-vCPU VM on 2 NUMA nodes (CPUs 0-3 and 4-7), latencyd as in `vm`."""
    return machines.get(NUMA)


@pytest.fixture
def fresh_vm(machines: Machines) -> Iterator[Vm]:
    """A 4-vCPU VM as the image boots, without latencyd (and the plain user alice), for a
    test that installs it its own way; powered off after the test, never handed out again."""
    yield machines.get(Shape(), installed=False)
    machines.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that leave the machine changed for good (marked `leaves_boot_changed`) last,
    those on the same machine shape together, so the fewest VMs are booted: the 4-vCPU
    machine is installed, its disk powered on as the NUMA machine for those tests, then
    its 4-vCPU snapshot restored (no boot). (Installing on 8 vCPUs instead saves a boot,
    but a starved 8-vCPU guest stalls: seen on a loaded 2-CPU host, its reboot after the
    install never answered ssh in 15 min.)"""

    def order(item: pytest.Item) -> tuple[bool, bool, bool]:
        fixtures = getattr(item, "fixturenames", ())
        return (
            "fresh_vm" not in fixtures,  # first: its machine is never reused
            item.get_closest_marker("leaves_boot_changed") is not None,
            "vm_numa" in fixtures,
        )

    items.sort(key=order)


# How many more runs a test gets whose guest died of the emulator flake. Two: a run lost
# to it costs seconds since its machine is restored (after_flake), and a test that flips
# static keys many times (a hold's release, a package upgrade's restart) met it twice in
# a row on a 2-CPU host (2026-11-30).
FLAKE_RETRIES = 2


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A VM test run as pytest runs any (set-up, call, tear-down, then reported), and run
    again on its machine as set up (Machines.after_flake), up to FLAKE_RETRIES times, when
    it failed because its guest died of the emulator flake (retry_for, on the consoles
    written while it ran); only the last run's outcome is reported, each earlier one said
    as a line, a warning and in the summary."""
    if not in_vm_tier(item):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for run in range(1, FLAKE_RETRIES + 2):
        mark = MACHINES.mark()
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
        flake = retry_for(any(r.failed for r in reports), MACHINES.console_since(mark))
        if flake is None or run > FLAKE_RETRIES:
            break
        failure = next(r for r in reports if r.failed)
        crash = getattr(failure.longrepr, "reprcrash", None)
        why = str(getattr(crash, "message", failure.longreprtext)).splitlines()[:1]
        said = (
            f"RETRIED {item.nodeid}: its guest died of the emulator flake ({flake}); its "
            f"run {run} failed in {failure.when}: {' '.join(why)}"
        )
        MACHINES.log.append(said)
        MACHINES.after_flake()  # the dead guest: the next run gets it as set up
        terminal = item.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.write_line("")
            terminal.write_line(said, yellow=True, bold=True)
        warnings.warn(pytest.PytestWarning(said), stacklevel=1)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MACHINES.log:
        terminalreporter.section("VM tier")
        terminalreporter.write_line(emulator_version())
        for line in MACHINES.log:
            terminalreporter.write_line(line)
