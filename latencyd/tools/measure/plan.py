"""What a measurement run measures (scenarios, CPUs, tools, rounds) and the time it may
take: the estimate, and with a budget the seconds each later round gets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from latencyd.cpuset import CpuSet


@dataclass
class Plan:
    scenarios: list[str]
    app_cpus: CpuSet
    housekeeping: CpuSet
    seconds: float  # per tool, per scenario, per round
    rounds: int
    tools: list[str]
    load: list[str] | None = None  # a command line run for the whole measurement
    idle_seconds: float = 0.0  # per scenario and round: CPU busy share with no traffic
    tuned_etc: Path = Path("/etc/tuned")  # the configuration "tuned:NAME" scenarios read
    # What to hold for a scenario, where it is not the scenario's own name (a file).
    holds: dict[str, str] = field(default_factory=dict)
    # Profiles held on the way from one measured scenario to the next, not measured
    # (attribution walks the daemon there one group of settings at a time).
    route: Callable[[str, str], list[str]] | None = None
    control_hog: bool = False  # run the control hog (load.CONTROL_HOG) for the whole measurement
    order: Callable[[int], list[str]] | None = None  # round -> its scenarios' order
    scratch: tuple[Path, ...] = ()  # the caller's temporary directories: the guard's too
    # The whole run's time, if it has one (--budget): the rounds after the first get the
    # seconds that fit what is left, at what the rounds so far cost besides the tools.
    budget_s: float | None = None

    @property
    def estimate_s(self) -> float:
        per = len(self.tools) * (self.seconds + 1) + 1 + self.idle_seconds
        return self.rounds * len(self.scenarios) * per


def refit_seconds(
    budget_s: float, elapsed_s: float, rounds_done: int, rounds: int, tool_s: float, runs: int
) -> float:
    """Seconds per tool run for the rounds left so that the run ends within `budget_s`:
    what a round cost besides its `tool_s` seconds of tool runs (switches, settling,
    starting tools, reading counters: more than estimated on a busy or large machine) is
    taken from the rounds done; never below 1 s (no group is dropped: a budget too small
    for them all is exceeded)."""
    overhead = max(0.0, elapsed_s - tool_s) / rounds_done
    left = rounds - rounds_done
    return max(1.0, (budget_s - elapsed_s - left * overhead) / (left * runs))
