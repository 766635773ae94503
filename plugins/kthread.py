"""kthread: pin kernel threads by name — including ones created later — and steer workqueues.

Rules match kernel threads (children of kthreadd) by regex on their name and set
their CPUs and, optionally, scheduling policy. Threads are keyed by pid and start
time, so a recycled pid is never mistaken for the thread that was pinned. New
threads arrive as task events (see latencyd.taskevents) and get their settings
within milliseconds; a periodic rescan is the safety net.

On Linux >= 3.10 writeback runs on the unbound `writeback` workqueue, steered by
its cpumask, not in `flush-*` threads; older kernels' `flush-MAJ:MIN` threads are
matched by the rules like any other thread.

`isolate_tasks` also moves user tasks off the given CPUs, except an allow-list.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.plugin import Plugin, Value
from latencyd.schema import Choice, Cpus, Int, ListOf, Option, Regex, Schema, Str, Table
from latencyd.system import POLICIES, System, Task
from latencyd.taskevents import TaskEvent

WORKQUEUES = {
    "workqueue/writeback": "sys/devices/virtual/workqueue/writeback/cpumask",
    "workqueue/unbound": "sys/devices/virtual/workqueue/cpumask",
}
RT_POLICIES = ("fifo", "rr")
RESCAN_WITH_EVENTS_S = 60.0


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    cpus: CpuSet
    policy: str | None
    priority: int


def rules_from(options: Mapping[str, Any]) -> list[Rule]:
    return [
        Rule(re.compile(r["match"]), r["cpus"], r.get("policy"), r.get("priority", 0))
        for r in options.get("rule", [])
    ]


def _require_movable(task: Task) -> None:
    if task.is_kthread and not task.pinnable:
        raise NotApplicable(
            f"{task.comm} (pid {task.pid}) is a per-CPU kernel thread "
            "(PF_NO_SETAFFINITY): the kernel does not let anyone move it"
        )


class KthreadPlugin(Plugin):
    name = "kthread"
    summary = "Kernel-thread affinity and policy by name, following threads as they come and go"
    events = frozenset({"thread", "block"})
    schema = Schema(
        options=(
            Option(
                "writeback_cpumask",
                Cpus(),
                "CPUs for the writeback workqueue (/sys/devices/virtual/workqueue/"
                "writeback/cpumask; Linux >= 3.10)",
            ),
            Option(
                "unbound_cpumask",
                Cpus(),
                "CPUs for all unbound workqueues (/sys/devices/virtual/workqueue/cpumask)",
            ),
            Option(
                "isolate_tasks",
                Cpus(),
                "Move every movable user task off these CPUs (and keep new ones off)",
            ),
            Option(
                "allow",
                ListOf(Str()),
                "Name patterns (globs) of user tasks that may stay on isolate_tasks CPUs",
            ),
            Option(
                "on_drift",
                Choice(("reapply", "report")),
                "When something else moves a thread or workqueue this profile owns",
                default="reapply",
            ),
        ),
        tables=(
            Table(
                "rule",
                Schema(
                    options=(
                        Option("match", Regex(), "Regex on the kernel thread's name (searched)"),
                        Option("cpus", Cpus(), "CPUs the matched threads may run on"),
                        Option(
                            "policy",
                            Choice(tuple(POLICIES)),
                            "Scheduling policy: other, fifo, rr, batch or idle",
                        ),
                        Option("priority", Int(0, 99), "Real-time priority for fifo/rr (1-99)"),
                    ),
                    required=("match", "cpus"),
                ),
                "Kernel-thread rules; the first rule whose regex matches a thread wins",
            ),
        ),
    )

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.options: Mapping[str, Any] = {}
        self.rules: list[Rule] = []
        self.last_scan = 0.0
        self.pinned_delays_ns: list[int] = []  # event timestamp -> pinned, for status/bench
        self.young_kthreads: set[int] = set()  # forked by kthreadd, maybe not named yet
        self.moved_tasks: set[str] = set()  # user-task keys we own (scans and events)

    # -- deciding what a task wants --------------------------------------------------
    def kthread_settings(self, task: Task) -> dict[str, Value]:
        if not task.is_kthread or task.pid == 2:
            return {}
        rule = next((r for r in self.rules if r.pattern.search(task.comm)), None)
        if rule is None:
            return {}
        wanted: dict[str, Value] = {f"thread/{task.ident}/affinity": rule.cpus.to_list()}
        if rule.policy is not None:
            prio = rule.priority if rule.policy in RT_POLICIES else 0
            wanted[f"thread/{task.ident}/sched"] = [
                rule.policy,
                max(prio, 1) if rule.policy in RT_POLICIES else 0,
            ]
        return wanted

    def user_task_settings(self, task: Task, threads: list[int] | None = None) -> dict[str, Value]:
        isolate: CpuSet | None = self.options.get("isolate_tasks")
        if not isolate or task.is_kthread:
            return {}
        if any(fnmatch.fnmatchcase(task.comm, p) for p in self.options.get("allow", [])):
            return {}
        housekeeping = self.system.online_cpus() - isolate
        wanted: dict[str, Value] = {}
        for tid in threads if threads is not None else [task.pid]:
            try:
                current = self.system.affinity(tid)
            except KernelRefused:
                continue
            key = f"task/{task.pid}@{task.start_time}/{tid}/affinity"
            if current & isolate:
                wanted[key] = ((current - isolate) or housekeeping).to_list()
                self.moved_tasks.add(key)
            elif key in self.moved_tasks:
                # Already moved by us: keep owning it, or the next rescan would restore it.
                wanted[key] = current.to_list()
        return wanted

    def expand(self, options: Mapping[str, Any]) -> dict[str, Value]:
        self.options = options
        self.rules = rules_from(options)
        wanted: dict[str, Value] = {}
        if "writeback_cpumask" in options:
            wanted["workqueue/writeback"] = options["writeback_cpumask"].to_list()
        if "unbound_cpumask" in options:
            wanted["workqueue/unbound"] = options["unbound_cpumask"].to_list()
        for task in self.system.tasks():
            if task.is_kthread:
                wanted.update(self.kthread_settings(task))
            elif options.get("isolate_tasks"):
                tids = [int(t) for t in self.system.listdir(f"proc/{task.pid}/task") if t.isdigit()]
                wanted.update(self.user_task_settings(task, tids))
        self.moved_tasks = {k for k in wanted if k.startswith("task/")}
        self.last_scan = time.monotonic()
        return wanted

    def follows_user_tasks(self, options: Mapping[str, Any]) -> bool:
        return bool(options.get("isolate_tasks"))

    def on_task(self, event: TaskEvent) -> dict[str, Value]:
        """Settings a just-created or renamed task needs; filters early so forks stay cheap."""
        if event.kind == "fork":
            if event.ppid != 2:  # user forks inherit their parent's (already right) affinity
                return {}
            task = self.system.task(event.tid)
            if task is None:
                return {}
            self.young_kthreads.add(task.pid)
            if len(self.young_kthreads) > 4096:
                self.young_kthreads.clear()
            return self.kthread_settings(task)
        if event.kind == "comm":
            if event.tid in self.young_kthreads:  # older kernels name kthreads after the fork
                self.young_kthreads.discard(event.tid)
                task = self.system.task(event.tid)
                return self.kthread_settings(task) if task is not None else {}
            if self.options.get("isolate_tasks"):
                task = self.system.task(event.pid)
                if task is not None and not task.is_kthread:
                    return self.user_task_settings(task, [event.tid])
        return {}

    # -- plugin verbs ------------------------------------------------------------------
    @staticmethod
    def _split(key: str) -> tuple[str, int, int, str]:
        """thread/PID@START/WHAT or task/PID@START/TID/WHAT -> (kind, tid, start, WHAT)."""
        parts = key.split("/")
        pid, _, start = parts[1].partition("@")
        tid = int(parts[2]) if parts[0] == "task" else int(pid)
        return parts[0], tid, int(start), parts[-1]

    def _task(self, key: str) -> Task:
        kind, tid, start, _ = self._split(key)
        pid = tid if kind == "thread" else int(key.split("/")[1].partition("@")[0])
        task = self.system.task(pid)
        if task is None or task.start_time != start:
            raise NotApplicable(f"pid {pid} has exited")
        return task

    def _require_workqueue(self, key: str) -> None:
        if not self.system.exists(WORKQUEUES[key]):
            raise NotApplicable(
                f"this kernel has no /{WORKQUEUES[key]} (before Linux 3.10, "
                "writeback runs in flush-* threads: match them with a rule)"
            )

    def capture(self, key: str) -> Value:
        if key in WORKQUEUES:
            # Checked here too: the engine captures the original before it applies.
            self._require_workqueue(key)
            return CpuSet.from_mask(self.system.read(WORKQUEUES[key])).to_list()
        _, tid, _, what = self._split(key)
        task = self._task(key)
        if what == "affinity":
            _require_movable(task)
            return self.system.affinity(tid).to_list()
        return list(self.system.scheduler(tid))

    def apply(self, key: str, value: Value) -> None:
        if key in WORKQUEUES:
            self._require_workqueue(key)
            nr = max(self.system.online_cpus()) + 1
            self.system.write(WORKQUEUES[key], CpuSet.from_list(value).to_mask(nr))
            return
        task = self._task(key)
        _, tid, _, what = self._split(key)
        if what == "affinity":
            _require_movable(task)
            try:
                self.system.set_affinity(tid, CpuSet.from_list(value))
            except KernelRefused as exc:
                if self.system.task(task.pid) is None:
                    raise NotApplicable(f"pid {tid} exited before it could be pinned") from exc
                raise NotApplicable(f"{task.comm} (pid {tid}): {exc.reason}") from exc
        else:
            policy, priority = value
            try:
                self.system.set_scheduler(tid, policy, int(priority))
            except KernelRefused as exc:
                raise NotApplicable(f"{task.comm} (pid {tid}): {exc.reason}") from exc

    def same(self, key: str, wanted: Value, actual: Value) -> bool:
        if key in WORKQUEUES or key.endswith("/affinity"):
            return CpuSet.from_list(str(wanted)) == CpuSet.from_list(str(actual))
        return list(wanted) == list(actual)

    def optional(self, key: str) -> bool:
        return key not in WORKQUEUES

    def exists(self, key: str) -> bool:
        if key in WORKQUEUES:
            return self.system.exists(WORKQUEUES[key])
        try:
            self._task(key)
        except NotApplicable:
            return False
        return True

    def changed(self) -> bool:
        """The periodic rescan: the safety net behind task events."""
        return time.monotonic() - self.last_scan >= self.rescan_interval_s

    def describe(self, key: str, value: Value) -> str:
        if key in WORKQUEUES:
            return f"{key} cpumask = {value}"
        kind, tid, _, what = self._split(key)
        task = self.system.task(tid) if kind == "thread" else None
        name = task.comm if task else f"pid {tid}"
        if kind == "task":
            name = f"task {tid}"
        if what == "affinity":
            return f"{name} (pid {tid}) CPUs = {value}"
        return f"{name} (pid {tid}) policy = {value[0]} priority {value[1]}"

    def record_delay(self, event: TaskEvent) -> None:
        if event.time_ns:
            self.pinned_delays_ns.append(
                time.clock_gettime_ns(time.CLOCK_MONOTONIC) - event.time_ns
            )
            del self.pinned_delays_ns[:-1000]

    def status(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if self.pinned_delays_ns:
            d = sorted(self.pinned_delays_ns)
            info["pin_delay_us"] = {
                "count": len(d),
                "p50": round(d[len(d) // 2] / 1000, 1),
                "p99": round(d[min(len(d) - 1, int(len(d) * 0.99))] / 1000, 1),
                "max": round(d[-1] / 1000, 1),
            }
        return info
