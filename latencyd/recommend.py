"""`latencyctl recommend`: a profile and isolated CPUs for this machine, with the reasons.

TuneD's `tuned-adm recommend` matches static rules (virt-what output, a file list).
This reads what decides latency here — how idle CPUs wait (the cpuidle driver), how
many CPUs there are and how they pair up (SMT siblings, NUMA nodes), where the NICs'
interrupts can go, whether irqbalance runs — proposes, explains each choice, and with
`--measure` checks the proposal against untuned before recommending it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused
from latencyd.idle import IdleFacts, read_idle
from latencyd.system import System

CPU = "sys/devices/system/cpu"
NET = "sys/class/net"


@dataclass(frozen=True)
class Nic:
    name: str
    driver: str
    queues: int
    node: int  # NUMA node of its device, -1 if unknown


@dataclass(frozen=True)
class Facts:
    virtual: str  # "" on bare metal, else what says so (hypervisor, haltpoll)
    idle_driver: str
    online: CpuSet
    cores: tuple[CpuSet, ...]  # SMT siblings of each core
    nodes: tuple[CpuSet, ...]  # CPUs of each NUMA node
    nics: tuple[Nic, ...]
    irqbalance: bool
    idle: IdleFacts | None = None  # how idle CPUs wait (None: not read)


@dataclass
class Recommendation:
    profile: str
    isolated: CpuSet = field(default_factory=CpuSet)
    reasons: list[str] = field(default_factory=list)

    def toml(self) -> str:
        """A profile file that builds on the recommended one."""
        lines = ["[main]", 'summary = "recommended by latencyctl recommend"',
                 f'include = ["{self.profile}"]']  # fmt: skip
        if self.isolated:
            lines += ["", "[variables]", f'isolated_cores = "{self.isolated}"']
        return "\n".join(lines) + "\n"


def read_facts(system: System) -> Facts:
    def read(rel: str, default: str = "") -> str:
        try:
            return system.read(rel)
        except KernelRefused:
            return default

    cpuinfo = read("proc/cpuinfo")
    virtual = ""
    if re.search(r"^flags\s*:.*\bhypervisor\b", cpuinfo, re.M):
        virtual = "the CPU flags say a hypervisor runs this machine"
    idle = read_idle(system)
    idle_driver = idle.driver
    if idle_driver == "haltpoll":
        virtual = virtual or "the cpuidle driver is haltpoll (KVM guests)"
    online = system.online_cpus()
    cores: dict[str, CpuSet] = {}
    for cpu in online:
        siblings = read(f"{CPU}/cpu{cpu}/topology/thread_siblings_list", str(cpu))
        cores.setdefault(siblings, CpuSet.from_list(siblings) & online)
    nodes = []
    for entry in system.listdir("sys/devices/system/node"):
        if re.fullmatch(r"node\d+", entry):
            cpus = CpuSet.from_list(read(f"sys/devices/system/node/{entry}/cpulist")) & online
            if cpus:
                nodes.append(cpus)
    nics = []
    for name in system.listdir(NET):
        if not system.exists(f"{NET}/{name}/device"):
            continue  # virtual: its interrupts are not a NIC's
        driver = system.realpath(f"{NET}/{name}/device/driver").rsplit("/", 1)[-1]
        queues = len([q for q in system.listdir(f"{NET}/{name}/queues") if q.startswith("rx-")])
        node = int(read(f"{NET}/{name}/device/numa_node", "-1") or -1)
        nics.append(Nic(name, driver, queues, node))
    irqbalance = any(
        read(f"proc/{pid}/comm") == "irqbalance" for pid in system.listdir("proc") if pid.isdigit()
    )
    return Facts(
        virtual, idle_driver, online, tuple(cores.values()), tuple(nodes or [online]),
        tuple(nics), irqbalance, idle,
    )  # fmt: skip


EXPECTED = (
    "Expected from this project's measurements on other machines, not measured here: "
    "`latencyctl recommend --measure` (or `latencyctl measure`) measures it on this one."
)


def idle_reason(f: Facts) -> str:
    """What the way idle CPUs wait here means for latency: only what was read, and no gain
    claimed that was not measured here."""
    idle = f.idle
    states = idle.states.get(min(idle.states), ()) if idle and idle.states else ()
    no_driver = idle.halts_regardless if idle is not None else not f.idle_driver
    if no_driver:
        return (
            "No cpuidle driver (cpuidle/current_driver reads none): idle CPUs halt and wake "
            "on the next interrupt whatever PM QoS says, so no idle setting can change "
            "wake-up latency here; the profiles' idle options will show as not applicable. "
            "What can help here is keeping noise off the application's CPUs (under load, "
            "cpu-partitioning) and the NIC settings."
        )
    listed = ", ".join(f"{s.name} {s.latency_us} µs" for s in states) or "not listed"
    if f.idle_driver == "haltpoll":
        return (
            f"How idle CPUs wait decides wake-up latency here: cpuidle driver haltpoll (a KVM "
            f"guest; states {listed}), so every profile below sets idle = 'responsive' "
            "(adaptive guest halt-polling, 200 µs window) instead of polling. On haltpoll "
            f"guests it cut sockperf p50 from ~41 to ~4 µs. {EXPECTED}"
        )
    real = [s for s in states if not s.is_poll]
    deepest = max(real, key=lambda s: s.latency_us) if real else None
    shallowest = min(real, key=lambda s: s.latency_us) if real else None
    if idle is None or shallowest is None or deepest is None:
        return (
            f"cpuidle driver {f.idle_driver} (states {listed}): idle = 'responsive' holds a "
            "PM QoS limit at the shallowest real C-state this machine lists when applied "
            f"(not applicable if it lists none). {EXPECTED}"
        )
    return (
        f"cpuidle driver {f.idle_driver}, states {listed}: a CPU waking from {deepest.name} "
        f"pays up to {deepest.latency_us} µs, so idle = 'responsive' holds a PM QoS limit "
        f"at {shallowest.latency_us} µs ({shallowest.name}, the shallowest real state) and "
        f"CPUs wake fast without polling. {EXPECTED}"
    )


def recommend(f: Facts) -> Recommendation:
    """A profile and isolated CPUs for these facts, each choice with its reason."""
    why: list[str] = [idle_reason(f)]
    if f.virtual:
        why.append(
            f"Virtual machine ({f.virtual}): the host schedules these vCPUs, so "
            "isolation inside the guest shields from the guest's own noise only."
        )
    physical = [n for n in f.nics if n.driver]
    base = "network-latency" if physical else "latency-performance"
    if physical:
        names = ", ".join(f"{n.name} ({n.driver}, {n.queues} rx queue{'s' * (n.queues != 1)})"
                          for n in physical)  # fmt: skip
        why.append(
            f"NICs: {names}. network-latency adds interrupt-per-packet coalescing, no RPS, "
            "and socket busy polling for blocking reads."
        )
    else:
        why.append("No physical NIC: latency-performance (no network section needed).")
    smt = any(len(c) > 1 for c in f.cores)
    if len(f.cores) < 4:
        why.append(
            f"{len(f.online)} CPUs in {len(f.cores)} core{'s' * (len(f.cores) != 1)}: too few "
            "to set CPUs aside without starving housekeeping; isolate one only if the "
            "application needs a CPU of its own (cpu-partitioning with isolated_cores)."
        )
        if f.irqbalance:
            why.append("irqbalance runs: fine without isolation.")
        return Recommendation(base, CpuSet(), why)
    # Isolate whole cores (both SMT siblings: a sibling's work stalls the other), from the
    # NIC's NUMA node if there is one, keeping the first core of every node for housekeeping.
    node = next((f.nodes[n.node] for n in physical if 0 <= n.node < len(f.nodes)), f.nodes[0])
    candidates = [c for c in f.cores if c.issubset(node)]
    keep = {min(min(c) for c in f.cores if c.issubset(n)) for n in f.nodes}
    candidates = [c for c in candidates if not keep & set(c)]
    isolated = CpuSet()
    for core in sorted(candidates, key=min, reverse=True)[: (len(candidates) + 1) // 2]:
        isolated = isolated | core
    why.append(
        f"{len(f.online)} CPUs, {len(f.cores)} cores{' with SMT' if smt else ''}, "
        f"{len(f.nodes)} NUMA node{'s' * (len(f.nodes) != 1)}: isolate {isolated} "
        f"({'whole cores, both siblings' if smt else 'whole cores'}, on the NUMA node "
        "of the NIC so packets do not cross nodes), keeping the first core of each node "
        "and half of the rest for housekeeping (IRQs, kernel threads, writeback)."
    )
    if f.irqbalance:
        why.append("irqbalance runs: cpu-partitioning bans the isolated CPUs in its config.")
    why.append(f"Start the application on the isolated CPUs as usual (`taskset -c {isolated} "
               "./app`): a task confined to them stays, everything allowed elsewhere too is "
               "moved off them (`latencyctl hold <profile> -- app` also works, and ends the "
               "profile with the application).")  # fmt: skip
    return Recommendation("cpu-partitioning", isolated, why)
