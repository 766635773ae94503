"""shield: keep user tasks off the CPUs the application runs on.

How the shield is kept is its `mechanism` (latencyd.kernel.cgroups.choose): a cgroup v2
isolated partition, AllowedCPUs= set through systemd where systemd owns the v2 tree, or
v1 exclusive cpusets, which the kernel keeps (tasks are born where
their parent is; each cgroup made, file written and task moved is a setting of its own,
journaled), or the affinity chase. The application is placed inside by `latencyctl run`
and `hold -- CMD` (PlaceHolder), or by name (`apps`) as it execs.

Under the chase, `cpus` shields CPUs from user tasks the way tuna and RedHawk's `shield`
do: a task also allowed on other CPUs is narrowed to those (and logged); a task whose
affinity lies entirely inside the shielded CPUs was put there on purpose (`taskset`, a
container runtime, `latencyctl hold`) and stays, also when someone moves a narrowed task
back inside. New tasks arrive as task events (latencyd.service.taskevents), and a
periodic rescan is the safety net. Tasks named in `allow` and the processes holding a
profile are left alone. `[[shield.rule]]` puts user processes matched by name on CPUs of
their own, as TuneD's scheduler groups can; such a rule wins over the shield.

These options were once [kthread]'s (isolate_tasks, allow, rule with user = true):
profiles that say so still load (Schema.moved), and journals that hold them still
restore (took_over).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import logging
import re
import time
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from latencyd.core.movable import MOVE_REFUSED, TaskMover, Tasks, TaskTarget
from latencyd.core.movable import require_movable as _require_movable
from latencyd.core.plugin import (
    CPU_ACTIONS,
    Expansion,
    FileTarget,
    Follows,
    Monitor,
    Options,
    Settings,
    Table,
    Target,
    TaskEvent,
    Value,
    original_of,
    plain_path,
    run_to_end,
    same_cpus,
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
from latencyd.cpuset import CpuSet, CpuSetError
from latencyd.errors import KernelRefused, LeftInPlace, NotApplicable
from latencyd.kernel.cgroups import (
    APP_SLICE,
    CGROUP_FILES,
    CGROUP_ROOT,
    ISOLATED_FILE,
    PARTITION_FILE,
    PREFIX,
    SHIELD,
    SYSTEMD_CONFINED,
    V1_ROOT_FILES,
    Chosen,
    app_scope,
    choose,
    owner,
    partition_says,
    placement,
    systemd_placement,
    unit_of,
    v1_groups,
    v2_groups,
)
from latencyd.kernel.owners import CPUS, Claim
from latencyd.kernel.system import System, Task

THREAD_CHUNK = 1024  # threads of one task read per piece of an expansion (expand_steps)
ANCESTRY_DEPTH = 64  # generations under_hold walks up at most (a loop cannot trap it)
MAX_VERDICTS = 65536  # under_hold's verdicts kept, past which they are judged afresh
BORN_NARROWED_DEPTH = 8  # generations born_narrowed walks up to a narrowed ancestor
MECHANISMS = ("auto", "cpuset", "affinity")
CGROUP_TASK_CHUNK = 256  # tasks judged per piece of a cpuset expansion
PLACED = re.compile("")  # the rule the application is placed by (ShieldPlugin.rule_for)

log = logging.getLogger(__name__)


def _hierarchy_problem(hierarchy: str) -> str | None:
    if hierarchy.startswith(f"{CGROUP_ROOT}/") and plain_path(hierarchy):
        return None
    return f"{hierarchy!r} is not a cgroup hierarchy under /{CGROUP_ROOT}"


def _name_of(system: System, pid: int) -> str:
    """A user task's name as its settings are described: "comm " ("" once it is gone)."""
    task = system.task(pid)
    return f"{task.comm} " if task else ""


# -- a user task's settings: reached through which task its pid is (Tasks) ----------------


