"""kthread: pin kernel threads by name — including ones created later — and steer workqueues.

Rules match kernel threads (children of kthreadd) by regex on their name and set
their CPUs and, optionally, scheduling policy. Threads are keyed by pid and start
time, so a recycled pid is never mistaken for the thread that was pinned. New
threads arrive as task events (see latencyd.service.taskevents) and get their settings
within milliseconds; a periodic rescan is the safety net.

On Linux >= 3.10 writeback runs on the unbound `writeback` workqueue, steered by
its cpumask, not in `flush-*` threads; older kernels' `flush-MAJ:MIN` threads are
matched by the rules like any other thread.

Keeping user tasks off the application's CPUs is the shield plugin's (plugins/shield/),
which took over the user-task options that once were here (its Schema.moved says which).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from latencyd.core.capabilities import FollowsTasks
from latencyd.core.movable import MOVE_REFUSED, TaskMover, Tasks, TaskTarget
from latencyd.core.movable import require_movable as _require_movable
from latencyd.core.plugin import (
    CPU_ACTIONS,
    CpuMaskFile,
    Expansion,
    Follows,
    Monitor,
    Settings,
    Target,
    TaskEvent,
    V,
    Value,
    plain_path,
    run_to_end,
    same_cpus,
)
from latencyd.core.schema import Choice, Cpus, Int, Regex, Schema, option, table
from latencyd.cpuset import CpuSet
from latencyd.kernel.owners import THREADS, Claim
from latencyd.kernel.system import POLICIES, System, Task

WORKQUEUES = {
    "writeback": "sys/devices/virtual/workqueue/writeback/cpumask",
    "unbound": "sys/devices/virtual/workqueue/cpumask",
}
RT_POLICIES = ("fifo", "rr")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Workqueue(CpuMaskFile):
    """An unbound workqueue's cpumask ("writeback", or "unbound" for all of them). A kernel
    facility: missing means not supported, said before the file is touched."""

    kind: ClassVar[str] = "workqueue"
    name: str

    def problem(self) -> str | None:
        return None if plain_path(self.name, 1) else f"no workqueue is called {self.name!r}"

    @property
    def rel(self) -> str:
        return WORKQUEUES[self.name]

    def lacking(self, system: System) -> str | None:
        if system.exists(self.rel):
            return None
        return (
            f"this kernel has no /{self.rel} (before Linux 3.10, writeback runs in flush-* "
            "threads: match them with a rule)"
        )

    def describe(self, value: str) -> str:
        return f"workqueue {self.name} cpumask = {value}"


@dataclass(frozen=True)
class KernelThread(TaskTarget[V]):
    """A setting of a kernel thread; pid and start time tell a recycled pid from the thread."""

    pid: int
    start: int

    def task_exists(self, tasks: Tasks) -> bool:
        tasks.task(self, fresh=True)  # a kthread's stat says whether it is there
        return True

    def who(self, tasks: Tasks) -> str:
        task = tasks.system.task(self.pid)
        return f"{task.comm} (pid {self.pid})" if task else f"pid {self.pid}"


@dataclass(frozen=True)
class ThreadAffinity(KernelThread[str]):
    """A kernel thread's CPUs."""

    kind: ClassVar[str] = "thread_affinity"
    refusal_means: ClassVar[str | None] = MOVE_REFUSED

    def read_task(self, tasks: Tasks) -> str:
        _require_movable(tasks.task(self))
        return tasks.system.affinity(self.pid).to_list()

    def write_task(self, tasks: Tasks, value: str) -> None:
        _require_movable(tasks.task(self))
        tasks.system.set_affinity(self.pid, CpuSet.from_list(value))

    def same(self, system: System, wanted: str, actual: str) -> bool:
        return same_cpus(wanted, actual)

    def describe_task(self, tasks: Tasks, value: str) -> str:
        return f"{self.who(tasks)} CPUs = {value}"

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(THREADS),)


Policy = list[str | int]  # [policy name, priority]


@dataclass(frozen=True)
class ThreadPolicy(KernelThread[Policy]):
    """A kernel thread's scheduling policy and priority, as [policy, priority]."""

    kind: ClassVar[str] = "thread_policy"
    refusal_means: ClassVar[str | None] = "the kernel will not change this thread's policy"

    def read_task(self, tasks: Tasks) -> Policy:
        tasks.task(self)
        return list(tasks.system.scheduler(self.pid))

    def write_task(self, tasks: Tasks, value: Policy) -> None:
        tasks.task(self)
        policy, priority = value
        tasks.system.set_scheduler(self.pid, str(policy), int(priority))

    def same(self, system: System, wanted: Policy, actual: Policy) -> bool:
        return list(wanted) == list(actual)

    def describe_task(self, tasks: Tasks, value: Policy) -> str:
        return f"{self.who(tasks)} policy = {value[0]} priority {value[1]}"


KthreadTarget = Workqueue | ThreadAffinity | ThreadPolicy


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    cpus: CpuSet | None  # None: the threads' CPUs are left as they are (a policy-only rule)
    policy: str | None
    priority: int


@dataclass(frozen=True)
class KthreadRules:
    rules: tuple[Rule, ...]
    scanned_at: float  # monotonic time of the expansion: the next rescan is due from here


def _rule_is_whole(rule: Mapping[str, Any]) -> tuple[str, str] | None:
    """A rule sets CPUs, a policy or both (a user process's rule, [[shield.rule]], sets
    CPUs only)."""
    if "cpus" not in rule and "policy" not in rule:
        return "match", "a rule needs cpus or a policy"
    return None


