"""kthread: pin kernel threads by name — including ones created later — and steer workqueues.

Rules match kernel threads (children of kthreadd) by regex on their name and set
their CPUs and, optionally, scheduling policy. Threads are keyed by pid and start
time, so a recycled pid is never mistaken for the thread that was pinned. New
threads arrive as task events (see latencyd.service.taskevents) and get their settings
within milliseconds; a periodic rescan is the safety net.

On Linux >= 3.10 writeback runs on the unbound `writeback` workqueue, steered by
its cpumask, not in `flush-*` threads; older kernels' `flush-MAJ:MIN` threads are
matched by the rules like any other thread.

`isolate_tasks` shields CPUs from user tasks the way tuna and RedHawk's `shield` do: a
task also allowed on other CPUs is narrowed to those (and logged); a task whose affinity
lies entirely inside the shielded CPUs was put there on purpose (`taskset`, a container
runtime, `latencyctl hold`) and stays, also when someone moves a narrowed task back
inside. Tasks named in `allow` and the processes holding a profile are left alone.
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
import re
import time
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

from latencyd.core.cpuset import CpuSet, CpuSetError
from latencyd.core.errors import KernelRefused, NotApplicable
from latencyd.core.plugin import (
    CPU_ACTIONS,
    Expansion,
    Follows,
    Monitor,
    Options,
    OwnedSettings,
    Plugin,
    Settings,
    Table,
    Target,
    TaskEvent,
    Value,
    plain_path,
    run_to_end,
)
from latencyd.core.schema import (
    ArrayOfTables,
    Bool,
    Choice,
    Cpus,
    Int,
    ListOf,
    Option,
    Regex,
    Schema,
    Str,
)
from latencyd.core.system import POLICIES, System, Task

WORKQUEUES = {
    "writeback": "sys/devices/virtual/workqueue/writeback/cpumask",
    "unbound": "sys/devices/virtual/workqueue/cpumask",
}
RT_POLICIES = ("fifo", "rr")
THREAD_CHUNK = 1024  # threads of one task read per piece of an expansion (expand_steps)
BORN_NARROWED_DEPTH = 8  # generations born_narrowed walks up to a narrowed ancestor
MOVE_REFUSED = "the kernel will not move this thread"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Workqueue(Target):
    """An unbound workqueue's cpumask ("writeback", or "unbound" for all of them)."""

    kind: ClassVar[str] = "workqueue"
    name: str

    def problem(self) -> str | None:
        return None if plain_path(self.name, 1) else f"no workqueue is called {self.name!r}"


@dataclass(frozen=True)
class ThreadAffinity(Target):
    """A kernel thread's CPUs; pid and start time tell a recycled pid from the thread."""

    kind: ClassVar[str] = "thread_affinity"
    refusal_means: ClassVar[str | None] = MOVE_REFUSED
    pid: int
    start: int


@dataclass(frozen=True)
class ThreadPolicy(Target):
    """A kernel thread's scheduling policy and priority, as [policy, priority]."""

    kind: ClassVar[str] = "thread_policy"
    refusal_means: ClassVar[str | None] = "the kernel will not change this thread's policy"
    pid: int
    start: int


@dataclass(frozen=True)
class TaskAffinity(Target):
    """One thread (tid) of a user process (pid, start) moved off isolated CPUs."""

    kind: ClassVar[str] = "task_affinity"
    refusal_means: ClassVar[str | None] = MOVE_REFUSED
    pid: int
    start: int
    tid: int


KthreadTarget = Workqueue | ThreadAffinity | ThreadPolicy | TaskAffinity


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    cpus: CpuSet | None  # None: the threads' CPUs are left as they are (a policy-only rule)
    policy: str | None
    priority: int
    user: bool = False  # matches user processes (all their threads), not kernel threads


@dataclass(frozen=True)
class KthreadRules:
    rules: tuple[Rule, ...]
    isolate_tasks: CpuSet
    allow: tuple[str, ...]
    scanned_at: float  # monotonic time of the expansion: the next rescan is due from here

    # Split once per expansion, not per task: a rescan looks at every one of 50,000 tasks.
    @cached_property
    def kthread_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if not r.user)

    @cached_property
    def user_rules(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.user)


def rules_from(options: Mapping[str, Any]) -> tuple[Rule, ...]:
    return tuple(
        Rule(
            re.compile(r["match"]),
            r.get("cpus"),
            r.get("policy"),
            r.get("priority", 0),
            r.get("user", False),
        )
        for r in options.get("rule", [])
    )