@dataclass(frozen=True)
class TaskAffinity(TaskTarget):
    """One thread (tid) of a user process (pid, start) moved off isolated CPUs."""

    kind: ClassVar[str] = "task_affinity"
    refusal_means: ClassVar[str | None] = MOVE_REFUSED
    pid: int
    start: int
    tid: int

    def read_task(self, tasks: Tasks) -> Value:
        _require_movable(tasks.task(self))
        return tasks.system.affinity(self.tid).to_list()

    def write_task(self, tasks: Tasks, value: Value) -> None:
        _require_movable(tasks.task(self))
        tasks.system.set_affinity(self.tid, CpuSet.from_list(value))

    def task_exists(self, tasks: Tasks) -> bool:
        tasks.task(self)  # then a thread's own directory says whether it is there
        return tasks.system.exists(f"proc/{self.pid}/task/{self.tid}")

    def same(self, system: System, wanted: Value, actual: Value) -> bool:
        return same_cpus(wanted, actual)

    def describe_task(self, tasks: Tasks, value: Value) -> str:
        name = _name_of(tasks.system, self.pid)
        return f"user task {name}(pid {self.pid}, thread {self.tid}) CPUs = {value}"


@dataclass(frozen=True)
class ProcessCgroup(TaskTarget):
    """Where a process (pid, start time) runs in a cgroup hierarchy: its cgroup ("/", or
    one of latencyd's). A move takes every thread; its children born later are born there."""

    hierarchy: str
    pid: int
    start: int

    def problem(self) -> str | None:
        return _hierarchy_problem(self.hierarchy)

    def read_task(self, tasks: Tasks) -> Value:
        cgroup = tasks.system.task_cgroup(self.pid)
        # Asked after the read: a task that began to exit before it already shows the root.
        if cgroup is None or tasks.task(self, fresh=True).exiting:
            raise NotApplicable(f"pid {self.pid} has exited")
        return cgroup

    def task_exists(self, tasks: Tasks) -> bool:
        return not tasks.task(self, fresh=True).exiting

    def describe_task(self, tasks: Tasks, value: Value) -> str:
        return f"user task {_name_of(tasks.system, self.pid)}(pid {self.pid}) in cgroup {value}"


@dataclass(frozen=True)
class TaskCgroup(ProcessCgroup):
    """The cpuset cgroup of a process, moved by writing its pid to the cgroup's procs."""

    kind: ClassVar[str] = "task_cgroup"
    refusal_means: ClassVar[str | None] = "the kernel will not move this task"

    def write_task(self, tasks: Tasks, value: Value) -> None:
        tasks.task(self)
        where = _cgroup_of(value).rstrip("/")
        tasks.system.write(f"{self.hierarchy}{where}/cgroup.procs", str(self.pid))


@dataclass(frozen=True)
class TaskUnit(ProcessCgroup):
    """Where systemd runs a process: its v2 cgroup. The application is moved by systemd
    into a scope of its own in latencyd's slice, and back into its unit with what it
    started meanwhile."""

    kind: ClassVar[str] = "systemd_task_cgroup"
    refusal_means: ClassVar[str | None] = "systemd will not move this task"

    def write_task(self, tasks: Tasks, value: Value) -> None:
        tasks.task(self)
        self._move(tasks.system, str(value))

    def _move(self, system: System, where: str) -> None:
        """Into the application's slice (a scope of its own), or back into the unit it
        came from with everything it started in that scope since."""
        top = top_cgroup(where)
        if where == f"/{APP_SLICE}/{app_scope(self.pid)}":
            scope = app_scope(self.pid)
            system.systemd.start_scope(scope, APP_SLICE, [self.pid], "latencyd: the application")
            return
        unit = unit_of(where)
        if top not in SYSTEMD_CONFINED or unit is None:
            raise KernelRefused(f"moving pid {self.pid} to {where}", "not a unit it came from")
        now = system.task_cgroup(self.pid) or ""
        pids = [self.pid]
        if now.startswith(f"/{APP_SLICE}/"):
            started = system.cgroup_pids(f"{self.hierarchy}{now}")
            pids += [pid for pid in started if pid != self.pid]
        try:
            system.systemd.attach(unit[0], unit[1], pids)
        except KernelRefused as exc:
            # systemd moves processes only into units delegated to their manager
            # (Delegate=yes: user@.service, containers); a login session's scope is not.
            # And a unit may have ended once latencyd moved its processes out
            # (`systemd-run --scope`'s scope goes when empty: "not loaded"). Its
            # cgroup.procs is systemd's to write: the process stays where it is.
            raise LeftInPlace(
                f"moving pid {self.pid} back to {unit[0]}: {exc.reason}; it stays in "
                f"{now or 'its scope'} until it exits, its CPUs no longer limited once "
                f"{APP_SLICE} is left"
            ) from exc


