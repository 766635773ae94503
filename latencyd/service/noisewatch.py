"""The noise watch: a private tracefs instance tracing interruptions on the shielded CPUs
only, read every interval and tallied by source (latencyd/kernel/noise.py decodes).

Why this mechanism, on the kernels this runs on (Linux 6.18 guests): the kernel's own
osnoise/timerlat tracers and hist triggers are not built in; the perf binding cannot read
tracepoint samples back; /proc counters name IRQs but not tasks nor time (they are the
fallback, CounterWatch, where tracefs cannot be had). A
tracefs instance has its own buffers and CPU mask, so a trace the user runs is never
disturbed, and only the shielded CPUs' events are written at all. The events are
written by the CPU they happen on; the reading is done here, on a housekeeping CPU.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, cast

from latencyd.core.capabilities import ProvidesNoiseWatch, declares
from latencyd.cpuset import CpuSet
from latencyd.errors import LatencydError
from latencyd.kernel import noise, procstat
from latencyd.kernel.noise import (
    Breach,
    LastInterval,
    ReportLimit,
    TickCount,
    WatchPlan,
    over_budget,
)
from latencyd.kernel.system import System, Tracefs

if TYPE_CHECKING:
    from latencyd.service.daemon import Daemon
    from latencyd.service.mainloop import MainLoop

log = logging.getLogger(__name__)

INSTANCE = "latencyd"
BUFFER_KB = 512  # per CPU: ~20,000 events, far more than an interval of a quiet shield


@dataclass
class NoiseInterval:
    """One interval: per CPU, source -> tally."""

    start: float  # CLOCK_MONOTONIC seconds
    end: float
    cpus: dict[int, dict[str, noise.Tally]] = field(default_factory=dict)
    events: int = 0
    pages: int = 0  # ring-buffer pages read (0 with events 0: the kernel handed out nothing)
    unseen_switches: int = 0  # task switches not in the buffers, made up for by the next event


class NoiseWatch:
    """Open with start(), read with poll() each interval, close with stop()."""

    timed: ClassVar[bool] = True  # each interruption's time, not only its count

    def __init__(self, system: System, cpus: CpuSet) -> None:
        self.system = system
        self.cpus = cpus
        self.mechanism = ""
        self.base = ""
        self._tracefs: Tracefs | None = None
        self._fds: dict[int, int] = {}
        self._state: dict[int, noise.CpuNoise] = {}
        self._decoder: noise.Decoder | None = None
        self._layout = noise.PageLayout()
        self._since = 0.0

    def start(self, expected: Callable[[int], bool] = lambda tid: False) -> None:
        self._tracefs = self.system.tracefs()
        self.base = self._tracefs.base
        events = self.base + "/events"
        formats = [
            noise.parse_format(sys_, self.system.read(f"{events}/{sys_}/{name}/format"))
            for sys_, name in noise.EVENTS
            if self.system.exists(f"{events}/{sys_}/{name}/format")
        ]
        self._layout = noise.parse_header_page(self.system.read(f"{events}/header_page"))
        self._decoder = noise.Decoder(formats, self._irq_names())
        present = [(f.system, f.name) for f in formats]
        self._fds = self.system.open_trace_instance(
            self.base, INSTANCE, self.cpus, present, BUFFER_KB
        )
        since = time.monotonic_ns()  # tracing is on (its clock is "mono"): the first interval
        self._state = {cpu: noise.CpuNoise(expected, since=since) for cpu in self.cpus}
        self.mechanism = (
            f"tracefs instance {INSTANCE} ({self._tracefs.where}): the watched CPUs' own "
            "ring buffers, read once an interval (no osnoise/timerlat tracer or hist "
            "triggers needed)"
        )
        self._since = since / 1e9

    def poll(self) -> NoiseInterval:
        """What interrupted each CPU since the last poll."""
        assert self._decoder is not None, "start() first"
        now = time.monotonic()
        interval = NoiseInterval(self._since, now)
        for cpu, fd in self._fds.items():
            state = self._state[cpu]
            before, unseen = state.events, state.unseen_switches
            pages = self.system.read_trace_pages(fd)
            interval.pages += len(pages)
            for page in pages:
                for ts, payload in noise.page_events(page, self._layout):
                    self._decoder.feed(state, ts, payload)
            interval.events += state.events - before
            interval.unseen_switches += state.unseen_switches - unseen
            interval.cpus[cpu] = noise.named(state.close(time.monotonic_ns()), self._comm)
        self._since = now
        return interval

    def stop(self) -> None:
        try:
            if self._fds or self.base:
                self.system.close_trace_instance(self.base, INSTANCE, self._fds.values())
        finally:  # tracefs is given back even when the instance could not be removed
            self._fds, self.base = {}, ""
            if self._tracefs is not None:
                self._tracefs.release()
                self._tracefs = None

    def _comm(self, pid: int) -> str:
        try:
            return self.system.read(f"proc/{pid}/comm").strip()
        except LatencydError:
            return "(exited)"

    def _irq_names(self) -> dict[int, str]:
        """IRQ number -> its name as /proc/interrupts shows it (the device's action)."""
        _, irqs = procstat.parse_interrupts(self.system.read("proc/interrupts"), with_counts=False)
        return {irq.number: procstat.irq_name(irq.label) for irq in irqs}


class CounterWatch:
    """The fallback that always works: /proc counters read each interval. It names every
    IRQ, softirq kind and IPI that fired on a watched CPU (counts, not their time), and
    times the tasks that ran there only together, at the clock tick's resolution
    (/proc/stat), less the application's own run time (its threads' schedstat): no
    pids, no comms, no single interruption's length. Used where tracefs cannot be."""

    # /proc/interrupts rows named as the tracefs watch names them (noise.VECTORS).
    ROWS: ClassVar[dict[str, str]] = {
        "LOC": noise.TICK,
        "CAL": "IPI function call",
        "RES": "IPI reschedule",
        "IWI": "irq work",
    }
    TASKS = "tasks (not named: /proc counters)"
    timed: ClassVar[bool] = False

    def __init__(self, system: System, cpus: CpuSet, why: str) -> None:
        self.system = system
        self.cpus = cpus
        self.mechanism = (
            f"/proc counters ({why}): IRQ, softirq and IPI counts without their time; "
            "other tasks' time together, at the clock tick's resolution"
        )
        self._expected_pids: Callable[[], frozenset[int]] = frozenset
        self._last: dict[str, dict[int, int]] = {}
        self._since = 0.0
        self._tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")

    def start(self, expected_pids: Callable[[], frozenset[int]] = frozenset) -> None:
        self._expected_pids = expected_pids
        self._last = self._read()
        self._since = time.monotonic()

    def _read(self) -> dict[str, dict[int, int]]:
        """source -> CPU -> count (or, for TASKS, nanoseconds) now."""
        out: dict[str, dict[int, int]] = {}
        for row, (what, counts) in procstat.interrupt_counts(
            self.system.read("proc/interrupts")
        ).items():
            label = procstat.interrupt_label(row, what)
            out[f"irq {label}" if row.isdigit() else self.ROWS.get(row, label)] = counts
        for kind, counts in procstat.softirq_counts(self.system.read("proc/softirqs")).items():
            out[f"softirq {kind}"] = counts
        busy = procstat.stat_busy_ticks(self.system.read("proc/stat"))
        tasks = {cpu: ticks * self._tick_ns for cpu, ticks in busy.items()}
        for cpu, ns in self._application_ns().items():
            tasks[cpu] = tasks.get(cpu, 0) - ns
        out[self.TASKS] = tasks
        return out

    def _application_ns(self) -> dict[int, int]:
        """Run time of the expected processes' threads, by the CPU each last ran on."""
        out: dict[int, int] = {}
        for pid in self._expected_pids():
            for task, ran in self.system.threads(pid):
                out[task.last_cpu] = out.get(task.last_cpu, 0) + ran
        return out

    def poll(self) -> NoiseInterval:
        now = time.monotonic()
        current = self._read()
        interval = NoiseInterval(self._since, now)
        for cpu in self.cpus:
            tallies = {}
            for source, counts in current.items():
                delta = counts.get(cpu, 0) - self._last.get(source, {}).get(cpu, 0)
                if delta <= 0:
                    continue
                if source == self.TASKS:
                    tallies[source] = noise.Tally(1, delta, 0)
                else:
                    tallies[source] = noise.Tally(delta, 0, 0)
                    interval.events += delta
            interval.cpus[cpu] = tallies
        self._last, self._since = current, now
        return interval

    def stop(self) -> None:
        self._last = {}


def remove_left_instance(system: System) -> bool:
    """A daemon killed while watching leaves its instance in the kernel, with buffers of
    BUFFER_KB for every CPU, until someone removes it: done at start-up, through tracefs
    where it is mounted or privately (nothing is mounted for it). True if there was one."""
    try:
        tracefs = system.tracefs(mount=False)
    except LatencydError:
        return False
    try:
        return system.remove_trace_instance(tracefs.base, INSTANCE)
    finally:
        tracefs.release()


# -- the daemon's side: follow the section that asks for the watch ([monitor]) ------------


class ShieldWatch:
    """Runs a NoiseWatch while the profile in force has a section whose plugin provides the
    watch (ProvidesNoiseWatch: [monitor]) and asks for one (noise_watch): polls it
    each interval, tells the plugin the last interval for `status` (noise_seen), and says
    when a CPU breaks its budget: a log line and `notify(breach, interval_s)` (the D-Bus
    signal). The application's threads (a hold's process and what it started) are
    expected on the watched CPUs, not noise."""

    def __init__(
        self, daemon: Daemon, loop: MainLoop, notify: Callable[[Breach, float], None]
    ) -> None:
        self.daemon = daemon
        self.loop = loop
        self.notify = notify
        self.plan: WatchPlan | None = None
        self.watch: NoiseWatch | CounterWatch | None = None
        self.ticks: TickCount | None = None  # since this watch began (status: the plugin)
        self.source: int | None = None
        self.limit = ReportLimit()
        self._holds: tuple[int, ...] = ()
        self._roots: frozenset[int] = frozenset()
        self._owner: dict[int, bool] = {}  # tid -> whether it is the application's
        # Called with each interval's tallies (cpu -> source -> Tally): the metrics.
        self.on_interval: list[Callable[[dict[int, dict[str, noise.Tally]]], None]] = []
        self.on_breach: list[Callable[[Breach], None]] = []  # every breach, unlimited
        daemon.after_step.append(self.sync)
        try:
            if remove_left_instance(daemon.system):
                log.warning("removed the tracefs instance %s a killed run left", INSTANCE)
        except LatencydError as exc:
            log.error("the tracefs instance a killed run left stays: %s", exc)

    def _provider(self) -> tuple[str, ProvidesNoiseWatch[Any]] | None:
        """The plugin whose section asks for the watch (ProvidesNoiseWatch), and the name
        its section goes by."""
        found = (
            (n, cast(ProvidesNoiseWatch[Any], p))
            for n, p in self.daemon.plugins.items()
            if declares(p, ProvidesNoiseWatch)
        )
        return next(found, None)

    @property
    def plugin(self) -> ProvidesNoiseWatch[Any] | None:
        """The plugin that provides the watch: it is told what the watch saw (noise_seen)."""
        found = self._provider()
        return found[1] if found else None

    def sync(self) -> None:
        found = self._provider()
        section = self.daemon.engine.sections.get(found[0]) if found else None
        plan = found[1].noise_watch(section.expansion.rules) if found and section else None
        if plan == self.plan:
            return
        self.close()
        self.plan = plan
        if plan is None or found is None:
            return
        plugin = found[1]
        tracing = NoiseWatch(self.daemon.system, plan.cpus)
        watch: NoiseWatch | CounterWatch = tracing
        try:
            tracing.start(self.expected)
        except (LatencydError, OSError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else str(exc)
            log.warning("noise watch: tracefs not usable (%s): /proc counters instead", reason)
            with contextlib.suppress(LatencydError, OSError):
                tracing.stop()  # whatever part of the instance was made
            watch = counters = CounterWatch(self.daemon.system, plan.cpus, f"tracefs: {reason}")
            try:
                counters.start(self.application_pids)
            except LatencydError as exc2:
                log.error("noise watch on CPUs %s not started: %s", plan.cpus, exc2)
                plugin.noise_seen(LastInterval(f"not running: {reason}; {exc2}"))
                return
        self.watch = watch
        self.ticks = TickCount(time.monotonic(), watch.timed)
        plugin.noise_seen(LastInterval(watch.mechanism, ticks=self.ticks))
        self.source = self.loop.timeout_add(plan.interval_ms, self._poll)
        log.info("watching CPUs %s for noise (%s)", plan.cpus, watch.mechanism)

    def _poll(self) -> bool:
        plugin = self.plugin
        if self.watch is None or self.plan is None or plugin is None:
            return False
        interval = self.watch.poll()
        seconds = interval.end - interval.start
        log.debug("noise poll: %d pages, %d events, %d switches not in the buffers",
                  interval.pages, interval.events, interval.unseen_switches)  # fmt: skip
        if self.ticks is not None:
            self.ticks = self.ticks.plus(interval.cpus, seconds)
        plugin.noise_seen(LastInterval(self.watch.mechanism, seconds, interval.cpus, self.ticks))
        for callback in self.on_interval:
            callback(interval.cpus)
        now = time.monotonic()
        for breach in over_budget(interval.cpus, self.plan.budget_us, self.plan.max_single_us):
            for counted in self.on_breach:
                counted(breach)
            if not self.limit.due(breach, now):
                continue
            log.warning("noise: %s", breach.line())
            self.notify(breach, seconds)
        return True

    def application_pids(self) -> frozenset[int]:
        """The processes holding a profile (the counters' fallback counts only their own
        threads as the application's, not what they started)."""
        return frozenset(h.pid for h in self.daemon.holds.values() if h.pid)

    def expected(self, tid: int) -> bool:
        """Whether thread `tid` is the application's: of a process holding a profile, or
        started by one. Asked at each switch to a thread on a watched CPU (thousands a
        second), so the answer is remembered per thread, and the holds are looked at
        again only when they change (cookies are never reused, nor a hold's pid changed)."""
        holds = tuple(self.daemon.holds)
        if holds != self._holds or len(self._owner) > 65_536:
            roots = frozenset(h.pid for h in self.daemon.holds.values() if h.pid)
            self._holds, self._roots, self._owner = holds, roots, {}
        roots = self._roots
        if not roots:
            return False
        if tid not in self._owner:
            self._owner[tid] = self._descends(tid, roots)
        return self._owner[tid]

    def _descends(self, tid: int, roots: frozenset[int]) -> bool:
        pid = tid
        for _ in range(64):  # the process tree's depth, bounded
            if pid in roots:
                return True
            try:
                status = self.daemon.system.read(f"proc/{pid}/status")
            except LatencydError:
                return False
            fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
            tgid, ppid = int(fields.get("Tgid", "0")), int(fields.get("PPid", "0"))
            pid = tgid if tgid not in (0, pid) else ppid
            if pid <= 1:
                return False
        return False

    def close(self) -> None:
        if self.source is not None:
            self.loop.source_remove(self.source)
            self.source = None
        if self.watch is not None:
            try:
                self.watch.stop()
            except LatencydError as exc:
                log.error("noise watch not closed cleanly: %s", exc)
            self.watch = None
        self.ticks = None
        self.plan = None
