"""`latencyctl recommend`: a profile and isolated CPUs for this machine, with the reasons.

TuneD's `tuned-adm recommend` matches static rules (virt-what output, a file list).
This reads what decides latency here — how idle CPUs wait (the cpuidle driver), how
many CPUs there are and how they pair up (SMT siblings, NUMA nodes), where the NICs'
interrupts can go, whether irqbalance runs — proposes, explains each choice, and with
`--measure` checks the proposal against untuned before recommending it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, LatencydError
from latencyd.kernel.boot import BootState, booted, compare
from latencyd.kernel.cgroups import Chosen, choose
from latencyd.kernel.idle import RESPONSIVE_POLL_NS, IdleFacts, read_idle
from latencyd.kernel.system import System

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
    idle: IdleFacts  # how idle CPUs wait here
    online: CpuSet
    cores: tuple[CpuSet, ...]  # SMT siblings of each core
    nodes: tuple[CpuSet, ...]  # CPUs of each NUMA node
    nics: tuple[Nic, ...]
    irqbalance: bool
    boot: BootState | None = None  # the isolation it booted with (None: not known)
    shield: Chosen | None = None  # the shield's mechanism here (None: not known)


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
    if idle.driver == "haltpoll":
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
    irqbalance = system.root_process("irqbalance") is not None
    try:
        boot: BootState | None = booted(system.boot_readings())
    except LatencydError:
        boot = None
    return Facts(
        virtual, idle, online, tuple(cores.values()), tuple(nodes or [online]), tuple(nics),
        irqbalance, boot, choose(system.cgroup_facts(), "auto"),
    )  # fmt: skip


def boot_reasons(isolated: CpuSet, boot: BootState | None) -> list[str]:
    """The boot arguments that would add to the isolated CPUs what no daemon can (the
    tick, RCU callbacks, managed IRQs), and those this kernel cannot honour, with why."""
    if boot is None or not isolated:
        return []
    findings = compare(isolated, boot)
    add = [f for f in findings if f.state == "not booted" and f.feature != "scheduler domains"]
    out = []
    if add:
        args = " ".join(dict.fromkeys(f.argument for f in add))
        does = "; ".join(f"{f.argument}: {f.detail.removeprefix(f.argument + ' ')}" for f in add)
        out.append(f"Boot arguments for {isolated} (the next boot brings them, not latencyd): "
                   f"{args}. {does}.")  # fmt: skip
    out += [f"Not on this kernel: {f.argument}: {f.detail}." for f in findings
            if f.state == "not applicable" and f.feature != "scheduler domains"]  # fmt: skip
    out += [f"Booted isolation the profile would not use: {f.feature}: {f.detail}." for f in
            findings if f.state == "mismatch"]  # fmt: skip
    return out


def machine_kind(f: Facts, kernel: str) -> str:
    """The machine a measured claim holds on, named as the README's tables name it."""
    if f.idle.driver == "haltpoll":
        kind = "haltpoll guest"
    elif f.virtual and f.idle.halts_regardless:
        kind = "guest without a cpuidle driver"
    elif f.virtual:
        kind = f"guest with cpuidle driver {f.idle.driver}"
    else:
        kind = f"bare metal, cpuidle driver {f.idle.driver or 'none'}"
    return f"{kind} ({len(f.online)} CPUs, Linux {kernel})"


def expectation(expected: str, measured: Sequence[str] | None) -> str:
    """A gain claimed only as measured here, or else as what is expected, and from what."""
    if measured is not None:
        helped = "; ".join(measured) or "no group of settings measurably helped"
        return f"Measured here (latency with / without each group that helped): {helped}."
    return (
        f"Expected, not measured here: {expected}. `latencyctl recommend --measure` "
        "measures it on this machine."
    )