# -- the cpusets and units latencyd makes: reached through the System ---------------------


@dataclass(frozen=True)
class Cgroup(Target):
    """A cgroup the shield makes (named latencyd-*): {file: value}, written in that order
    once it is made, or None: not there (removed, what runs in it moved to its parent).
    Made all or nothing: a cpuset the kernel would not finish goes."""

    kind: ClassVar[str] = "cgroup"
    refusal_means: ClassVar[str | None] = "the kernel will not make this cpuset"
    hierarchy: str
    name: str

    def problem(self) -> str | None:
        if not self.name.startswith(PREFIX) or not plain_path(self.name, 1):
            return f"{self.name!r} is not a cgroup latencyd makes"
        return _hierarchy_problem(self.hierarchy)

    @property
    def path(self) -> str:
        return f"{self.hierarchy}/{self.name}"

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(CPUS),)

    def read(self, system: System) -> Value:
        if not system.exists(self.path):
            return None
        return {
            name: system.read(f"{self.path}/{name}")
            for name in CGROUP_FILES
            if system.exists(f"{self.path}/{name}")
        }

    def write(self, system: System, value: Value) -> None:
        if value is None:
            system.remove_cgroup(self.path)
            return
        made = not system.exists(self.path)
        system.make_cgroup(self.path)
        try:
            self._write_files(system, dict(value))
        except KernelRefused:
            if made:
                system.remove_cgroup(self.path)
            raise

    def _write_files(self, system: System, files: dict[str, str]) -> None:
        for name, wanted in files.items():
            try:
                system.write(f"{self.path}/{name}", str(wanted))
            except KernelRefused as exc:
                if name == "cpuset.cpu_exclusive" and wanted == "1":
                    self._exclusive_refused(system, files.get("cpuset.cpus", ""), exc)
                raise
        partition = files.get("cpuset.cpus.partition")
        got = system.read(f"{self.path}/cpuset.cpus.partition") if partition else ""
        if partition and got != partition:
            # "isolated invalid (Cpu list in cpuset.cpus not exclusive)": the kernel's why
            raise KernelRefused(f"making /{self.path} an isolated partition", got)

    def _exclusive_refused(self, system: System, cpus: str, exc: KernelRefused) -> None:
        """v1 refuses an exclusive cpuset whose CPUs a sibling has too (EINVAL, unsaid):
        name the siblings, and whose they are (a kubelet's kubepods, a runtime's)."""
        try:
            mine = CpuSet.from_list(cpus)
        except CpuSetError:
            return
        shared, overlap = [], CpuSet()
        for sibling in system.listdir(self.hierarchy):
            path = f"{self.hierarchy}/{sibling}"
            if sibling == self.name or not system.exists(f"{path}/cpuset.cpus"):
                continue
            try:
                theirs = CpuSet.from_list(system.read(f"{path}/cpuset.cpus"))
            except (CpuSetError, KernelRefused, OSError):
                continue
            if theirs & mine:
                overlap = overlap | (theirs & mine)
                whose = owner(f"/{sibling}") or "latencyd's"
                shared.append(f"/{sibling} ({whose}: CPUs {theirs})")
        if shared:
            raise KernelRefused(
                f"making /{self.path} exclusive",
                f"CPUs {overlap} are also in {', '.join(shared)}, and "
                "an exclusive cpuset shares no CPU with a sibling; the shield can be kept by "
                'the affinity chase (mechanism = "affinity") beside it',
            ) from exc

    def same(self, system: System, wanted: Value, actual: Value) -> bool:
        if wanted is None or actual is None:
            return wanted is actual
        return all(
            _same_file(name, value, actual.get(name)) for name, value in dict(wanted).items()
        )

    def describe(self, value: Value) -> str:
        if value is None:
            return f"cgroup /{self.path} absent"
        files = ", ".join(f"{name} = {v}" for name, v in dict(value).items())
        return f"cgroup /{self.path}: {files}"


