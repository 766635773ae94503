"""The shield's settings, one kind each: a user task's CPUs (TaskAffinity) and cgroup
(TaskCgroup, or TaskUnit through systemd), and the cgroups and units latencyd makes
(Cgroup, RootFile, Controller, UnitCpus, SlicePartition); which cgroup is the shield's.
How each is read, written, compared and described; not which are wanted when (the
mechanisms', mechanism.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from latencyd.core.movable import MOVE_REFUSED, Tasks, TaskTarget
from latencyd.core.movable import require_movable as _require_movable
from latencyd.core.plugin import (
    FileTarget,
    Target,
    Value,
    plain_path,
    same_cpus,
)
from latencyd.cpuset import CpuSet, CpuSetError
from latencyd.errors import KernelRefused, LeftInPlace, NotApplicable
from latencyd.kernel.cgroups import (
    APP_SLICE,
    CGROUP_FILES,
    CGROUP_ROOT,
    PARTITION_FILE,
    PREFIX,
    SHIELD,
    SYSTEMD_CONFINED,
    V1_ROOT_FILES,
    app_scope,
    is_app_scope,
    owner,
    unit_of,
)
from latencyd.kernel.owners import CPUS, Claim
from latencyd.kernel.system import System


def _hierarchy_problem(hierarchy: str) -> str | None:
    if hierarchy.startswith(f"{CGROUP_ROOT}/") and plain_path(hierarchy):
        return None
    return f"{hierarchy!r} is not a cgroup hierarchy under /{CGROUP_ROOT}"


def name_of(system: System, pid: int) -> str:
    """A user task's name as its settings are described: "comm " ("" once it is gone)."""
    task = system.task(pid)
    return f"{task.comm} " if task else ""


# -- a user task's settings: reached through which task its pid is (Tasks) ----------------


@dataclass(frozen=True)
class TaskAffinity(TaskTarget[str]):
    """One thread (tid) of a user process (pid, start) moved off isolated CPUs."""

    kind: ClassVar[str] = "task_affinity"
    refusal_means: ClassVar[str | None] = MOVE_REFUSED
    pid: int
    start: int
    tid: int

    def read_task(self, tasks: Tasks) -> str:
        _require_movable(tasks.task(self))
        return tasks.system.affinity(self.tid).to_list()

    def write_task(self, tasks: Tasks, value: str) -> None:
        _require_movable(tasks.task(self))
        tasks.system.set_affinity(self.tid, CpuSet.from_list(value))

    def task_exists(self, tasks: Tasks) -> bool:
        tasks.task(self)  # then a thread's own directory says whether it is there
        return tasks.system.exists(f"proc/{self.pid}/task/{self.tid}")

    def same(self, system: System, wanted: str, actual: str) -> bool:
        return same_cpus(wanted, actual)

    def describe_task(self, tasks: Tasks, value: str) -> str:
        name = name_of(tasks.system, self.pid)
        return f"user task {name}(pid {self.pid}, thread {self.tid}) CPUs = {value}"


@dataclass(frozen=True)
class ProcessCgroup(TaskTarget[str]):
    """Where a process (pid, start time) runs in a cgroup hierarchy: its cgroup ("/", or
    one of latencyd's). A move takes every thread; its children born later are born there."""

    hierarchy: str
    pid: int
    start: int

    def problem(self) -> str | None:
        return _hierarchy_problem(self.hierarchy)

    def read_task(self, tasks: Tasks) -> str:
        cgroup = tasks.system.task_cgroup(self.pid)
        # Asked after the read: a task that began to exit before it already shows the root.
        if cgroup is None or tasks.task(self, fresh=True).exiting:
            raise NotApplicable(f"pid {self.pid} has exited")
        return cgroup

    def task_exists(self, tasks: Tasks) -> bool:
        return not tasks.task(self, fresh=True).exiting

    def describe_task(self, tasks: Tasks, value: str) -> str:
        return f"user task {name_of(tasks.system, self.pid)}(pid {self.pid}) in cgroup {value}"


@dataclass(frozen=True)
class TaskCgroup(ProcessCgroup):
    """The cpuset cgroup of a process, moved by writing its pid to the cgroup's procs."""

    kind: ClassVar[str] = "task_cgroup"
    refusal_means: ClassVar[str | None] = "the kernel will not move this task"

    def write_task(self, tasks: Tasks, value: str) -> None:
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

    def write_task(self, tasks: Tasks, value: str) -> None:
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


CgroupFiles = dict[str, str]  # a cgroup's files as the shield writes them, file -> text


