"""monitor: watch the shielded CPUs' promise, e.g. ``cpus = "${isolated_cores}"`` and
``budget_us = 500``.

A shield promises that nothing but the application runs on its CPUs. This section sets
nothing: while it is in force, the daemon traces every interruption of `cpus` (hardware
and soft IRQs, the local timer, IPIs, other tasks, kernel threads included) in a private
tracefs instance (latencyd/service/noisewatch.py; /proc counters where tracefs cannot be
had, saying so), tallies them by source each interval, and
when a CPU's noise in one interval exceeds `budget_us` (or one interruption
`max_single_us`) it says so: one log line naming the CPU and the top sources, and the
D-Bus signal NoiseExceeded. `status` shows the last interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from latencyd.core.capabilities import ProvidesNoiseWatch
from latencyd.core.plugin import Expansion, Json, Monitor, Plugin, Row, Table, Target, Value
from latencyd.core.schema import Cpus, Int, Schema, option
from latencyd.cpuset import CpuSet
from latencyd.kernel.noise import (
    DEFAULT_INTERVAL_MS,
    HIDDEN_TASK,
    LastInterval,
    WatchPlan,
    ranked,
    task_of,
)
from latencyd.kernel.system import System


@dataclass(frozen=True)
class MonitorOptions:
    cpus: CpuSet = option(
        Cpus(),
        "CPUs whose interruptions are watched (the shield's)",
        required=True,
        compose="union",
    )
    interval_ms: int | None = option(
        Int(100, 60_000),
        "How long noise is tallied before it is judged and reported",
        unit="ms",
    )
    budget_us: int | None = option(
        Int(1),
        "Noise a watched CPU may take in one interval, all sources together; "
        "beyond it, a log line and the NoiseExceeded signal",
        unit="µs",
    )
    max_single_us: int | None = option(
        Int(1), "The longest single interruption a watched CPU may take", unit="µs"
    )


class MonitorPlugin(Plugin[Target, WatchPlan, MonitorOptions], ProvidesNoiseWatch[WatchPlan]):
    name = "monitor"
    summary = "Watch the shielded CPUs: every interruption by source, against a noise budget"
    example: ClassVar[dict[str, Any]] = {"cpus": "1", "interval_ms": 1000, "budget_us": 2000}
    schema = Schema(section=MonitorOptions, watches_only=True)

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.last = LastInterval()  # what the daemon's noise watch saw last (noise_seen)

    def expand(
        self, options: MonitorOptions, owned: Mapping[Target, Value]
    ) -> Expansion[WatchPlan]:
        plan = WatchPlan(
            options.cpus,
            options.interval_ms or DEFAULT_INTERVAL_MS,
            options.budget_us,
            options.max_single_us,
        )
        return Expansion({}, rules=plan)

    def describe(self, target: Target, value: Value) -> str:
        return f"{target} = {value}"  # no targets: the section sets nothing

    def noise_watch(self, rules: WatchPlan | None) -> WatchPlan | None:
        return rules

    def noise_seen(self, last: LastInterval) -> None:
        self.last = last

    def monitor(self, rules: WatchPlan | None) -> Monitor:
        if rules is None:  # not expanded: nothing watched
            return Monitor()
        plan = rules
        facts: dict[str, Json] = {
            "cpus": plan.cpus.to_list(),
            "interval_ms": plan.interval_ms,
            "budget_us": plan.budget_us,
            "max_single_us": plan.max_single_us,
            "mechanism": self.last.mechanism or "not running",
            # The tick since the watch began: `measure` takes it over a run.
            "ticks": self.last.ticks.as_json() if self.last.ticks else None,
        }
        rows = []
        for cpu, tallies in sorted((self.last.cpus or {}).items()):
            for source, t in ranked(tallies, 5):
                rows.append((str(cpu), source, str(t.count), f"{t.total_ns / 1000:.1f}",
                             f"{t.max_ns / 1000:.1f}"))  # fmt: skip
        title = f"noise in the last interval ({self.last.seconds:.2f} s)"
        columns = ("cpu", "source", "count", "total µs", "max µs")
        table = Table(title, columns, tuple(rows), hide_tasks=_without_task_names)
        return Monitor((table,), facts)


def _without_task_names(row: Row) -> Row:
    """A row as a caller who may not see other users' tasks sees it: a task's time and
    events, not its pid and name."""
    cpu, source, *rest = row
    return (cpu, HIDDEN_TASK if isinstance(source, str) and task_of(source) else source, *rest)