@dataclass(frozen=True)
class RootFile(FileTarget):
    """A file of a hierarchy's root cgroup (v1: the root stops balancing every CPU)."""

    kind: ClassVar[str] = "cgroup_root_file"
    hierarchy: str
    file: str

    def problem(self) -> str | None:
        if self.file not in V1_ROOT_FILES:
            return f"{self.file!r} is not a root cgroup file the shield sets"
        return _hierarchy_problem(self.hierarchy)

    @property
    def rel(self) -> str:
        return f"{self.hierarchy}/{self.file}"

    def watch_files(self, system: System) -> tuple[str, ...]:
        return ()  # polled, as every cgroup setting of the shield's

    def describe(self, value: Value) -> str:
        return f"/{self.rel} = {value}"


@dataclass(frozen=True)
class Controller(FileTarget):
    """Whether a hierarchy's root hands a controller to its children (v2's
    cgroup.subtree_control): true or false."""

    kind: ClassVar[str] = "cgroup_controller"
    hierarchy: str
    name: str

    def problem(self) -> str | None:
        if self.name != "cpuset":
            return f"{self.name!r} is not a controller the shield enables"
        return _hierarchy_problem(self.hierarchy)

    @property
    def rel(self) -> str:
        return f"{self.hierarchy}/cgroup.subtree_control"

    def parse(self, text: str) -> Value:
        return self.name in text.split()

    def text(self, system: System, value: Value) -> str:
        return f"{'+' if value else '-'}{self.name}"

    def watch_files(self, system: System) -> tuple[str, ...]:
        return ()  # polled, as every cgroup setting of the shield's

    def describe(self, value: Value) -> str:
        state = "enabled" if value else "disabled"
        return f"controller {self.name} {state} for /{self.hierarchy}'s children"


@dataclass(frozen=True)
class UnitCpus(Target):
    """A systemd unit's AllowedCPUs= (a CPU list, "" when not set), set through systemd
    for the running boot; latencyd's own slice is None while it is not there."""

    kind: ClassVar[str] = "systemd_allowed_cpus"
    refusal_means: ClassVar[str | None] = "systemd will not set this unit's CPUs"
    unit: str

    def problem(self) -> str | None:
        if self.unit in (*SYSTEMD_CONFINED, APP_SLICE):
            return None
        return f"{self.unit!r} is not a unit the shield confines"

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(CPUS, self.unit),)

    def read(self, system: System) -> Value:
        cpus = system.systemd.allowed_cpus(self.unit)
        return None if cpus is None else cpus.to_list()

    def write(self, system: System, value: Value) -> None:
        """AllowedCPUs= through systemd; latencyd's slice is started with it, and stopped
        (None) once nothing runs in it: a unit its user gave Slice=latencyd.slice keeps it,
        with AllowedCPUs= unset, and the refusal says so."""
        systemd = system.systemd
        if value is not None:
            cpus = CpuSet.from_list(str(value))
            if self.unit == APP_SLICE and systemd.allowed_cpus(APP_SLICE) is None:
                systemd.start_slice(APP_SLICE, cpus, "latencyd: the shielded CPUs")
            else:
                systemd.set_allowed_cpus(self.unit, cpus)
            return
        unified = system.cgroup_facts().unified
        running = system.cgroup_pids(f"{unified}/{APP_SLICE}") if unified else []
        if not running:
            systemd.stop(APP_SLICE)
            return
        systemd.set_allowed_cpus(APP_SLICE, CpuSet())
        raise LeftInPlace(
            f"removing {APP_SLICE}: {len(running)} processes run in it (units given "
            f"Slice={APP_SLICE}, or an application whose own unit ended): left there, its "
            "AllowedCPUs= unset"
        )

    def same(self, system: System, wanted: Value, actual: Value) -> bool:
        if wanted is not None and actual is not None:
            return same_cpus(wanted, actual)
        return bool(wanted == actual)

    def describe(self, value: Value) -> str:
        if value is None:
            return f"systemd unit {self.unit} absent"
        return f"systemd unit {self.unit}: AllowedCPUs={value or ' (not set)'}"


