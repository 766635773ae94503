"""What a scenario costs while nothing happens: the share of the measured CPUs' time they
stay awake (running, or polling) with no traffic."""

from __future__ import annotations

import contextlib
import time

from latencyd.cpuset import CpuSet
from latencyd.errors import LatencydError
from latencyd.kernel import procstat
from latencyd.kernel.idle import state_counters
from latencyd.kernel.idle import states_of as idle_states_of
from latencyd.kernel.system import System


def wake(system: System, cpus: list[int]) -> None:
    """Bring each of `cpus` out of its idle state by running there for a moment: the
    kernel adds a sleep to a state's residency only when the sleep ends, and a quiet
    tickless CPU sleeps through half a second and more, so a window read without this
    counts a whole sleep in or out at random. A CPU this process may not run on (a
    cpuset) is left as it is."""
    ours = system.affinity(0)
    try:
        for cpu in cpus:
            # Returns on `cpu`: the migration wakes it, which ends its sleep.
            with contextlib.suppress(LatencydError):
                system.set_affinity(0, CpuSet({cpu}))
    finally:
        system.set_affinity(0, ours)


def busy_share(system: System, seconds: float, measured: CpuSet | None = None) -> float:
    """Share of the `measured` CPUs' time (default all) not spent in a real idle state
    (running, or polling) over `seconds`: what a scenario costs while nothing happens.
    Polling happens inside the idle task, so /proc/stat calls it idle; cpuidle residency
    does not (a VM's host sees a polling vCPU as busy, a bare-metal CPU spends the
    power). Without cpuidle, the share of time /proc/stat does not count idle."""
    cpus = system.online_cpus() if measured is None else measured
    # Per CPU with idle states, the ones it sleeps in (POLL is polling: awake); a CPU
    # without states has nothing to count and leaves the share to /proc/stat.
    sleeping = {
        cpu: [s.index for s in states if not s.is_poll]
        for cpu in cpus
        if (states := idle_states_of(system, cpu))
    }

    def asleep_us() -> int:
        wake(system, list(sleeping))
        total = 0
        for cpu, indexes in sleeping.items():
            for i in indexes:
                with contextlib.suppress(LatencydError, ValueError):  # a state gone: skipped
                    total += state_counters(system, cpu, i)[0]
        return total

    def stat() -> tuple[int, int]:
        ticks = procstat.stat_ticks(system.read("proc/stat"))
        mine = [t for cpu, t in ticks.items() if cpu in cpus]
        return sum(sum(t[:8]) for t in mine), sum(t[3] + t[4] for t in mine)

    if not sleeping:
        total0, idle0 = stat()
        time.sleep(seconds)
        total1, idle1 = stat()
        total = total1 - total0
        return (total - (idle1 - idle0)) / total if total else 0.0
    asleep0 = asleep_us()
    start = time.monotonic()
    time.sleep(seconds)
    asleep, wall_us = asleep_us() - asleep0, (time.monotonic() - start) * 1e6
    return max(0.0, 1 - asleep / (wall_us * len(sleeping)))
