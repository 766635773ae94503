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

import dataclasses
import os
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from latencyd.cpuset import CpuSet

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
    # A task that execs while on the CPU keeps running under a new comm with no switch
    # (a `taskset -c 1 prog` arrives as "taskset"): renamed here, or named for its launcher.
    ("sched", "sched_process_exec"),
    # When a task found by an event (its switch in not read) began: the run it reports.
    ("sched", "sched_stat_runtime"),
)
SOFTIRQS = ("HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED",
            "HRTIMER", "RCU")  # fmt: skip

# Ring-buffer event header: type_len (5 bits), time_delta (27 bits).
_PADDING, _TIME_EXTEND, _TIME_STAMP = 29, 30, 31
_TS_SHIFT = 27
_COMMIT_MASK = 0xFFFFF  # the commit word's low bits: bytes of data on the page
# Every event's common fields: common_type (u16), flags, preempt count, common_pid (int).
_COMMON = struct.Struct("<H2xi")


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


DEFAULT_INTERVAL_MS = 1000


@dataclass(frozen=True)
class WatchPlan:
    """What a profile's [monitor] section asks for; the daemon's noise watch follows it."""

    cpus: CpuSet
    interval_ms: int = DEFAULT_INTERVAL_MS
    budget_us: int | None = None
    max_single_us: int | None = None


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

    def merged(self, other: Tally) -> Tally:
        """This and `other` as one source's."""
        return Tally(
            self.count + other.count, self.total_ns + other.total_ns, max(self.max_ns, other.max_ns)
        )


TICK = VECTORS["local_timer"]  # the scheduler tick's source, as both watches name it


