"""The irq plugin against a fake /proc/interrupts, /proc/irq and sysfs device links."""

# ruff: noqa: E501 - /proc/interrupts lines are as wide as the kernel prints them

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import shutil
import socket
import struct
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import latencyd.plugins.irq as irq_module
import pytest
from latencyd.plugins.irq import (
    DefaultAffinity,
    IrqAffinity,
    IrqbalanceBan,
    IrqPlugin,
    IrqRules,
)

from latencyd.core.capabilities import FollowsTasks, declares, files_to_watch
from latencyd.core.engine import (
    SECTION,
    ApplyFailed,
    Engine,
    Refused,
    Section,
    SettingId,
    plugin_options,
    section_schemas,
)
from latencyd.core.journal import Journal
from latencyd.core.plugin import DeviceEvent, Expansion, TaskEvent, Value
from latencyd.core.profile import Profile
from latencyd.core.schema import SchemaError, validate
from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.kernel.procstat import Irq, interrupt_counts, parse_interrupts
from latencyd.kernel.system import Machine, System
from tests.harness import wait_for
from tests.unit.fakesys import (
    EIO_REASON,
    EPERM_REASON,
    RefusingSystem,
    add_irqs,
    add_task,
    make_fake_root,
    put,
    tree_values,
)

# A 4-CPU x86 VM: IO-APIC lines, a shared line with two actions, virtio-net (eth0, at
# 0000:00:04.0), virtio-blk (vda, at 0000:00:05.0), nvme queues 40-43, a line whose
# handler has no action name, and the arch rows (NMI, LOC, ...) that are not IRQs.
INTERRUPTS_4 = """\
            CPU0       CPU1       CPU2       CPU3       
   0:         44          0          0          0   IO-APIC   2-edge      timer
   1:          0          9          0          0   IO-APIC   1-edge      i8042
   9:          0          0          0          0   IO-APIC   9-fasteoi   acpi
  11:          0         31          0          5   IO-APIC  11-fasteoi   uhci_hcd:usb1, virtio2
  24:          0          0          0          0 PCI-MSIX-0000:00:04.0   0-edge      virtio3-config
  25:       1200          0         15          0 PCI-MSIX-0000:00:04.0   1-edge      virtio3-input.0
  26:          0        311          0          0 PCI-MSIX-0000:00:04.0   2-edge      virtio3-output.0
  27:          0          0          0          0 PCI-MSIX-0000:00:05.0   0-edge      virtio4-config
  28:          7          0          0          0 PCI-MSIX-0000:00:05.0   1-edge      virtio4-req.0
  40:          0          0          0          0 PCI-MSIX-0000:00:06.0   0-edge      nvme0q0
  41:        100          0          0          0 PCI-MSIX-0000:00:06.0   1-edge      nvme0q1
  42:          0        200          0          0 PCI-MSIX-0000:00:06.0   2-edge      nvme0q2
  43:          0          0        300          0 PCI-MSIX-0000:00:06.0   3-edge      nvme0q3
  44:          3          0          0          0 PCI-MSI-0000:00:1f.2    0-edge
 NMI:          0          0          0          0   Non-maskable interrupts
 LOC:      12345      23456      34567      45678   Local timer interrupts
 ERR:          0
 MIS:          0
"""  # noqa: W291 - the kernel pads the header line

INTERRUPTS_2 = """\
           CPU0       CPU1       
 24:          1          0  IO-APIC   5-edge      ACPI:Ged
 26:          0         12  IO-APIC   4-edge      ttyS0
 28:          0          0 PCI-MSIX-0000:00:01.0   0-edge      virtio0-config
 36:      39403     248663 PCI-MSIX-0000:00:02.0   1-edge      virtio1-req.0
NMI:          0          0   Non-maskable interrupts
LOC:     131578     144185   Local timer interrupts
"""  # noqa: W291

ALL_IRQS = [0, 1, 9, 11, 24, 25, 26, 27, 28, 40, 41, 42, 43, 44]
NEW_LINE = "  50:          0          4          0          0 PCI-MSIX-0000:00:07.0   0-edge  virtio5-config"
IRQBALANCE_CONFIG = """\
# Configuration for the irqbalance daemon

# Should irqbalance be enabled?
ENABLED="1"
# Balance the IRQs only once?
ONESHOT="0"
"""
NOT_MOVABLE = "the kernel will not move this IRQ (kernel-managed or per-queue interrupt)"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = make_fake_root(tmp_path, cpus="0-3")
    add_irqs(root, INTERRUPTS_4)
    # /sys/class/net/eth0/device -> ../../../virtio3, i.e. .../0000:00:04.0/virtio3
    for name, cls, addr, virtio in (
        ("eth0", "class/net", "0000:00:04.0", "virtio3"),
        ("vda", "block", "0000:00:05.0", "virtio4"),
    ):
        dev = root / f"sys/devices/pci0000:00/{addr}/{virtio}"
        dev.mkdir(parents=True)
        (root / f"sys/{cls}/{name}").mkdir(parents=True)
        (root / f"sys/{cls}/{name}/device").symlink_to(dev)
    return root


@pytest.fixture
def plugin(root: Path) -> IrqPlugin:
    return IrqPlugin(System(root))


def section(plugin: IrqPlugin, machine: Machine, raw: dict[str, Any]) -> dict[str, Any]:
    """A section as a profile holds it: validated, with the engine's `on_drift` too."""
    return validate(section_schemas({"irq": plugin})["irq"], raw, machine)


def expand(plugin: IrqPlugin, machine: Machine, raw: dict[str, Any]) -> Expansion:
    """What the engine asks the plugin: the section without its own options, nothing owned."""
    return plugin.expand(plugin.options_of(plugin_options(section(plugin, machine, raw))), {})


