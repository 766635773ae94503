"""tasks benchmark: enumerating every thread the shield judges, /proc directly against psutil.

The shield (`[shield] cpus`) and its reports walk every task: each process's pid,
name, parent and kernel-thread flag, then each thread's id and CPU affinity. latencyd reads
/proc itself (core.system.System.tasks, the plugin's thread_ids, sched_getaffinity per
thread). psutil is the field's library for this; this bench measures both ways over the
same tasks, one process holding N idle threads beside the machine's own:

  latencyd:  System.tasks() + listdir(proc/PID/task) + sched_getaffinity(tid)
  psutil:    process_iter(["pid", "ppid", "name"]) + Process.threads()
             + Process(tid).cpu_affinity()  (and with os.sched_getaffinity(tid) instead)

    python -m bench tasks [--threads 20000] [--rounds 3]
    python -m bench tasks --quick        # 500 threads: that it runs, not figures

Issue 20 asks for the faster at 20,000 threads; the figures decide whether psutil is used
(docs/design-decisions.md). psutil is installed by the dev extra for this comparison only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from bench import arguments
from latencyd.errors import KernelRefused
from latencyd.kernel.system import System
from tests.harness import idle_threads


def with_proc(system: System) -> int:
    seen = 0
    for task in system.tasks():
        for tid in system.entries(f"proc/{task.pid}/task"):
            if tid.isdigit():
                try:
                    system.affinity(int(tid))
                except KernelRefused:
                    continue  # exited meanwhile
                seen += 1
    return seen


def with_psutil(affinity_by_os: bool = False) -> int:
    """psutil all the way, or (affinity_by_os) psutil's listing with the affinity read by
    os.sched_getaffinity: psutil.Process(tid) reads the thread's stat to pin its identity."""
    import psutil

    seen = 0
    for proc in psutil.process_iter(["pid", "ppid", "name"]):
        try:
            threads = proc.threads()
        except psutil.Error:
            continue
        for thread in threads:
            try:
                if affinity_by_os:
                    os.sched_getaffinity(thread.id)
                else:
                    psutil.Process(thread.id).cpu_affinity()
            except (psutil.Error, OSError):
                continue
            seen += 1
    return seen


def best(fn: Callable[[], int], rounds: int) -> tuple[float, int]:
    times, seen = [], 0
    for _ in range(rounds):
        start = time.perf_counter()
        seen = fn()
        times.append(time.perf_counter() - start)
    return min(times), seen


def run(threads: int, rounds: int) -> dict[str, Any]:
    system = System()
    with idle_threads(threads):
        proc_s, proc_seen = best(lambda: with_proc(system), rounds)
        psutil_s, psutil_seen = best(with_psutil, rounds)
        listing_s, _ = best(lambda: with_psutil(affinity_by_os=True), rounds)
    return {
        "threads": threads,
        "rounds": rounds,
        "proc_s": round(proc_s, 4),
        "proc_tasks": proc_seen,
        "psutil_s": round(psutil_s, 4),
        "psutil_tasks": psutil_seen,
        "psutil_over_proc": round(psutil_s / proc_s, 2),
        "psutil_listing_s": round(listing_s, 4),
        "psutil_listing_over_proc": round(listing_s / proc_s, 2),
    }


def main(argv: list[str]) -> int:
    parser = arguments("tasks", __doc__, "500 threads: that it runs, not figures")
    parser.add_argument("--threads", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    r = run(500 if args.quick else args.threads, 1 if args.quick else args.rounds)
    if args.json:
        print(json.dumps(r))
    else:
        print(
            f"every task's threads and affinities, beside one process of {r['threads']:,} "
            f"idle threads (best of {r['rounds']}; {os.cpu_count()} CPUs):\n"
            f"  /proc directly (latencyd): {r['proc_s'] * 1000:8.1f} ms  "
            f"({r['proc_tasks']:,} threads)\n"
            f"  psutil:                    {r['psutil_s'] * 1000:8.1f} ms  "
            f"({r['psutil_tasks']:,} threads)  {r['psutil_over_proc']}x\n"
            f"  psutil listing, os affinity: {r['psutil_listing_s'] * 1000:6.1f} ms  "
            f"{r['psutil_listing_over_proc']}x",
            file=sys.stdout,
        )
    return 0
