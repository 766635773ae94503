"""Per-CPU counters the kernel keeps in /proc, parsed in one place: /proc/interrupts
(every row: numbered IRQs with their chip and actions, and the architecture's rows such
as LOC, CAL, RES), /proc/softirqs, and /proc/schedstat's run time per CPU. The irq
plugin, `measure`'s attribution of what ran on the measured CPUs and the noise watch's
fallback all read them through here. Pure functions of the files' text.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Iterable, Iterator
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


def interrupt_label(row: str, what: str) -> str:
    """A row of `interrupt_counts` as noise reports name it: a numbered IRQ by its number
    and `irq_name` ("28 virtio1-input.0"), any other row by its name and what the kernel
    calls it ("LOC (Local timer interrupts)")."""
    if row.isdigit():
        return f"{row} {irq_name(what)}".strip()
    return f"{row} ({what})" if what else row


def irq_name(label: str) -> str:
    """The one name an IRQ is shown by in noise reports (`latencyctl top`, the counters
    fallback, `measure`'s attribution), from its label (`Irq.label`, or what
    `interrupt_counts` gives a numbered row: its actions, comma-separated, else its
    chip): the last action (on a shared line, the handler registered last), else the
    chip. An action's name may hold blanks ("PCIe PME"): it is kept whole."""
    return label.rpartition(",")[2].strip()


def parse_interrupts(text: str, with_counts: bool = True) -> tuple[list[int], list[Irq]]:
    """/proc/interrupts -> (CPU numbers of the columns, numbered IRQs with their actions).

    The file is IRQs x CPUs numbers (a million on a 256-CPU server with 4,096 IRQs):
    without `with_counts` the count columns are not read at all (see `_rows`), which is
    what keeps an IRQ event cheap."""
    cpus, rows = _interrupt_rows(text, with_counts)
    irqs = []
    for key, counts, words in rows:
        if key.isdigit():
            chip, actions = _chip_and_actions(words)
            names = tuple(a.strip() for a in actions.split(",") if a.strip())
            devices = frozenset(PCI_ADDR.findall(chip))
            irqs.append(Irq(int(key), names, chip, counts or (), devices))
    return cpus, irqs


def interrupt_counts(text: str) -> dict[str, tuple[str, dict[int, int]]]:
    """Every /proc/interrupts row: key (the IRQ number, or LOC, CAL, ...) -> (its label:
    the actions of a numbered IRQ (else its chip), the description of the others; count
    per CPU)."""
    cpus, rows = _interrupt_rows(text, with_counts=True)
    out = {}
    for key, counts, words in rows:
        if key.isdigit():
            chip, actions = _chip_and_actions(words)
            what = actions or chip
        else:
            what = " ".join(words)
        out[key] = (what, dict(zip(cpus, counts or (), strict=False)))
    return out


# A /proc/interrupts row: (its key, the IRQ number or LOC, ERR, ...; its counts, None when
# not read; the words after them).
_InterruptRow = tuple[str, tuple[int, ...] | None, list[str]]


def _interrupt_rows(text: str, with_counts: bool) -> tuple[list[int], Iterator[_InterruptRow]]:
    """/proc/interrupts -> (the CPU numbers of its columns, its rows): the one reading of
    the file `parse_interrupts` and `interrupt_counts` share."""
    lines = text.splitlines()
    columns = _columns(lines[0]) if lines else []
    return columns, _rows(itertools.islice(lines, 1, None), len(columns), with_counts)


def _rows(lines: Iterable[str], columns: int, with_counts: bool) -> Iterator[_InterruptRow]:
    """The rows after the header, read as far as asked.

    Counts are the numbers a row starts with, one per column at most: ERR and MIS (x86)
    have a single one. Without `with_counts` they are not read at all: the kernel prints
    each at a fixed width, so where they end on one line is where they end on the next,
    and a row costs a slice. A line where that does not hold (a count wider than the
    kernel pads to, or fewer counts) is read in full."""
    end = 0  # where the count columns end, learnt from a line read in full
    for line in lines:
        key, _, rest = line.partition(":")
        if not with_counts and end and _counts_end_at(rest, end):
            words = rest[end:].split()
            if words and not words[0].isdigit():
                yield key.strip(), None, words
                continue
        words = rest.split()
        counts = _leading_counts(words, columns)
        if not with_counts and (skipped := _count_columns(columns).match(rest)):
            end = skipped.end()
        yield key.strip(), counts if with_counts else None, words[len(counts) :]


def _leading_counts(words: list[str], columns: int) -> tuple[int, ...]:
    head = words[:columns]
    try:
        return tuple(map(int, head))
    except ValueError:  # fewer counts than columns (ERR, MIS): only then word by word
        return tuple(map(int, itertools.takewhile(str.isdigit, head)))


def _chip_and_actions(words: list[str]) -> tuple[str, str]:
    """A numbered IRQ's words after its counts -> (its chip, its actions as printed:
    comma-separated, "" for none)."""
    # Kernels with GENERIC_IRQ_SHOW_LEVEL (ARM) print Level/Edge before the actions.
    skip = 3 if words[2:3] in (["Level"], ["Edge"]) else 2
    return (words[0] if words else ""), " ".join(words[skip:])


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


def schedule_calls(text: str) -> dict[int, int]:
    """/proc/schedstat (CONFIG_SCHEDSTATS): CPU -> times schedule() was called on it (the
    3rd number of each cpuN line)."""
    out = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 3:
            out[int(name[3:])] = int(fields[2])
    return out


def stat_ticks(text: str) -> dict[int, tuple[int, ...]]:
    """/proc/stat: CPU -> its clock ticks (USER_HZ) by column: user, nice, system, idle,
    iowait, irq, softirq, steal (then guest and guest_nice, already within user and nice)."""
    out = {}
    for line in text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit():
            out[int(name[3:])] = tuple(int(f) for f in fields)
    return out


def stat_busy_ticks(text: str) -> dict[int, int]:
    """/proc/stat: CPU -> clock ticks spent running tasks (user, nice, system; IRQ and
    softirq time are the kernel's own columns, not counted here)."""
    return {cpu: sum(ticks[:3]) for cpu, ticks in stat_ticks(text).items()}