def wanted(plugin: IrqPlugin, machine: Machine, raw: dict[str, Any]) -> dict[SettingId, Value]:
    return {("irq", t): v for t, v in expand(plugin, machine, raw).settings.items()}


def profile(plugin: IrqPlugin, machine: Machine, name: str, raw: dict[str, Any]) -> Profile:
    return Profile(name, Path(f"{name}.toml"), "", {"irq": section(plugin, machine, raw)}, {})


def engine_for(tmp_path: Path, plugin: IrqPlugin) -> Engine:
    return Engine({"irq": plugin}, Journal(tmp_path / "state"))


def state(plugin: IrqPlugin) -> dict[str, Any]:
    """Everything the instance holds (deep copies; the System by identity)."""
    return {k: v if k == "system" else copy.deepcopy(v) for k, v in vars(plugin).items()}


def affinity(root: Path, irq: int) -> str:
    return (root / f"proc/irq/{irq}/smp_affinity_list").read_text().strip()


def add_irq_50(root: Path, mask: str = "0-3") -> None:
    """A device appeared: IRQ 50 in /proc/interrupts (before the arch rows) and /proc/irq."""
    interrupts = root / "proc/interrupts"
    lines = interrupts.read_text().splitlines()
    interrupts.write_text("\n".join([*lines[:15], NEW_LINE, *lines[15:]]) + "\n")
    put(root, "proc/irq/50/smp_affinity_list", mask)


def set_counts(root: Path, number: int, counts: tuple[int, ...]) -> None:
    """Rewrite one IRQ's counters in the fake /proc/interrupts."""
    path = root / "proc/interrupts"
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        label, _, rest = line.partition(":")
        if label.strip() == str(number):
            tail = " ".join(rest.split()[len(counts) :])
            lines[i] = f"{number:>4}:" + "".join(f"{c:>11}" for c in counts) + "   " + tail
    path.write_text("\n".join(lines) + "\n")


# -- parse_interrupts -----------------------------------------------------------------------


def test_parse_interrupts_four_cpus() -> None:
    cpus, irqs = parse_interrupts(INTERRUPTS_4)
    assert cpus == [0, 1, 2, 3]
    assert [i.number for i in irqs] == ALL_IRQS  # NMI, LOC, ERR, MIS are not IRQs
    by = {i.number: i for i in irqs}
    assert by[0] == Irq(0, ("timer",), "IO-APIC", (44, 0, 0, 0), frozenset())
    assert by[11].actions == ("uhci_hcd:usb1", "virtio2")
    assert by[11].label == "uhci_hcd:usb1,virtio2"
    assert by[11].counts == (0, 31, 0, 5)
    assert by[25] == Irq(
        25,
        ("virtio3-input.0",),
        "PCI-MSIX-0000:00:04.0",
        (1200, 0, 15, 0),
        frozenset({"0000:00:04.0"}),
    )
    assert by[44].actions == () and by[44].label == "PCI-MSI-0000:00:1f.2"
    assert by[44].devices == frozenset({"0000:00:1f.2"})


def test_parse_interrupts_two_cpus() -> None:
    cpus, irqs = parse_interrupts(INTERRUPTS_2)
    assert cpus == [0, 1]
    assert [(i.number, i.actions, i.counts) for i in irqs] == [
        (24, ("ACPI:Ged",), (1, 0)),
        (26, ("ttyS0",), (0, 12)),
        (28, ("virtio0-config",), (0, 0)),
        (36, ("virtio1-req.0",), (39403, 248663)),
    ]
    assert irqs[3].devices == frozenset({"0000:00:02.0"})


def test_parse_interrupts_columns_name_the_online_cpus() -> None:
    text = "           CPU0       CPU2\n  5:   1   2   IO-APIC   5-edge   eth1\n"
    cpus, irqs = parse_interrupts(text)
    assert cpus == [0, 2]
    assert irqs[0].counts == (1, 2) and irqs[0].actions == ("eth1",)
    assert parse_interrupts("") == ([], [])


def test_parse_interrupts_arm_gic_level_column() -> None:
    text = (
        "           CPU0       CPU1\n"
        " 11:      24631      23954     GICv3  27 Level     arch_timer\n"
        " 40:          0          0     GICv3 106 Edge      virtio0, virtio1\n"
    )
    _, irqs = parse_interrupts(text)
    assert [i.actions for i in irqs] == [("arch_timer",), ("virtio0", "virtio1")]


@pytest.mark.parametrize("text", [INTERRUPTS_4, INTERRUPTS_2, "/proc/interrupts"])
def test_parse_interrupts_without_counts_reads_the_same_irqs(text: str) -> None:
    """Skipping the count columns (what an IRQ event does) loses nothing but the counts."""
    if text.startswith("/"):
        text = Path(text).read_text()
    cpus, irqs = parse_interrupts(text)
    quick_cpus, quick = parse_interrupts(text, with_counts=False)
    assert quick_cpus == cpus and quick
    assert [dataclasses.replace(i, counts=()) for i in irqs] == quick


def test_parse_interrupts_without_counts_reads_lines_wider_than_the_padding() -> None:
    """Counts past 10 digits widen their column: such a line is read in full, even when
    the widening is exactly one column's width (its counts then end where others do)."""

    def line(n: int, counts: tuple[int, ...], name: str) -> str:
        return f"{n:>3}:" + "".join(f" {c:>10}" for c in counts) + f"  PCI-MSI {n}-edge  {name}"

    text = "\n".join([
        "            CPU0       CPU1       CPU2",
        line(24, (1, 2, 3), "virtio0-config"),
        line(25, (12_345_678_901, 0, 7), "virtio0-input.0"),  # one digit wider
        line(26, (18_446_744_073_709_551_615, 12_345_678_901, 0), "virtio0-output.0"),
        line(27, (0, 0, 0), "nvme0q1"),
    ])  # fmt: skip
    _, full = parse_interrupts(text)
    _, quick = parse_interrupts(text, with_counts=False)
    assert [(i.number, i.actions, i.chip) for i in quick] == [
        (i.number, i.actions, i.chip) for i in full
    ]
    assert [i.actions for i in quick] == [
        ("virtio0-config",),
        ("virtio0-input.0",),
        ("virtio0-output.0",),
        ("nvme0q1",),
    ]


