"""What interrupted a shielded CPU, and for how long: tracefs ring-buffer pages decoded
into interruptions by source (issue 17's noise watch).

The kernel writes each traced event into a per-CPU ring buffer; `trace_pipe_raw` hands
out its pages as they are (the field's tools, trace-cmd and rtla, read them the same
way). Decoding them here costs ~1 µs an event, where parsing `trace_pipe`'s text costs
several, and a shielded CPU that runs its application takes 250 timer ticks a second.
The pieces are pure: the event formats from tracefs' `format` files, the page layout
from `events/header_page`, and the accounting of entry/exit pairs into sources.

Sources: a hardware IRQ ("irq 28 virtio1-input.0"), a softirq ("softirq NET_RX"), the
local timer, IPIs (function call, reschedule, irq_work), and a task other than those
expected on the CPU ("task 4242 stress-ng"), kernel threads included. The time of an
interruption nested in a task's run (an IRQ while the task ran) is the interruption's,
not the task's.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

# Entry / exit tracepoints of each kind of interruption, and the source it is named as.
VECTORS = {
    "local_timer": "local timer",
    "call_function": "IPI function call",
    "call_function_single": "IPI function call",
    "reschedule": "IPI reschedule",
    "irq_work": "irq work",
}
EVENTS = (
    ("irq", "irq_handler_entry"),
    ("irq", "irq_handler_exit"),
    ("irq", "softirq_entry"),
    ("irq", "softirq_exit"),
    *(("irq_vectors", f"{v}_{edge}") for v in VECTORS for edge in ("entry", "exit")),
    ("sched", "sched_switch"),
)
SOFTIRQS = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED",
            "HRTIMER", "RCU")  # fmt: skip

# Ring-buffer event header: type_len (5 bits), time_delta (27 bits).
_PADDING, _TIME_EXTEND, _TIME_STAMP = 29, 30, 31
_TS_SHIFT = 27
_COMMIT_MASK = 0xFFFFF  # the commit word's low bits: bytes of data on the page


@dataclass(frozen=True)
class Field:
    name: str
    offset: int
    size: int
    signed: bool
    data_loc: bool = False  # __data_loc: u32 (length << 16 | offset) to the bytes


@dataclass(frozen=True)
class EventFormat:
    system: str
    name: str
    id: int
    fields: Mapping[str, Field]

    def value(self, payload: bytes, name: str) -> int | str:
        f = self.fields[name]
        if f.data_loc:
            (loc,) = struct.unpack_from("<I", payload, f.offset)
            start, length = loc & 0xFFFF, loc >> 16
            return payload[start : start + length].split(b"\0", 1)[0].decode(errors="replace")
        if f.size in (1, 2, 4, 8) and not f.name.endswith("]"):
            code = {1: "b", 2: "h", 4: "i", 8: "q"}[f.size]
            (v,) = struct.unpack_from("<" + (code if f.signed else code.upper()), payload, f.offset)
            return int(v)
        return payload[f.offset : f.offset + f.size].split(b"\0", 1)[0].decode(errors="replace")


_FIELD = re.compile(r"field:(?P<decl>[^;]+);\s*offset:(\d+);\s*size:(\d+);\s*signed:(\d+);")


def parse_format(system: str, text: str) -> EventFormat:
    """An event's `format` file."""
    name = re.search(r"^name: (\S+)", text, re.M)
    ident = re.search(r"^ID: (\d+)", text, re.M)
    if not name or not ident:
        raise ValueError("not a tracefs event format (no name or ID)")
    fields = {}
    for m in _FIELD.finditer(text):
        decl = m["decl"].strip()
        fname = re.sub(r"\[.*\]$", "", decl.split()[-1])
        fields[fname] = Field(
            fname, int(m[2]), int(m[3]), m[4] == "1", decl.startswith("__data_loc")
        )
    return EventFormat(system, name[1], int(ident[1]), fields)


@dataclass(frozen=True)
class PageLayout:
    """From `events/header_page`: where the commit word and the data start."""

    commit_offset: int = 8
    commit_size: int = 8
    data_offset: int = 16


def parse_header_page(text: str) -> PageLayout:
    found = {m[1]: (int(m[2]), int(m[3])) for m in re.finditer(
        r"field: \S+ (\w+);\s*offset:(\d+);\s*size:(\d+);", text)}  # fmt: skip
    commit, data = found.get("commit", (8, 8)), found.get("data", (16, 0))
    return PageLayout(commit[0], commit[1], data[0])


