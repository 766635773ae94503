"""Who a user task is to the shield, by the profile's rules and the holds: the
application (`apps`, by what its user cannot forge; a holder that asked to be placed),
a task left alone (`allow`, anything a hold started), or one a `[[shield.rule]]` puts on
CPUs of its own, by name. The same for every mechanism: they ask here, and decide only
how a task gets where it goes."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from latencyd.core.plugin import Settings, Value
from latencyd.cpuset import CpuSet
from latencyd.kernel.cgroups import Chosen
from latencyd.kernel.system import System, Task
from latencyd.text import printable

from .options import ShieldOptions
from .targets import ShieldTarget, TaskAffinity

ANCESTRY_DEPTH = 64  # generations under_hold walks up at most (a loop cannot trap it)
MAX_VERDICTS = 65536  # under_hold's verdicts kept, past which they are judged afresh
PLACED = re.compile("")  # the rule the application is placed by (Judge.rule_for)


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
    apps: tuple[str, ...] = ()  # globs of the application's names: placed as they exec
    # The mechanism here, and why not the others.
    choice: Chosen = field(default_factory=lambda: Chosen("affinity", None))
    # Tasks another manager's cgroup holds, left alone: (pid, name, cgroup, whose).
    theirs: tuple[tuple[int, str, str, str], ...] = ()


@dataclass(frozen=True)
class KeptInside:
    """The shield's Handover: a task whose user confined it to the shielded CPUs (taskset,
    a container runtime, `latencyctl hold`) was put there on purpose and stays."""

    cpus: CpuSet  # the shielded CPUs

    def theirs(self, target: ShieldTarget, actual: Value) -> str | None:
        if not isinstance(target, TaskAffinity):
            return None
        cpus = CpuSet.from_list(str(actual))
        if cpus and cpus.issubset(self.cpus):
            return f"put on isolated CPUs {cpus} on purpose: a task inside the shield stays"
        return None


def rules_from(options: ShieldOptions) -> tuple[Rule, ...]:
    return tuple(Rule(re.compile(r.match), r.cpus) for r in options.rule)


def by_name(rules: ShieldRules, task: Task) -> Rule | None:
    """The first rule whose regex a user task's name matches (user_rule: the one it runs
    by)."""
    if task.is_kthread:
        return None
    return next((r for r in rules.rules if r.pattern.search(task.comm)), None)


def ruled_inside(rules: ShieldRules, rule: Rule | None) -> bool:
    """Whether `rule` puts its tasks on shielded CPUs only. Under a cpuset the kernel
    lets a task have those CPUs only inside the shield's cgroup (elsewhere its affinity
    is refused: EINVAL), so it is moved in as the application is: the rule is the
    profile's, by name, as TuneD's scheduler groups are."""
    return rule is not None and bool(rule.cpus) and rule.cpus.issubset(rules.cpus)


def rule_settings(rule: Rule, task: Task, tids: list[int]) -> Settings:
    """A rule's settings for some threads of a task: each on the rule's CPUs."""
    cpus = rule.cpus.to_list()
    return {TaskAffinity(task.pid, task.start_time, tid): cpus for tid in tids}


class Judge:
    """The rules as they apply to one task, with the holders the daemon told
    (PlacesApplications.holders) and the verdicts on who descends from one."""

    def __init__(self, system: System) -> None:
        self.system = system
        # Processes holding a profile (`latencyctl hold PROFILE -- app`): they and what they
        # start are never moved (the daemon tells them, PlacesApplications.holders).
        self.exempt_pids: frozenset[int] = frozenset()
        # Of those, the holders that asked to be placed (HoldAndPlace), each with its
        # hold's CPUs: each is put on its own CPUs only, so its command is born there.
        self.placed_pids: Mapping[int, CpuSet] = {}
        # Whether a task is under a hold (under_hold): pid -> (start time, verdict), valid
        # for the holders in verdicts_for.
        self.verdicts: dict[int, tuple[int, bool]] = {}
        self.verdicts_for: frozenset[int] = frozenset()

    def holders(self, exempt: frozenset[int], placed: Mapping[int, CpuSet]) -> None:
        self.exempt_pids, self.placed_pids = exempt, placed

    def is_app(self, rules: ShieldRules, task: Task) -> bool:
        """Whether the task is the application ([shield] apps), by what its user cannot
        forge: a pattern with a `/` matches its executable's path; a bare name, the file
        name of an executable root owns and no one else may write (not a process name:
        any user's process may rename itself, or run a copy named like the application)."""
        if not rules.apps:
            return False
        exe = self.system.executable(task.pid)
        if exe is None:
            return False
        name = exe.path.rsplit("/", 1)[-1]
        by_path = (p for p in rules.apps if "/" in p)
        by_name = (p for p in rules.apps if "/" not in p) if exe.trusted else ()
        return any(fnmatch.fnmatchcase(exe.path, p) for p in by_path) or any(
            fnmatch.fnmatchcase(name, p) for p in by_name
        )

    def placed(self, rules: ShieldRules, task: Task, rule: Rule | None) -> bool:
        """Whether the shield puts the task on the shielded CPUs: the application, by
        name or because it holds the profile (`latencyctl run`/`hold`, whose command is
        then born there), or a task its rule (user_rule, found once by the caller) puts
        there."""
        return task.pid in self.placed_pids or self.is_app(rules, task) or ruled_inside(rules, rule)

    def user_rule(self, rules: ShieldRules, task: Task) -> Rule | None:
        """The rule a user task runs by: the first whose regex its name matches, unless
        that one gives way to the task's hold (gives_way)."""
        rule = by_name(rules, task)
        return None if self.gives_way(rules, task.pid, rule) else rule

    def gives_way(self, rules: ShieldRules, pid: int, rule: Rule | None) -> bool:
        """Whether `rule` gives way to the hold of the application `pid` holds: the hold
        names the CPUs of that very process (HoldAndPlace), a rule any process of a name.
        Moved by the rule, the holder would leave its hold's CPUs (for another hold's, or
        housekeeping) and the hold be undone as not placed; a rule within them applies."""
        return (
            rule is not None
            and bool(rules.cpus)
            and pid in self.placed_pids
            and not rule.cpus.issubset(self.own_cpus(rules, pid))
        )

    def given_way(self, rules: ShieldRules) -> dict[str, str]:
        """The rules that give way to a hold for its holder, said as not applicable (what,
        why): a few holders looked at, not every task. No pid nor name of the holder in
        them: anyone may read them in status."""
        said: dict[str, str] = {}
        for pid in self.placed_pids:
            task = self.system.task(pid)
            rule = by_name(rules, task) if task is not None else None
            if rule is not None and self.gives_way(rules, pid, rule):
                said[f"rule {printable(rule.pattern.pattern)}"] = (
                    f"not applied to a held application's process of that name: its hold "
                    f"keeps it on its CPUs {self.own_cpus(rules, pid)}, which do not include "
                    f"all of the rule's {rule.cpus} (a hold names the CPUs of that process, "
                    "a rule any process of a name)"
                )
        return said

    def left_alone(self, rules: ShieldRules, task: Task) -> str | None:
        """Why the shield leaves a user task alone wherever it runs, or None."""
        if any(fnmatch.fnmatchcase(task.comm, p) for p in rules.allow):
            return "allowed by name ([shield] allow)"
        if self.exempt_pids and self.under_hold(task):
            return "started under a hold (latencyctl hold)"  # the application itself
        return None

    def under_hold(self, task: Task) -> bool:
        """Whether the task is a holder (exempt_pids) or descends from one. Each task's
        verdict is kept, by pid and start time, for as long as the holders are the same:
        the walk up the parents stops at the first one already judged, so a process 60
        generations down renaming itself in a loop costs no look at the machine per
        rename, and a new task one look (its parent's start time, which tells a pid
        reused from the one judged). A task moved to another parent keeps the verdict it
        was given (what a hold started stays the hold's when a shell between exits)."""
        if self.verdicts_for != self.exempt_pids or len(self.verdicts) > MAX_VERDICTS:
            self.verdicts, self.verdicts_for = {}, self.exempt_pids
        chain: list[Task] = []
        current: Task | None = task
        verdict = False
        for _ in range(ANCESTRY_DEPTH):
            if current is None:
                break
            known = self.verdicts.get(current.pid)
            if known is not None and known[0] == current.start_time:
                verdict = known[1]
                break
            chain.append(current)
            if current.pid in self.exempt_pids:
                verdict = True
                break
            if current.ppid <= 1:
                break
            current = self.system.task(current.ppid)
        for member in chain:
            self.verdicts[member.pid] = (member.start_time, verdict)
        return verdict

    def rule_for(self, rules: ShieldRules, task: Task) -> Rule | None:
        """The CPUs a user task is put on by name: its rule's, or, for the application
        (placed), the shielded CPUs; None: the shield judges it."""
        rule = self.user_rule(rules, task)
        if rule is None and rules.cpus and self.placed(rules, task, rule):
            return Rule(PLACED, self.own_cpus(rules, task.pid))
        return rule

    def own_cpus(self, rules: ShieldRules, pid: int) -> CpuSet:
        """The CPUs the application `pid` is placed on: its hold's (several holds share
        the shield, each application on its own), else the whole shield (by name)."""
        mine = self.placed_pids.get(pid, CpuSet()) & rules.cpus
        return mine or rules.cpus
