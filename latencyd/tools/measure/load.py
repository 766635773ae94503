"""What runs beside the tools for a whole measurement: a CPU load (`--load`), and the
control hog (`--attribute --control`), a group known to hurt."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from latencyd.cpuset import CpuSet


def cpu_load(cpus: int) -> list[str]:
    """`--load`: stress-ng, a CPU hog per CPU, unpinned as the machine's other work is: a
    load pinned to housekeeping is a shield already, and would show the shield buying
    nothing. CPU hogs only: stress-ng's --io/--vm workers spend long stretches in the
    kernel, which does not preempt them (PREEMPT_NONE), on the housekeeping CPU where the
    shield puts them and where measure's own client runs, so they slow the client and not
    the application (the figures: docs/measurements.md)."""
    return ["stress-ng", "--cpu", str(cpus)]


# The control hog's name (its comm): Python started through a link of this name, parked
# on the housekeeping CPUs (asleep: it must not load them) until the control group's
# [[shield.rule]] moves it onto the measured ones; there it makes itself SCHED_FIFO 1
# and is busy 80 µs of every 100: a real-time task the application cannot preempt, so
# most wake-ups wait, whatever else runs. The period is shorter than a round trip's
# work so the median moves, not only the tail: with gaps long enough for many round
# trips only one of them waits (a plain CPU hog shares the CPU by EEVDF's rules, and
# beside a load may make no difference; the figures: docs/measurements.md). The fifth
# left keeps the CPU's kernel threads alive. It ends by itself when measure dies (even
# by SIGKILL).
CONTROL_HOG = "ltdm-hog"
CONTROL_HOG_LOOP = """
import os, sys, time
parent, measured = int(sys.argv[1]), {int(c) for c in sys.argv[2].split(",")}
busy, period, fifo = 0.00008, 0.0001, False
while True:
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
    there = os.sched_getaffinity(0) <= measured
    if there != fifo:
        policy = os.SCHED_FIFO if there else os.SCHED_OTHER
        os.sched_setscheduler(0, policy, os.sched_param(1 if there else 0))
        fifo = there
    if not there:
        time.sleep(0.02)
        continue
    end = time.perf_counter() + busy
    while time.perf_counter() < end:
        pass
    time.sleep(period - busy)
"""


def control_hog(workdir: Path, parked: CpuSet, measured: CpuSet) -> list[str]:
    """The control hog (CONTROL_HOG_LOOP), parked on `parked` until moved onto `measured`;
    alive only as long as this process."""
    link = workdir / CONTROL_HOG
    link.symlink_to(sys.executable)  # exec through the link: its comm is the link's name
    cpus = ",".join(map(str, measured))
    return ["taskset", "-c", parked.to_list(), str(link), "-c", CONTROL_HOG_LOOP,
            str(os.getpid()), cpus]  # fmt: skip
