"""The CPU-hotplug helper puts back what the kernel moves when a CPU goes offline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hotplug import PF_NO_SETAFFINITY, cpu_offline, put_back, snapshot

pytestmark = pytest.mark.usefixtures("kernel_guard")


def kthread_pid(prefixes: tuple[str, ...]) -> int | None:
    """A movable kernel thread whose name starts with one of `prefixes`."""
    for entry in sorted(os.listdir("/proc"), key=lambda e: (not e.isdigit(), e)):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        if (
            fields[1] == "2"
            and comm.startswith(prefixes)
            and not int(fields[6]) & PF_NO_SETAFFINITY
        ):
            return int(entry)
    return None


def test_put_back_restores_threads_and_masks_the_kernel_moved() -> None:
    """What made `make test` fail on fresh machines: irq/25-ACPI:Ged sat on CPU 1 and the
    hotplug test left it on CPU 0. Here we move things the way hotplug does, by hand."""
    pid = kthread_pid(("irq/", "kcompactd", "khugepaged", "kswapd"))
    if pid is None:
        pytest.skip("no movable kernel thread found")
    before = snapshot()
    original = os.sched_getaffinity(pid)
    os.sched_setaffinity(pid, {0})  # as the kernel does when the thread's CPU goes away
    put_back(before)
    assert os.sched_getaffinity(pid) == original


def test_threaded_irq_handlers_keep_their_cpu_across_hotplug() -> None:
    if not Path("/sys/devices/system/cpu/cpu1/online").exists():
        pytest.skip("CPU 1 cannot be taken offline here")
    pid = kthread_pid(("irq/",)) or kthread_pid(("kcompactd", "khugepaged", "kswapd"))
    if pid is None:
        pytest.skip("no movable kernel thread found")
    original = os.sched_getaffinity(pid)
    os.sched_setaffinity(pid, {1})
    try:
        with cpu_offline(1):
            pass
        assert os.sched_getaffinity(pid) == {1}
    finally:
        os.sched_setaffinity(pid, original)


def test_an_irq_mask_naming_only_the_offlined_cpu_is_put_back() -> None:
    from latencyd.kernel.procstat import parse_interrupts

    if not Path("/sys/devices/system/cpu/cpu1/online").exists():
        pytest.skip("CPU 1 cannot be taken offline here")
    _, irqs = parse_interrupts(Path("/proc/interrupts").read_text())
    rng = next((i.number for i in irqs if any(a.startswith("virtio4-") for a in i.actions)), None)
    if rng is None:
        pytest.skip("needs the virtio4 (virtio-rng) IRQs of these VMs")
    mask = Path(f"/proc/irq/{rng}/smp_affinity_list")
    original = mask.read_text().strip()
    mask.write_text("1")
    try:
        with cpu_offline(1):
            assert mask.read_text().strip() != "1"  # the kernel rewrote it
        assert mask.read_text().strip() == "1"
    finally:
        mask.write_text(original)