def _rule_is_whole(rule: Mapping[str, Any]) -> tuple[str, str] | None:
    """A rule sets CPUs, a policy or both; a user process's rule sets CPUs only."""
    if "cpus" not in rule and ("policy" not in rule or rule.get("user")):
        return "match", "a rule needs cpus (or, for kernel threads, a policy)"
    # Policies are kept for kernel threads: a user process's policy is its own (and
    # the daemon could not give it back after an exec changed what the process is).
    if rule.get("user"):
        for key in ("policy", "priority"):
            if key in rule:
                return key, (
                    f"{key}: a user = true rule sets CPUs only (start the process "
                    "with chrt for a real-time policy)"
                )
    return None


def _require_movable(task: Task) -> None:
    if task.is_kthread and not task.pinnable:
        # The setting names the thread; the reason is the same for every such thread.
        raise NotApplicable(
            "a per-CPU kernel thread (PF_NO_SETAFFINITY): the kernel does not let anyone move it"
        )


class KthreadPlugin(Plugin[KthreadTarget]):
    name = "kthread"
    summary = "Kernel-thread affinity and policy by name, following threads as they come and go"
    targets = (Workqueue, ThreadAffinity, ThreadPolicy, TaskAffinity)
    example: ClassVar[dict[str, Any]] = {
        "writeback_cpumask": "0",
        "rule": [{"match": "^kswapd", "cpus": "0", "policy": "fifo", "priority": 2}],
    }
    follows = Follows(threads=True, udev={"cpu": CPU_ACTIONS})
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
                shields=True,
            ),
            Option(
                "allow",
                ListOf(Str()),
                "Name patterns (globs) of user tasks that may stay on isolate_tasks CPUs",
            ),
        ),
        tables=(
            ArrayOfTables(
                "rule",
                Schema(
                    options=(
                        Option("match", Regex(), "Regex on the kernel thread's name (searched)"),
                        Option(
                            "cpus",
                            Cpus(),
                            "CPUs the matched threads may run on (without it, a rule sets "
                            "a policy only: per-CPU threads such as ksoftirqd/N keep their CPU)",
                        ),
                        Option(
                            "policy",
                            Choice(tuple(POLICIES)),
                            "Scheduling policy: other, fifo, rr, batch or idle",
                        ),
                        Option("priority", Int(0, 99), "Real-time priority for fifo/rr (1-99)"),
                        Option(
                            "user",
                            Bool(),
                            "Match user processes (by name; every thread, CPUs only) instead "
                            "of kernel threads, as TuneD's scheduler groups can; such a rule "
                            "wins over isolate_tasks",
                            default=False,
                        ),
                    ),
                    required=("match",),
                    consistent=_rule_is_whole,
                ),
                "Kernel-thread rules (and user-process rules, user = true); the first rule "
                "whose regex matches wins",
            ),
        ),
        groups=(
            ("rules", ("rule",)),
            ("workqueues", ("writeback_cpumask", "unbound_cpumask")),
            ("tasks", ("isolate_tasks", "allow")),
        ),
    )

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.young_kthreads: set[int] = set()  # forked by kthreadd, maybe not named yet
        self.identities: dict[int, Task | None] | None = None  # pid -> task, within a step
        self.every_cpu: str | None = None  # the online CPUs, within a step
        self.just_narrowed: set[int] = set()  # processes whose new settings await "applied"

    # -- deciding what a task wants --------------------------------------------------
    @staticmethod
    def kthread_settings(rules: KthreadRules, task: Task) -> Settings:
        if not task.is_kthread or task.pid == 2:
            return {}
        rule = next((r for r in rules.kthread_rules if r.pattern.search(task.comm)), None)
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

    @staticmethod
    def user_rule(rules: KthreadRules, task: Task) -> Rule | None:
        if task.is_kthread:
            return None
        return next((r for r in rules.user_rules if r.pattern.search(task.comm)), None)

    @staticmethod
    def user_rule_settings(rule: Rule, task: Task, tids: list[int]) -> Settings:
        if rule.cpus is None:  # not for a user rule: _rule_is_whole
            return {}
        cpus = rule.cpus.to_list()
        return {TaskAffinity(task.pid, task.start_time, tid): cpus for tid in tids}

    def user_task_settings(
        self,
        rules: KthreadRules,
        task: Task,
        tids: list[int],
        owned: Mapping[Target, Value],
        current: dict[Target, Value] | None = None,
    ) -> Settings:
        """Narrow the threads of `task` that may run on isolated CPUs *and* elsewhere to
        the elsewhere; threads confined to isolated CPUs are left where they are. The
        CPUs read of each thread it narrows go into `current` (Expansion.current)."""
        isolate = rules.isolate_tasks
        if not isolate or task.is_kthread or self.left_alone(rules, task):
            return {}
        settings: Settings = {}
        for tid in tids:
            target = TaskAffinity(task.pid, task.start_time, tid)
            # A thread we moved is judged by what its user gave it (its original), not by
            # what we made of it: a switch that shields other CPUs starts from there, and
            # one that no longer touches them gives it back. If someone confines it to the
            # isolated CPUs meanwhile, `handed_over` lets it go.
            given = owned.original(target) if isinstance(owned, OwnedSettings) else None
            if given is None and target in owned:  # owned, original unknown: keep it so
                settings[target] = owned[target]
                continue
            if given is not None and current is None and self._confined(tid, isolate):
                continue  # an exec after its user confined it (`taskset -c 1 app`): theirs
            try:
                cpus = (
                    CpuSet.from_list(str(given)) if given is not None else self.system.affinity(tid)
                )
            except (KernelRefused, CpuSetError):
                continue
            if cpus & isolate and not cpus.issubset(isolate):
                settings[target] = (cpus - isolate).to_list()
            elif (
                given is None
                and current is not None
                and owned  # the first switch: nothing narrowed yet
                and (parent := self.born_narrowed(target, cpus.to_list(), owned.get))
            ):  # expansions only: on an exec it may be mid-way through `taskset -c 1 app`
                # Judged as its parent is, by what the parent was given: a switch to other
                # isolated CPUs must not leave it on what the last shield left it.
                settings[target] = self._narrowed_as(parent, isolate, owned)
            else:
                continue
            if given is None and current is not None:
                current[target] = cpus.to_list()
        return settings

    @staticmethod
    def _narrowed_as(parent: TaskAffinity, isolate: CpuSet, owned: Mapping[Target, Value]) -> Value:
        """What a task born of the narrowed `parent` is set to: the parent's original less
        the isolated CPUs (its applied value, if the original is not known)."""
        given = owned.original(parent) if isinstance(owned, OwnedSettings) else None
        if given is None:
            return owned[parent]
        narrowed = CpuSet.from_list(str(given)) - isolate
        return narrowed.to_list() if narrowed else owned[parent]

    def _confined(self, tid: int, isolate: CpuSet) -> bool:
        """Whether the thread now runs only on isolated CPUs (its user put it there;
        `handed_over` then lets it go at the next check)."""
        try:
            return self.system.affinity(tid).issubset(isolate)
        except KernelRefused:
            return False

    def left_alone(self, rules: KthreadRules, task: Task) -> str | None:
        """Why the shield leaves a user task alone wherever it runs, or None."""
        if any(fnmatch.fnmatchcase(task.comm, p) for p in rules.allow):
            return "allowed by name ([kthread] allow)"
        if self.exempt_pids and self.exempt_pids.intersection(self.system.ancestors(task.pid)):
            return "started under a hold (latencyctl hold)"  # the application itself
        return None

    def thread_ids(self, pid: int) -> Iterator[int]:
        """The process's threads, as the kernel lists them (lazily: 20,000 take a while)."""
        return (int(t) for t in self.system.entries(f"proc/{pid}/task") if t.isdigit())

    def handed_over(self, rules: Any, target: KthreadTarget, actual: Value) -> str | None:
        if not isinstance(target, TaskAffinity) or not isinstance(rules, KthreadRules):
            return None
        cpus = CpuSet.from_list(str(actual))
        if cpus and rules.isolate_tasks and cpus.issubset(rules.isolate_tasks):
            return f"put on isolated CPUs {cpus} on purpose: a task inside the shield stays"
        return None

    def expand_steps(
        self, options: Options, owned: Mapping[Target, Value]
    ) -> Generator[None, None, Expansion]:
        """Yields after each task and each THREAD_CHUNK threads of one (a JVM's 20,000)."""
        rules = KthreadRules(
            rules_from(options),
            options.get("isolate_tasks", CpuSet()),
            tuple(options.get("allow", ())),
            time.monotonic(),
        )
        settings: Settings = {}
        current: dict[Target, Value] = {}
        for name in ("writeback", "unbound"):
            if f"{name}_cpumask" in options:
                settings[Workqueue(name)] = options[f"{name}_cpumask"].to_list()
        for task in self.system.tasks():
            if task.is_kthread:
                settings.update(self.kthread_settings(rules, task))
            elif (rule := self.user_rule(rules, task)) is not None or (
                rules.isolate_tasks and not self.left_alone(rules, task)
            ):
                tids = self.thread_ids(task.pid)
                while chunk := list(itertools.islice(tids, THREAD_CHUNK)):
                    settings.update(
                        self.user_rule_settings(rule, task, chunk)
                        if rule is not None
                        else self.user_task_settings(rules, task, chunk, owned, current)
                    )
                    yield
            yield
        return Expansion(settings, rules, current=current)

    def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion:
        return run_to_end(self.expand_steps(options, owned))

    def follows_user_tasks(self, options: Options) -> bool:
        return bool(options.get("isolate_tasks")) or any(
            r.get("user") for r in options.get("rule", [])
        )

    def on_task(self, rules: Any, event: TaskEvent, owned: Mapping[Target, Value]) -> Settings:
        """Settings a just-created or renamed task needs; filters early so forks stay cheap."""
        if not isinstance(rules, KthreadRules):
            return {}
        if event.kind == "fork":
            if event.ppid != 2:  # user forks inherit their parent's affinity (born_narrowed)
                return {}
            task = self.system.task(event.tid)
            if task is None:
                return {}
            self.young_kthreads.add(task.pid)
            if len(self.young_kthreads) > 4096:
                self.young_kthreads.clear()
            return self.kthread_settings(rules, task)
        if event.kind == "applied":
            return self.started_before_narrowed(rules, owned)
        if event.kind == "comm":
            if event.tid in self.young_kthreads:  # older kernels name kthreads after the fork
                self.young_kthreads.discard(event.tid)
                task = self.system.task(event.tid)
                return self.kthread_settings(rules, task) if task is not None else {}
            if rules.isolate_tasks or rules.user_rules:
                task = self.system.task(event.pid)
                if task is None or task.is_kthread:
                    return {}
                if (rule := self.user_rule(rules, task)) is not None:
                    return self.user_rule_settings(rule, task, [event.tid])
                settings = self.user_task_settings(rules, task, [event.tid], owned)
                if settings:
                    self.just_narrowed.add(task.pid)
                return settings
        return {}

    def started_before_narrowed(
        self, rules: KthreadRules, owned: Mapping[Target, Value]
    ) -> Settings:
        """The threads and children that the processes just narrowed started between their
        exec and the write: they inherited the CPUs from before (stress-ng's workers ran on
        the isolated CPU until the next switch). Read after the write, none is missed: what
        starts later inherits the narrowed CPUs. Their own children are asked next round."""
        pids, self.just_narrowed = self.just_narrowed, set()
        settings: Settings = {}
        for pid in pids:
            for member in (pid, *self.system.children(pid)):
                task = self.system.task(member)
                if task is None or task.is_kthread:
                    continue
                tids = [t for t in self.thread_ids(member)
                        if TaskAffinity(member, task.start_time, t) not in owned]  # fmt: skip
                if (rule := self.user_rule(rules, task)) is not None:
                    got = self.user_rule_settings(rule, task, tids)
                else:
                    got = self.user_task_settings(rules, task, tids, owned)
                if got and member != pid:
                    self.just_narrowed.add(member)
                settings.update(got)
        return settings

    def born_narrowed(
        self, target: TaskAffinity, cpus: str, applied: Callable[[Target], Value | None]
    ) -> TaskAffinity | None:
        """The narrowed task `target` descends from, when it carries exactly the CPUs the
        shield gave that one (`applied`: what an owned target was set to, else None): a
        new thread of a narrowed process, a child of one, or a grandchild through
        processes that carry them too (a shell's subshell starting a load). Forks are not
        heard of (the kernel filter drops user forks, so a fork storm costs the daemon
        nothing): a rescan or the next switch finds them, and owning them lets `off` give
        them their ancestor's original CPUs, and a switch judge them by it, instead of
        leaving them (and all a narrowed shell starts) where the last shield put them. A
        task its user pinned to exactly those CPUs after the switch is taken for such a
        descendant: the one case told wrong."""
        if target.tid != target.pid:
            parent = TaskAffinity(target.pid, target.start, target.pid)
            if str(applied(parent)) == cpus:
                return parent
        for _ in range(BORN_NARROWED_DEPTH):
            try:
                ppid = self._task(target).ppid
            except NotApplicable:
                return None
            start = self._start_of(ppid)
            if start is None:
                return None
            parent = TaskAffinity(ppid, start, ppid)
            given = applied(parent)
            if given is not None:  # the first owned ancestor decides
                return parent if str(given) == cpus else None
            if cpus == self._every_cpu():  # nothing narrowed: not worth a walk per thread
                return None
            try:
                if self.system.affinity(ppid).to_list() != cpus:
                    return None  # a generation that does not carry them: not inherited
            except KernelRefused:
                return None
            target = parent
        return None

    def _every_cpu(self) -> str:
        """The online CPUs as a list (read once per step: asked per thread of 20,000)."""
        every = self.every_cpu
        if every is None:
            every = self.system.online_cpus().to_list()
            if self.identities is not None:
                self.every_cpu = every
        return every

    def _start_of(self, pid: int) -> int | None:
        task = self.identities.get(pid) if self.identities is not None else None
        task = task or self.system.task(pid)
        return task.start_time if task is not None else None

    def original(
        self,
        target: KthreadTarget,
        current: Value,
        owned: Callable[[Target], tuple[Value, Value] | None],
    ) -> Value:
        """A task born narrowed (born_narrowed) gets its parent's original back."""
        if isinstance(target, TaskAffinity):

            def applied(t: Target) -> Value | None:
                got = owned(t)
                return got[1] if got is not None else None

            parent = self.born_narrowed(target, str(current), applied)
            given = owned(parent) if parent is not None else None
            if given is not None:
                return given[0]
        return current

    def changed(self, rules: Any) -> bool:
        """A periodic rescan: the safety net behind task events."""
        scanned = rules.scanned_at if isinstance(rules, KthreadRules) else 0.0
        return time.monotonic() - scanned >= self.rescan_interval_s

    # -- plugin verbs ------------------------------------------------------------------
    def begin_step(self) -> None:
        self.identities = {}

    def end_step(self) -> None:
        self.identities = None
        self.every_cpu = None

    def _task(
        self, target: ThreadAffinity | ThreadPolicy | TaskAffinity, fresh: bool = False
    ) -> Task:
        """The target's task, if it is still the one the target names. Within a step a
        process is read once, not once per thread of its 20,000 (a pid cannot be freed
        and reused while a step runs without giving the main loop a turn, and the
        engine begins a new step after each turn; across steps the start time tells)."""
        cache = self.identities
        if cache is None or fresh:
            task = self.system.task(target.pid)
        elif target.pid in cache:
            task = cache[target.pid]
        else:
            task = cache[target.pid] = self.system.task(target.pid)
        if task is None or task.start_time != target.start:
            raise NotApplicable(f"pid {target.pid} has exited")
        return task

    @staticmethod
    def _tid(target: ThreadAffinity | ThreadPolicy | TaskAffinity) -> int:
        return target.tid if isinstance(target, TaskAffinity) else target.pid

    def _require_workqueue(self, target: Workqueue) -> str:
        path = WORKQUEUES[target.name]
        if not self.system.exists(path):
            raise NotApplicable(
                f"this kernel has no /{path} (before Linux 3.10, writeback runs in flush-* "
                "threads: match them with a rule)"
            )
        return path

    def read(self, target: KthreadTarget) -> Value:
        if isinstance(target, Workqueue):
            return CpuSet.from_mask(self.system.read(self._require_workqueue(target))).to_list()
        task = self._task(target)
        if isinstance(target, ThreadPolicy):
            return list(self.system.scheduler(target.pid))
        _require_movable(task)
        return self.system.affinity(self._tid(target)).to_list()

    def write(self, target: KthreadTarget, value: Value) -> None:
        if isinstance(target, Workqueue):
            nr = max(self.system.online_cpus()) + 1
            path = self._require_workqueue(target)
            self.system.write(path, CpuSet.from_list(value).to_mask(nr))
            return
        task = self._task(target)
        if isinstance(target, ThreadPolicy):
            policy, priority = value
            self.system.set_scheduler(target.pid, policy, int(priority))
            return
        _require_movable(task)
        self.system.set_affinity(self._tid(target), CpuSet.from_list(value))

    def write_unless_changed(
        self, target: KthreadTarget, value: Value, judged: Value
    ) -> Value | None:
        """A user task's CPUs read and written back to back (System.set_affinity): its
        user may pin it in between (`taskset -c 1 app` right after an exec narrowed)."""
        if not isinstance(target, TaskAffinity):
            return super().write_unless_changed(target, value, judged)
        _require_movable(self._task(target))
        cpus, judged_cpus = CpuSet.from_list(str(value)), CpuSet.from_list(str(judged))
        found = self.system.set_affinity(target.tid, cpus, only_from=judged_cpus)
        return None if found is None else found.to_list()

    def report(self, changes: list[tuple[KthreadTarget, Value, Value]]) -> None:
        """Every move of a user task is said: one line per process and move (name, pid,
        how many of its threads, CPUs before and after), not one per thread."""
        moves: dict[tuple[int, str, str], list[int]] = {}
        for target, before, after in changes:
            if isinstance(target, TaskAffinity):
                moves.setdefault((target.pid, str(before), str(after)), []).append(target.tid)
        for (pid, before, after), tids in moves.items():
            task = self.system.task(pid)
            threads = f"thread {tids[0]}" if len(tids) == 1 else f"{len(tids)} threads"
            log.info(
                "user task %s (pid %d, %s): CPUs %s -> %s",
                task.comm if task else "?", pid, threads, before, after,
            )  # fmt: skip

    def same(self, target: KthreadTarget, wanted: Value, actual: Value) -> bool:
        if isinstance(target, ThreadPolicy):
            return list(wanted) == list(actual)
        return CpuSet.from_list(str(wanted)) == CpuSet.from_list(str(actual))

    def exists(self, target: KthreadTarget) -> bool:
        if isinstance(target, Workqueue):
            return True  # a kernel facility: missing means not supported (read says so)
        try:  # a thread's own directory says whether it is there; a kthread's stat does
            self._task(target, fresh=not isinstance(target, TaskAffinity))
        except NotApplicable:
            return False
        return not isinstance(target, TaskAffinity) or self.system.exists(
            f"proc/{target.pid}/task/{target.tid}"
        )

    def watch_files(self, target: KthreadTarget) -> tuple[str, ...]:
        return (WORKQUEUES[target.name],) if isinstance(target, Workqueue) else ()

    def describe(self, target: KthreadTarget, value: Value) -> str:
        if isinstance(target, Workqueue):
            return f"workqueue {target.name} cpumask = {value}"
        task = self.system.task(target.pid)
        if isinstance(target, TaskAffinity):
            name = f"{task.comm} " if task else ""
            return f"user task {name}(pid {target.pid}, thread {target.tid}) CPUs = {value}"
        name = f"{task.comm} (pid {target.pid})" if task else f"pid {target.pid}"
        if isinstance(target, ThreadPolicy):
            return f"{name} policy = {value[0]} priority {value[1]}"
        return f"{name} CPUs = {value}"

    def group(self, target: KthreadTarget) -> Hashable | None:
        return ("task", target.pid, target.start) if isinstance(target, TaskAffinity) else None

    def describe_group(self, targets: Sequence[KthreadTarget], value: Value) -> str:
        first = targets[0]
        if not isinstance(first, TaskAffinity):
            return super().describe_group(targets, value)
        task = self.system.task(first.pid)
        name = f"{task.comm} " if task else ""
        return f"user task {name}(pid {first.pid}, {len(targets):,} threads) CPUs = {value}"

    def monitor(self, rules: Any) -> Monitor:
        if not isinstance(rules, KthreadRules):
            return Monitor()
        facts = {"rules": len(rules.rules), "rescan_every_s": self.rescan_interval_s}
        if not rules.isolate_tasks:
            return Monitor(facts=facts)
        return Monitor((self.shielded_tasks(rules),), facts)

    def shielded_tasks(self, rules: KthreadRules) -> Table:
        """The user threads that may run on the isolated CPUs now, and why they may."""
        isolate = rules.isolate_tasks
        rows = []
        for task in self.system.tasks():
            if task.is_kthread:
                continue
            alone = self.left_alone(rules, task)
            for tid in self.thread_ids(task.pid):
                try:
                    cpus = self.system.affinity(tid)
                except KernelRefused:
                    continue  # exited meanwhile
                if not cpus & isolate:
                    continue
                if cpus.issubset(isolate):
                    why = "confined to isolated CPUs: put there on purpose"
                else:
                    why = alone or "not moved yet"
                rows.append((task.pid, tid, task.comm, str(cpus & isolate), why))
        return Table(
            f"User tasks on the isolated CPUs {isolate} (tasks moved off them: applied "
            "settings 'user task ... CPUs')",
            ("PID", "TID", "name", "isolated CPUs", "why it is there"),
            tuple(rows),
            hide_tasks=lambda row: None,  # every row is a task's: counted only
        )