# CPU 2 offline (no column), an IRQ without an action, ERR and MIS with their one count,
# and an arch row after them (as x86 prints PIN).
INTERRUPTS_OFFLINE = """\
            CPU0       CPU1       CPU3       
   0:         44          0          0   IO-APIC   2-edge      timer
  11:          0         31          5   IO-APIC  11-fasteoi   uhci_hcd:usb1, virtio2
  44:          3          0          0   PCI-MSI-0000:00:1f.2    0-edge
  45:          0          0          7   PCI-MSIX-0000:00:03.0   0-edge
 NMI:          0          0          0   Non-maskable interrupts
 LOC:      12345      23456      45678   Local timer interrupts
 ERR:          2
 MIS:          0
 PIN:          0          1          0   Posted-interrupt notification event
"""  # noqa: W291


def test_interrupt_counts_reads_offline_columns_and_one_count_rows() -> None:
    rows = interrupt_counts(INTERRUPTS_OFFLINE)
    assert rows["11"] == ("uhci_hcd:usb1, virtio2", {0: 0, 1: 31, 3: 5})
    assert rows["45"] == ("PCI-MSIX-0000:00:03.0", {0: 0, 1: 0, 3: 7})  # no action: the chip
    assert rows["LOC"] == ("Local timer interrupts", {0: 12345, 1: 23456, 3: 45678})
    assert rows["ERR"] == ("", {0: 2}) and rows["MIS"] == ("", {0: 0})
    assert rows["PIN"] == ("Posted-interrupt notification event", {0: 0, 1: 1, 3: 0})
    assert interrupt_counts("") == {}


@pytest.mark.parametrize(
    "text", [INTERRUPTS_4, INTERRUPTS_2, INTERRUPTS_OFFLINE, "/proc/interrupts"]
)
def test_parse_interrupts_and_interrupt_counts_read_the_irqs_alike(text: str) -> None:
    """The two readings of /proc/interrupts agree on the rows they share, the numbered
    IRQs: the same IRQs, columns, counts, and actions (else the chip)."""
    if text.startswith("/"):
        text = Path(text).read_text()
    cpus, irqs = parse_interrupts(text)
    rows = interrupt_counts(text)
    assert [i.number for i in irqs] == [int(k) for k in rows if k.isdigit()]
    for irq in irqs:
        what, counts = rows[str(irq.number)]
        assert counts == dict(zip(cpus, irq.counts, strict=True))
        assert tuple(a.strip() for a in what.split(",")) == irq.actions or (
            not irq.actions and what == irq.chip
        )
    assert {cpu for _, counts in rows.values() for cpu in counts} <= set(cpus)
    assert parse_interrupts(text, with_counts=False)[1] == [
        dataclasses.replace(i, counts=()) for i in irqs
    ]


# -- matching rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("match", "numbers"),
    [
        ("25", {25}),
        ("40-43", {40, 41, 42, 43}),
        ("virtio3-*", {24, 25, 26}),
        ("nvme0q[12]", {41, 42}),
        ("timer", {0}),
        ("virtio2", {11}),  # the second action of a shared line
        ("uhci*", {11}),
        ("0000:00:05.0", {27, 28}),  # PCI address
        ("eth0", {24, 25, 26}),  # net device -> its PCI function's IRQs
        ("vda", {27, 28}),  # block device
        ("irq:9", {9}),
        ("irq:40-41", {40, 41}),
        ("name:virtio3-config", {24}),
        ("name:25", set()),  # name: never reads a number
        ("name:eth0", set()),  # ... nor a device
        ("dev:eth0", {24, 25, 26}),
        ("dev:0000:00:06.0", {40, 41, 42, 43}),
        ("dev:virtio3-*", set()),  # dev: never globs action names
        ("dev:eth9", set()),
        ("nope", set()),
    ],
)
def test_rule_matching(plugin: IrqPlugin, match: str, numbers: set[int]) -> None:
    assert {i.number for i in plugin.inventory()[1] if plugin.matches(i, match)} == numbers


def test_device_address_follows_the_sysfs_link(plugin: IrqPlugin) -> None:
    assert plugin.device_address("eth0") == "0000:00:04.0"
    assert plugin.device_address("vda") == "0000:00:05.0"
    assert plugin.device_address("eth9") is None


def test_inventory_skips_irqs_without_an_affinity_file(root: Path, plugin: IrqPlugin) -> None:
    shutil.rmtree(root / "proc/irq/0")  # in /proc/interrupts, but gone from /proc/irq
    columns, irqs = plugin.inventory()
    assert [i.number for i in irqs] == ALL_IRQS[1:]
    assert columns == [0, 1, 2, 3]
    for path in (root / "proc/irq").glob("*/smp_affinity_list"):
        path.unlink()  # a kernel without SMP: no IRQ has an affinity
    assert plugin.inventory()[1] == []


# -- expand ------------------------------------------------------------------------------------