def idle_reason(f: Facts, measured: Sequence[str] | None = None) -> str:
    """What the way idle CPUs wait here means for latency: only what was read, and no gain
    claimed that was not measured here."""
    idle = f.idle
    if idle.halts_regardless:
        return (
            "Idle CPUs: no cpuidle driver and no idle states here, so an idle CPU halts until "
            "the next interrupt whatever PM QoS says: no idle option can change how fast it "
            "wakes, and the profile's idle options will show as not applicable. "
            + expectation(
                "nothing at idle from any profile, and under load a gain from shielding the "
                "application's CPUs (cpu-partitioning) only, as this project measured on a KVM "
                "guest without a cpuidle driver (sockperf p50 5.4-5.9 µs untuned and with "
                f"every profile; this machine is {'virtual' if f.virtual else 'bare metal'})",
                measured,
            )
        )
    states = idle.states.get(min(idle.states), ()) if idle.states else ()
    seen = (
        f"Idle CPUs: cpuidle driver {idle.driver or '(unnamed)'}, governor "
        f"{idle.governor or 'unknown'}, states {', '.join(map(str, states)) or 'none listed'}"
    )
    if idle.driver == "haltpoll":
        if idle.poll_ns:
            now = f"guest halt-polling now up to {idle.poll_ns / 1000:g} µs, then a halt"
        else:
            state = "off" if idle.poll_ns == 0 else "unknown"
            now = f"guest halt-polling {state}: an idle vCPU halts"
        return (
            f"{seen}; {now}: a KVM guest, whose halted vCPUs wait for the host to wake them. "
            "The profiles below set idle = 'responsive' (adaptive guest halt-polling up to "
            f"{RESPONSIVE_POLL_NS // 1000} µs, polling only while wake-ups come soon after "
            "idle entry). "
            + expectation(
                "faster wake-ups: on haltpoll guests this project measured sockperf p50 "
                "~41 -> ~4 µs with it",
                measured,
            )
        )
    real = [s for s in states if not s.is_poll]
    if not real:
        return (
            f"{seen}: no idle state deeper than polling, so the profiles' idle = 'responsive' "
            "will show as not applicable."
        )
    deepest = max(real, key=lambda s: s.latency_us)
    low = min(real, key=lambda s: s.latency_us)
    return (
        f"{seen}: a CPU in {deepest.name} takes up to {deepest.latency_us} µs to wake (the "
        "driver's exit latency). The profiles below set idle = 'responsive': a PM QoS limit "
        f"at {low.latency_us} µs ({low.name}, the shallowest real state), so no idle CPU goes "
        "deeper. "
        + expectation(
            f"wake-ups within {low.name}'s {low.latency_us} µs exit latency instead of up to "
            f"{deepest.latency_us} µs, going by the driver's table (this project has not "
            "measured bare metal)",
            measured,
        )
    )


def recommend(f: Facts, measured: Sequence[str] | None = None) -> Recommendation:
    """A profile and isolated CPUs for these facts, each choice with its reason; `measured`:
    what attribution found the proposal's groups buy here (attribute.quote), when run."""
    why: list[str] = [idle_reason(f, measured)]
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
    why += boot_reasons(isolated, f.boot)
    why.append(shield_reason(isolated, f.shield))
    return Recommendation("cpu-partitioning", isolated, why)


def shield_reason(isolated: CpuSet, chosen: Chosen | None) -> str:
    """How the shield will be kept here, why not the other ways, and so how to start the
    application."""
    start = (
        "Start the application with `latencyctl run -- ./app` (or `hold cpu-partitioning "
        "-- ./app`, or name it in [shield] apps)"
    )
    why_not = "; ".join(f"not {m}: {why}" for m, why in (chosen.why_not if chosen else {}).items())
    if chosen is None or chosen.mechanism in (None, "affinity"):
        return (
            f"The shield narrows every task also allowed elsewhere off {isolated} (the "
            f"affinity chase{': ' + why_not if why_not else ''}). {start}, or as you would "
            f"anyway, `taskset -c {isolated} ./app`: a task confined to them stays."
        )
    return (
        f"The kernel keeps the shield ({chosen.mechanism} on /{chosen.hierarchy}; {why_not}). "
        f"{start}: inside a cpuset `taskset -c {isolated}` from a shell is refused (Invalid "
        "argument)."
    )
