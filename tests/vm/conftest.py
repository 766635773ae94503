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
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.qemu import CACHE, Shape, Vm, install_latencyd

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
        try:
            vm.boot()
            if installed:
                install_latencyd(vm)
                vm.reboot()  # systemd starts latencyd at boot, as on a user's server
            vm.ssh("useradd --create-home alice")  # a plain user
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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MACHINES.log:
        terminalreporter.section("VM tier")
        for line in MACHINES.log:
            terminalreporter.write_line(line)
