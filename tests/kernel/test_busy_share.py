"""measure's cost of a scenario with no traffic (`busy_share`) on the real CPUs: a hog on
CPU 1 shows as busy, CPU 1 left alone as no busier than what ran there. With a cpuidle
driver it is read from the idle states' residency, without one from /proc/stat: `make
test` runs this on both. What else runs on CPU 1 (another process of the machine's: a
neighbour's build once) is read from /proc/stat around each reading, and allowed for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from latencyd.cpuset import CpuSet
from latencyd.kernel.procstat import stat_ticks
from latencyd.kernel.system import System
from latencyd.tools.measure.idle_cost import busy_share


@pytest.mark.machine_kind
def test_a_hog_is_busy_and_an_idle_cpu_is_not() -> None:
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")
    cpu1 = CpuSet.from_list("1")
    hog = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"])
    try:
        busy = busy_share(System("/"), 1.0, cpu1)
    finally:
        hog.kill()
        hog.wait()
    ours = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})  # this test's own process waits elsewhere
    try:
        idle, ran = beside_what_ran(1.0, cpu1)
    finally:
        os.sched_setaffinity(0, ours)
    assert busy > 0.9, busy
    assert idle - ran < 0.7, (idle, ran)


def stat_ticks_of(cpu: int) -> tuple[int, int]:
    """A CPU's clock ticks in /proc/stat: all of them, and those idle (idle, iowait)."""
    ticks = stat_ticks(Path("/proc/stat").read_text())[cpu]
    return sum(ticks[:8]), ticks[3] + ticks[4]


def beside_what_ran(seconds: float, cpus: CpuSet) -> tuple[float, float]:
    """busy_share of one CPU over `seconds`, and the share /proc/stat counts busy around
    it: what ran there (a polling idle CPU is busy to the first, idle to the second)."""
    (cpu,) = cpus
    all0, idle0 = stat_ticks_of(cpu)
    share = busy_share(System("/"), seconds, cpus)
    all1, idle1 = stat_ticks_of(cpu)
    total = all1 - all0
    return share, (total - (idle1 - idle0)) / total if total else 0.0


@pytest.mark.machine_kind
def test_a_quiet_cpu_reads_as_idle_in_every_short_window() -> None:
    """The kernel adds a sleep to a state's residency only when the sleep ends, and a quiet
    CPU here sleeps half a second and more: without waking the CPU at both ends, a window
    inside one sleep read as all busy, one ending a long sleep as less than idle (seen in
    CI as the control hog's cost read against an idle baseline of 60 %). Read 50 windows
    of 0.1 s, each beside what ran on the CPU meanwhile (/proc/stat counts in 10 ms
    ticks: a window's figure is within a tick or two); one stray burst of a kernel
    thread is allowed, a pattern is not."""
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")
    cpu1 = CpuSet.from_list("1")
    ours = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {0})
    try:
        shares = [beside_what_ran(0.1, cpu1) for _ in range(50)]
        assert os.sched_getaffinity(0) == {0}  # waking CPU 1 moved this process back
    finally:
        os.sched_setaffinity(0, ours)
    beyond = [round(share - ran, 2) for share, ran in shares]
    assert sum(b > 0.3 for b in beyond) <= 1, beyond
