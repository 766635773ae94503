"""Take a CPU offline for a test, and put back everything the kernel moved meanwhile.

Offlining a CPU makes the kernel move what was bound to it alone: kernel threads
(threaded IRQ handlers such as irq/25-ACPI:Ged follow their IRQ) get a new CPU
set, and IRQs get a new effective CPU. Bringing the CPU back moves none of it
back. So the state is snapshotted first and restored after:

- kernel-thread affinities, by pid and start time (threads that can be moved);
- IRQ masks (smp_affinity_list), which the kernel rewrites for an IRQ whose mask
  named only the offlined CPU;
- effective IRQ affinity: an IRQ's CPU can only be changed by a new mask that
  takes effect when the IRQ next fires. Each IRQ whose effective CPU moved gets
  its old CPU as mask until it fires (bounded wait), then its own mask back; the
  kernel keeps the current CPU when it is in the new mask. An IRQ that does not
  fire in that time keeps its new CPU: nothing on the machine can move it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PF_NO_SETAFFINITY = 0x04000000
CPU = Path("/sys/devices/system/cpu")


@dataclass
class HotplugState:
    threads: dict[tuple[int, int], set[int]] = field(default_factory=dict)  # (pid, start)
    masks: dict[int, str] = field(default_factory=dict)
    effective: dict[int, str] = field(default_factory=dict)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _kthread(pid: int) -> tuple[int, int] | None:
    """(start time, flags) of a kernel thread, or None for other tasks."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    if stat is None:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[1] != "2":  # children of kthreadd
        return None
    return int(fields[19]), int(fields[6])


def snapshot() -> HotplugState:
    state = HotplugState()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        info = _kthread(int(entry))
        if info is None or info[1] & PF_NO_SETAFFINITY:
            continue
        with contextlib.suppress(OSError):
            state.threads[(int(entry), info[0])] = os.sched_getaffinity(int(entry))
    for irq in Path("/proc/irq").iterdir():
        if irq.name.isdigit():
            mask = _read(irq / "smp_affinity_list")
            effective = _read(irq / "effective_affinity_list")
            if mask is not None:
                state.masks[int(irq.name)] = mask
            if effective:
                state.effective[int(irq.name)] = effective
    return state


def _write(path: Path, value: str) -> None:
    with contextlib.suppress(OSError):  # a managed IRQ refuses: the kernel moves it itself
        path.write_text(value)


def put_back(before: HotplugState, wait_s: float = 0.5) -> None:
    after = snapshot()
    moved = [
        n
        for n, cpus in before.effective.items()
        if after.effective.get(n) not in (None, cpus) and n in before.masks
    ]
    for n in moved:
        _write(Path(f"/proc/irq/{n}/smp_affinity_list"), before.effective[n])
    deadline = time.monotonic() + wait_s
    while moved and time.monotonic() < deadline:
        if all(
            _read(Path(f"/proc/irq/{n}/effective_affinity_list")) == before.effective[n]
            for n in moved
        ):
            break
        time.sleep(0.01)
    for n, mask in before.masks.items():
        if _read(Path(f"/proc/irq/{n}/smp_affinity_list")) not in (None, mask):
            _write(Path(f"/proc/irq/{n}/smp_affinity_list"), mask)
    # Threads last: an IRQ handler thread takes its IRQ's CPU when it next runs.
    for (pid, start), cpus in before.threads.items():
        info = _kthread(pid)
        if info is None or info[0] != start:
            continue  # exited (or the pid was recycled)
        with contextlib.suppress(OSError):
            if os.sched_getaffinity(pid) != cpus:
                os.sched_setaffinity(pid, cpus)


@contextlib.contextmanager
def cpu_offline(cpu: int) -> Iterator[Path]:
    """CPU `cpu` offline inside the block; online again, with what moved put back, after."""
    online = CPU / f"cpu{cpu}" / "online"
    before = snapshot()
    online.write_text("0")
    try:
        yield online
    finally:
        if _read(online) != "1":
            online.write_text("1")
        put_back(before)