def test_rules_first_match_wins_and_others_are_left_alone(
    plugin: IrqPlugin, machine: Machine
) -> None:
    raw = {
        "rule": [
            {"match": "25", "cpus": "2"},
            {"match": "virtio3-*", "cpus": "3"},
            {"match": "eth0", "cpus": "1"},
            {"match": "40-41", "cpus": "0-1"},
        ]
    }
    exp = expand(plugin, machine, raw)
    assert exp.settings == {
        IrqAffinity(25): "2",
        IrqAffinity(24): "3",
        IrqAffinity(26): "3",
        IrqAffinity(40): "0-1",
        IrqAffinity(41): "0-1",
    }
    # What IRQs appearing later are matched against, and the IRQs there were.
    assert exp.rules == IrqRules(
        (
            ("25", CpuSet([2])),
            ("virtio3-*", CpuSet([3])),
            ("eth0", CpuSet([1])),
            ("40-41", CpuSet([0, 1])),
        ),
        CpuSet(),
        frozenset(ALL_IRQS),
    )
    assert exp.notes == {} and exp.refused == {}


def test_isolate_moves_every_unmatched_irq_and_sets_the_default(
    plugin: IrqPlugin, machine: Machine
) -> None:
    exp = expand(plugin, machine, {"isolate": "1", "rule": [{"match": "vda", "cpus": "1"}]})
    assert exp.settings == {
        DefaultAffinity(): "0,2-3",
        **{IrqAffinity(n): "0,2-3" for n in ALL_IRQS if n not in (27, 28)},
        IrqAffinity(27): "1",  # rules still win, even onto an isolated CPU
        IrqAffinity(28): "1",
    }
    assert IrqbalanceBan() not in exp.settings  # irqbalance is not running
    assert exp.rules.isolate == CpuSet([1])


def test_explicit_default_affinity(plugin: IrqPlugin, machine: Machine) -> None:
    assert expand(plugin, machine, {"default_affinity": "0-1"}).settings == {
        DefaultAffinity(): "0-1"
    }
    exp = expand(plugin, machine, {"isolate": "3", "default_affinity": "0"})
    assert exp.settings[DefaultAffinity()] == "0"


def test_isolating_every_cpu_is_not_applicable(plugin: IrqPlugin, machine: Machine) -> None:
    with pytest.raises(NotApplicable, match="isolate = 0-3 leaves no CPU for interrupts"):
        expand(plugin, machine, {"isolate": "all"})


def test_expand_stores_nothing_on_the_plugin(plugin: IrqPlugin, machine: Machine) -> None:
    """A rejected switch must leave no trace: everything an expansion needs later is in it."""
    first = {"isolate": "1", "rule": [{"match": "eth0", "cpus": "2"}]}
    second = {"default_affinity": "0-1", "rule": [{"match": "nvme*", "cpus": "3"}]}
    before = state(plugin)
    expanded = expand(plugin, machine, first)
    expand(plugin, machine, second)
    assert state(plugin) == before
    assert expand(plugin, machine, first) == expanded


# -- read / write ------------------------------------------------------------------------------


def test_default_affinity_is_written_and_read_as_a_mask(root: Path, plugin: IrqPlugin) -> None:
    assert plugin.read(DefaultAffinity()) == "0-3"  # the file holds "f"
    plugin.write(DefaultAffinity(), "0,2-3")  # no expand first (a restore after a restart)
    assert (root / "proc/irq/default_smp_affinity").read_text() == "d"
    assert plugin.read(DefaultAffinity()) == "0,2-3"
    assert plugin.describe(DefaultAffinity(), "0,2-3") == "default IRQ affinity = 0,2-3"


def test_default_affinity_mask_beyond_32_cpus(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, cpus="0-39")
    put(root, "proc/irq/default_smp_affinity", "ff,ffffffff")
    plugin = IrqPlugin(System(root))
    assert plugin.read(DefaultAffinity()) == "0-39"
    plugin.write(DefaultAffinity(), "0,2-39")
    assert (root / "proc/irq/default_smp_affinity").read_text() == "ff,fffffffd"
    assert plugin.read(DefaultAffinity()) == "0,2-39"


def test_irq_affinity_is_a_cpulist(root: Path, plugin: IrqPlugin) -> None:
    plugin.write(IrqAffinity(25), "0,2-3")
    assert affinity(root, 25) == "0,2-3"
    assert plugin.read(IrqAffinity(25)) == "0,2-3"
    assert plugin.same(IrqAffinity(25), "0,2,3", "0,2-3")
    assert not plugin.same(IrqAffinity(25), "0-1", "0-3")
    assert plugin.exists(IrqAffinity(25)) and not plugin.exists(IrqAffinity(99))
    assert plugin.exists(DefaultAffinity()) and plugin.exists(IrqbalanceBan())
    assert plugin.describe(IrqAffinity(25), "1") == "IRQ 25 affinity = 1"


def test_only_an_irq_refusing_means_not_applicable() -> None:
    # Kernel-managed IRQs refuse; the default mask or irqbalance's config refusing is a failure.
    assert IrqAffinity.refusal_means == NOT_MOVABLE
    assert DefaultAffinity.refusal_means is None
    assert IrqbalanceBan.refusal_means is None


def test_watch_files(plugin: IrqPlugin) -> None:
    # The mask can be written in either form, so both files are watched.
    assert files_to_watch(plugin, IrqAffinity(25)) == (
        "proc/irq/25/smp_affinity_list",
        "proc/irq/25/smp_affinity",
    )
    assert files_to_watch(plugin, DefaultAffinity()) == ("proc/irq/default_smp_affinity",)
    assert files_to_watch(plugin, IrqbalanceBan()) == ("etc/default/irqbalance",)


@pytest.mark.parametrize("reason", [EPERM_REASON, EIO_REASON])
def test_refused_irq_write_is_the_kernels_refusal(root: Path, reason: str) -> None:
    """The plugin reports the refusal as it is; the engine decides it means "not applicable"."""
    system = RefusingSystem(root)
    system.refuse["proc/irq/28/smp_affinity_list"] = reason
    with pytest.raises(KernelRefused) as info:
        IrqPlugin(system).write(IrqAffinity(28), "1")
    assert info.value.what == "writing '1' to /proc/irq/28/smp_affinity_list"
    assert info.value.reason == reason