@dataclass(frozen=True)
class SlicePartition(Target):
    """latencyd.slice as an isolated partition: its cpuset.cpus.partition, the one file of
    a systemd unit latencyd writes (the slice it started; systemd 252 has no setting for
    it: latencyd.kernel.cgroups says why no other way runs). "isolated", or "member" (None
    while the slice is not there). The kernel's refusal is said, not failed: the shield
    holds by AllowedCPUs= without it."""

    kind: ClassVar[str] = "systemd_slice_partition"
    refusal_means: ClassVar[str | None] = "no isolated partition here"
    hierarchy: str

    def problem(self) -> str | None:
        return _hierarchy_problem(self.hierarchy)

    @property
    def path(self) -> str:
        return f"{self.hierarchy}/{APP_SLICE}/{PARTITION_FILE}"

    def read(self, system: System) -> Value:
        return system.read(self.path) if system.exists(self.path) else None

    def write(self, system: System, value: Value) -> None:
        if value is None or value == "member":
            if system.exists(self.path):  # a stopped slice took its partition with it
                system.write(self.path, "member")
            return
        if not system.exists(self.path):
            raise KernelRefused(f"making /{APP_SLICE} an isolated partition", "it is not there")
        system.write(self.path, str(value))
        got = system.read(self.path)
        if got != value:
            # "isolated invalid (reason)" takes the CPUs from no one: back to member
            system.write(self.path, "member")
            raise KernelRefused(f"making /{APP_SLICE} an isolated partition", got)

    def describe(self, value: Value) -> str:
        if value is None:
            return f"cgroup /{APP_SLICE} absent"
        return f"cgroup /{APP_SLICE}: {PARTITION_FILE} = {value}"


ShieldTarget = (
    TaskAffinity
    | Cgroup
    | RootFile
    | Controller
    | TaskCgroup
    | UnitCpus
    | TaskUnit
    | SlicePartition
)


def top_cgroup(cgroup: str) -> str:
    """The cgroup directly below the root that `cgroup` is in (or is): whose it is
    (latencyd's shield or slice, or a systemd slice or scope)."""
    return cgroup.strip("/").split("/")[0]


def inside_shield(cgroup: str) -> bool:
    """Whether `cgroup` is (or is below) the shield's cgroup: latencyd's v1/v2 shield or,
    under systemd, its slice; the kernel keeps a task there on the shielded CPUs."""
    return top_cgroup(cgroup) in (SHIELD, APP_SLICE)


def _cgroup_of(value: Value) -> str:
    """A task's cgroup as the shield may set it: the root, or one of latencyd's."""
    text = str(value)
    if text == "/" or (text.startswith(f"/{PREFIX}") and plain_path(text[1:], 1)):
        return text
    raise KernelRefused(f"moving a task to cgroup {text!r}", "not a cgroup the shield uses")


def _same_file(name: str, wanted: Value, actual: Value) -> bool:
    if actual is None:
        return False
    if name == "cpuset.cpus":
        return same_cpus(wanted, actual)
    return str(wanted) == str(actual)


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


def rules_from(options: Mapping[str, Any]) -> tuple[Rule, ...]:
    return tuple(Rule(re.compile(r["match"]), r["cpus"]) for r in options.get("rule", []))


