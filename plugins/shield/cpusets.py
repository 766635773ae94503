"""What the three cpuset mechanisms share (v1.py, partition.py, systemd.py): the kernel
keeps the shield, as tasks are born where their parent is. Each makes its own cgroups
(cgroups); then every user task of the root cgroup that must move is moved (v1: all but
those allowed, to housekeeping; each: the application and tasks their users confined to
the shielded CPUs, into the shield), each held application into a cgroup of its own
where the mechanism makes one (own_cgroup), and what runs in another manager's cgroup
stays, listed. Not here: the cgroups and units each makes (cgroups, in its own module),
and systemd's way of moving a task (systemd.py's task_placement)."""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import ClassVar

from latencyd.core.plugin import Expansion, Settings, Table, Value, original_of
from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused
from latencyd.kernel.cgroups import SHIELD, Chosen, owner, placement
from latencyd.kernel.system import Task

from .mechanism import Mechanism, Owned, chosen_table, thread_ids
from .options import ShieldOptions
from .rules import PLACED, Rule, ShieldRules, rule_settings, ruled_inside
from .targets import Cgroup, TaskAffinity, TaskCgroup, TaskUnit, inside_shield

CGROUP_TASK_CHUNK = 256  # tasks judged per piece of a cpuset expansion
START_INSIDE = (  # what a cpuset mechanism asks of whoever starts the application
    "; inside a cpuset the kernel refuses an affinity outside it (taskset -c: "
    "EINVAL): start the application with `latencyctl run` or name it in apps"
)


def shield_was(hierarchy: str, owned: Owned) -> CpuSet | None:
    """The CPUs latencyd gave the shield's cgroup in `hierarchy` (None: it owns none)."""
    given = owned.get(Cgroup(hierarchy, SHIELD))
    if isinstance(given, Mapping) and "cpuset.cpus" in given:
        return CpuSet.from_list(str(given["cpuset.cpus"]))
    return None


@dataclass(frozen=True)
class UserTask:
    """A user task as a cpuset mechanism finds it: the task, its cgroup now, and the rule
    it runs by (Judge.user_rule: found once per task by the caller, handed down)."""

    task: Task
    cgroup: str
    rule: Rule | None


@dataclass(frozen=True)
class Placement:
    """Where a cpuset mechanism puts a user task: its setting (`target`), the cgroup it
    must move to (`into`; None: it stays) and, when it stays for another manager's sake,
    why."""

    target: TaskCgroup | TaskUnit
    into: str | None
    why: str | None = None


