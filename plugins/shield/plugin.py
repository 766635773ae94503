"""The shield plugin's class: what the engine, the daemon and status ask of it (the
package's docstring says what the shield is)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from latencyd.core.capabilities import (
    FollowsTasks,
    PlacesApplications,
    ReportsGrouped,
    SharesWithUser,
)
from latencyd.core.movable import TaskMover
from latencyd.core.movable import require_movable as _require_movable
from latencyd.core.plugin import (
    CPU_ACTIONS,
    Expansion,
    Follows,
    Monitor,
    Options,
    Settings,
    Table,
    Target,
    TaskEvent,
    Value,
    original_of,
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
from latencyd.core.sharing import read_then_write
from latencyd.cpuset import CpuSet, CpuSetError
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.kernel.cgroups import (
    APP_SLICE,
    ISOLATED_FILE,
    PARTITION_FILE,
    SHIELD,
    SYSTEMD_CONFINED,
    V1_ROOT_FILES,
    Chosen,
    app_cgroup,
    app_scope,
    choose,
    is_app_scope,
    owner,
    partition_says,
    placement,
    systemd_placement,
    v1_app_group,
    v1_groups,
    v2_groups,
)
from latencyd.kernel.system import System, Task

from .rules import (
    PLACED,
    Judge,
    KeptInside,
    Rule,
    ShieldRules,
    rule_settings,
    ruled_inside,
    rules_from,
)
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
    top_cgroup,
)

THREAD_CHUNK = 1024  # threads of one task read per piece of an expansion (expand_steps)
BORN_NARROWED_DEPTH = 8  # generations born_narrowed walks up to a narrowed ancestor
MECHANISMS = ("auto", "cpuset", "affinity")
CGROUP_TASK_CHUNK = 256  # tasks judged per piece of a cpuset expansion

log = logging.getLogger(__name__)


class ShieldPlugin(
    TaskMover[ShieldTarget, ShieldRules],
    FollowsTasks[ShieldRules],
    SharesWithUser[ShieldTarget, ShieldRules],
    ReportsGrouped[ShieldTarget],
    PlacesApplications[ShieldRules],
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
                "apps",
                ListOf(Str()),
                "The application's executables (globs): a path (/opt/md/bin/*), or a file "
                "name that only root's files match (not a process name, which any user "
                "chooses): placed on the shielded CPUs as it starts (exec)",
            ),
            Option(
                "mechanism",
                Choice(MECHANISMS),
                "How the shield is kept: cpuset has the kernel keep it (a cgroup v2 "
                "isolated partition; under systemd, AllowedCPUs= set through systemd on "
                "init.scope, system.slice, user.slice and a latencyd.slice for the "
                "application; else v1 exclusive cpusets; inside one the kernel "
                "refuses taskset to CPUs outside it: start the application with latencyctl "
                "run, hold -- CMD or apps); affinity narrows each task's CPUs as it comes; "
                "auto takes cpuset where the machine has one (status says which runs)",
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
        self.every_cpu: str | None = None  # the online CPUs, within a step
        self.just_narrowed: set[int] = set()  # processes whose new settings await started_meanwhile
        # Who a task is to the shield (the application, allowed, under a hold, ruled).
        self.judge = Judge(system)

    def holders(self, exempt: frozenset[int], placed: Mapping[int, CpuSet]) -> None:
        self.judge.holders(exempt, placed)

    # -- which mechanism keeps the shield ------------------------------------------------
    def mechanism(self, options: Options) -> Chosen:
        """The mechanism that keeps the section's shield here (latencyd.kernel.cgroups.
        choose), and why not each other one; NotApplicable when the profile asks for a
        cpuset and the machine has none."""
        choice = choose(self.system.cgroup_facts(), options.get("mechanism", "auto"))
        if choice.mechanism is None:
            raise NotApplicable(
                'mechanism = "cpuset", and no cpuset can run here: '
                + "; ".join(f"{m}: {why}" for m, why in choice.why_not.items())
            )
        return choice

    def starts_afresh(self, options: Options, owned: Mapping[Target, Value]) -> bool:
        """From cpusets to the chase: the tasks get their own CPUs back only once moved out
        of latencyd's cpusets, so the chase must judge them (and read their originals)
        after that, not before. (The other way round needs nothing: affinities given
        back first, the kernel then intersects them with the cpuset.) And a shield on
        other CPUs: v1's exclusive cpusets cannot trade CPUs in place (whichever is
        written first overlaps its exclusive sibling: EINVAL), so they are made anew;
        a shield that only grows or only shrinks (a hold's CPUs joining or leaving it)
        changes in place, what runs inside not moved (v1_groups orders the writes)."""
        # Looked up, not scanned: beside 20,000 narrowed threads this is asked at every
        # apply. Each cpuset mechanism's first setting (the root's) is journaled with the
        # rest of its step before anything is written: owned whenever any of it is.
        facts = self.system.cgroup_facts()
        v1 = facts.v1_cpuset
        firsts: list[Target] = [RootFile(v1, f) for f in V1_ROOT_FILES] if v1 else []
        firsts += [Controller(h, "cpuset") for h in (facts.unified,) if h]
        firsts.append(UnitCpus(APP_SLICE))
        if not any(first in owned for first in firsts):
            return False
        try:
            chosen = self.mechanism(options) if options.get("cpus") else Chosen("affinity", None)
        except NotApplicable:
            return True
        if chosen.mechanism == "affinity":
            return True
        given = owned.get(Cgroup(chosen.hierarchy or "", SHIELD))
        wanted: CpuSet = options["cpus"]
        if isinstance(given, Mapping) and "cpuset.cpus" in given:
            was = CpuSet.from_list(str(given["cpuset.cpus"]))
            return not (was.issubset(wanted) or wanted.issubset(was))
        return False

    def expand_steps(
        self, options: Options, owned: Mapping[Target, Value]
    ) -> Generator[None, None, Expansion[ShieldRules]]:
        """The section's settings, by the mechanism that keeps the shield here."""
        choice = self.mechanism(options) if options.get("cpus") else Chosen("affinity", None)
        rules = ShieldRules(
            rules_from(options),
            options.get("cpus", CpuSet()),
            tuple(options.get("allow", ())),
            time.monotonic(),
            tuple(options.get("apps", ())),
            choice,
        )
        if choice.mechanism == "affinity":
            expansion = yield from self.affinity_expand_steps(rules, owned)
        else:
            expansion = yield from self.cpuset_expand_steps(rules, owned)
        expansion.refused.update(self.judge.given_way(rules))
        return expansion

    def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion[ShieldRules]:
        return run_to_end(self.expand_steps(options, owned))

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
            cgroup == self.own_cgroup(rules, pid) or (own == rules.cpus and inside_shield(cgroup))
        ):
            return None  # in its own cgroup, or the shield's: the kernel keeps it on its CPUs
        why = next((w for p, _, _, w in rules.theirs if p == pid), None)
        where = f" in cgroup {cgroup}" if cgroup else ""
        return (
            f"process {pid} runs on CPUs {affinity.to_list() or 'none'}{where}, not on the "
            f"shielded CPUs {own.to_list()}" + (f": {why}" if why else "")
        )

    # -- the cpuset mechanisms: the kernel keeps the shield ----------------------------------
    def cpuset_expand_steps(
        self, rules: ShieldRules, owned: Mapping[Target, Value]
    ) -> Generator[None, None, Expansion[ShieldRules]]:
        """The cpusets, then every user task of the root cgroup that must move (v1: all but
        those allowed, to housekeeping; both: the application and tasks their users
        confined to the shielded CPUs, into the shield). What runs in another manager's
        cgroup stays, listed. Yields every CGROUP_TASK_CHUNK tasks."""
        mechanism, hierarchy = rules.choice.mechanism, rules.choice.hierarchy
        assert mechanism is not None and hierarchy is not None
        settings: Settings = {}
        refused: dict[str, str] = {}
        groups: dict[str, dict[str, str]] = {}
        if mechanism == "cpuset-systemd":
            # The application's slice first: its step is the one starts_afresh looks up.
            settings[UnitCpus(APP_SLICE)] = rules.cpus.to_list()
            housekeeping = (self.system.online_cpus() - rules.cpus).to_list()
            settings.update({UnitCpus(unit): housekeeping for unit in SYSTEMD_CONFINED})
            # Once every other unit is off the shielded CPUs, the slice can have them alone.
            settings[SlicePartition(hierarchy)] = "isolated"
            if rules.allow:
                refused["allow"] = (
                    f"AllowedCPUs= of {', '.join(SYSTEMD_CONFINED)} keeps every task in them "
                    "off the shielded CPUs: none may stay (name the application in apps)"
                )
        elif mechanism == "cpuset-v2":
            settings[Controller(hierarchy, "cpuset")] = True
            groups = v2_groups(rules.cpus)
            if rules.allow:
                refused["allow"] = (
                    "an isolated partition takes its CPUs from every cgroup outside it: no "
                    "task outside may stay on them (name the application in apps instead)"
                )
        else:
            mems = self.system.read(f"{hierarchy}/cpuset.effective_mems")
            given = owned.get(Cgroup(hierarchy, SHIELD))
            was = (
                CpuSet.from_list(str(given["cpuset.cpus"]))
                if isinstance(given, Mapping) and "cpuset.cpus" in given
                else None
            )
            groups = v1_groups(rules.cpus, self.system.online_cpus(), mems, was)
            settings.update({RootFile(hierarchy, f): v for f, v in V1_ROOT_FILES.items()})
        settings.update({Cgroup(hierarchy, name): files for name, files in groups.items()})
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
                target, where, why = self.task_placement(rules, task, cgroup, owned, rule)
            except KernelRefused:
                continue  # exited meanwhile
            own = False
            if where is not None or target in owned:
                value = where if where is not None else owned[target]
                own = self.place(rules, task, target, value, where or cgroup, settings)
            elif why:
                theirs.append((task.pid, task.comm, cgroup, why))
            inside = inside_shield(where or cgroup)
            if rule is None and inside and task.pid in self.judge.placed_pids and not own:
                # Each hold's application on its own CPUs inside the shield: in a cgroup of
                # its own where the mechanism makes one (place), else by an affinity its
                # command inherits and the kernel keeps when the shield's CPUs change (the
                # user-requested mask): another hold's CPUs joining or leaving the shield
                # do not spread it over them.
                rule = Rule(PLACED, self.judge.own_cpus(rules, task.pid))
            if rule is not None:  # after its move
                settings.update(rule_settings(rule, task, [*self.thread_ids(task.pid)]))
        rules = dataclasses.replace(rules, theirs=tuple(theirs))
        return Expansion(settings, rules, refused=refused)

    def task_placement(
        self,
        rules: ShieldRules,
        task: Task,
        cgroup: str,
        owned: Mapping[Target, Value],
        rule: Rule | None,
    ) -> tuple[TaskCgroup | TaskUnit, str | None, str | None]:
        """A user task's setting under a cpuset mechanism, the cgroup it must move to (None:
        it stays) and, when it stays for another manager's sake, why. `rule`: its
        user_rule, as the caller found it."""
        mechanism, hierarchy = rules.choice.mechanism, rules.choice.hierarchy
        assert mechanism is not None and hierarchy is not None
        if mechanism == "cpuset-systemd":
            unit_target = TaskUnit(hierarchy, task.pid, task.start_time)
            confined = top_cgroup(cgroup) in SYSTEMD_CONFINED
            cpus = self._users_cpus(task, owned) if confined else CpuSet()
            placed = self.judge.placed(rules, task, rule)
            # By name or under a hold; asked only where it decides (a walk up the parents).
            confined_there = bool(cpus) and cpus.issubset(rules.cpus)
            allowed = confined_there and self.judge.left_alone(rules, task) is not None
            into, why = systemd_placement(cgroup, cpus, rules.cpus, placed, allowed)
            where = f"/{APP_SLICE}/{app_scope(task.pid)}" if into else None
            return unit_target, where, why
        target = TaskCgroup(hierarchy, task.pid, task.start_time)
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
        into = placement(mechanism, judged, cpus, rules.cpus, placed, allowed)
        own = self.own_cgroup(rules, task.pid)
        if into == SHIELD and own is not None:
            return target, own, None  # a held application: into its own cpuset inside
        if into == SHIELD and self.held_cgroup(rules, judged):
            # Put inside by name (apps, a rule), and in a held application's own cpuset
            # (born of it): inside already, as in its scope under systemd, on its hold's
            # CPUs. Moved into the shield's it would have all the shield's (another hold's
            # too), and on shielded CPUs already, it is left as it is (KeptInside).
            return target, None, None
        where = f"/{into}" if into else ("/" if released else None)
        return target, where, owner(cgroup)

    def held_cgroup(self, rules: ShieldRules, cgroup: str) -> bool:
        """Whether `cgroup` is a held application's own (own_cgroup) while its hold lasts:
        once it ends, its cpuset goes and what runs in it is moved into the shield's.
        Every own cgroup is inside the shield's (app_cgroup, app_scope): the holders are
        looked through only for a task in there."""
        return inside_shield(cgroup) and any(
            self.own_cgroup(rules, pid) == cgroup for pid in self.judge.placed_pids
        )

    def own_cgroup(self, rules: ShieldRules, pid: int) -> str | None:
        """The cgroup a held application runs in on its hold's CPUs alone (placed_pids):
        a cpuset of its own inside the shield's (v1), or a scope of its own in
        latencyd.slice whose AllowedCPUs= are its CPUs (systemd); None: by an affinity
        (the v2 partition, the chase) or on the whole shield (an application by name)."""
        if pid not in self.judge.placed_pids:
            return None
        if rules.choice.mechanism == "cpuset-v1":
            return f"/{app_cgroup(pid)}"
        if rules.choice.mechanism == "cpuset-systemd":
            return f"/{APP_SLICE}/{app_scope(pid)}"
        return None

    def place(
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
        cgroup's CPUs: its cpuset is made before the task moves in (v1), its scope's
        AllowedCPUs= set once the move has made the scope (systemd). Whether it lands in
        its own. Another hold's start or end writes nothing of it: its CPUs are its own."""
        own = self.own_cgroup(rules, task.pid)
        mine = own is not None and lands == own
        hierarchy, cpus = rules.choice.hierarchy or "", self.judge.own_cpus(rules, task.pid)
        if own is not None and mine and rules.choice.mechanism == "cpuset-v1":
            mems = self.system.read(f"{hierarchy}/cpuset.effective_mems")  # the shield's
            settings[Cgroup(hierarchy, own.lstrip("/"))] = v1_app_group(cpus, mems)
        settings[target] = value
        if mine and rules.choice.mechanism == "cpuset-systemd":
            settings[UnitCpus(app_scope(task.pid))] = cpus.to_list()
        return mine

    def _users_cpus(self, task: Task, owned: Mapping[Target, Value]) -> CpuSet:
        """The CPUs the task's user gave it: what the chase narrowed is judged by its
        original (from the chase to a cpuset, a task narrowed to the housekeeping CPUs,
        read as it is, would look confined there by its user and be moved inside)."""
        given = original_of(owned, TaskAffinity(task.pid, task.start_time, task.pid))
        if given is not None:
            return CpuSet.from_list(str(given))
        return self.system.affinity(task.pid)

    # -- the affinity mechanism: deciding what a task wants --------------------------------
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
    def _narrowed_as(parent: TaskAffinity, isolate: CpuSet, owned: Mapping[Target, Value]) -> Value:
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

    def thread_ids(self, pid: int) -> Iterator[int]:
        """The process's threads, as the kernel lists them (lazily: 20,000 take a while)."""
        return (int(t) for t in self.system.entries(f"proc/{pid}/task") if t.isdigit())

    def handover(self, rules: ShieldRules | None) -> KeptInside | None:
        """A task its user put inside the shield stays there (SharesWithUser)."""
        return KeptInside(rules.cpus) if rules is not None and rules.cpus else None

    def affinity_expand_steps(
        self, rules: ShieldRules, owned: Mapping[Target, Value]
    ) -> Generator[None, None, Expansion[ShieldRules]]:
        """Yields after each task and each THREAD_CHUNK threads of one (a JVM's 20,000)."""
        settings: Settings = {}
        current: dict[Target, Value] = {}
        for task in self.system.tasks():
            if not task.is_kthread and (
                (rule := self.judge.rule_for(rules, task)) is not None
                or (rules.cpus and not self.judge.left_alone(rules, task))
            ):
                tids = self.thread_ids(task.pid)
                while chunk := list(itertools.islice(tids, THREAD_CHUNK)):
                    settings.update(
                        rule_settings(rule, task, chunk)
                        if rule is not None
                        else self.user_task_settings(rules, task, chunk, owned, current)
                    )
                    yield
            yield
        return Expansion(settings, rules, current=current)

    def follows_user_tasks(self, options: Options) -> bool:
        """Exec events: the affinity chase needs every one; under a cpuset only the
        application's and the rules' (the kernel places every other new task)."""
        if options.get("rule") or options.get("apps"):
            return True
        if not options.get("cpus"):
            return False
        try:
            return self.mechanism(options).mechanism == "affinity"
        except NotApplicable:
            return False

    def follows_renames(self, options: Options) -> bool:
        """Rules match a process's name, which it may change (prctl PR_SET_NAME) as TuneD's
        scheduler groups follow; the rest of the shield judges a task at its exec (its
        CPUs do not change with its name) and the application by what it execs."""
        return bool(options.get("rule"))

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
            if rules.choice.mechanism != "affinity":  # the kernel keeps the rest
                return self.cpuset_task_settings(rules, task, [event.tid], owned)
            if (rule := self.judge.rule_for(rules, task)) is not None:
                return rule_settings(rule, task, [event.tid])
            settings = self.user_task_settings(rules, task, [event.tid], owned)
            if settings:
                self.just_narrowed.add(task.pid)
            return settings
        return {}

    def cpuset_task_settings(
        self, rules: ShieldRules, task: Task, tids: list[int], owned: Mapping[Target, Value]
    ) -> Settings:
        """Under a cpuset, what an exec asks: the application, and a task a rule puts on
        shielded CPUs, moved into the shield (every thread goes along), then a rule's
        CPUs; nothing for any other task."""
        settings: Settings = {}
        cgroup = self.system.task_cgroup(task.pid)
        rule = self.judge.user_rule(rules, task)
        if cgroup is not None and (self.judge.is_app(rules, task) or ruled_inside(rules, rule)):
            try:
                target, where, _ = self.task_placement(rules, task, cgroup, owned, rule)
            except KernelRefused:
                return {}  # exited meanwhile
            if where is not None:
                self.place(rules, task, target, where, where, settings)
        if rule is not None:
            settings.update(rule_settings(rule, task, tids))
        return settings

    def started_meanwhile(
        self, rules: ShieldRules | None, owned: Mapping[Target, Value]
    ) -> Settings:
        """The threads and children that the processes just narrowed started between their
        exec and the write: they inherited the CPUs from before (stress-ng's workers ran on
        the isolated CPU until the next switch). Read after the write, none is missed: what
        starts later inherits the narrowed CPUs. Their own children are asked next round."""
        if rules is None:
            return {}
        pids, self.just_narrowed = self.just_narrowed, set()
        settings: Settings = {}
        for pid in pids:
            for member in (pid, *self.system.children(pid)):
                task = self.system.task(member)
                if task is None or task.is_kthread:
                    continue
                tids = [t for t in self.thread_ids(member)
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

            parent = self.born_narrowed(target, str(current), applied)
            given = owned(parent) if parent is not None else None
            if given is not None:
                return given[0]
        return current

    # -- plugin verbs ------------------------------------------------------------------
    def end_step(self) -> None:
        super().end_step()
        self.every_cpu = None

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
        if choice.mechanism == "affinity":
            return Monitor((self.mechanisms(rules), self.shielded_tasks(rules)), facts)
        tables = [self.mechanisms(rules), self.inside(rules), self.others(rules)]
        if choice.mechanism == "cpuset-systemd":
            tables.insert(1, self.partition(rules))
        return Monitor(tuple(tables), facts)

    def partition(self, rules: ShieldRules) -> Table:
        """What the isolated partition adds here, read back from the kernel, or why none."""
        hierarchy = rules.choice.hierarchy or ""
        state = SlicePartition(hierarchy).read(self.system)
        isolated_at = f"{hierarchy}/{ISOLATED_FILE}"
        isolated = self.system.read(isolated_at) if self.system.exists(isolated_at) else None
        rows = (
            (f"/{APP_SLICE} {PARTITION_FILE}", state if state is not None else "(no slice)"),
            (f"/ {ISOLATED_FILE}", isolated if isolated is not None else "(not in this kernel)"),
            ("adds here", partition_says(state, isolated, rules.cpus)),
        )
        return Table("Isolated partition (read back from the kernel)", ("", "here"), rows)

    @staticmethod
    def mechanisms(rules: ShieldRules) -> Table:
        """Which mechanism keeps the shield here, and why not each other one."""
        used = rules.choice.mechanism
        where = f" on /{rules.choice.hierarchy}" if rules.choice.hierarchy else ""
        rows = [(used, f"in use{where}")]
        rows += [(m, why) for m, why in rules.choice.why_not.items()]
        hint = (
            "; inside a cpuset the kernel refuses an affinity outside it (taskset -c: "
            "EINVAL): start the application with `latencyctl run` or name it in apps"
            if used != "affinity"
            else ""
        )
        return Table(f"Shield mechanism{hint}", ("mechanism", "here"), tuple(rows))

    def inside(self, rules: ShieldRules) -> Table:
        """The tasks in the shield's cgroup and below it: the applications (each held one
        in a cgroup of its own), and what their users put on the shielded CPUs."""
        rows = []
        inside = APP_SLICE if rules.choice.mechanism == "cpuset-systemd" else SHIELD
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

    def shielded_tasks(self, rules: ShieldRules) -> Table:
        """The user threads that may run on the isolated CPUs now, and why they may."""
        isolate = rules.cpus
        rows = []
        for task in self.system.tasks():
            if task.is_kthread:
                continue
            alone = self.judge.left_alone(rules, task)
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
