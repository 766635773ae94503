"""The run: `plan`'s scenarios put in force in turn, round by round, each measured by the
tools while the load runs beside them, and everything started ended whatever happens."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from latencyd.kernel.system import System
from latencyd.tools import ticks
from latencyd.tools.latency import Histogram
from latencyd.tools.measure import MeasureError
from latencyd.tools.measure.counters import attribution, counters, merge_attribution
from latencyd.tools.measure.idle_cost import busy_share
from latencyd.tools.measure.load import control_hog
from latencyd.tools.measure.network import Network
from latencyd.tools.measure.plan import Plan, refit_seconds
from latencyd.tools.measure.processes import Processes
from latencyd.tools.measure.result import result
from latencyd.tools.measure.scenarios import Switcher
from latencyd.tools.measure.scratch import remove_what_dead_runs_left, scratch_dir
from latencyd.tools.measure.tools import missing_tools, run_tool
from latencyd.tools.runguard import Guard


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM ends the run like Ctrl-C: through the clean-up, never around it."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(
    system: System,
    plan: Plan,
    hold: Callable[[str], int],
    release: Callable[[int], None],
    progress: Callable[[str, float], None] = lambda what, share: None,
    status: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Measure `plan`'s scenarios, held with `hold`/`release`, reading the kernel through
    `system`; `status`, the daemon's Status, is read around each scenario's tools for the
    tick on its shielded CPUs."""
    missing = missing_tools(plan.tools)
    if missing:
        raise MeasureError(f"missing measurement tools: {', '.join(missing)}")
    if os.geteuid() != 0:
        raise MeasureError("measuring needs root (network namespaces, SCHED_FIFO, mlock)")
    remove_what_dead_runs_left(system)
    guard = Guard()
    procs = Processes(system, guard)
    switcher = Switcher(hold, release, procs, plan.tuned_etc)
    per_round: dict[str, dict[str, list[Histogram]]] = {t: {} for t in plan.tools}
    blame: dict[str, dict[str, Any]] = {}
    idle: dict[str, list[float]] = {}
    # Per scenario: the tick its watch counted, the booted isolation beside its shield.
    tick_counts: dict[str, ticks.Counted] = {}
    boot: dict[str, Any] = {}
    order: list[list[str]] = []
    previous: str | None = None
    started = time.time()
    steps = plan.rounds * len(plan.scenarios) * len(plan.tools)
    done = 0
    # measure itself is not the application: it reads counters and parses results
    # between rounds, and as the hold's holder it is exempt from the shield, so it keeps
    # to the housekeeping CPUs.
    own_cpus = system.affinity(0)
    begun, seconds, tool_s, seconds_per_round = time.monotonic(), plan.seconds, 0.0, []
    with (
        interruptible(),
        tempfile.TemporaryDirectory(
            prefix=f"latencyd-measure-{os.getpid()}-", dir=scratch_dir()
        ) as tmp,
    ):
        for path in (*plan.scratch, Path(tmp)):
            guard.path(path)
        try:
            system.set_affinity(0, (plan.housekeeping & own_cpus) or own_cpus)
            with Network(procs) as net:
                if plan.load:
                    procs.detach(plan.load, Path(tmp))
                if plan.control_hog:
                    hog = control_hog(Path(tmp), plan.housekeeping, plan.app_cpus)
                    procs.detach(hog, Path(tmp), "hog")
                for r in range(plan.rounds):
                    # Alternate the order too, so no scenario always runs right after another.
                    if plan.order is not None:
                        scenarios = plan.order(r)
                    else:
                        scenarios = plan.scenarios if r % 2 == 0 else plan.scenarios[::-1]
                    order.append(list(scenarios))
                    runs = len(scenarios) * len(plan.tools)
                    if plan.budget_s is not None and r > 0:
                        seconds = refit_seconds(plan.budget_s, time.monotonic() - begun, r,
                                                plan.rounds, tool_s, runs)  # fmt: skip
                    seconds_per_round.append(seconds)
                    tool_s += seconds * runs
                    this_round = replace(plan, seconds=seconds)
                    for scenario in scenarios:
                        if plan.route is not None and previous is not None:
                            for via in plan.route(previous, scenario):
                                switcher.enter(via, plan.holds.get(via), settle=0.0)
                        switcher.enter(scenario, plan.holds.get(scenario))
                        previous = scenario
                        if plan.idle_seconds:
                            progress(f"round {r + 1}/{plan.rounds}: {scenario}: idle",
                                     done / steps)  # fmt: skip
                            idle.setdefault(scenario, []).append(
                                busy_share(system, plan.idle_seconds, plan.app_cpus)
                            )
                        seen = status() if status is not None else None
                        before = counters(plan.app_cpus, system)
                        for tool in plan.tools:
                            progress(f"round {r + 1}/{plan.rounds}: {scenario}: {tool}",
                                     done / steps)  # fmt: skip
                            hist = run_tool(tool, this_round, procs, net, Path(tmp))
                            per_round[tool].setdefault(scenario, []).append(hist)
                            done += 1
                        part = attribution(before, counters(plan.app_cpus, system), plan.app_cpus)
                        blame[scenario] = merge_attribution(blame.get(scenario, {}), part)
                        if status is not None:
                            now = status()
                            boot[scenario] = now.get("boot")
                            window = ticks.counted(seen, now)
                            if window is not None:
                                was = tick_counts.get(scenario, ticks.Counted())
                                tick_counts[scenario] = was.plus(window)
        finally:
            try:
                switcher.leave()
            finally:  # whatever leave raised, the processes end, and the guard with them
                procs.end_all()
                guard.done()
                system.set_affinity(0, own_cpus)
    progress("done", 1.0)
    out = result(plan, per_round, blame, order, started)
    out["plan"]["seconds_per_round"] = seconds_per_round
    if idle:
        out["idle_busy_pct"] = {s: round(100 * sum(v) / len(v), 2) for s, v in idle.items()}
    if switcher.tuned.put_back:
        out["tuned_left_put_back"] = switcher.tuned.put_back
    tick = {s: t for s in plan.scenarios if (t := ticks.report(boot.get(s), tick_counts.get(s)))}
    if tick:
        out["tick"] = tick
    return out