def page_events(page: bytes, layout: PageLayout = PageLayout()) -> Iterator[tuple[int, bytes]]:
    """(timestamp ns, payload) of each event on one ring-buffer page, in order."""
    if len(page) < layout.data_offset:
        return
    (ts,) = struct.unpack_from("<Q", page, 0)
    commit_fmt = "<Q" if layout.commit_size == 8 else "<I"
    (commit,) = struct.unpack_from(commit_fmt, page, layout.commit_offset)
    end = layout.data_offset + min(commit & _COMMIT_MASK, len(page) - layout.data_offset)
    pos = layout.data_offset
    while pos + 4 <= end:
        (header,) = struct.unpack_from("<I", page, pos)
        type_len, delta = header & 0x1F, header >> 5
        pos += 4
        if type_len == _PADDING:
            if delta == 0:
                return  # the rest of the page is empty
            (length,) = struct.unpack_from("<I", page, pos)
            pos += length
            ts += delta
        elif type_len == _TIME_EXTEND:
            (high,) = struct.unpack_from("<I", page, pos)
            ts += (high << _TS_SHIFT) + delta
            pos += 4
        elif type_len == _TIME_STAMP:
            (high,) = struct.unpack_from("<I", page, pos)
            ts = (ts & ~((1 << 59) - 1)) | (high << _TS_SHIFT) | delta
            pos += 4
        else:
            if type_len == 0:
                (length,) = struct.unpack_from("<I", page, pos)
                pos += 4
                length = (length - 4 + 3) & ~3
            else:
                length = type_len * 4
            ts += delta
            yield ts, page[pos : pos + length]
            pos += length


@dataclass
class Tally:
    """One source's interruptions of one CPU in one interval."""

    count: int = 0
    total_ns: int = 0
    max_ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.total_ns += ns
        self.max_ns = max(self.max_ns, ns)


@dataclass
class CpuNoise:
    """Accounting of one CPU's events: open interruptions (a stack, as they nest) and the
    task on the CPU."""

    expected: frozenset[int] = frozenset()  # pids expected here (the application's)
    tallies: dict[str, Tally] = field(default_factory=dict)
    stack: list[tuple[str, int, int]] = field(default_factory=list)  # source, start, nested
    task: tuple[str, int, int] | None = None  # source, start, nested ns inside
    events: int = 0

    def enter(self, source: str, ts: int) -> None:
        self.stack.append((source, ts, 0))

    def exit(self, ts: int) -> None:
        if not self.stack:
            return  # the entry was before the watch began
        source, start, nested = self.stack.pop()
        spent = max(0, ts - start)
        self.tallies.setdefault(source, Tally()).add(spent - nested)
        self._nest(spent)

    def switch(self, ts: int, next_pid: int, next_comm: str) -> None:
        if self.task is not None:
            source, start, nested = self.task
            self.tallies.setdefault(source, Tally()).add(max(0, ts - start - nested))
        self.task = None
        if next_pid != 0 and next_pid not in self.expected:
            self.task = (f"task {next_pid} {next_comm}", ts, 0)

    def _nest(self, spent: int) -> None:
        if self.stack:
            source, start, nested = self.stack[-1]
            self.stack[-1] = (source, start, nested + spent)
        elif self.task is not None:
            source, start, nested = self.task
            self.task = (source, start, nested + spent)

    def close(self, ts: int) -> dict[str, Tally]:
        """The interval's tallies, an unfinished task run counted up to `ts` (and carried
        on into the next interval from there)."""
        if self.task is not None:
            source, start, nested = self.task
            self.tallies.setdefault(source, Tally()).add(max(0, ts - start - nested))
            self.task = (source, ts, 0)
        out, self.tallies = self.tallies, {}
        return out


class Decoder:
    """Turns events of the formats given into entries, exits and switches on a CpuNoise."""

    def __init__(self, formats: Iterable[EventFormat], irq_names: Mapping[int, str]) -> None:
        self.by_id = {f.id: f for f in formats}
        self.irq_names = dict(irq_names)

    def feed(self, cpu: CpuNoise, ts: int, payload: bytes) -> None:
        (event_id,) = struct.unpack_from("<H", payload, 0)
        fmt = self.by_id.get(event_id)
        if fmt is None:
            return
        cpu.events += 1
        name = fmt.name
        if name == "sched_switch":
            comm = fmt.value(payload, "next_comm")
            cpu.switch(ts, int(fmt.value(payload, "next_pid")), str(comm))
        elif name.endswith("_exit"):
            cpu.exit(ts)
        elif name == "irq_handler_entry":
            irq = int(fmt.value(payload, "irq"))
            label = self.irq_names.get(irq) or str(fmt.value(payload, "name"))
            cpu.enter(f"irq {irq} {label}", ts)
        elif name == "softirq_entry":
            vec = int(fmt.value(payload, "vec"))
            kind = SOFTIRQS[vec] if vec < len(SOFTIRQS) else str(vec)
            cpu.enter(f"softirq {kind}", ts)
        elif name.endswith("_entry"):
            cpu.enter(VECTORS.get(name[: -len("_entry")], name), ts)
