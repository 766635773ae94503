"""irq plugin on real /proc/irq masks (moved and restored)."""

from __future__ import annotations

from pathlib import Path

import pytest
from latencyd.plugins.irq import IrqAffinity, IrqPlugin

from latencyd.core.engine import Engine
from latencyd.core.journal import Journal
from latencyd.cpuset import CpuSet
from latencyd.kernel.procstat import parse_interrupts
from latencyd.kernel.system import System
from tests.wanted import wanted

pytestmark = pytest.mark.usefixtures("kernel_guard")


def irqs() -> list:
    return parse_interrupts(Path("/proc/interrupts").read_text())[1]


def mask(n: int) -> str:
    return Path(f"/proc/irq/{n}/smp_affinity_list").read_text().strip()


@pytest.fixture
def plugin() -> IrqPlugin:
    if len(System("/").online_cpus()) < 2:
        pytest.skip("needs two CPUs")
    return IrqPlugin(System("/"))


@pytest.fixture
def engine(plugin: IrqPlugin, tmp_path: Path) -> Engine:
    return Engine({"irq": plugin}, Journal(tmp_path / "state"))


def test_rule_by_action_glob_moves_and_restores(engine: Engine, plugin: IrqPlugin) -> None:
    target = next(i for i in irqs() if any(a.startswith("virtio4-") for a in i.actions))
    before = mask(target.number)
    engine.switch(wanted(plugin, {"rule": [{"match": "virtio4-*", "cpus": CpuSet([1])}]}), "t")
    assert mask(target.number) == "1"
    assert engine.verify() == []
    engine.off()
    assert mask(target.number) == before


def test_kernel_managed_irq_is_not_applicable_with_reason(
    engine: Engine, plugin: IrqPlugin
) -> None:
    """The virtio-blk request IRQ is kernel-managed: reported, not failed, not drift."""
    blk = [i for i in irqs() if i.devices and plugin.device_address("vda") in i.devices]
    if not blk:
        pytest.skip("no virtio-blk vda here")
    report = engine.switch(wanted(plugin, {"rule": [{"match": "vda", "cpus": CpuSet([1])}]}), "t")
    refused = {t: r.reason for (_, t), r in report.not_applicable.items()}
    managed = [i.number for i in blk if IrqAffinity(i.number) in refused]
    assert managed, f"expected the managed virtio-blk IRQ to be refused; got {refused}"
    for n in managed:
        assert "kernel-managed" in refused[IrqAffinity(n)]
        reason = refused[IrqAffinity(n)]
        assert "read-only" in reason or "EPERM" in reason or "EIO" in reason
    movable = [i.number for i in blk if i.number not in managed]
    for n in movable:
        assert mask(n) == "1"
    assert engine.verify() == []  # refused IRQs are not drift
    engine.off()


def test_isolate_moves_every_movable_irq_off_the_cpu(engine: Engine, plugin: IrqPlugin) -> None:
    report = engine.switch(wanted(plugin, {"isolate": CpuSet([1])}), "t")
    refused = {t for (_, t) in report.not_applicable}
    for irq in irqs():
        if IrqAffinity(irq.number) not in refused:
            assert mask(irq.number) == "0", irq
    assert CpuSet.from_mask(Path("/proc/irq/default_smp_affinity").read_text()) == CpuSet([0])
    engine.off()


def test_drift_is_detected_and_reapplied(engine: Engine, plugin: IrqPlugin) -> None:
    target = next(i for i in irqs() if any(a.startswith("virtio4-") for a in i.actions))
    engine.switch(wanted(plugin, {"rule": [{"match": "virtio4-*", "cpus": CpuSet([1])}]}), "t")
    Path(f"/proc/irq/{target.number}/smp_affinity_list").write_text("0")
    drifts = engine.verify()
    assert [(d.target, d.wanted, d.actual) for d in drifts] == [
        (IrqAffinity(target.number), "1", "0")
    ]
    assert [r["action"] for r in engine.handle_drift(drifts)] == ["reapplied"]
    assert mask(target.number) == "1"
    engine.off()
