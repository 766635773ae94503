"""The affinity chase: the shield kept by narrowing each user task's CPUs as it comes (an
exec heard as a task event, a periodic rescan behind them), as tuna and RedHawk's
`shield` do. A task confined to the shielded CPUs by its user stays (the handover,
KeptInside); what a narrowed task starts inherits its CPUs, and is owned once found
(born_narrowed), so `off` gives it its ancestor's original."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator

from latencyd.core.movable import Tasks
from latencyd.core.plugin import Expansion, Settings, Table, Target, Value, original_of
from latencyd.cpuset import CpuSet, CpuSetError
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.kernel.cgroups import Chosen
from latencyd.kernel.system import Task

from .mechanism import Mechanism, Owned, chosen_table, thread_ids
from .options import ShieldOptions
from .rules import Judge, ShieldRules, rule_settings
from .targets import TaskAffinity

THREAD_CHUNK = 1024  # threads of one task read per piece of an expansion (expand_steps)
BORN_NARROWED_DEPTH = 8  # generations born_narrowed walks up to a narrowed ancestor


class Chase(Mechanism):
    name = "affinity"
    follows_every_exec = True

    def __init__(self, tasks: Tasks, judge: Judge) -> None:
        super().__init__(tasks, judge)
        self.every_cpu: str | None = None  # the online CPUs, within a step
        self.just_narrowed: set[int] = set()  # processes whose new settings await started_meanwhile

    def expand_steps(
        self, rules: ShieldRules, owned: Owned
    ) -> Generator[None, None, Expansion[ShieldRules]]:
        """Yields after each task and each THREAD_CHUNK threads of one (a JVM's 20,000)."""
        settings: Settings = {}
        current: dict[Target, Value] = {}
        for task in self.system.tasks():
            if not task.is_kthread and (
                (rule := self.judge.rule_for(rules, task)) is not None
                or (rules.cpus and not self.judge.left_alone(rules, task))
            ):
                tids = thread_ids(self.system, task.pid)
                while chunk := list(itertools.islice(tids, THREAD_CHUNK)):
                    settings.update(
                        rule_settings(rule, task, chunk)
                        if rule is not None
                        else self.user_task_settings(rules, task, chunk, owned, current)
                    )
                    yield
            yield
        return Expansion(settings, rules, current=current)

    def starts_afresh(self, chosen: Chosen, options: ShieldOptions, owned: Owned) -> bool:
        """From cpusets to the chase: the tasks get their own CPUs back only once moved out
        of latencyd's cpusets, so the chase must judge them (and read their originals)
        after that, not before. (The other way round needs nothing: affinities given
        back first, the kernel then intersects them with the cpuset.)"""
        return True

    def place(self, rules: ShieldRules, task: Task, tids: list[int], owned: Owned) -> Settings:
        """An exec: the task's rule, or the application's CPUs; else its threads narrowed
        off the shield, to be asked once more after the write (started_meanwhile)."""
        if (rule := self.judge.rule_for(rules, task)) is not None:
            return rule_settings(rule, task, tids)
        settings = self.user_task_settings(rules, task, tids, owned)
        if settings:
            self.just_narrowed.add(task.pid)
        return settings

    def user_task_settings(
        self,
        rules: ShieldRules,
        task: Task,
        tids: list[int],
        owned: Owned,
        current: dict[Target, Value] | None = None,
    ) -> Settings:
        """Narrow the threads of `task` that may run on isolated CPUs *and* elsewhere to
        the elsewhere; threads confined to isolated CPUs are left where they are. The
        CPUs read of each thread it narrows go into `current` (Expansion.current)."""
        isolate = rules.cpus
        if not isolate or task.is_kthread or self.judge.left_alone(rules, task):
            return {}
        settings: Settings = {}
        for tid in tids:
            target = TaskAffinity(task.pid, task.start_time, tid)
            # A thread we moved is judged by what its user gave it (its original), not by
            # what we made of it: a switch that shields other CPUs starts from there, and
            # one that no longer touches them gives it back. If someone confines it to the
            # isolated CPUs meanwhile, the handover (KeptInside) lets it go.
            given = original_of(owned, target)
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
    def _narrowed_as(parent: TaskAffinity, isolate: CpuSet, owned: Owned) -> Value:
        """What a task born of the narrowed `parent` is set to: the parent's original less
        the isolated CPUs (its applied value, if the original is not known)."""
        given = original_of(owned, parent)
        if given is None:
            return owned[parent]
        narrowed = CpuSet.from_list(str(given)) - isolate
        return narrowed.to_list() if narrowed else owned[parent]

    def _confined(self, tid: int, isolate: CpuSet) -> bool:
        """Whether the thread now runs only on isolated CPUs (its user put it there;
        the handover, KeptInside, then lets it go at the next check)."""
        try:
            return self.system.affinity(tid).issubset(isolate)
        except KernelRefused:
            return False

    def started_meanwhile(self, rules: ShieldRules, owned: Owned) -> Settings:
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
                tids = [t for t in thread_ids(self.system, member)
                        if TaskAffinity(member, task.start_time, t) not in owned]  # fmt: skip
                if (rule := self.judge.user_rule(rules, task)) is not None:
                    got = rule_settings(rule, task, tids)
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
                ppid = self.tasks.task(target).ppid
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
            if self.tasks.identities is not None:
                self.every_cpu = every
        return every

    def _start_of(self, pid: int) -> int | None:
        task = self.tasks.identities.get(pid) if self.tasks.identities is not None else None
        task = task or self.system.task(pid)
        return task.start_time if task is not None else None

    def tables(self, rules: ShieldRules) -> tuple[Table, ...]:
        return (chosen_table(rules), self.shielded_tasks(rules))

    def shielded_tasks(self, rules: ShieldRules) -> Table:
        """The user threads that may run on the isolated CPUs now, and why they may."""
        isolate = rules.cpus
        rows = []
        for task in self.system.tasks():
            if task.is_kthread:
                continue
            alone = self.judge.left_alone(rules, task)
            for tid in thread_ids(self.system, task.pid):
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

    def end_step(self) -> None:
        self.every_cpu = None