class Cpusets(Mechanism):
    """A cpuset mechanism: the shield's cgroup is `shield_cgroup` (the kernel keeps a
    task there on the shielded CPUs)."""

    shield_cgroup: ClassVar[str] = SHIELD

    @staticmethod
    def hierarchy(rules: ShieldRules) -> str:
        """The cgroup hierarchy the shield is kept in (every cpuset mechanism has one)."""
        hierarchy = rules.choice.hierarchy
        assert hierarchy is not None
        return hierarchy

    @abstractmethod
    def cgroups(self, rules: ShieldRules, owned: Owned, refused: dict[str, str]) -> Settings:
        """The cgroups and units this mechanism makes for the shield, in the order they
        are written; what of the section it cannot do goes into `refused`."""

    def starts_afresh(self, chosen: Chosen, options: ShieldOptions, owned: Owned) -> bool:
        """A shield on other CPUs: v1's exclusive cpusets cannot trade CPUs in place
        (whichever is written first overlaps its exclusive sibling: EINVAL), so they are
        made anew; a shield that only grows or only shrinks (a hold's CPUs joining or
        leaving it) changes in place, what runs inside not moved (v1_groups orders the
        writes)."""
        was = shield_was(chosen.hierarchy or "", owned)
        wanted = options.cpus or CpuSet()  # a cpuset mechanism is chosen for CPUs only
        return was is not None and not (was.issubset(wanted) or wanted.issubset(was))

    def own_made(self, rules: ShieldRules, pid: int, cpus: CpuSet) -> Settings:
        """What a held application's own cgroup needs before it moves in."""
        return {}

    def own_set(self, pid: int, cpus: CpuSet) -> Settings:
        """What a held application's own cgroup needs once it has moved in."""
        return {}

    def expand_steps(
        self, rules: ShieldRules, owned: Owned
    ) -> Generator[None, None, Expansion[ShieldRules]]:
        """The cpusets, then every user task of the root cgroup that must move (v1: all but
        those allowed, to housekeeping; each: the application and tasks their users
        confined to the shielded CPUs, into the shield). What runs in another manager's
        cgroup stays, listed. Yields every CGROUP_TASK_CHUNK tasks."""
        refused: dict[str, str] = {}
        settings = self.cgroups(rules, owned, refused)
        theirs = []
        for n, task in enumerate(self.system.tasks()):
            if n % CGROUP_TASK_CHUNK == CGROUP_TASK_CHUNK - 1:
                yield
            if task.is_kthread:
                continue
            cgroup = self.system.task_cgroup(task.pid)
            if cgroup is None:
                continue
            rule = self.judge.user_rule(rules, task)  # once per task: where it goes, then its CPUs
            try:
                goes = self.task_placement(rules, UserTask(task, cgroup, rule), owned)
            except KernelRefused:
                continue  # exited meanwhile
            target, where = goes.target, goes.into
            own = False
            if where is not None or target in owned:
                value = where if where is not None else owned[target]
                own = self.place_in(rules, task, target, value, where or cgroup, settings)
            elif goes.why:
                theirs.append((task.pid, task.comm, cgroup, goes.why))
            inside = inside_shield(where or cgroup)
            if rule is None and inside and task.pid in self.judge.placed_pids and not own:
                # Each hold's application on its own CPUs inside the shield: in a cgroup of
                # its own where the mechanism makes one (place_in), else by an affinity its
                # command inherits and the kernel keeps when the shield's CPUs change (the
                # user-requested mask): another hold's CPUs joining or leaving the shield
                # do not spread it over them.
                rule = Rule(PLACED, self.judge.own_cpus(rules, task.pid))
            if rule is not None:  # after its move
                settings.update(rule_settings(rule, task, [*thread_ids(self.system, task.pid)]))
        rules = dataclasses.replace(rules, theirs=tuple(theirs))
        return Expansion(settings, rules, refused=refused)

    def task_placement(self, rules: ShieldRules, found: UserTask, owned: Owned) -> Placement:
        """Where a user task goes. Here v1's and v2's way: into latencyd's cpusets, the task
        moved by latencyd itself (their cgroup.procs); systemd's moves it through systemd."""
        task, cgroup, rule = found.task, found.cgroup, found.rule
        target = TaskCgroup(self.hierarchy(rules), task.pid, task.start_time)
        placed = self.judge.placed(rules, task, rule)
        # A hold's holder whose hold ended (placed no more, the CPUs it was given still
        # owned): judged as from the root, so it leaves the shield its CPUs were taken from.
        # Its own cpuset or the CPUs it was given tell it, whichever placed it.
        in_own = target in owned and str(owned[target]).startswith(f"/{SHIELD}/")
        released = (
            not placed
            and cgroup != "/"
            and target in owned
            and (in_own or TaskAffinity(task.pid, task.start_time, task.pid) in owned)
            and rule is None
        )
        judged = "/" if released else cgroup
        allowed = judged == "/" and self.judge.left_alone(rules, task) is not None
        # Its CPUs now are its own cpuset's, not its user's: a holder is not judged by them.
        users = judged == "/" and not (released and in_own)
        cpus = self._users_cpus(task, owned) if users else CpuSet()
        into = placement(self.name, judged, cpus, rules.cpus, placed, allowed)
        own = self.own_cgroup(task.pid)
        if into == SHIELD and own is not None:
            return Placement(target, own)  # a held application: into its own cpuset inside
        if into == SHIELD and self.held_cgroup(rules, judged):
            # Put inside by name (apps, a rule), and in a held application's own cpuset
            # (born of it): inside already, as in its scope under systemd, on its hold's
            # CPUs. Moved into the shield's it would have all the shield's (another hold's
            # too), and on shielded CPUs already, it is left as it is (KeptInside).
            return Placement(target, None)
        where = f"/{into}" if into else ("/" if released else None)
        return Placement(target, where, owner(cgroup))

    def held_cgroup(self, rules: ShieldRules, cgroup: str) -> bool:
        """Whether `cgroup` is a held application's own (own_cgroup) while its hold lasts:
        once it ends, its cpuset goes and what runs in it is moved into the shield's.
        Every own cgroup is inside the shield's (app_cgroup, app_scope): the holders are
        looked through only for a task in there."""
        return inside_shield(cgroup) and any(
            self.own_cgroup(pid) == cgroup for pid in self.judge.placed_pids
        )

    def place_in(
        self,
        rules: ShieldRules,
        task: Task,
        target: TaskCgroup | TaskUnit,
        value: Value,
        lands: str,
        settings: Settings,
    ) -> bool:
        """Set where a user task runs (`value`; `lands`: the cgroup it is in after the
        step) and, when that is a held application's own cgroup (own_cgroup), that
        cgroup's CPUs: made before the task moves in (own_made: v1's cpuset), or set once
        the move has made it (own_set: a systemd scope's AllowedCPUs=). Whether it lands in
        its own. Another hold's start or end writes nothing of it: its CPUs are its own."""
        own = self.own_cgroup(task.pid)
        mine = own is not None and lands == own
        cpus = self.judge.own_cpus(rules, task.pid)
        if mine:
            settings.update(self.own_made(rules, task.pid, cpus))
        settings[target] = value
        if mine:
            settings.update(self.own_set(task.pid, cpus))
        return mine

    def _users_cpus(self, task: Task, owned: Owned) -> CpuSet:
        """The CPUs the task's user gave it: what the chase narrowed is judged by its
        original (from the chase to a cpuset, a task narrowed to the housekeeping CPUs,
        read as it is, would look confined there by its user and be moved inside)."""
        given = original_of(owned, TaskAffinity(task.pid, task.start_time, task.pid))
        if given is not None:
            return CpuSet.from_list(str(given))
        return self.system.affinity(task.pid)

    def place(self, rules: ShieldRules, task: Task, tids: list[int], owned: Owned) -> Settings:
        """Under a cpuset, what an exec asks: the application, and a task a rule puts on
        shielded CPUs, moved into the shield (every thread goes along), then a rule's
        CPUs; nothing for any other task."""
        settings: Settings = {}
        cgroup = self.system.task_cgroup(task.pid)
        rule = self.judge.user_rule(rules, task)
        if cgroup is not None and (self.judge.is_app(rules, task) or ruled_inside(rules, rule)):
            try:
                goes = self.task_placement(rules, UserTask(task, cgroup, rule), owned)
            except KernelRefused:
                return {}  # exited meanwhile
            if (where := goes.into) is not None:
                self.place_in(rules, task, goes.target, where, where, settings)
        if rule is not None:
            settings.update(rule_settings(rule, task, tids))
        return settings

    def tables(self, rules: ShieldRules) -> tuple[Table, ...]:
        return (chosen_table(rules, START_INSIDE), self.inside(rules), self.others(rules))

    def inside(self, rules: ShieldRules) -> Table:
        """The tasks in the shield's cgroup and below it: the applications (each held one
        in a cgroup of its own), and what their users put on the shielded CPUs."""
        rows = []
        inside = self.shield_cgroup
        for pid in self.system.cgroup_pids(f"{rules.choice.hierarchy}/{inside}"):
            task = self.system.task(pid)
            if task is not None:
                rows.append((pid, task.comm, self.system.task_cgroup(pid) or ""))
        return Table(
            f"User tasks inside the shield (cgroup /{inside}, CPUs {rules.cpus})",
            ("PID", "name", "cgroup"),
            tuple(rows),
            hide_tasks=lambda row: None,
        )

    @staticmethod
    def others(rules: ShieldRules) -> Table:
        """Tasks another manager's cgroup holds: never moved nor narrowed behind its back."""
        return Table(
            "User tasks left in cgroups other managers own (as of the last expansion)",
            ("PID", "name", "cgroup", "whose"),
            rules.theirs,
            hide_tasks=lambda row: None,
        )