@dataclass(frozen=True)
class KthreadRule:
    """One [[kthread.rule]] entry."""

    match: str = option(Regex(), "Regex on the kernel thread's name (searched)", required=True)
    cpus: CpuSet | None = option(
        Cpus(),
        "CPUs the matched threads may run on (without it, a rule sets "
        "a policy only: per-CPU threads such as ksoftirqd/N keep their CPU)",
    )
    policy: str | None = option(
        Choice(tuple(POLICIES)), "Scheduling policy: other, fifo, rr, batch or idle"
    )
    priority: int | None = option(Int(0, 99), "Real-time priority for fifo/rr (1-99)")


@dataclass(frozen=True)
class KthreadOptions:
    writeback_cpumask: CpuSet | None = option(
        Cpus(),
        "CPUs for the writeback workqueue (/sys/devices/virtual/workqueue/"
        "writeback/cpumask; Linux >= 3.10)",
    )
    unbound_cpumask: CpuSet | None = option(
        Cpus(), "CPUs for all unbound workqueues (/sys/devices/virtual/workqueue/cpumask)"
    )
    rule: tuple[KthreadRule, ...] = table(
        KthreadRule,
        "Kernel-thread rules (user processes: [[shield.rule]]); the first rule "
        "whose regex matches wins",
        consistent=_rule_is_whole,
        selectors=("match",),
    )


def rules_from(options: KthreadOptions) -> tuple[Rule, ...]:
    return tuple(Rule(re.compile(r.match), r.cpus, r.policy, r.priority or 0) for r in options.rule)


class KthreadPlugin(
    TaskMover[KthreadTarget, KthreadRules, KthreadOptions],
    FollowsTasks[KthreadRules, KthreadOptions],
):
    name = "kthread"
    summary = "Kernel-thread affinity and policy by name, following threads as they come and go"
    targets = (Workqueue, ThreadAffinity, ThreadPolicy)
    example: ClassVar[dict[str, Any]] = {
        "writeback_cpumask": "0",
        "rule": [{"match": "^kswapd", "cpus": "0", "policy": "fifo", "priority": 2}],
    }
    follows = Follows(udev={"cpu": CPU_ACTIONS})
    schema = Schema(
        section=KthreadOptions,
        groups=(
            ("rules", ("rule",)),
            ("workqueues", ("writeback_cpumask", "unbound_cpumask")),
        ),
    )

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.young_kthreads: set[int] = set()  # forked by kthreadd, maybe not named yet

    # -- deciding what a task wants --------------------------------------------------
    @staticmethod
    def kthread_settings(rules: KthreadRules, task: Task) -> Settings:
        if not task.is_kthread or task.pid == 2:
            return {}
        rule = next((r for r in rules.rules if r.pattern.search(task.comm)), None)
        if rule is None:
            return {}
        settings: Settings = {}
        if rule.cpus is not None:  # a policy-only rule leaves per-CPU threads where they are
            settings[ThreadAffinity(task.pid, task.start_time)] = rule.cpus.to_list()
        if rule.policy is not None:
            realtime = rule.policy in RT_POLICIES
            settings[ThreadPolicy(task.pid, task.start_time)] = [
                rule.policy,
                max(rule.priority, 1) if realtime else 0,
            ]
        return settings

    def expand_steps(
        self, options: KthreadOptions, owned: Mapping[Target, Value]
    ) -> Generator[None, None, Expansion[KthreadRules]]:
        """Yields after each task: a rescan looks at every one of 50,000."""
        rules = KthreadRules(rules_from(options), time.monotonic())
        settings: Settings = {}
        masks = (("writeback", options.writeback_cpumask), ("unbound", options.unbound_cpumask))
        for name, cpus in masks:
            if cpus is not None:
                settings[Workqueue(name)] = cpus.to_list()
        for task in self.system.tasks():
            if task.is_kthread:
                settings.update(self.kthread_settings(rules, task))
            yield
        return Expansion(settings, rules)

    def expand(
        self, options: KthreadOptions, owned: Mapping[Target, Value]
    ) -> Expansion[KthreadRules]:
        return run_to_end(self.expand_steps(options, owned))

    def follows_renames(self, options: KthreadOptions) -> bool:
        """Kernels before 6.4 name a new kthread after its fork: the rename says its name."""
        return not self.system.names_kthreads_at_fork()

    def on_task(
        self, rules: KthreadRules | None, event: TaskEvent, owned: Mapping[Target, Value]
    ) -> Settings:
        """Settings a just-created or renamed task needs; filters early so forks stay cheap."""
        if rules is None:
            return {}
        if event.kind == "fork":
            if event.ppid != 2:  # user tasks are the shield's
                return {}
            task = self.system.task(event.tid)
            if task is None:
                return {}
            self.young_kthreads.add(task.pid)
            if len(self.young_kthreads) > 4096:
                self.young_kthreads.clear()
            return self.kthread_settings(rules, task)
        if event.kind == "comm" and event.tid in self.young_kthreads:
            # older kernels name kthreads after the fork
            self.young_kthreads.discard(event.tid)
            task = self.system.task(event.tid)
            return self.kthread_settings(rules, task) if task is not None else {}
        return {}

    def monitor(self, rules: KthreadRules | None) -> Monitor:
        if rules is None:
            return Monitor()
        facts = {"rules": len(rules.rules), "rescan_every_s": self.rescan_interval_s}
        return Monitor(facts=facts)
