"""The noise watch: a private tracefs instance tracing interruptions on the shielded CPUs
only, read every interval and tallied by source (latencyd/noise.py decodes).

Why this mechanism, on the kernels this runs on (Linux 6.18 guests): the kernel's own
osnoise/timerlat tracers and hist triggers are not built in; the perf binding cannot read
tracepoint samples back; /proc/interrupts deltas name IRQs but not tasks nor time. A
tracefs instance has its own buffers and CPU mask, so a trace the user runs is never
disturbed, and only the shielded CPUs' events are written at all. The events are
written by the CPU they happen on; the reading is done here, on a housekeeping CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from latencyd import noise
from latencyd.cpuset import CpuSet
from latencyd.system import System

INSTANCE = "latencyd"
BUFFER_KB = 512  # per CPU: ~20,000 events, far more than an interval of a quiet shield


@dataclass
class NoiseInterval:
    """One interval: per CPU, source -> tally."""

    start: float  # CLOCK_MONOTONIC seconds
    end: float
    cpus: dict[int, dict[str, noise.Tally]] = field(default_factory=dict)
    events: int = 0

    def top(self, cpu: int, n: int = 5) -> list[tuple[str, noise.Tally]]:
        tallies = self.cpus.get(cpu, {})
        return sorted(tallies.items(), key=lambda kv: -kv[1].total_ns)[:n]


class NoiseWatch:
    """Open with start(), read with poll() each interval, close with stop()."""

    def __init__(self, system: System, cpus: CpuSet) -> None:
        self.system = system
        self.cpus = cpus
        self.mechanism = "tracefs instance"
        self.base = ""
        self._mounted = False
        self._fds: dict[int, int] = {}
        self._state: dict[int, noise.CpuNoise] = {}
        self._decoder: noise.Decoder | None = None
        self._layout = noise.PageLayout()
        self._since = 0.0

    def start(self, expected: frozenset[int] = frozenset()) -> None:
        self.base, self._mounted = self.system.tracefs()
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
        self._state = {cpu: noise.CpuNoise(expected) for cpu in self.cpus}
        self._since = time.monotonic()

    def expect(self, pids: frozenset[int]) -> None:
        """The tasks that belong on the shielded CPUs (the application's)."""
        for state in self._state.values():
            state.expected = pids

    def poll(self) -> NoiseInterval:
        """What interrupted each CPU since the last poll."""
        assert self._decoder is not None, "start() first"
        now = time.monotonic()
        interval = NoiseInterval(self._since, now)
        for cpu, fd in self._fds.items():
            state = self._state[cpu]
            before = state.events
            for page in self.system.read_trace_pages(fd):
                for ts, payload in noise.page_events(page, self._layout):
                    self._decoder.feed(state, ts, payload)
            interval.events += state.events - before
            interval.cpus[cpu] = state.close(time.monotonic_ns())
        self._since = now
        return interval

    def stop(self) -> None:
        if self._fds or self.base:
            self.system.close_trace_instance(self.base, INSTANCE, self._fds.values())
            self._fds = {}
        if self._mounted:
            self.system.unmount(self.base)
            self._mounted = False

    def _irq_names(self) -> dict[int, str]:
        """IRQ number -> its name as /proc/interrupts shows it (the device's action)."""
        names = {}
        for line in self.system.read("proc/interrupts").splitlines()[1:]:
            head, _, rest = line.partition(":")
            if head.strip().isdigit():
                parts = rest.split()
                names[int(head)] = parts[-1] if parts else ""
        return names
