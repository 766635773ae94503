"""Per-CPU counters the kernel keeps in /proc, parsed in one place: /proc/interrupts
(every row: numbered IRQs with their chip and actions, and the architecture's rows such
as LOC, CAL, RES), /proc/softirqs, and /proc/schedstat's run time per CPU. The irq
plugin, `measure`'s attribution of what ran on the measured CPUs and the noise watch's
fallback all read them through here. Pure functions of the files' text.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

PCI_ADDR = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")


@dataclass(frozen=True)
class Irq:
    number: int
    actions: tuple[str, ...]
    chip: str
    counts: tuple[int, ...]  # per CPU, in /proc/interrupts column order (or not parsed: ())
    devices: frozenset[str] = field(default_factory=frozenset)

    @property
    def label(self) -> str:
        return ",".join(self.actions) or self.chip


def parse_interrupts(text: str, with_counts: bool = True) -> tuple[list[int], list[Irq]]:
    """/proc/interrupts -> (CPU numbers of the columns, numbered IRQs with their actions).

    The file is IRQs x CPUs numbers (a million on a 256-CPU server with 4,096 IRQs).
    Without `with_counts` the count columns are not read at all: the kernel prints each
    at a fixed width, so where they end on one line is where they end on the next, and
    an IRQ event costs a slice per line. A line where that does not hold (a count wider
    than the kernel pads to) is read in full."""
    lines = text.splitlines()
    cpus = [int(c[3:]) for c in lines[0].split()] if lines else []
    end = 0  # where the count columns end, learnt from the first line read in full
    irqs = []
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        if not label.strip().isdigit():
            continue
        tail = rest[end:].split() if end and _counts_end_at(rest, end) else None
        if with_counts or not tail or tail[0].isdigit():
            fields = rest.split()
            counts = tuple(map(int, fields[: len(cpus)])) if with_counts else ()
            tail = fields[len(cpus) :]
            if not with_counts:
                skipped = _count_columns(len(cpus)).match(rest)
                end = skipped.end() if skipped else 0
        else:
            counts = ()
        chip = tail[0] if tail else ""
        # Kernels with GENERIC_IRQ_SHOW_LEVEL (ARM) print Level/Edge before the actions.
        skip = 3 if tail[2:3] in (["Level"], ["Edge"]) else 2
        actions = " ".join(tail[skip:]) if len(tail) > skip else ""
        names = tuple(a.strip() for a in actions.split(",") if a.strip())
        devices = frozenset(PCI_ADDR.findall(chip))
        irqs.append(Irq(int(label), names, chip, counts, devices))
    return cpus, irqs


def _counts_end_at(rest: str, end: int) -> bool:
    """Whether a line's counts end at `end`: a digit, then a blank. (Right-aligned numbers
    never have a blank after a digit inside a column; a shifted line fails this, or its
    tail starts with a number, which no chip name does.)"""
    return end < len(rest) and rest[end - 1].isdigit() and rest[end].isspace()


@functools.lru_cache(maxsize=4)
def _count_columns(n: int) -> re.Pattern[str]:
    return re.compile(rf"(?:[ \t]+\d+){{{n}}}")


def _columns(header: str) -> list[int]:
    """The CPU numbers of a /proc/interrupts or /proc/softirqs header ("CPU0 CPU1 ...")."""
    return [int(c[3:]) for c in header.split() if c.startswith("CPU")]


def interrupt_counts(text: str) -> dict[str, tuple[str, dict[int, int]]]:
    """Every /proc/interrupts row: key (the IRQ number, or LOC, CAL, ...) -> (its label:
    the actions of a numbered IRQ, the description of the others; count per CPU)."""
    lines = text.splitlines()
    if not lines:
        return {}
    cpus = _columns(lines[0])
    rows = {}
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        key, fields = label.strip(), rest.split()
        counts = {cpu: int(n) for cpu, n in zip(cpus, fields, strict=False) if n.isdigit()}
        tail = fields[len(counts) :]
        if key.isdigit():
            skip = 3 if tail[2:3] in (["Level"], ["Edge"]) else 2
            what = " ".join(tail[skip:]) or (tail[0] if tail else "")
        else:
            what = " ".join(tail)
        rows[key] = (what, counts)
    return rows


def softirq_counts(text: str) -> dict[str, dict[int, int]]:
    """/proc/softirqs: kind (NET_RX, TIMER, ...) -> count per CPU."""
    lines = text.splitlines()
    if not lines:
        return {}
    cpus = _columns(lines[0])
    out = {}
    for line in lines[1:]:
        kind, _, rest = line.partition(":")
        out[kind.strip()] = {c: int(n) for c, n in zip(cpus, rest.split(), strict=False)}
    return out


def schedstat_run_ns(text: str) -> dict[int, int]:
    """/proc/schedstat (CONFIG_SCHEDSTATS): CPU -> nanoseconds tasks have run on it (the
    idle task excluded; the 7th number of each cpuN line)."""
    out = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 7:
            out[int(name[3:])] = int(fields[6])
    return out


def stat_busy_ticks(text: str) -> dict[int, int]:
    """/proc/stat: CPU -> clock ticks (USER_HZ) spent running tasks (user, nice, system;
    IRQ and softirq time are the kernel's own columns, not counted here)."""
    out = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            out[int(name[3:])] = sum(int(f) for f in fields[:3])
    return out