@dataclass(frozen=True)
class Cgroup(Target[CgroupFiles | None]):
    """A cgroup the shield makes (named latencyd-*, or a held application's own inside
    the shield's: app_cgroup): {file: value}, written in that order once it is made, or
    None: not there (removed, what runs in it moved to its parent). Made all or nothing:
    a cpuset the kernel would not finish goes."""

    kind: ClassVar[str] = "cgroup"
    refusal_means: ClassVar[str | None] = "the kernel will not make this cpuset"
    hierarchy: str
    name: str

    def problem(self) -> str | None:
        if not _latencyds(self.name):
            return f"{self.name!r} is not a cgroup latencyd makes"
        return _hierarchy_problem(self.hierarchy)

    @property
    def path(self) -> str:
        return f"{self.hierarchy}/{self.name}"

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(CPUS),)

    def read(self, system: System) -> CgroupFiles | None:
        if not system.exists(self.path):
            return None
        return {
            name: system.read(f"{self.path}/{name}")
            for name in CGROUP_FILES
            if system.exists(f"{self.path}/{name}")
        }

    def write(self, system: System, value: CgroupFiles | None) -> None:
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

    def same(self, system: System, wanted: CgroupFiles | None, actual: CgroupFiles | None) -> bool:
        if wanted is None or actual is None:
            return wanted is actual
        return all(
            _same_file(name, value, actual.get(name)) for name, value in dict(wanted).items()
        )

    def describe(self, value: CgroupFiles | None) -> str:
        if value is None:
            return f"cgroup /{self.path} absent"
        files = ", ".join(f"{name} = {v}" for name, v in dict(value).items())
        return f"cgroup /{self.path}: {files}"


@dataclass(frozen=True)
class RootFile(FileTarget[str]):
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

    def describe(self, value: str) -> str:
        return f"/{self.rel} = {value}"


@dataclass(frozen=True)
class Controller(FileTarget[bool]):
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

    def parse(self, text: str) -> bool:
        return self.name in text.split()

    def text(self, system: System, value: bool) -> str:
        return f"{'+' if value else '-'}{self.name}"

    def watch_files(self, system: System) -> tuple[str, ...]:
        return ()  # polled, as every cgroup setting of the shield's

    def describe(self, value: bool) -> str:
        state = "enabled" if value else "disabled"
        return f"controller {self.name} {state} for /{self.hierarchy}'s children"


@dataclass(frozen=True)
class UnitCpus(Target[str | None]):
    """A systemd unit's AllowedCPUs= (a CPU list, "" when not set), set through systemd
    for the running boot; latencyd's own slice, and a held application's own scope in it
    (app_scope: its hold's CPUs), are None while they are not there."""

    kind: ClassVar[str] = "systemd_allowed_cpus"
    refusal_means: ClassVar[str | None] = "systemd will not set this unit's CPUs"
    unit: str

    def problem(self) -> str | None:
        if self.unit in (*SYSTEMD_CONFINED, APP_SLICE) or is_app_scope(self.unit):
            return None
        return f"{self.unit!r} is not a unit the shield confines"

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(CPUS, self.unit),)

    def read(self, system: System) -> str | None:
        cpus = system.systemd.allowed_cpus(self.unit)
        return None if cpus is None else cpus.to_list()

    def write(self, system: System, value: str | None) -> None:
        """AllowedCPUs= through systemd; latencyd's slice is started with it, and stopped
        (None) once nothing runs in it: a unit its user gave Slice=latencyd.slice keeps it,
        with AllowedCPUs= unset, and the refusal says so. An application's scope goes with
        its processes (systemd's to collect): given back, its AllowedCPUs= is unset, so a
        process it still holds has the slice's CPUs, as before it had its own."""
        systemd = system.systemd
        if value is None and is_app_scope(self.unit):
            if systemd.allowed_cpus(self.unit) is not None:
                systemd.set_allowed_cpus(self.unit, CpuSet())
            return
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

    def same(self, system: System, wanted: str | None, actual: str | None) -> bool:
        if wanted is not None and actual is not None:
            return same_cpus(wanted, actual)
        return bool(wanted == actual)

    def describe(self, value: str | None) -> str:
        if value is None:
            return f"systemd unit {self.unit} absent"
        return f"systemd unit {self.unit}: AllowedCPUs={value or ' (not set)'}"


@dataclass(frozen=True)
class SlicePartition(Target[str | None]):
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

    def read(self, system: System) -> str | None:
        return system.read(self.path) if system.exists(self.path) else None

    def write(self, system: System, value: str | None) -> None:
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

    def describe(self, value: str | None) -> str:
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


def _latencyds(name: str) -> bool:
    """Whether a cgroup's name (relative to its hierarchy) is one latencyd makes: one of
    its own at the top, or a held application's inside the shield's (app_cgroup)."""
    parts = name.split("/")
    return (
        plain_path(name)
        and len(parts) <= 2
        and all(part.startswith(PREFIX) for part in parts)
        and (len(parts) == 1 or parts[0] == SHIELD)
    )


def _cgroup_of(value: Value) -> str:
    """A task's cgroup as the shield may set it: the root, or one of latencyd's."""
    text = str(value)
    if text == "/" or (text.startswith("/") and _latencyds(text[1:])):
        return text
    raise KernelRefused(f"moving a task to cgroup {text!r}", "not a cgroup the shield uses")


def _same_file(name: str, wanted: Value, actual: Value) -> bool:
    if actual is None:
        return False
    if name == "cpuset.cpus":
        return same_cpus(wanted, actual)
    return str(wanted) == str(actual)
