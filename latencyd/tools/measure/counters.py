"""What interfered on the measured CPUs while the tools ran: the interrupts, softirqs
and schedule() calls there, and the other tasks that ran there, read from /proc before
and after a scenario's tools and merged over its rounds."""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from latencyd.cpuset import CpuSet
from latencyd.errors import LatencydError
from latencyd.kernel import procstat
from latencyd.kernel.system import System


@dataclass
class Counters:
    irqs: Counter[str] = field(default_factory=Counter)
    softirqs: Counter[str] = field(default_factory=Counter)
    schedule_calls: int = 0  # stays 0 where /proc/schedstat is absent
    tasks: dict[tuple[int, str], int] = field(default_factory=dict)  # (tid, comm) -> ns run
    last_cpu: dict[tuple[int, str], int] = field(default_factory=dict)


MEASURING = {"sockperf", "cyclictest", "oslat"}


def counters(cpus: CpuSet, system: System) -> Counters:
    c = Counters()
    for row, (what, counts) in procstat.interrupt_counts(system.read("proc/interrupts")).items():
        label = procstat.interrupt_label(row, what)
        c.irqs[label] += sum(n for cpu, n in counts.items() if cpu in cpus)
    for kind, counts in procstat.softirq_counts(system.read("proc/softirqs")).items():
        c.softirqs[kind] += sum(n for cpu, n in counts.items() if cpu in cpus)
    with contextlib.suppress(LatencydError):  # only with CONFIG_SCHEDSTATS
        calls = procstat.schedule_calls(system.read("proc/schedstat"))
        c.schedule_calls = sum(n for cpu, n in calls.items() if cpu in cpus)
    for pid in system.entries("proc"):
        if pid.isdigit():
            for task, ran in system.threads(int(pid)):
                c.tasks[task.pid, task.comm] = ran
                c.last_cpu[task.pid, task.comm] = task.last_cpu
    return c


def attribution(before: Counters, after: Counters, cpus: CpuSet) -> dict[str, Any]:
    irqs = {k: v - before.irqs.get(k, 0) for k, v in after.irqs.items()}
    soft = {k: v - before.softirqs.get(k, 0) for k, v in after.softirqs.items()}
    ran: list[dict[str, Any]] = []
    for key, runtime in after.tasks.items():
        delta = runtime - before.tasks.get(key, 0)
        if delta > 0 and after.last_cpu.get(key) in cpus and key[1] not in MEASURING:
            ran.append({"tid": key[0], "comm": key[1], "ran_ms": round(delta / 1e6, 3)})
    ran.sort(key=lambda t: -float(t["ran_ms"]))
    return {
        "interrupts": {k: v for k, v in sorted(irqs.items(), key=lambda kv: -kv[1]) if v > 0},
        "softirqs": {k: v for k, v in sorted(soft.items(), key=lambda kv: -kv[1]) if v > 0},
        "schedule_calls": after.schedule_calls - before.schedule_calls,
        "tasks_that_ran": ran[:15],
    }


def merge_attribution(total: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    if not total:
        return part
    out = dict(total)
    for key in ("interrupts", "softirqs"):
        merged = Counter(total[key])
        merged.update(part[key])
        out[key] = dict(merged.most_common())
    out["schedule_calls"] = total["schedule_calls"] + part["schedule_calls"]
    runs: Counter[tuple[int, str]] = Counter()  # ms run, by (tid, comm)
    for t in (*total["tasks_that_ran"], *part["tasks_that_ran"]):
        runs[(int(t["tid"]), str(t["comm"]))] += float(t["ran_ms"])  # type: ignore[assignment]
    out["tasks_that_ran"] = [
        {"tid": tid, "comm": comm, "ran_ms": round(ms, 3)}
        for (tid, comm), ms in runs.most_common(15)
    ]
    return out
