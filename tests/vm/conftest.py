"""The VM tier's machines: one Debian VM at a time (the development machines have 2 CPUs),
latencyd installed in it as a user installs it, then rebooted, so every test starts on a
machine where systemd started latencyd at boot with its default profile.

A test may change the machine (a profile, the boot configuration); the next test that asks
for a machine gets the same one only if it still reads as it did after that first boot
(`BASELINE`), else a fresh one. A test asking for another shape (8 vCPUs on 2 NUMA nodes)
gets the same disk powered on as that shape, which costs a boot, not an install. Tests
that leave boot arguments behind therefore cost a new VM for whichever test follows them:
`pytest_collection_modifyitems` runs them last. A test that installs latencyd its own way
(the Debian package) asks for `fresh_vm`: the image as it boots, without `make install`,
powered off after it; such tests run first.

A test whose guest died of the emulator flake (tests/qemu.py: `Oops: int3` on its serial
console while the test ran, not met by a retried boot) is run once more on a fresh
machine, and said: a line as it happens, a warning, and the run's summary. A failure
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
from tests.qemu import CACHE, Shape, Vm, install_latencyd, retry_for

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
    baseline: str
    installed: bool  # latencyd put in by make install (else the image as built)


class Machines:
    """Hands out one VM of a shape, with latencyd installed by `make install` or as the
    image boots (`installed=False`), reused while its baseline holds."""

    def __init__(self) -> None:
        self.current: Booted | None = None
        self.log: list[str] = []  # what each machine cost, for the run's summary
        self.vms: list[Vm] = []  # every machine powered on, in order (console_since)

    def get(self, shape: Shape, installed: bool = True) -> Vm:
        if self.current is not None:
            vm, baseline = self.current.vm, self.current.baseline
            if self.current.installed == installed and (
                vm.ssh(BASELINE, check=False, lost_ok=True).stdout == baseline
            ):
                if vm.shape == shape:
                    return vm
                vm.power_cycle(shape)  # the same disk as another machine: no new install
                if vm.ssh(BASELINE, check=False, lost_ok=True).stdout == baseline:
                    return vm
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
            self.current = Booted(vm, vm.ssh(BASELINE).stdout, installed)
        except BaseException:
            self.log.append(f"{shape}: failed; console tail:\n{vm.console()[-3000:]}")
            vm.stop()
            raise
        return vm

    def close(self) -> None:
        if self.current is not None:
            vm = self.current.vm
            boots = ", ".join(f"{s:.0f} s" for s in vm.boot_seconds)
            self.log.append(f"{vm.shape}: boots to ssh {boots}; flakes retried: {vm.flakes or 0}")
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
    machine is installed, its disk powered on as the NUMA machine for those tests, then as
    the 4-vCPU one again. (Installing on 8 vCPUs instead saves that boot, but a starved
    8-vCPU guest stalls: seen on a loaded 2-CPU host, its reboot after the install never
    answered ssh in 15 min.)"""

    def order(item: pytest.Item) -> tuple[bool, bool, bool]:
        fixtures = getattr(item, "fixturenames", ())
        return (
            "fresh_vm" not in fixtures,  # first: its machine is never reused
            item.get_closest_marker("leaves_boot_changed") is not None,
            "vm_numa" in fixtures,
        )

    items.sort(key=order)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A VM test run as pytest runs any (set-up, call, tear-down, then reported), and run
    once more on a fresh machine when it failed because its guest died of the emulator
    flake (retry_for, on the consoles written while it ran); only the second run's
    outcome is reported, the first said as a line, a warning and in the summary."""
    if not in_vm_tier(item):
        return None
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    mark = MACHINES.mark()
    reports = runtestprotocol(item, nextitem=nextitem, log=False)
    flake = retry_for(any(r.failed for r in reports), MACHINES.console_since(mark))
    if flake is not None:
        failure = next(r for r in reports if r.failed)
        crash = getattr(failure.longrepr, "reprcrash", None)
        why = str(getattr(crash, "message", failure.longreprtext)).splitlines()[:1]
        said = (
            f"RETRIED {item.nodeid}: its guest died of the emulator flake ({flake}); its "
            f"first run failed in {failure.when}: {' '.join(why)}"
        )
        MACHINES.log.append(said)
        MACHINES.close()  # the dead guest: the second run gets a fresh machine
        terminal = item.config.pluginmanager.get_plugin("terminalreporter")
        if terminal is not None:
            terminal.write_line("")
            terminal.write_line(said, yellow=True, bold=True)
        warnings.warn(pytest.PytestWarning(said), stacklevel=1)
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MACHINES.log:
        terminalreporter.section("VM tier")
        for line in MACHINES.log:
            terminalreporter.write_line(line)
