"""The shield plugin's class: what the engine, the daemon and status ask of it (the
package's docstring says what the shield is). It keeps no way of keeping the shield
itself: each question goes to the mechanism chosen (mechanism.py), or is answered by
the setting's kind where a setting may be another mechanism's (the last section)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Hashable, Mapping, Sequence
from typing import Any, ClassVar

from latencyd.core.capabilities import (
    FollowsTasks,
    PlacesApplications,
    ReportsGrouped,
    SharesWithUser,
    StartsAfresh,
    TookOver,
)
from latencyd.core.movable import TaskMover
from latencyd.core.movable import require_movable as _require_movable
from latencyd.core.plugin import (
    CPU_ACTIONS,
    Expansion,
    Follows,
    Monitor,
    Settings,
    Target,
    TaskEvent,
    Value,
    run_to_end,
)
from latencyd.core.schema import (
    Moved,
    Schema,
)
from latencyd.core.sharing import read_then_write
from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.kernel.cgroups import (
    APP_SLICE,
    Chosen,
    choose,
    is_app_scope,
)
from latencyd.kernel.system import System

from .chase import Chase
from .mechanism import Mechanism
from .options import ShieldOptions
from .partition import V2Partition
from .rules import (
    Judge,
    KeptInside,
    ShieldRules,
    rules_from,
)
from .systemd import SystemdCpus
from .targets import (
    Cgroup,
    Controller,
    ProcessCgroup,
    RootFile,
    ShieldTarget,
    SlicePartition,
    TaskAffinity,
    TaskCgroup,
    TaskUnit,
    UnitCpus,
    inside_shield,
    name_of,
)
from .v1 import V1Cpusets

log = logging.getLogger(__name__)


class ShieldPlugin(
    TaskMover[ShieldTarget, ShieldRules, ShieldOptions],
    FollowsTasks[ShieldRules, ShieldOptions],
    SharesWithUser[ShieldTarget, ShieldRules],
    StartsAfresh[ShieldOptions],
    ReportsGrouped[ShieldTarget],
    PlacesApplications[ShieldRules],
    TookOver,
):
    name = "shield"
    summary = "Keep user tasks off the application's CPUs, following tasks as they come"
    targets = (
        TaskAffinity, Cgroup, RootFile, Controller, TaskCgroup, UnitCpus, TaskUnit, SlicePartition,
    )  # fmt: skip
    # Journals of versions where [kthread] moved user tasks hold ("kthread", task_affinity).
    took_over: ClassVar[Mapping[str, str]] = {"task_affinity": "kthread"}
    example: ClassVar[dict[str, Any]] = {
        "cpus": "1",
        "allow": ["sshd"],
        "rule": [{"match": "^myapp$", "cpus": "1"}],
    }
    follows = Follows(udev={"cpu": CPU_ACTIONS})
    schema = Schema(
        section=ShieldOptions,
        groups=(
            ("tasks", ("cpus", "allow", "apps", "mechanism")),
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
        # Who a task is to the shield (the application, allowed, under a hold, ruled).
        self.judge = Judge(system)
        # Each way of keeping the shield, by the name choose() gives it; the chase's also
        # gives back what it narrowed whichever one runs now (original).
        self.chase = Chase(self.tasks, self.judge)
        self.mechanisms: dict[str, Mechanism] = {
            m.name: m
            for m in (
                self.chase,
                V1Cpusets(self.tasks, self.judge),
                V2Partition(self.tasks, self.judge),
                SystemdCpus(self.tasks, self.judge),
            )
        }

    def holders(self, exempt: frozenset[int], placed: Mapping[int, CpuSet]) -> None:
        self.judge.holders(exempt, placed)

    # -- which mechanism keeps the shield, handed each question ---------------------------
    def mechanism(self, options: ShieldOptions) -> Chosen:
        """The mechanism that keeps the section's shield here (latencyd.kernel.cgroups.
        choose), and why not each other one; NotApplicable when the profile asks for a
        cpuset and the machine has none."""
        choice = choose(self.system.cgroup_facts(), options.mechanism)
        if choice.mechanism is None:
            raise NotApplicable(
                'mechanism = "cpuset", and no cpuset can run here: '
                + "; ".join(f"{m}: {why}" for m, why in choice.why_not.items())
            )
        return choice

    def chosen(self, options: ShieldOptions) -> Chosen:
        """The mechanism for the section: mechanism() where it shields CPUs; the chase
        where it shields none (its rules are CPUs given by name, as the chase gives them)."""
        return self.mechanism(options) if options.cpus else Chosen(Chase.name, None)

    def keeper_of(self, choice: Chosen) -> Mechanism:
        """The mechanism `choice` names (a cpuset that cannot run, None, never reaches here:
        mechanism() refuses it)."""
        return self.mechanisms[choice.mechanism or Chase.name]

    def keeper(self, rules: ShieldRules) -> Mechanism:
        """The mechanism that keeps the shield the section expanded to."""
        return self.keeper_of(rules.choice)

    def starts_afresh(self, options: ShieldOptions, owned: Mapping[Target, Value]) -> bool:
        """Whether latencyd's cgroups are given back before the section is expanded again:
        only where some cpuset mechanism's are owned, and then as the mechanism chosen now
        says (Mechanism.starts_afresh: the chase always, a cpuset one when its shield moves
        to other CPUs)."""
        # Looked up, not scanned: beside 20,000 narrowed threads this is asked at every
        # apply. Every mechanism's first settings are looked for, not only the chosen one's:
        # a journal may hold another one's.
        facts = self.system.cgroup_facts()
        firsts = (first for m in self.mechanisms.values() for first in m.first_made(facts))
        if not any(first in owned for first in firsts):
            return False
        try:
            chosen = self.chosen(options)
        except NotApplicable:
            return True
        return self.keeper_of(chosen).starts_afresh(chosen, options, owned)

    def expand_steps(
        self, options: ShieldOptions, owned: Mapping[Target, Value]
    ) -> Generator[None, None, Expansion[ShieldRules]]:
        """The section's settings, by the mechanism that keeps the shield here."""
        choice = self.chosen(options)
        rules = ShieldRules(
            rules_from(options),
            options.cpus if options.cpus is not None else CpuSet(),
            tuple(options.allow or ()),
            time.monotonic(),
            tuple(options.apps or ()),
            choice,
        )
        expansion = yield from self.keeper(rules).expand_steps(rules, owned)
        expansion.refused.update(self.judge.given_way(rules))
        return expansion

    def expand(
        self, options: ShieldOptions, owned: Mapping[Target, Value]
    ) -> Expansion[ShieldRules]:
        return run_to_end(self.expand_steps(options, owned))

    def follows_user_tasks(self, options: ShieldOptions) -> bool:
        """Exec events: the affinity chase needs every one; under a cpuset only the
        application's and the rules' (the kernel places every other new task)."""
        if options.rule or options.apps:
            return True
        if not options.cpus:
            return False
        try:
            return self.keeper_of(self.mechanism(options)).follows_every_exec
        except NotApplicable:
            return False

    def follows_renames(self, options: ShieldOptions) -> bool:
        """Rules match a process's name, which it may change (prctl PR_SET_NAME) as TuneD's
        scheduler groups follow; the rest of the shield judges a task at its exec (its
        CPUs do not change with its name) and the application by what it execs."""
        return bool(options.rule)

    def on_task(
        self, rules: ShieldRules | None, event: TaskEvent, owned: Mapping[Target, Value]
    ) -> Settings:
        """Settings a just-renamed (exec'd) user task needs; user forks inherit their
        parent's affinity (born_narrowed), so they are not asked and stay cheap."""
        if rules is None:
            return {}
        if event.kind == "comm" and (rules.cpus or rules.rules):
            task = self.system.task(event.pid)
            if task is None or task.is_kthread:
                return {}
            return self.keeper(rules).place(rules, task, [event.tid], owned)
        return {}

    def started_meanwhile(
        self, rules: ShieldRules | None, owned: Mapping[Target, Value]
    ) -> Settings:
        """What the tasks just placed started before the write (the chase's: what the
        processes it narrowed started between their exec and the write)."""
        return {} if rules is None else self.keeper(rules).started_meanwhile(rules, owned)

    def not_placed(self, rules: ShieldRules | None, pid: int) -> str | None:
        """Why the holder `pid` is not on the shielded CPUs (PlacesApplications): what its
        cgroup's owner keeps it in, or the CPUs it has."""
        if rules is None or not rules.cpus:
            return None
        own = self.judge.own_cpus(rules, pid)
        affinity = self.system.affinity(pid)
        if affinity and affinity.issubset(own):
            return None
        cgroup = self.system.task_cgroup(pid)
        if cgroup is not None and (
            cgroup == self.keeper(rules).own_cgroup(pid)
            or (own == rules.cpus and inside_shield(cgroup))
        ):
            return None  # in its own cgroup, or the shield's: the kernel keeps it on its CPUs
        why = next((w for p, _, _, w in rules.theirs if p == pid), None)
        where = f" in cgroup {cgroup}" if cgroup else ""
        return (
            f"process {pid} runs on CPUs {affinity.to_list() or 'none'}{where}, not on the "
            f"shielded CPUs {own.to_list()}" + (f": {why}" if why else "")
        )

    def handover(self, rules: ShieldRules | None) -> KeptInside | None:
        """A task its user put inside the shield stays there (SharesWithUser)."""
        return KeptInside(rules.cpus) if rules is not None and rules.cpus else None

    def end_step(self) -> None:
        super().end_step()
        for mechanism in self.mechanisms.values():
            mechanism.end_step()

    def monitor(self, rules: ShieldRules | None) -> Monitor:
        if rules is None:
            return Monitor()
        choice = rules.choice
        facts = {
            "mechanism": choice.mechanism,
            "rules": len(rules.rules),
            "rescan_every_s": self.rescan_interval_s,
        }
        if not rules.cpus:
            return Monitor(facts=facts)
        return Monitor(self.keeper(rules).tables(rules), facts)

    # -- by the setting's kind, whichever mechanism set it ---------------------------------
    # What follows asks a target's kind, not the mechanism chosen now: a step may give back
    # another mechanism's settings (a journal from before a switch of mechanism: the
    # chase's narrowed threads, a cpuset's task moves), and a task's CPUs (TaskAffinity)
    # are set under every mechanism (a rule's, a held application's).
    def original(
        self,
        target: ShieldTarget,
        current: Value,
        owned: Callable[[Target], tuple[Value, Value] | None],
    ) -> Value:
        """A task born narrowed (born_narrowed) gets its parent's original back. A cgroup
        named latencyd-* is latencyd's, even one a killed run left without a journal:
        given back, it is removed."""
        if isinstance(target, Cgroup) or (
            isinstance(target, UnitCpus) and (target.unit == APP_SLICE or is_app_scope(target.unit))
        ):
            return None
        if isinstance(target, TaskAffinity):

            def applied(t: Target) -> Value | None:
                got = owned(t)
                return got[1] if got is not None else None

            parent = self.chase.born_narrowed(target, str(current), applied)
            given = owned(parent) if parent is not None else None
            if given is not None:
                return given[0]
        return current

    def write_unless_changed(
        self, target: ShieldTarget, value: Value, judged: Value
    ) -> Value | None:
        """A user task's CPUs read and written back to back (System.set_affinity): its
        user may pin it in between (`taskset -c 1 app` right after an exec narrowed)."""
        if not isinstance(target, TaskAffinity):
            return read_then_write(self, target, value, judged)
        _require_movable(self._task(target))
        if target.pid in self.judge.placed_pids:
            # A holder placed on its hold's CPUs: its move into the shield, earlier in this
            # step, changed its CPUs; no user pinned it meanwhile.
            self.system.set_affinity(target.tid, CpuSet.from_list(str(value)))
            return None
        cpus, judged_cpus = CpuSet.from_list(str(value)), CpuSet.from_list(str(judged))
        try:
            found = self.system.set_affinity(target.tid, cpus, only_from=judged_cpus)
        except KernelRefused as exc:
            # A holder whose hold ended stays in latencyd's cgroup where systemd moves
            # nothing back (a scope of `systemd-run --scope`) until it exits: the kernel
            # keeps it on the cgroup's CPUs, and its CPUs from before are not among them.
            cgroup = self.system.task_cgroup(target.pid) or ""
            if not inside_shield(cgroup):
                raise
            raise NotApplicable(
                f"pid {target.pid} stays in {cgroup}, whose CPUs do not include {value} "
                f"({exc.reason}): it runs on that cgroup's CPUs until it leaves it or exits"
            ) from exc
        if found not in (None, cpus) and self._moved_inside(target.pid, judged_cpus, found):
            self.system.set_affinity(target.tid, cpus)
            return None
        return None if found is None else found.to_list()

    def _moved_inside(self, pid: int, judged: CpuSet, found: CpuSet) -> bool:
        """Whether a task a rule puts on shielded CPUs lost CPUs it held when judged by a
        move into the shield's cgroup since (the move earlier in its step: the kernel gives
        it the cgroup's CPUs). Inside, nothing else takes CPUs from a task but its user,
        and the profile's rule is written over that, as over an exec's `taskset`."""
        if judged.issubset(found):
            return False
        cgroup = self.system.task_cgroup(pid)
        return cgroup is not None and inside_shield(cgroup)

    def report(self, changes: list[tuple[ShieldTarget, Value, Value]]) -> None:
        """Every move of a user task is said: one line per process and move (name, pid,
        how many of its threads, CPUs before and after), not one per thread; moves
        between cgroups as one line per cgroup, the tasks counted."""
        moves: dict[tuple[int, str, str], list[int]] = {}
        into: dict[tuple[str, str], int] = {}
        for target, before, after in changes:
            if isinstance(target, TaskAffinity):
                moves.setdefault((target.pid, str(before), str(after)), []).append(target.tid)
            elif isinstance(target, ProcessCgroup):
                into[(str(before), str(after))] = into.get((str(before), str(after)), 0) + 1
        for (pid, before, after), tids in moves.items():
            task = self.system.task(pid)
            threads = f"thread {tids[0]}" if len(tids) == 1 else f"{len(tids)} threads"
            log.info(
                "user task %s (pid %d, %s): CPUs %s -> %s",
                task.comm if task else "?", pid, threads, before, after,
            )  # fmt: skip
        for (before, after), count in into.items():
            log.info("%d user tasks moved from cgroup %s to %s", count, before, after)

    def group(self, target: ShieldTarget) -> Hashable | None:
        if isinstance(target, TaskAffinity):
            return ("task", target.pid, target.start)
        return ("cgroup",) if isinstance(target, ProcessCgroup) else None

    def describe_group(self, targets: Sequence[ShieldTarget], value: Value) -> str:
        first = targets[0]
        if isinstance(first, ProcessCgroup):
            return f"{len(targets):,} user tasks in cgroup {value}"
        if not isinstance(first, TaskAffinity):
            return f"{self.describe(first, value)} and {len(targets) - 1:,} more like it"
        name = name_of(self.system, first.pid)
        return f"user task {name}(pid {first.pid}, {len(targets):,} threads) CPUs = {value}"
