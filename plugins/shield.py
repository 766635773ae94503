"""shield: keep user tasks off the CPUs the application runs on.

`cpus` shields CPUs from user tasks the way tuna and RedHawk's `shield` do: a task also
allowed on other CPUs is narrowed to those (and logged); a task whose affinity lies
entirely inside the shielded CPUs was put there on purpose (`taskset`, a container
runtime, `latencyctl hold`) and stays, also when someone moves a narrowed task back
inside. Tasks named in `allow` and the processes holding a profile are left alone.
`[[shield.rule]]` puts user processes matched by name on CPUs of their own, as TuneD's
scheduler groups can; such a rule wins over the shield.

How the shield is kept is its `mechanism`; the one built so far narrows each task's
affinity (the affinity chase: new tasks arrive as task events, see
latencyd.service.taskevents, and a periodic rescan is the safety net). These options
were once [kthread]'s (isolate_tasks, allow, rule with user = true): profiles that say
so still load (Schema.moved), and journals that hold them still restore (took_over).
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
import re
import time
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from latencyd.core.cpuset import CpuSet, CpuSetError
from latencyd.core.errors import KernelRefused, NotApplicable
from latencyd.core.movable import MOVE_REFUSED, TaskMover
from latencyd.core.movable import require_movable as _require_movable
from latencyd.core.plugin import (
    CPU_ACTIONS,
    Expansion,
    Follows,
    Monitor,
    Options,
    OwnedSettings,
    Settings,
    Table,
    Target,
    TaskEvent,
    Value,
    run_to_end,
)
from latencyd.core.schema import (
    ArrayOfTables,
    Choice,
    Cpus,
    ListOf,
    Moved,
    Option,
    Regex,
    Schema,
    Str,
)
from latencyd.core.system import System, Task

THREAD_CHUNK = 1024  # threads of one task read per piece of an expansion (expand_steps)
BORN_NARROWED_DEPTH = 8  # generations born_narrowed walks up to a narrowed ancestor
MECHANISMS = ("auto", "cpuset", "affinity")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskAffinity(Target):
    """One thread (tid) of a user process (pid, start) moved off isolated CPUs."""

    kind: ClassVar[str] = "task_affinity"
    refusal_means: ClassVar[str | None] = MOVE_REFUSED
    pid: int
    start: int
    tid: int


@dataclass(frozen=True)
class Rule:
    """A user process's rule: its CPUs only. A user process's policy is its own (and the
    daemon could not give it back after an exec changed what the process is)."""

    pattern: re.Pattern[str]
    cpus: CpuSet


@dataclass(frozen=True)
class ShieldRules:
    rules: tuple[Rule, ...]
    cpus: CpuSet  # the shielded CPUs
    allow: tuple[str, ...]
    scanned_at: float  # monotonic time of the expansion: the next rescan is due from here


def rules_from(options: Mapping[str, Any]) -> tuple[Rule, ...]:
    return tuple(Rule(re.compile(r["match"]), r["cpus"]) for r in options.get("rule", []))


class ShieldPlugin(TaskMover[TaskAffinity]):
    name = "shield"
    summary = "Keep user tasks off the application's CPUs, following tasks as they come"
    targets = (TaskAffinity,)
    # Journals of versions where [kthread] moved user tasks hold ("kthread", task_affinity).
    took_over: ClassVar[Mapping[str, str]] = {"task_affinity": "kthread"}
    example: ClassVar[dict[str, Any]] = {
        "cpus": "1",
        "allow": ["sshd"],
        "rule": [{"match": "^myapp$", "cpus": "1"}],
    }
    follows = Follows(threads=True, udev={"cpu": CPU_ACTIONS})
    schema = Schema(
        options=(
            Option(
                "cpus",
                Cpus(),
                "Move every movable user task off these CPUs (and keep new ones off)",
                shields=True,
            ),
            Option(
                "allow",
                ListOf(Str()),
                "Name patterns (globs) of user tasks that may stay on the shielded CPUs",
            ),
            Option(
                "mechanism",
                Choice(MECHANISMS),
                "How the shield is kept: affinity narrows each task's CPUs; cpuset (not "
                "built yet) has the kernel keep them; auto picks what the machine has",
                default="auto",
            ),
        ),
        tables=(
            ArrayOfTables(
                "rule",
                Schema(
                    options=(
                        Option("match", Regex(), "Regex on the process's name (searched)"),
                        Option(
                            "cpus",
                            Cpus(),
                            "CPUs every thread of the matched processes may run on (CPUs "
                            "only: start the process with chrt for a real-time policy)",
                        ),
                    ),
                    required=("match", "cpus"),
                ),
                "User-process rules, by name, as TuneD's scheduler groups can; the first "
                "rule whose regex matches wins, and a rule wins over the shield",
            ),
        ),
        groups=(
            ("tasks", ("cpus", "allow", "mechanism")),
            ("rules", ("rule",)),
        ),
        moved=(
            Moved("kthread", "isolate_tasks", "cpus"),
            Moved("kthread", "allow", "allow"),
            Moved("kthread", "rule", "rule", only_with=("user", True)),
        ),
    )

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.every_cpu: str | None = None  # the online CPUs, within a step
        self.just_narrowed: set[int] = set()  # processes whose new settings await "applied"

    # -- which mechanism keeps the shield ------------------------------------------------
    def mechanism(self, options: Options) -> str:
        """The mechanism that keeps the section's shield here. Only the affinity chase is
        built: "auto" is it, and "cpuset" cannot apply yet."""
        chosen = options.get("mechanism", "auto")
        if chosen == "cpuset":
            raise NotApplicable("the cpuset mechanism is not built yet")
        return "affinity"

    def expand_steps(
        self, options: Options, owned: Mapping[Target, Value]
    ) -> Generator[None, None, Expansion]:
        """The section's settings, by the mechanism that keeps the shield here."""
        self.mechanism(options)  # the affinity chase is the only one built: it runs
        return (yield from self.affinity_expand_steps(options, owned))

    def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion:
        return run_to_end(self.expand_steps(options, owned))

    # -- the affinity mechanism: deciding what a task wants --------------------------------
    @staticmethod
    def user_rule(rules: ShieldRules, task: Task) -> Rule | None:
        if task.is_kthread:
            return None
        return next((r for r in rules.rules if r.pattern.search(task.comm)), None)

    @staticmethod
    def user_rule_settings(rule: Rule, task: Task, tids: list[int]) -> Settings:
        cpus = rule.cpus.to_list()
        return {TaskAffinity(task.pid, task.start_time, tid): cpus for tid in tids}

    def user_task_settings(
        self,
        rules: ShieldRules,
        task: Task,
        tids: list[int],
        owned: Mapping[Target, Value],
        current: dict[Target, Value] | None = None,
    ) -> Settings:
        """Narrow the threads of `task` that may run on isolated CPUs *and* elsewhere to
        the elsewhere; threads confined to isolated CPUs are left where they are. The
        CPUs read of each thread it narrows go into `current` (Expansion.current)."""
        isolate = rules.cpus
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

    def left_alone(self, rules: ShieldRules, task: Task) -> str | None:
        """Why the shield leaves a user task alone wherever it runs, or None."""
        if any(fnmatch.fnmatchcase(task.comm, p) for p in rules.allow):
            return "allowed by name ([shield] allow)"
        if self.exempt_pids and self.exempt_pids.intersection(self.system.ancestors(task.pid)):
            return "started under a hold (latencyctl hold)"  # the application itself
        return None

    def thread_ids(self, pid: int) -> Iterator[int]:
        """The process's threads, as the kernel lists them (lazily: 20,000 take a while)."""
        return (int(t) for t in self.system.entries(f"proc/{pid}/task") if t.isdigit())

    def handed_over(self, rules: Any, target: TaskAffinity, actual: Value) -> str | None:
        if not isinstance(target, TaskAffinity) or not isinstance(rules, ShieldRules):
            return None
        cpus = CpuSet.from_list(str(actual))
        if cpus and rules.cpus and cpus.issubset(rules.cpus):
            return f"put on isolated CPUs {cpus} on purpose: a task inside the shield stays"
        return None

    def affinity_expand_steps(
        self, options: Options, owned: Mapping[Target, Value]
    ) -> Generator[None, None, Expansion]:
        """Yields after each task and each THREAD_CHUNK threads of one (a JVM's 20,000)."""
        rules = ShieldRules(
            rules_from(options),
            options.get("cpus", CpuSet()),
            tuple(options.get("allow", ())),
            time.monotonic(),
        )
        settings: Settings = {}
        current: dict[Target, Value] = {}
        for task in self.system.tasks():
            if not task.is_kthread and (
                (rule := self.user_rule(rules, task)) is not None
                or (rules.cpus and not self.left_alone(rules, task))
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

    def follows_user_tasks(self, options: Options) -> bool:
        return bool(options.get("cpus") or options.get("rule"))

    def on_task(self, rules: Any, event: TaskEvent, owned: Mapping[Target, Value]) -> Settings:
        """Settings a just-renamed (exec'd) user task needs; user forks inherit their
        parent's affinity (born_narrowed), so they are not asked and stay cheap."""
        if not isinstance(rules, ShieldRules):
            return {}
        if event.kind == "applied":
            return self.started_before_narrowed(rules, owned)
        if event.kind == "comm" and (rules.cpus or rules.rules):
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
        self, rules: ShieldRules, owned: Mapping[Target, Value]
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
        target: TaskAffinity,
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

    # -- plugin verbs ------------------------------------------------------------------
    def end_step(self) -> None:
        super().end_step()
        self.every_cpu = None

    def read(self, target: TaskAffinity) -> Value:
        _require_movable(self._task(target))
        return self.system.affinity(target.tid).to_list()

    def write(self, target: TaskAffinity, value: Value) -> None:
        _require_movable(self._task(target))
        self.system.set_affinity(target.tid, CpuSet.from_list(value))

    def write_unless_changed(
        self, target: TaskAffinity, value: Value, judged: Value
    ) -> Value | None:
        """A user task's CPUs read and written back to back (System.set_affinity): its
        user may pin it in between (`taskset -c 1 app` right after an exec narrowed)."""
        if not isinstance(target, TaskAffinity):
            return super().write_unless_changed(target, value, judged)
        _require_movable(self._task(target))
        cpus, judged_cpus = CpuSet.from_list(str(value)), CpuSet.from_list(str(judged))
        found = self.system.set_affinity(target.tid, cpus, only_from=judged_cpus)
        return None if found is None else found.to_list()

    def report(self, changes: list[tuple[TaskAffinity, Value, Value]]) -> None:
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

    def same(self, target: TaskAffinity, wanted: Value, actual: Value) -> bool:
        return CpuSet.from_list(str(wanted)) == CpuSet.from_list(str(actual))

    def exists(self, target: TaskAffinity) -> bool:
        try:  # a thread's own directory says whether it is there
            self._task(target)
        except NotApplicable:
            return False
        return self.system.exists(f"proc/{target.pid}/task/{target.tid}")

    def describe(self, target: TaskAffinity, value: Value) -> str:
        task = self.system.task(target.pid)
        name = f"{task.comm} " if task else ""
        return f"user task {name}(pid {target.pid}, thread {target.tid}) CPUs = {value}"

    def group(self, target: TaskAffinity) -> Hashable | None:
        return ("task", target.pid, target.start)

    def describe_group(self, targets: Sequence[TaskAffinity], value: Value) -> str:
        first = targets[0]
        task = self.system.task(first.pid)
        name = f"{task.comm} " if task else ""
        return f"user task {name}(pid {first.pid}, {len(targets):,} threads) CPUs = {value}"

    def monitor(self, rules: Any) -> Monitor:
        if not isinstance(rules, ShieldRules):
            return Monitor()
        facts = {
            "mechanism": "affinity",
            "rules": len(rules.rules),
            "rescan_every_s": self.rescan_interval_s,
        }
        if not rules.cpus:
            return Monitor(facts=facts)
        return Monitor((self.shielded_tasks(rules),), facts)

    def shielded_tasks(self, rules: ShieldRules) -> Table:
        """The user threads that may run on the isolated CPUs now, and why they may."""
        isolate = rules.cpus
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
