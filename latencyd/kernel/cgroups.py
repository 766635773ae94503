"""cgroup hierarchies as the kernel shows them, whose a cgroup is, and the shield's cpusets.

Pure: decoders of /proc/self/mountinfo and /proc/PID/cgroup, the choice between the
shield's mechanisms from what the machine has, and the cpusets each mechanism makes
(the system facade reads and writes them; plugins/shield/ owns them as settings).

The kernel facts this rests on (Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/
cpusets.rst; checked on Linux 6.18):
- A controller sits in one hierarchy at a time: cpuset is in v2 only while no v1
  hierarchy holds it (it shows in the v2 root's cgroup.controllers then).
- v2: a child with `cpuset.cpus.partition = isolated` (Linux >= 6.1) takes its CPUs from
  every cgroup outside it and turns load balancing off there, in one write; a task
  placed inside is the only kind that runs there. The partition reads
  "isolated invalid (reason)" when the kernel will not make it.
- v1: a cpuset with `cpu_exclusive` and `sched_load_balance = 0`, beside a housekeeping
  cpuset holding every task that was in the root cpuset, does the same (what `cset
  shield` does); a task forked later is born in its parent's cpuset: no per-start work.
- Under systemd the v2 tree is systemd's: the sanctioned shield (RHEL's) is AllowedCPUs=
  set at run time, through its D-Bus API, on the slices and scope every process of the
  machine lives in (init.scope, system.slice, user.slice), and a slice of latencyd's for
  the application, whose processes systemd itself moves (a transient scope; back with
  AttachProcessesToUnit). No cgroup file of systemd's is written behind its back.
- An isolated partition's parent must be a partition root (a local partition), or every
  cgroup between it and the root must have `cpuset.cpus.exclusive` (a remote one, 6.7+);
  every child of the root is a systemd unit under systemd, and a unit's own cgroup files
  stay systemd's when it is delegated (Delegate=yes hands over what is below it only).
  systemd 252 has no setting for either file (CPUSetPartition= came much later), never
  writes nor resets them (`daemon-reload`, `set-property` keep them); so the one file of a
  unit latencyd writes is `cpuset.cpus.partition` of latencyd.slice, the slice it started
  itself: the application's slice becomes an isolated partition (checked on Debian's 6.12
  in the VM tier: a delegated scope's child reads "isolated invalid (Invalid cpu list in
  cpuset.cpus.exclusive)" without it, and a sibling's `cpuset.cpus.exclusive` is refused
  beside latencyd.slice's AllowedCPUs=). The root's `cpuset.cpus.isolated` then lists
  the CPUs, which have no scheduler domain: no load balancing across them.
- Moving a task between cpusets sets its CPUs to the cpuset's, intersected with what its
  user asked with sched_setaffinity (Linux >= 6.2 keeps that mask): moved back, a task
  gets its own affinity back from the kernel. sched_setaffinity outside the task's
  cpuset fails with EINVAL.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from latencyd.cpuset import CpuSet

PREFIX = "latencyd-"  # every cgroup latencyd makes is named so, and only those it removes
SHIELD = "latencyd-shield"
HOUSEKEEPING = "latencyd-housekeeping"
CGROUP_ROOT = "sys/fs/cgroup"  # where the hierarchies latencyd uses are mounted
V2_PARTITION_KERNEL = (6, 1)  # `cpuset.cpus.partition = isolated` came with Linux 6.1

# The files of a cgroup the shield may set, in the order they must be written (a cpuset
# takes tasks only once it has CPUs and memory nodes; a partition needs its CPUs first).
CGROUP_FILES = (
    "cpuset.cpus",
    "cpuset.mems",
    "cpuset.cpu_exclusive",
    "cpuset.sched_load_balance",
    "cpuset.cpus.partition",
)

# systemd's units every process of a systemd machine runs in (machine.slice and the like
# belong to containers: left alone); latencyd's slice for the application beside them.
SYSTEMD_CONFINED = ("init.scope", "system.slice", "user.slice")
APP_SLICE = "latencyd.slice"

MECHANISMS = ("cpuset-v2", "cpuset-systemd", "cpuset-v1", "affinity")
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class CgroupMount:
    """A hierarchy's root mounted at `path` (relative to /): version 1 with its
    controllers, or the unified (v2) hierarchy."""

    path: str
    version: int
    controllers: frozenset[str] = frozenset()
    read_only: bool = False  # mounted ro (a container's view of the host's hierarchies)


def _unescape(text: str) -> str:
    """mountinfo's octal escapes (a space is \\040)."""
    return _OCTAL.sub(lambda m: chr(int(m[1], 8)), text)


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """The cgroup hierarchies mounted at their root (a bind of a sub-cgroup, as a
    container sees its own, is not the hierarchy and is left out)."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3 or fields[3] != "/":
            continue
        fstype, options = rest[0], rest[2].split(",")
        where = _unescape(fields[4]).strip("/")
        read_only = "ro" in fields[5].split(",")
        if fstype == "cgroup2":
            mounts.append(CgroupMount(where, 2, read_only=read_only))
        elif fstype == "cgroup":
            mounts.append(CgroupMount(where, 1, frozenset(options), read_only))
    return mounts


def task_cgroup(proc_cgroup: str) -> str | None:
    """A task's cpuset cgroup from /proc/PID/cgroup: in the v1 hierarchy holding cpuset,
    else in the unified one (cpuset is in one hierarchy at a time); None when the task is
    in neither (it has exited meanwhile)."""
    unified = None
    for line in proc_cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "cpuset" in controllers.split(","):
            return path
        if number == "0" and controllers == "":
            unified = path
    return unified


def owner(path: str) -> str | None:
    """Who else manages the cgroup at `path` (a task's), in words, or None: the root
    cgroup or one of latencyd's. The shield never moves a task out of a cgroup it did not
    make, nor narrows it behind its owner's back."""
    parts = [p for p in path.split("/") if p]
    if not parts or parts[0].startswith(PREFIX):
        return None
    if any(part.startswith("kubepods") for part in parts):  # a pod's containers are its
        return f"kubelet (pod cgroup {path})"
    for part in reversed(parts):  # the innermost names the manager (libpod in machine.slice)
        if part.startswith(("crio-", "cri-containerd-", "containerd-")):
            return f"a container runtime (cgroup {path})"
        if part == "docker" or part.startswith("docker-"):
            return f"docker (cgroup {path})"
        if part == "libpod_parent" or part.startswith("libpod"):
            return f"podman (cgroup {path})"
        if part == "machine.slice" or part.startswith("machine-"):
            return f"systemd-machined (cgroup {path})"
    if parts[-1].endswith((".service", ".scope", ".slice")):
        return f"systemd ({parts[-1]})"
    return f"another manager (cgroup {path})"


@dataclass(frozen=True)
class CgroupFacts:
    """What the machine has for a shield (System.cgroup_facts)."""

    mounts: tuple[CgroupMount, ...]
    v2_controllers: frozenset[str]  # available in the unified root (its cgroup.controllers)
    kernel: tuple[int, int]
    systemd: bool  # systemd runs the machine (/run/systemd/system): it owns the v2 tree

    @property
    def v1_cpuset(self) -> str | None:
        held = (m.path for m in self.mounts if m.version == 1 and "cpuset" in m.controllers)
        return next(held, None)

    @property
    def unified(self) -> str | None:
        return next((m.path for m in self.mounts if m.version == 2), None)

    def read_only(self, path: str) -> bool:
        return any(m.path == path and m.read_only for m in self.mounts)


@dataclass(frozen=True)
class Chosen:
    """The mechanism the shield uses here (None: the one asked for cannot run), on which
    hierarchy, and why not each of the others."""

    mechanism: str | None
    hierarchy: str | None
    why_not: dict[str, str] = field(default_factory=dict)


def kernel_version(osrelease: str) -> tuple[int, int]:
    """(major, minor) of /proc/sys/kernel/osrelease; (0, 0) if it cannot be read."""
    numbers = osrelease.strip().split("-")[0].split(".")
    try:
        return int(numbers[0]), int(numbers[1])
    except (IndexError, ValueError):
        return 0, 0


def _blockers(facts: CgroupFacts) -> dict[str, str]:
    """Why each cgroup mechanism cannot run here; absent: it can."""
    why: dict[str, str] = {}
    if facts.unified is None:
        why["cpuset-v2"] = "no cgroup v2 hierarchy is mounted"
    elif "cpuset" not in facts.v2_controllers:
        held = f" (a v1 hierarchy holds it at /{facts.v1_cpuset})" if facts.v1_cpuset else ""
        why["cpuset-v2"] = f"the cpuset controller is not available in cgroup v2{held}"
    elif facts.kernel < V2_PARTITION_KERNEL:
        why["cpuset-v2"] = "isolated cpuset partitions need Linux >= 6.1"
    elif facts.systemd:
        why["cpuset-v2"] = (
            "systemd owns the cgroup v2 tree here: the shield is set through its D-Bus API "
            "(cpuset-systemd)"
        )
    elif facts.read_only(facts.unified):
        why["cpuset-v2"] = f"/{facts.unified} is mounted read-only here (a container's view)"
    if not facts.systemd:
        why["cpuset-systemd"] = "systemd does not run this machine"
    elif "cpuset-v2" in why and "cpuset" not in facts.v2_controllers:
        why["cpuset-systemd"] = why["cpuset-v2"]  # AllowedCPUs= acts through v2's cpuset
    if facts.v1_cpuset is None:
        why["cpuset-v1"] = "no cgroup v1 hierarchy has the cpuset controller"
    elif facts.read_only(facts.v1_cpuset):
        why["cpuset-v1"] = f"/{facts.v1_cpuset} is mounted read-only here (a container's view)"
    return why


def choose(facts: CgroupFacts, asked: str) -> Chosen:
    """The mechanism for `asked` ("auto", "cpuset" or "affinity"): the v2 partition where
    it can run, else the v1 cpusets, else (auto only) the affinity chase."""
    why = _blockers(facts)
    if asked == "affinity":
        why_not = {m: "the profile asks for the affinity mechanism" for m in MECHANISMS[:-1]}
        return Chosen("affinity", None, why_not)
    for mechanism, hierarchy in (
        ("cpuset-v2", facts.unified),
        ("cpuset-systemd", facts.unified),
        ("cpuset-v1", facts.v1_cpuset),
    ):
        if mechanism not in why:
            others = dict(why)
            for later in MECHANISMS[MECHANISMS.index(mechanism) + 1 :]:
                others.setdefault(later, f"{mechanism} runs here, and the kernel enforces it")
            return Chosen(mechanism, hierarchy, others)
    if asked == "cpuset":
        return Chosen(None, None, why)
    return Chosen("affinity", None, why)


# -- the cpusets of each mechanism ---------------------------------------------------
def v1_groups(
    shield: CpuSet, online: CpuSet, mems: str, was: CpuSet | None = None
) -> dict[str, dict[str, str]]:
    """The v1 cpusets, each file in the order to write it: housekeeping takes every
    task from the root; the shield is exclusive and not load-balanced. Made, or changed
    in place from a shield on `was`: a shrinking shield is written before housekeeping
    takes its CPUs, a growing one after housekeeping gave them up (an exclusive cpuset
    never overlaps its sibling: EINVAL)."""
    housekeeping = {HOUSEKEEPING: {"cpuset.cpus": (online - shield).to_list(), "cpuset.mems": mems}}
    shielded = {
        SHIELD: {
            "cpuset.cpus": shield.to_list(),
            "cpuset.mems": mems,
            "cpuset.cpu_exclusive": "1",
            "cpuset.sched_load_balance": "0",
        },
    }
    if was is not None and shield.issubset(was) and shield != was:
        return shielded | housekeeping
    return housekeeping | shielded


def app_cgroup(pid: int) -> str:
    """The cpuset of a held application's own, inside the shield's (v1): named for its
    holder, as its scope is under systemd (app_scope)."""
    return f"{SHIELD}/{PREFIX}app-{pid}"


def v1_app_group(cpus: CpuSet, mems: str) -> dict[str, str]:
    """A held application's own v1 cpuset inside the shield: its hold's CPUs, the
    shield's memory nodes, and no load balancing, as in the shield (a child balancing
    its CPUs would make them a scheduler domain of their own). Not exclusive: two holds
    may share CPUs."""
    return {"cpuset.cpus": cpus.to_list(), "cpuset.mems": mems, "cpuset.sched_load_balance": "0"}


# The root cpuset stops balancing across all CPUs, or the shield's CPUs stay in its
# scheduler domain (cpusets.rst: a cpuset's flag counts only if its parent's is off).
V1_ROOT_FILES = {"cpuset.sched_load_balance": "0"}


def v2_groups(shield: CpuSet) -> dict[str, dict[str, str]]:
    """The v2 partition: its CPUs, then the partition type."""
    return {SHIELD: {"cpuset.cpus": shield.to_list(), "cpuset.cpus.partition": "isolated"}}


def placement(
    mechanism: str, cgroup: str, affinity: CpuSet, shield: CpuSet, placed: bool, allowed: bool
) -> str | None:
    """Where the shield moves a user task now in `cgroup` (the cgroup's name), or None:
    it stays. A task in another manager's cgroup always stays; the application (`placed`:
    a hold's holder, an app) goes inside from the root or from housekeeping; of the rest
    only tasks in the root are moved. `allowed`: named in allow."""
    if owner(cgroup) is not None:
        return None
    if placed:
        return SHIELD
    if cgroup != "/":
        return None  # in one of latencyd's already
    if allowed:
        # Left where it is, whatever its CPUs now: a holder such as `latencyctl measure`,
        # pinned for a while to what happens to be the shielded CPU, moved inside would
        # confine everything it starts after to the shield (its client could not run).
        return None
    if affinity and affinity.issubset(shield):
        return SHIELD  # its user put it on the shield's CPUs: there it keeps them
    if mechanism == "cpuset-v1":
        return HOUSEKEEPING
    return None  # v2: the partition takes its CPUs from the root without a move


# -- under systemd ---------------------------------------------------------------------
PARTITION_FILE = "cpuset.cpus.partition"
ISOLATED_FILE = "cpuset.cpus.isolated"  # the root's: the CPUs isolated partitions hold (6.7+)
PARTITION_ADDS = (
    "no load balancing across them, unbound workqueues kept off, and the kernel's "
    "cpu_is_isolated() users (vmstat updates, memcg stock draining) leaving them alone"
)


def partition_says(state: str | None, isolated: str | None, shield: CpuSet) -> str:
    """What the isolated partition adds here, from what the kernel reads back: latencyd.slice's
    cpuset.cpus.partition (None: no slice) and the root's cpuset.cpus.isolated (None: a
    kernel without it)."""
    if state is None:
        return "none: latencyd.slice is not there"
    if state != "isolated":
        # A refused write is put back to member: the kernel's reason is the setting's,
        # shown under "not applicable"; an invalid partition a change made since says it.
        why = state.partition("(")[2].rstrip(")") if "(" in state else f"it reads {state!r}"
        return (
            f"none: the kernel did not make latencyd.slice an isolated partition: {why} "
            "(the kernel's reason for a refusal is under not applicable)"
        )
    try:
        held = CpuSet.from_list(isolated) if isolated else CpuSet()
    except ValueError:
        held = CpuSet()
    if isolated is not None and not shield.issubset(held):
        return f"none: the kernel isolates CPUs {held.to_list() or 'none'}, not {shield}"
    return f"CPUs {shield} isolated by the kernel: {PARTITION_ADDS}"


def unit_of(path: str) -> tuple[str, str] | None:
    """The system manager's unit a v2 cgroup belongs to, and the sub-cgroup of it the
    path names ("" for the unit's own): the outermost service or scope (below it is
    delegated: user@UID.service's own units, a container's). None: a slice or the root."""
    parts = [p for p in path.split("/") if p]
    for at, part in enumerate(parts):
        if part.endswith((".service", ".scope")):
            return part, "/".join(parts[at + 1 :])
    return None


def systemd_unit(proc_cgroup: str) -> str | None:
    """The systemd unit a task runs in, from /proc/PID/cgroup: its path in the unified
    hierarchy (or systemd's own named v1 one, on a legacy layout); None outside any unit
    (a slice, the root: no systemd runs it)."""
    for line in proc_cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (number == "0" and controllers == "") or controllers == "name=systemd":
            unit = unit_of(path)
            return unit[0] if unit else None
    return None


def app_scope(pid: int) -> str:
    """The transient scope latencyd places an application's process in."""
    return f"{PREFIX}app-{pid}.scope"


def is_app_scope(unit: str) -> bool:
    """Whether `unit` names a scope app_scope makes."""
    return re.fullmatch(rf"{PREFIX}app-[0-9]+\.scope", unit) is not None


def systemd_placement(
    cgroup: str, affinity: CpuSet, shield: CpuSet, placed: bool, allowed: bool
) -> tuple[str | None, str | None]:
    """Under systemd: where the shield moves a user task now in `cgroup` (APP_SLICE: a
    scope of its own there, app_scope) or None, and why it is left alone when that
    is worth saying. Only processes of systemd's own scopes (login sessions and the like)
    are moved, by systemd; a service's process would leave its service's tracking, and a
    container's cgroup is its runtime's."""
    parts = [p for p in cgroup.split("/") if p]
    if not parts or parts[0] == APP_SLICE:
        return None, None  # the root (kernel threads), or inside already
    whose = owner(cgroup)
    if parts[0] not in SYSTEMD_CONFINED:
        return None, whose  # machine.slice, kubepods.slice, …: AllowedCPUs= of their own
    unit = unit_of(cgroup)
    container = whose is not None and not whose.startswith("systemd (")
    if container:
        return None, f"{whose}: within {parts[0]}'s AllowedCPUs="
    wants_in = placed or (not allowed and bool(affinity) and affinity.issubset(shield))
    if not wants_in:
        return None, None
    if unit is None or not unit[0].endswith(".scope"):
        service = unit[0] if unit else parts[-1]
        return None, (
            f"systemd ({service}): a service's process stays in its unit; give the unit "
            f"Slice={APP_SLICE} to run it on the shield, or, from a shell of it, start "
            "the application in a scope of its own: systemd-run --scope latencyctl run -- CMD"
        )
    return APP_SLICE, None