# -- through the engine ----------------------------------------------------------------------


def test_engine_round_trip_restores_every_mask(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    put(root, "proc/irq/41/smp_affinity_list", "1")
    before = tree_values(root, "proc/irq")
    engine = engine_for(tmp_path, plugin)
    raw = {"isolate": "1", "rule": [{"match": "nvme*", "cpus": "2-3"}]}
    p = profile(plugin, machine, "p", raw)
    report = engine.apply(p)
    assert report.not_applicable == {} and engine.not_applicable == {}
    assert report.applied == len(ALL_IRQS) + 1  # every IRQ and the default mask
    assert affinity(root, 0) == "0,2-3" and affinity(root, 41) == "2-3"
    assert (root / "proc/irq/default_smp_affinity").read_text() == "d"
    exp = expand(plugin, machine, raw)
    assert engine.sections == {"irq": Section(p.sections["irq"], exp)}
    assert engine.on_drift("irq") == "reapply"
    assert engine.verify() == []
    assert engine.off() == []
    assert tree_values(root, "proc/irq") == before
    assert Journal(tmp_path / "state").load() is None


@pytest.mark.parametrize(("born", "restored"), [("0,2-3", "0-3"), ("2", "2")])
def test_an_irq_born_with_the_profiles_default_gets_the_machines_default_back(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine, born: str, restored: str
) -> None:
    """A device bound while `isolate` is in force: its IRQ starts with the default mask the
    profile set. Restoring it to that would leave it shielded after `off`; it gets what
    the machine's own default would have given it. A mask its driver chose is its own."""
    engine = engine_for(tmp_path, plugin)
    engine.apply(profile(plugin, machine, "p", {"isolate": "1"}))
    add_irq_50(root, born)
    engine.apply(profile(plugin, machine, "p", {"isolate": "1"}))
    assert affinity(root, 50) == "0,2-3"
    assert engine.originals[("irq", IrqAffinity(50))] == restored
    assert engine.off() == []
    assert affinity(root, 50) == restored


def test_restart_adopts_the_journal_and_restores_every_mask(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    """Targets round-trip through the journal: a new daemon can give back what the last set."""
    before = tree_values(root, "proc/irq")
    engine_for(tmp_path, plugin).apply(profile(plugin, machine, "p", {"isolate": "1"}))
    assert affinity(root, 25) == "0,2-3"
    after_restart = engine_for(tmp_path, IrqPlugin(System(root)))
    adopted = after_restart.adopt()
    assert adopted is not None and adopted.profile == "p"
    assert set(after_restart.applied) == {("irq", DefaultAffinity())} | {
        ("irq", IrqAffinity(n)) for n in ALL_IRQS
    }
    assert after_restart.off() == []
    assert tree_values(root, "proc/irq") == before


@pytest.mark.parametrize("reason", [EPERM_REASON, EIO_REASON])
def test_engine_records_refused_irqs_and_still_applies_the_profile(
    tmp_path: Path, root: Path, machine: Machine, reason: str
) -> None:
    system = RefusingSystem(root)
    system.refuse["proc/irq/28/smp_affinity_list"] = reason
    plugin = IrqPlugin(system)
    engine = engine_for(tmp_path, plugin)
    report = engine.apply(profile(plugin, machine, "p", {"isolate": "1"}))
    refused = {("irq", IrqAffinity(28)): Refused("0,2-3", f"{NOT_MOVABLE}: {reason}")}
    assert report.not_applicable == refused
    assert engine.not_applicable == refused
    assert engine.profile == "p"
    assert report.applied == len(ALL_IRQS)  # the other 13 IRQs and the default mask
    assert affinity(root, 28) == "0-3" and affinity(root, 27) == "0,2-3"
    assert engine.verify() == []  # a refused IRQ is not drift
    assert engine.off() == []
    assert affinity(root, 27) == "0-3"
    assert ("proc/irq/28/smp_affinity_list", "0-3") not in system.writes  # never "restored"


def test_engine_write_accepted_but_mask_kept_is_not_applicable(
    tmp_path: Path, root: Path, machine: Machine
) -> None:
    system = RefusingSystem(root)
    system.ignore.add("proc/irq/25/smp_affinity_list")
    plugin = IrqPlugin(system)
    engine = engine_for(tmp_path, plugin)
    report = engine.switch(wanted(plugin, machine, {"rule": [{"match": "eth0", "cpus": "2"}]}), "p")
    assert report.not_applicable == {
        ("irq", IrqAffinity(25)): Refused(
            "2", f"{NOT_MOVABLE}: the kernel accepted the write but kept '0-3'"
        )
    }
    assert affinity(root, 24) == "2" and affinity(root, 26) == "2"
    assert ("irq", IrqAffinity(25)) not in engine.applied


def test_engine_refused_default_mask_fails_and_rolls_back(
    tmp_path: Path, root: Path, machine: Machine
) -> None:
    """Only IRQs declare a refusal "not applicable": the default mask refusing fails the step."""
    system = RefusingSystem(root)
    system.refuse["proc/irq/default_smp_affinity"] = EPERM_REASON
    plugin = IrqPlugin(system)
    before = tree_values(root, "proc/irq")
    engine = engine_for(tmp_path, plugin)
    # The default mask last, so the IRQ masks written before it must be rolled back.
    settings = wanted(plugin, machine, {"isolate": "1"})
    default = settings.pop(("irq", DefaultAffinity()))
    with pytest.raises(ApplyFailed, match=r"default IRQ affinity = 0,2-3.*EPERM"):
        engine.switch({**settings, ("irq", DefaultAffinity()): default}, "p")
    assert ("proc/irq/25/smp_affinity_list", "0,2-3") in system.writes
    assert tree_values(root, "proc/irq") == before
    assert engine.applied == {} and engine.profile is None
    assert Journal(tmp_path / "state").load() is None


def test_engine_section_refused_as_a_whole_gives_back_what_it_had(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    before = tree_values(root, "proc/irq")
    engine = engine_for(tmp_path, plugin)
    engine.apply(profile(plugin, machine, "p", {"isolate": "1"}))
    report = engine.apply(profile(plugin, machine, "q", {"isolate": "all"}))
    assert report.restored == len(ALL_IRQS) + 1
    assert engine.sections["irq"].expansion.refused == {
        SECTION: "isolate = 0-3 leaves no CPU for interrupts"
    }
    assert engine.profile == "q" and engine.applied == {}
    assert tree_values(root, "proc/irq") == before


def test_verify_reports_an_unreadable_mask_as_drift(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    """A mask that exists but cannot be read is drift to report, not a crash of the check."""
    engine = engine_for(tmp_path, plugin)
    engine.apply(profile(plugin, machine, "p", {"rule": [{"match": "25", "cpus": "2"}]}))
    mask = root / "proc/irq/25/smp_affinity_list"
    mask.unlink()
    mask.mkdir()  # still there, but reading it fails (EISDIR)
    [drift] = engine.verify()
    assert (drift.target, drift.wanted) == (IrqAffinity(25), "2")
    assert str(drift.actual).startswith("<unreadable: reading /proc/irq/25/smp_affinity_list")


# -- new IRQs -----------------------------------------------------------------------------------


def test_changed_when_the_set_of_irqs_changes(
    root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    first = expand(plugin, machine, {"isolate": "1"})
    assert not plugin.changed(first.rules)
    original = (root / "proc/interrupts").read_text()
    add_irq_50(root)
    assert plugin.changed(first.rules)
    again = expand(plugin, machine, {"isolate": "1"})
    assert again.settings[IrqAffinity(50)] == "0,2-3"
    assert not plugin.changed(again.rules)
    set_counts(root, 50, (9, 9, 9, 9))  # counters moving is not a change
    assert not plugin.changed(again.rules)
    (root / "proc/interrupts").write_text(original)  # the IRQ went away again
    assert plugin.changed(again.rules)
    assert not plugin.changed(first.rules)  # each expansion knows its own IRQs


def test_a_device_event_tunes_just_the_irqs_that_came_and_drops_those_that_went(
    root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    """Issue 19: a device appearing beside 4,096 IRQs must not expand them all again;
    the device's own IRQs (27 and 28 of 0000:00:05.0) are read back, since an unbind and
    a bind handled together find them under the same numbers with the default mask."""
    exp = expand(plugin, machine, {"isolate": "1", "rule": [{"match": "50", "cpus": "3"}]})
    owned = dict(exp.settings)
    original = (root / "proc/interrupts").read_text()
    add_irq_50(root)
    event = DeviceEvent("pci", "add", "0000:00:05.0")
    its_own = {IrqAffinity(27): "0,2-3", IrqAffinity(28): "0,2-3"}  # wanted again
    assert plugin.on_device(exp.rules, event, owned) == (
        {IrqAffinity(50): "3"} | its_own,  # its rule, as expand would give it
        {IrqAffinity(50)} | set(its_own),
    )
    assert not plugin.changed(exp.rules)  # the tick has nothing left to pick up
    owned[IrqAffinity(50)] = "3"
    (root / "proc/interrupts").write_text(original)  # unbound: IRQ 50 is gone
    gone = DeviceEvent("pci", "remove", "0000:00:05.0")
    assert plugin.on_device(exp.rules, gone, owned) == (its_own, {IrqAffinity(50)} | set(its_own))
    assert plugin.on_device(exp.rules, gone, owned) == (its_own, set(its_own))  # nothing new
    virtio = DeviceEvent(
        "virtio", "bind", "virtio4", devpath="/devices/pci0000:00/0000:00:05.0/virtio4"
    )
    assert plugin.on_device(exp.rules, virtio, owned) == (its_own, set(its_own))  # its PCI's


def test_section_refused_as_a_whole_is_not_expanded_again_on_every_tick(
    tmp_path: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    """No IRQ came or went: the safety-net tick has nothing to pick up for this section."""
    engine = engine_for(tmp_path, plugin)
    engine.apply(profile(plugin, machine, "p", {"isolate": "all"}))
    assert engine.sections["irq"].expansion.refused
    assert not plugin.changed(engine.sections["irq"].expansion.rules)


# -- irqbalance ---------------------------------------------------------------------------------


def test_irqbalance_running_bans_the_isolated_cpus(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    add_task(root, 812, "irqbalance")
    config = root / "etc/default/irqbalance"
    put(root, "etc/default/irqbalance", IRQBALANCE_CONFIG.rstrip("\n"))
    original = config.read_text()
    assert plugin.irqbalance_pid() == 812
    assert expand(plugin, machine, {"isolate": "1"}).settings[IrqbalanceBan()] == "1"
    off = expand(plugin, machine, {"isolate": "1", "coordinate_irqbalance": False})
    assert IrqbalanceBan() not in off.settings
    no_isolation = expand(plugin, machine, {"rule": [{"match": "1", "cpus": 0}]})
    assert IrqbalanceBan() not in no_isolation.settings

    engine = engine_for(tmp_path, plugin)
    report = engine.apply(profile(plugin, machine, "p", {"isolate": "1"}))
    assert report.not_applicable == {}
    lines = config.read_text().splitlines()
    assert lines[:-1] == original.splitlines()  # every other line is kept as it was
    assert lines[-1].startswith('IRQBALANCE_BANNED_CPULIST="1"')
    assert plugin.read(IrqbalanceBan()) == "1"
    assert engine.verify() == []
    assert plugin.monitor(engine.sections["irq"].expansion.rules).facts["irqbalance"] == (
        "running (pid 812); banned CPUs in /etc/default/irqbalance: 1 (it reads this only at "
        "start, it has no socket to be told through, and systemd could not restart it here: "
        "restart irqbalance to apply)"
    )
    assert engine.off() == []
    assert config.read_text() == original
    assert plugin.read(IrqbalanceBan()) is None


def test_a_process_only_named_irqbalance_is_not_irqbalance(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    """Issue 37: any user may name a process irqbalance; only root's makes latencyd edit
    irqbalance's config and restart the service."""
    put(root, "etc/default/irqbalance", IRQBALANCE_CONFIG.rstrip("\n"))
    original = (root / "etc/default/irqbalance").read_text()
    add_task(root, 812, "irqbalance", uid=1000)
    assert plugin.irqbalance_pid() is None
    assert IrqbalanceBan() not in expand(plugin, machine, {"isolate": "1"}).settings
    engine = engine_for(tmp_path, plugin)
    engine.apply(profile(plugin, machine, "p", {"isolate": "1"}))
    assert (root / "etc/default/irqbalance").read_text() == original
    engine.off()
    add_task(root, 813, "irqbalance", uid=0)
    assert plugin.irqbalance_pid() == 813


class FakeIrqbalanceSocket:
    """irqbalance's command socket (/run/irqbalance/irqbalance<PID>.sock) in the fake
    root: a real listening socket that keeps each command with its sender's uid, as
    irqbalance reads them (SO_PASSCRED). What cannot run here is irqbalance itself: it
    would move this machine's IRQs."""

    def __init__(self, root: Path, pid: int) -> None:
        path = root / f"run/irqbalance/irqbalance{pid}.sock"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.sock.settimeout(5)
        self.commands: list[tuple[str, int]] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                with conn:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
                    data, anc, _, _ = conn.recvmsg(4096, socket.CMSG_SPACE(12))
                    uid = next((struct.unpack("3i", d)[1] for lvl, t, d in anc
                                if t == socket.SCM_CREDENTIALS), -1)  # fmt: skip
                    self.commands.append((data.decode(), uid))

    def close(self) -> None:
        self.sock.close()


def test_irqbalance_is_told_through_its_socket_instead_of_a_restart(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    add_task(root, 812, "irqbalance")
    put(root, "etc/default/irqbalance", IRQBALANCE_CONFIG.rstrip("\n"))
    irqbalance = FakeIrqbalanceSocket(root, 812)
    try:
        engine = engine_for(tmp_path, plugin)
        engine.apply(profile(plugin, machine, "p", {"isolate": "1"}))
        facts = plugin.monitor(engine.sections["irq"].expansion.rules).facts
        assert "restart irqbalance to apply" not in facts["irqbalance"]
        assert engine.off() == []
        wait_for(lambda: len(irqbalance.commands) == 2, timeout=5)
        uid = os.getuid()  # sent with the daemon's credentials: root's, where it runs as root
        assert irqbalance.commands == [("settings cpus 1", uid), ("settings cpus NULL", uid)]
    finally:
        irqbalance.close()


def test_an_irqbalance_started_after_the_profile_is_banned_at_its_exec(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    """Issue 37: banned whenever it starts, not only at the next switch (meanwhile it and
    the drift repair rewrite the same IRQ masks back and forth)."""
    put(root, "etc/default/irqbalance", IRQBALANCE_CONFIG.rstrip("\n"))
    engine = engine_for(tmp_path, plugin)
    engine.apply(profile(plugin, machine, "p", {"isolate": "1"}))
    assert ("irq", IrqbalanceBan()) not in engine.applied  # not running: nothing to ban
    rules = engine.sections["irq"].expansion.rules
    assert declares(plugin, FollowsTasks)
    assert plugin.follows_user_tasks(plugin.options_of(section(plugin, machine, {"isolate": "1"})))
    add_task(root, 900, "irqbalance", uid=1000)  # a user's process of that name: no
    assert plugin.on_task(rules, TaskEvent("comm", 900, 900), engine.owned("irq")) == {}
    add_task(root, 901, "irqbalance")  # root's: its exec
    assert plugin.on_task(rules, TaskEvent("fork", 901, 901), engine.owned("irq")) == {}
    ban = plugin.on_task(rules, TaskEvent("comm", 901, 901), engine.owned("irq"))
    assert ban == {IrqbalanceBan(): "1"}
    engine.extend("irq", ban)
    assert plugin.read(IrqbalanceBan()) == "1"
    assert engine.off() == []
    assert plugin.read(IrqbalanceBan()) is None
    coordinate_off = {"isolate": "1", "coordinate_irqbalance": False}
    assert not plugin.follows_user_tasks(
        plugin.options_of(section(plugin, machine, coordinate_off))
    )


def test_irqbalance_original_ban_is_put_back(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    add_task(root, 812, "irqbalance")
    put(root, "etc/sysconfig/irqbalance", "IRQBALANCE_ARGS=\nIRQBALANCE_BANNED_CPULIST=3")
    assert plugin.irqbalance_file() == "etc/sysconfig/irqbalance"
    assert files_to_watch(plugin, IrqbalanceBan()) == ("etc/sysconfig/irqbalance",)
    assert plugin.read(IrqbalanceBan()) == "3"
    engine = engine_for(tmp_path, plugin)
    engine.apply(profile(plugin, machine, "p", {"isolate": "1-2"}))
    text = (root / "etc/sysconfig/irqbalance").read_text()
    assert text.count("IRQBALANCE_BANNED_CPULIST") == 1
    assert plugin.read(IrqbalanceBan()) == "1-2"
    assert engine.off() == []
    assert plugin.read(IrqbalanceBan()) == "3"
    assert (root / "etc/sysconfig/irqbalance").read_text().startswith("IRQBALANCE_ARGS=\n")
    assert not (root / "etc/default/irqbalance").exists()


def test_without_irqbalance_nothing_is_written(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    add_task(root, 700, "irqbalancer")  # a name that only looks alike
    put(root, "proc/701/comm", "sshd")
    assert plugin.irqbalance_pid() is None
    engine = engine_for(tmp_path, plugin)
    engine.apply(profile(plugin, machine, "p", {"isolate": "1"}))
    assert not (root / "etc").exists()
    assert (
        plugin.monitor(engine.sections["irq"].expansion.rules).facts["irqbalance"] == "not running"
    )
    assert engine.off() == []
    assert not (root / "etc").exists()


# -- monitoring ---------------------------------------------------------------------------------


def test_monitor_counts_interrupts_per_cpu_since_apply(
    root: Path, plugin: IrqPlugin, machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [50.0]
    monkeypatch.setattr(irq_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    rules = expand(plugin, machine, {"isolate": "1"}).rules
    assert plugin.monitor(rules).facts["perf_irq_handler_counts"] == (
        "unavailable: no profile applied"
    )
    plugin.on_applied(rules)
    set_counts(root, 25, (1300, 0, 20, 0))
    set_counts(root, 43, (0, 2, 300, 0))  # 2 more on isolated CPU1
    add_irq_50(root, "1")  # new since apply: all 4 counts are new
    put(root, "proc/irq/25/smp_affinity_list", "0,2-3")
    now[0] = 52.5
    monitor = plugin.monitor(rules)
    [table] = monitor.tables
    assert table.title == "interrupts per CPU since the profile was applied (2.5 s)"
    assert table.columns == ("IRQ", "name", "affinity", "CPU0", "CPU1", "CPU2", "CPU3")
    rows = {r[0]: r for r in table.rows}
    assert rows[25] == (25, "virtio3-input.0", "0,2-3", 100, 0, 5, 0)
    assert rows[43] == (43, "nvme0q3", "0-3", 0, 2, 0, 0)
    assert rows[50] == (50, "virtio5-config", "1", 0, 4, 0, 0)
    assert rows[0] == (0, "timer", "0-3", 0, 0, 0, 0)
    assert table.rows[-1] == ("all", "", "", 100, 6, 5, 0)
    assert monitor.facts == {
        "isolated_cpus": "1",
        "irqs_on_isolated_cpus_since_apply": 6,
        "perf_irq_handler_counts": "unavailable: tracefs is not mounted",
        "irqbalance": "not running",
    }


def test_monitor_takes_the_isolated_cpus_from_the_rules(
    plugin: IrqPlugin, machine: Machine
) -> None:
    isolating = expand(plugin, machine, {"isolate": "1"}).rules
    plain = expand(plugin, machine, {"rule": [{"match": "25", "cpus": "0"}]}).rules
    plugin.on_applied(plain)
    for rules in (plain, None):
        monitor = plugin.monitor(rules)
        assert "isolated_cpus" not in monitor.facts
        assert "irqs_on_isolated_cpus_since_apply" not in monitor.facts
        assert monitor.tables[0].rows[-1] == ("all", "", "", 0, 0, 0, 0)
    # The rules of an earlier expansion still say what they isolated.
    assert plugin.monitor(isolating).facts["isolated_cpus"] == "1"


# -- schema ---------------------------------------------------------------------------------------


def test_schema_defaults_and_errors(plugin: IrqPlugin, machine: Machine) -> None:
    out = section(plugin, machine, {"isolate": "1", "rule": {"match": "eth0", "cpus": 0}})
    assert out["on_drift"] == "reapply" and out["coordinate_irqbalance"] is True
    assert out["rule"][0]["cpus"] == CpuSet([0])
    assert "on_drift" not in plugin_options(out)  # the engine's option, not the plugin's
    with pytest.raises(SchemaError) as info:
        section(plugin, machine, {"rule": [{"match": "eth0"}]})
    assert (info.value.path, info.value.message) == (("rule", 0), "missing required option 'cpus'")
    with pytest.raises(SchemaError, match="on_drift: expected one of reapply, report"):
        section(plugin, machine, {"on_drift": "ignore"})
    with pytest.raises(SchemaError, match="unknown option 'on_drift'"):
        validate(plugin.schema, {"on_drift": "report"}, machine)


def test_an_irq_whose_affinity_the_kernel_made_read_only_is_not_applicable_before_a_write(
    tmp_path: Path, root: Path, plugin: IrqPlugin, machine: Machine
) -> None:
    """procfs makes a kernel-managed IRQ's affinity files read-only: the IRQ is not
    applicable when read, before any write is tried (root could still open the file, for
    the write to be refused), so a plan says what the switch then says."""
    managed = root / "proc/irq/41/smp_affinity_list"
    managed.chmod(0o444)
    engine = engine_for(tmp_path, plugin)
    p = profile(plugin, machine, "p", {"isolate": "1"})
    switch_plan = engine.plan_profile(p)
    planned = {s.target: (s.action, s.reason) for s in switch_plan.settings}
    why = f"{NOT_MOVABLE}: the kernel made proc/irq/41/smp_affinity_list read-only"
    assert planned[IrqAffinity(41)] == ("not applicable", why)
    report = engine.apply(p)
    assert report.not_applicable == {("irq", IrqAffinity(41)): Refused("0,2-3", why)}
    assert managed.read_text().strip() == "0-3"  # never written
    assert engine.verify() == []