@dataclass(frozen=True)
class TickCount:
    """The tick on each watched CPU since the watch began, its intervals added up: status
    shows only the last interval, and `measure` needs the tick over a whole run (it reads
    this before and after, and takes the difference)."""

    since: float  # CLOCK_MONOTONIC s the watch began: another watch, counts from zero
    timed: bool  # False: counts without their time (the /proc counters' fallback)
    seconds: float = 0.0  # the intervals added up
    cpus: Mapping[int, Tally] = field(default_factory=dict)

    def plus(self, interval: Mapping[int, Mapping[str, Tally]], seconds: float) -> TickCount:
        """After one more interval (per CPU, source -> Tally)."""
        cpus = dict(self.cpus)
        for cpu, tallies in interval.items():
            cpus[cpu] = cpus.get(cpu, Tally()).merged(tallies.get(TICK, Tally()))
        return dataclasses.replace(self, seconds=self.seconds + seconds, cpus=cpus)

    def as_json(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "timed": self.timed,
            "seconds": self.seconds,
            "cpus": {
                str(c): {"count": t.count, "total_ns": t.total_ns} for c, t in self.cpus.items()
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TickCount:
        return cls(
            float(data["since"]),
            bool(data["timed"]),
            float(data["seconds"]),
            {int(c): Tally(int(t["count"]), int(t["total_ns"])) for c, t in data["cpus"].items()},
        )


@dataclass
class LastInterval:
    """What the daemon's watch saw last (the monitor plugin shows it in status), and the
    tick since it began."""

    mechanism: str = ""
    seconds: float = 0.0
    cpus: Mapping[int, Mapping[str, Tally]] | None = None
    ticks: TickCount | None = None


UNNAMED = "\0"  # a task's source before its name is known: "task PID \0" (see `named`)


@dataclass
class Span:
    """Time a source holds a CPU: since `start`, less `nested` ns of interruptions inside;
    `pid` for a task's run."""

    source: str
    start: int
    nested: int = 0
    pid: int = 0
    # A task found on the CPU by an event, its switch in not read: it began after `floor`
    # (the last event before, on what ran then: `before`, idle or the application's when
    # None), and its first sched_stat_runtime says when; `before` ran until then.
    floor: int | None = None
    before: Span | None = None

    def spent(self, ts: int) -> int:
        return max(0, ts - self.start - self.nested)


@dataclass
class CpuNoise:
    """Accounting of one CPU's events: open interruptions (a stack, as they nest) and the
    task on the CPU."""

    expected: Callable[[int], bool] = lambda tid: False  # the application's threads
    tallies: dict[str, Tally] = field(default_factory=dict)
    stack: list[Span] = field(default_factory=list)
    task: Span | None = None  # None: idle, or one of the application's threads
    events: int = 0
    # Every event names the task on the CPU (common_pid: the one it interrupted, or a
    # switch's prev), so no task depends on its switch in being read: the first event
    # says what ran when the watch began, from `since` (a busy loop on a quiet CPU may
    # never be switched out); a later one that disagrees with the switches read says one
    # is not in the buffer (lost to an overrun, or never written: the 6.18 guests here
    # write none away from the idle task), and the accounting goes on from there. Such a
    # task is named by the next event that carries its comm, else at the poll (`named`).
    since: int = 0  # CLOCK_MONOTONIC ns: the watch's start, or the last close before that
    on_cpu: int | None = None  # the pid on the CPU (0: idle), None: no event yet
    last: int = 0  # the last event's time
    unseen_switches: int = 0

    def running(self, ts: int, pid: int) -> None:
        """An event that ran on `pid`'s time (its common_pid), not the one on the CPU."""
        if self.on_cpu is None:  # the first event: on the CPU since the watch began
            self._run(self.since, pid, UNNAMED)
            return
        self.unseen_switches += 1
        if self.task is not None:  # as known as it gets: the one before it ends
            self._settle(self.task)
        before, self.task = self.task, None
        self._run(ts, pid, UNNAMED)
        if self.task is not None:
            self.task.floor, self.task.before = self.last, before
        elif before is not None:
            self._add(before, ts)

    def ran(self, ts: int, pid: int, runtime: int, comm: str) -> None:
        """sched_stat_runtime: `pid` (named `comm`) ran `runtime` ns since its switch in
        or its last tick."""
        task = self.task
        if task is not None and task.pid == pid and task.floor is not None:
            self._name(task, comm)
            task.start = max(task.floor, min(task.start, ts - runtime))
            self._settle(task)

    @staticmethod
    def _name(task: Span, comm: str) -> None:
        if comm and task.source.endswith(UNNAMED):
            task.source = f"task {task.pid} {comm}"

    def _settle(self, task: Span) -> None:
        """The start of a task found by an event is as known as it gets: what ran before
        it ends there."""
        if task.before is not None:
            self._add(task.before, task.start)
        task.floor = task.before = None

    def switch(self, ts: int, next_pid: int, next_comm: str, prev_comm: str = "") -> None:
        if self.task is not None:
            self._name(self.task, prev_comm)
        self._run(ts, next_pid, next_comm)

    def enter(self, source: str, ts: int) -> None:
        self.stack.append(Span(source, ts))

    def exit(self, ts: int) -> None:
        if not self.stack:
            return  # the entry was before the watch began
        span = self.stack.pop()
        self._add(span, ts)
        outer = self.stack[-1] if self.stack else self.task
        if outer is not None:  # the time was not the outer one's own
            outer.nested += max(0, ts - span.start)

    def _run(self, ts: int, pid: int, comm: str) -> None:
        """`pid` on the CPU from `ts` (the task before off it then)."""
        if self.task is not None:
            self._settle(self.task)
            self._add(self.task, ts)
        self.task, self.on_cpu = None, pid
        if pid != 0 and not self.expected(pid):
            self.task = Span(f"task {pid} {comm}", ts, pid=pid)

    def exec(self, ts: int, pid: int, old_pid: int, comm: str) -> None:
        """The running task exec'd: its run goes on under its new name (the time before
        under the old), and a thread other than the leader under the leader's pid."""
        if old_pid == self.on_cpu:
            self.switch(ts, pid, comm)

    def _add(self, span: Span, ts: int) -> None:
        self.tallies.setdefault(span.source, Tally()).add(span.spent(ts))

    def close(self, ts: int) -> dict[str, Tally]:
        """The interval's tallies, an unfinished task run counted up to `ts` (and carried
        on into the next interval from there); tasks still unnamed (`named` names them)."""
        if self.task is not None:
            self._settle(self.task)
            self._add(self.task, ts)
            self.task = dataclasses.replace(self.task, start=ts, nested=0)
        self.since = ts if self.on_cpu is None else self.since
        out, self.tallies = self.tallies, {}
        return out


def named(tallies: Mapping[str, Tally], comm_of: Callable[[int], str]) -> dict[str, Tally]:
    """Tallies with each task the event stream did not name named by `comm_of(pid)` (its
    name now, at the poll), merged with its runs that were named."""
    out: dict[str, Tally] = {}
    for source, tally in tallies.items():
        if source.endswith(UNNAMED):
            pid = int(source.split()[1])
            source = f"task {pid} {comm_of(pid)}"
        out[source] = out[source].merged(tally) if source in out else tally
    return out


_SOURCE_TASK = re.compile(r"task (\d+) (.*)", re.DOTALL)


def task_of(source: str) -> tuple[int, str] | None:
    """The pid and command name of a task's source ("task 4242 stress-ng"), else None."""
    m = _SOURCE_TASK.fullmatch(source)
    return (int(m[1]), m[2]) if m else None


HIDDEN_TASK = "task (hidden)"  # a task's source to a caller who may not see its pid and name


class Decoder:
    """Turns events of the formats given into entries, exits and switches on a CpuNoise."""

    def __init__(self, formats: Iterable[EventFormat], irq_names: Mapping[int, str]) -> None:
        self.by_id = {f.id: f for f in formats}
        self.irq_names = dict(irq_names)

    def feed(self, cpu: CpuNoise, ts: int, payload: bytes) -> None:
        event_id, pid = _COMMON.unpack_from(payload, 0)
        fmt = self.by_id.get(event_id)
        if fmt is None:
            return
        cpu.events += 1
        name = fmt.name
        if name == "sched_process_exec":  # by a thread not the leader: the leader's pid now
            pid = int(fmt.value(payload, "old_pid"))
        if pid != cpu.on_cpu:  # (this compare is all that most events cost here)
            cpu.running(ts, pid)
        cpu.last = ts
        if name.startswith("sched_"):  # strings read only where wanted: a switch is common
            task = cpu.task
            unnamed = task is not None and task.source.endswith(UNNAMED)
            if name == "sched_stat_runtime":  # of use only for a task found by an event
                if task is not None and task.floor is not None:  # (always the current's)
                    comm = str(fmt.value(payload, "comm")) if unnamed else ""
                    cpu.ran(ts, pid, int(fmt.value(payload, "runtime")), comm)
                return
            if name == "sched_switch":
                next_pid = int(fmt.value(payload, "next_pid"))
                comm = str(fmt.value(payload, "next_comm")) if next_pid else ""
                prev = str(fmt.value(payload, "prev_comm")) if unnamed else ""
                cpu.switch(ts, next_pid, comm, prev)
                return
        if name == "sched_process_exec":
            # The kernel names the task for the file's base name, cut to 15 bytes.
            comm = os.path.basename(str(fmt.value(payload, "filename")))[:15]
            cpu.exec(ts, int(fmt.value(payload, "pid")), pid, comm)  # pid: its old_pid
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


def ranked(tallies: Mapping[str, Tally], n: int) -> list[tuple[str, Tally]]:
    """The `n` sources that took the most time."""
    return sorted(tallies.items(), key=lambda kv: -kv[1].total_ns)[:n]


@dataclass(frozen=True)
class Breach:
    """A CPU beyond its noise budget in one interval."""

    cpu: int
    total_us: float
    longest_us: float
    why: str  # "budget 500 µs" or "max single 50 µs"
    top: tuple[tuple[str, Tally], ...]

    def sources_json(self) -> list[dict[str, object]]:
        return [
            {"source": s, "count": t.count, "total_us": round(t.total_ns / 1000, 1),
             "max_us": round(t.max_ns / 1000, 1)}
            for s, t in self.top
        ]  # fmt: skip

    def line(self) -> str:
        top = ", ".join(f"{s} {t.total_ns / 1000:.0f} µs ({t.count}x)" for s, t in self.top)
        return (f"CPU {self.cpu} took {self.total_us:.0f} µs of noise in one interval "
                f"(longest {self.longest_us:.0f} µs; {self.why}): {top}")  # fmt: skip


def over_budget(
    cpus: Mapping[int, Mapping[str, Tally]],
    budget_us: int | None,
    max_single_us: int | None,
    top: int = 3,
) -> list[Breach]:
    """The CPUs whose interval broke the budget (all sources' time together) or had one
    interruption longer than max_single_us; each with its top sources by time."""
    out = []
    for cpu, tallies in sorted(cpus.items()):
        total = sum(t.total_ns for t in tallies.values()) / 1000
        longest = max((t.max_ns for t in tallies.values()), default=0) / 1000
        whys = []
        if budget_us is not None and total > budget_us:
            whys.append(f"budget {budget_us} µs")
        if max_single_us is not None and longest > max_single_us:
            whys.append(f"max single {max_single_us} µs")
        if whys:
            out.append(Breach(cpu, total, longest, ", ".join(whys), tuple(ranked(tallies, top))))
    return out


@dataclass
class ReportLimit:
    """Which breaches are reported: a culprit (a CPU's top source) once per `every_s`
    however long it lasts, and at most `per_cpu` reports per CPU in that time, so a stream
    of new culprits (short tasks, a new pid each) cannot flood the log. A new culprit is
    named at once even when another was just reported: a per-CPU silence hid it."""

    every_s: float = 10.0
    per_cpu: int = 3
    sent: dict[int, list[tuple[float, str]]] = field(default_factory=dict)  # cpu -> (when, who)

    def due(self, breach: Breach, now: float) -> bool:
        recent = [(t, who) for t, who in self.sent.get(breach.cpu, []) if now - t < self.every_s]
        culprit = breach.top[0][0] if breach.top else ""
        due = len(recent) < self.per_cpu and all(who != culprit for _, who in recent)
        self.sent[breach.cpu] = [*recent, (now, culprit)] if due else recent
        return due