class ShieldPlugin(TaskMover[ShieldTarget, ShieldRules]):
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
        self.just_narrowed: set[int] = set()  # processes whose new settings await "applied"
        # Whether a task is under a hold (under_hold): pid -> (start time, verdict), valid
        # for the holders in verdicts_for.
        self.verdicts: dict[int, tuple[int, bool]] = {}
        self.verdicts_for: frozenset[int] = frozenset()

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
            return (yield from self.affinity_expand_steps(rules, owned))
        return (yield from self.cpuset_expand_steps(rules, owned))

    def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion[ShieldRules]:
        return run_to_end(self.expand_steps(options, owned))

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

    def not_placed(self, rules: ShieldRules | None, pid: int) -> str | None:
        """Why the holder `pid` is not on the shielded CPUs (PlacesApplications): what its
        cgroup's owner keeps it in, or the CPUs it has."""
        if rules is None or not rules.cpus:
            return None
        own = self.own_cpus(rules, pid)
        affinity = self.system.affinity(pid)
        if affinity and affinity.issubset(own):
            return None
        cgroup = self.system.task_cgroup(pid)
        if own == rules.cpus and cgroup is not None and inside_shield(cgroup):
            return None  # inside the shield's cgroup: the kernel keeps it on those CPUs
        why = next((w for p, _, _, w in rules.theirs if p == pid), None)
        where = f" in cgroup {cgroup}" if cgroup else ""
        return (
            f"process {pid} runs on CPUs {affinity.to_list() or 'none'}{where}, not on the "
            f"shielded CPUs {own.to_list()}" + (f": {why}" if why else "")
        )

    def placed(self, rules: ShieldRules, task: Task) -> bool:
        """Whether the shield puts the task on the shielded CPUs: the application, by
        name or because it holds the profile (`latencyctl run`/`hold`, whose command is
        then born there), or a task a rule puts there."""
        return (
            task.pid in self.placed_pids
            or self.is_app(rules, task)
            or self.ruled_inside(rules, task)
        )

    def ruled_inside(self, rules: ShieldRules, task: Task) -> bool:
        """Whether a rule puts the task on shielded CPUs only. Under a cpuset the kernel
        lets a task have those CPUs only inside the shield's cgroup (elsewhere its affinity
        is refused: EINVAL), so it is moved in as the application is: the rule is the
        profile's, by name, as TuneD's scheduler groups are."""
        rule = self.user_rule(rules, task)
        return rule is not None and bool(rule.cpus) and rule.cpus.issubset(rules.cpus)

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
            try:
                target, where, why = self.task_placement(rules, task, cgroup, owned)
            except KernelRefused:
                continue  # exited meanwhile
            if where is not None:
                settings[target] = where
            elif target in owned:
                settings[target] = owned[target]
            elif why:
                theirs.append((task.pid, task.comm, cgroup, why))
            inside = inside_shield(where or cgroup)
            rule = self.user_rule(rules, task)
            if rule is None and inside and task.pid in self.placed_pids:
                # Each hold's application on its own CPUs inside the shield, by an affinity
                # its command inherits and the kernel keeps when the shield's CPUs change
                # (the user-requested mask): another hold's CPUs joining or leaving the
                # shield do not spread it over them.
                rule = Rule(PLACED, self.own_cpus(rules, task.pid))
            if rule is not None:  # after its move
                settings.update(self.user_rule_settings(rule, task, [*self.thread_ids(task.pid)]))
        rules = dataclasses.replace(rules, theirs=tuple(theirs))
        return Expansion(settings, rules, refused=refused)

    def task_placement(
        self, rules: ShieldRules, task: Task, cgroup: str, owned: Mapping[Target, Value]
    ) -> tuple[TaskCgroup | TaskUnit, str | None, str | None]:
        """A user task's setting under a cpuset mechanism, the cgroup it must move to (None:
        it stays) and, when it stays for another manager's sake, why."""
        mechanism, hierarchy = rules.choice.mechanism, rules.choice.hierarchy
        assert mechanism is not None and hierarchy is not None
        if mechanism == "cpuset-systemd":
            unit_target = TaskUnit(hierarchy, task.pid, task.start_time)
            confined = top_cgroup(cgroup) in SYSTEMD_CONFINED
            cpus = self._users_cpus(task, owned) if confined else CpuSet()
            placed = self.placed(rules, task)
            # By name or under a hold; asked only where it decides (a walk up the parents).
            confined_there = bool(cpus) and cpus.issubset(rules.cpus)
            allowed = confined_there and self.left_alone(rules, task) is not None
            into, why = systemd_placement(cgroup, cpus, rules.cpus, placed, allowed)
            where = f"/{APP_SLICE}/{app_scope(task.pid)}" if into else None
            return unit_target, where, why
        target = TaskCgroup(hierarchy, task.pid, task.start_time)
        placed = self.placed(rules, task)
        # A hold's holder whose hold ended (placed no more, the CPUs it was given still
        # owned): judged as from the root, so it leaves the shield its CPUs were taken from.
        released = (
            not placed
            and cgroup != "/"
            and target in owned
            and TaskAffinity(task.pid, task.start_time, task.pid) in owned
            and self.user_rule(rules, task) is None
        )
        judged = "/" if released else cgroup
        allowed = judged == "/" and self.left_alone(rules, task) is not None
        cpus = self._users_cpus(task, owned) if judged == "/" else CpuSet()
        into = placement(mechanism, judged, cpus, rules.cpus, placed, allowed)
        where = f"/{into}" if into else ("/" if released else None)
        return target, where, owner(cgroup)

    def _users_cpus(self, task: Task, owned: Mapping[Target, Value]) -> CpuSet:
        """The CPUs the task's user gave it: what the chase narrowed is judged by its
        original (from the chase to a cpuset, a task narrowed to the housekeeping CPUs,
        read as it is, would look confined there by its user and be moved inside)."""
        given = original_of(owned, TaskAffinity(task.pid, task.start_time, task.pid))
        if given is not None:
            return CpuSet.from_list(str(given))
        return self.system.affinity(task.pid)

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
        `handed_over` then lets it go at the next check)."""
        try:
            return self.system.affinity(tid).issubset(isolate)
        except KernelRefused:
            return False

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

    def thread_ids(self, pid: int) -> Iterator[int]:
        """The process's threads, as the kernel lists them (lazily: 20,000 take a while)."""
        return (int(t) for t in self.system.entries(f"proc/{pid}/task") if t.isdigit())

    def handed_over(
        self, rules: ShieldRules | None, target: ShieldTarget, actual: Value
    ) -> str | None:
        if not isinstance(target, TaskAffinity) or rules is None:
            return None
        cpus = CpuSet.from_list(str(actual))
        if cpus and rules.cpus and cpus.issubset(rules.cpus):
            return f"put on isolated CPUs {cpus} on purpose: a task inside the shield stays"
        return None

    def affinity_expand_steps(
        self, rules: ShieldRules, owned: Mapping[Target, Value]
    ) -> Generator[None, None, Expansion[ShieldRules]]:
        """Yields after each task and each THREAD_CHUNK threads of one (a JVM's 20,000)."""
        settings: Settings = {}
        current: dict[Target, Value] = {}
        for task in self.system.tasks():
            if not task.is_kthread and (
                (rule := self.rule_for(rules, task)) is not None
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

    def rule_for(self, rules: ShieldRules, task: Task) -> Rule | None:
        """The CPUs a user task is put on by name: its rule's, or, for the application
        (placed), the shielded CPUs; None: the shield judges it."""
        rule = self.user_rule(rules, task)
        if rule is None and rules.cpus and self.placed(rules, task):
            return Rule(PLACED, self.own_cpus(rules, task.pid))
        return rule

    def own_cpus(self, rules: ShieldRules, pid: int) -> CpuSet:
        """The CPUs the application `pid` is placed on: its hold's (several holds share
        the shield, each application on its own), else the whole shield (by name)."""
        mine = self.placed_pids.get(pid, CpuSet()) & rules.cpus
        return mine or rules.cpus

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
        if event.kind == "applied":
            return self.started_before_narrowed(rules, owned)
        if event.kind == "comm" and (rules.cpus or rules.rules):
            task = self.system.task(event.pid)
            if task is None or task.is_kthread:
                return {}
            if rules.choice.mechanism != "affinity":  # the kernel keeps the rest
                return self.cpuset_task_settings(rules, task, [event.tid], owned)
            if (rule := self.rule_for(rules, task)) is not None:
                return self.user_rule_settings(rule, task, [event.tid])
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
        if cgroup is not None and (self.is_app(rules, task) or self.ruled_inside(rules, task)):
            try:
                target, where, _ = self.task_placement(rules, task, cgroup, owned)
            except KernelRefused:
                return {}  # exited meanwhile
            if where is not None:
                settings[target] = where
        if (rule := self.user_rule(rules, task)) is not None:
            settings.update(self.user_rule_settings(rule, task, tids))
        return settings

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
        target: ShieldTarget,
        current: Value,
        owned: Callable[[Target], tuple[Value, Value] | None],
    ) -> Value:
        """A task born narrowed (born_narrowed) gets its parent's original back. A cgroup
        named latencyd-* is latencyd's, even one a killed run left without a journal:
        given back, it is removed."""
        if isinstance(target, Cgroup) or target == UnitCpus(APP_SLICE):
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
            return super().write_unless_changed(target, value, judged)
        _require_movable(self._task(target))
        if target.pid in self.placed_pids:
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
            return super().describe_group(targets, value)
        name = _name_of(self.system, first.pid)
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
        """The tasks in the shield's cgroup: the application, and what its users put on
        the shielded CPUs."""
        rows = []
        inside = APP_SLICE if rules.choice.mechanism == "cpuset-systemd" else SHIELD
        for pid in self.system.cgroup_pids(f"{rules.choice.hierarchy}/{inside}"):
            task = self.system.task(pid)
            if task is not None:
                rows.append((pid, task.comm))
        return Table(
            f"User tasks inside the shield (cgroup /{inside}, CPUs {rules.cpus})",
            ("PID", "name"),
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
