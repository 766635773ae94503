"""How idle CPUs wait on this machine, read in one place for everyone who needs to know: the
cstate plugin (which of its options can act here, and its status table) and `recommend`.

Three kinds of machine are known, and they differ in what any idle setting can do:
- a *haltpoll guest* (KVM, cpuidle driver `haltpoll`): idle CPUs poll for a window the
  haltpoll governor grows and shrinks (up to guest_halt_poll_ns), then halt; PM QoS
  limits and state disables choose between POLL and halt;
- a *guest without a cpuidle driver* (`current_driver` reads `none`, no cpuN/cpuidle):
  the idle loop halts (default_idle_call) whatever PM QoS, resume latency limits or the
  haltpoll parameters say, so no idle option changes how fast a CPU wakes;
- *bare metal* (`intel_idle`, `acpi_idle`, ...): C-states with exit latencies, the
  governor choosing among those the PM QoS limits and disables allow.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from latencyd.errors import KernelRefused
from latencyd.kernel.system import System

CPU = "sys/devices/system/cpu"
CPUIDLE = f"{CPU}/cpuidle"
HALTPOLL = "sys/module/haltpoll/parameters"
PM_QOS_NO_LIMIT_US = 2_000_000_000  # what /dev/cpu_dma_latency reads with no request held
NO_DRIVER = "no cpuidle driver: idle CPUs halt whatever PM QoS says"
# The kernel's resume-latency file inverts intuition: "0" means no constraint and
# "n/a" means zero tolerance. Profiles say what they mean in µs; cstate translates.
NO_CONSTRAINT, ZERO_TOLERANCE = "0", "n/a"
# How long a haltpoll guest CPU polls before it halts, when `idle = "responsive"`: on
# these VMs 200 µs cut sockperf's median RTT/2 from ~41 to ~4 µs; the window is adaptive
# (it grows while wake-ups come soon after idle entry, shrinks to nothing when they do
# not), so an idle machine does not poll.
RESPONSIVE_POLL_NS = 200_000


@dataclass(frozen=True)
class IdleState:
    index: int
    name: str
    latency_us: int  # exit latency, as the driver lists it
    disabled: bool = False

    @property
    def is_poll(self) -> bool:
        return self.name.upper() == "POLL"

    def __str__(self) -> str:
        return f"{self.name} {self.latency_us} µs" + (" (disabled)" if self.disabled else "")


@dataclass(frozen=True)
class IdleFacts:
    driver: str  # "" when there is none (the kernel's "none", or no cpuidle at all)
    governor: str  # "" when unknown
    states: Mapping[int, tuple[IdleState, ...]] = field(default_factory=dict)  # per CPU read
    poll_ns: int | None = None  # guest_halt_poll_ns, where the haltpoll governor's params exist
    pm_qos_us: int | None = None  # the machine-wide CPU latency limit in force; None: none
    resume_us: Mapping[int, int | None] = field(default_factory=dict)  # per CPU; None: none

    @property
    def halts_regardless(self) -> bool:
        """No cpuidle driver and no idle states: nothing any idle option sets changes how
        idle CPUs wait (they halt)."""
        return not self.driver and not any(self.states.values())

    @property
    def halt_polls(self) -> bool:
        """Guest halt-polling is in use: the haltpoll governor runs and has its parameters."""
        return self.governor == "haltpoll" and self.poll_ns is not None

    def limit_us(self, cpu: int) -> int | None:
        """The wake-up latency limit cpuidle applies to `cpu` (the smaller of the machine-wide
        PM QoS limit and the CPU's resume latency limit); None: no limit."""
        limits = [v for v in (self.pm_qos_us, self.resume_us.get(cpu)) if v is not None]
        return min(limits) if limits else None

    def waits(self, cpu: int) -> str:
        """How an idle `cpu` waits here, in words, from what was read."""
        if self.halts_regardless:
            return "halt (no cpuidle driver): halted until the next interrupt"
        states = self.states.get(cpu, ())
        limit = self.limit_us(cpu)
        allowed = [s for s in states if not s.disabled and (limit is None or s.latency_us <= limit)]
        over = [s for s in states if not s.disabled and s not in allowed]
        listed = ", ".join(map(str, [s for s in states if s not in over]))
        listed += f"; over the {limit} µs limit: {', '.join(map(str, over))}" if over else ""
        if allowed and all(s.is_poll for s in allowed):
            return f"poll, no deeper state allowed ({listed})"
        if self.halt_polls:
            window = (
                f"poll up to {self.poll_ns / 1000:g} µs (adaptive), then halt"
                if self.poll_ns
                else "halt at once (guest_halt_poll_ns 0)"
            )
            return f"{window}: haltpoll governor ({listed})"
        return f"the {self.governor or 'cpuidle'} governor picks one of: {listed or 'none'}"

    def options_that_act(self) -> tuple[str, ...]:
        """The cstate options that can change how idle CPUs wait here."""
        if self.halts_regardless:
            return ()
        acting = ("idle", "force_latency_us", "resume_latency_us", "disable_states")
        return (*acting, "idle_governor", *(("haltpoll",) if self.halt_polls else ()))


def _read(system: System, rel: str) -> str:
    try:
        return system.read(rel)
    except KernelRefused:
        return ""


def read_driver(system: System) -> str:
    """The cpuidle driver's name; "" when the kernel says "none" (or has no cpuidle)."""
    driver = _read(system, f"{CPUIDLE}/current_driver")
    return "" if driver == "none" else driver


def states_of(system: System, cpu: int) -> tuple[IdleState, ...]:
    """cpuN/cpuidle/stateK, by index; none where the CPU has no cpuidle directory."""
    base = f"{CPU}/cpu{cpu}/cpuidle"
    out = []
    for entry in system.listdir(base):
        if re.fullmatch(r"state\d+", entry):
            d = f"{base}/{entry}"
            out.append(
                IdleState(
                    int(entry[5:]),
                    system.read(f"{d}/name"),
                    int(system.read(f"{d}/latency")),
                    _read(system, f"{d}/disable") == "1",
                )
            )
    return tuple(sorted(out, key=lambda s: s.index))


def state_counters(system: System, cpu: int, index: int) -> tuple[int, int]:
    """(time µs, usage) of cpuN's idle state `index`, as the kernel counts them since boot;
    raises LatencydError (unreadable, gone) or ValueError: each caller chooses."""
    d = f"{CPU}/cpu{cpu}/cpuidle/state{index}"
    return int(system.read(f"{d}/time")), int(system.read(f"{d}/usage"))


def resume_limit(text: str) -> int | None:
    """A CPU's pm_qos_resume_latency_us as a limit: the kernel shows "n/a" for 0 µs (polling
    only) and "0" for no limit; None too where the file is missing or unreadable."""
    if text == ZERO_TOLERANCE:
        return 0
    return int(text) if text.isdigit() and text != NO_CONSTRAINT else None


def read_idle(system: System, cpus: Iterable[int] | None = None) -> IdleFacts:
    """What decides how idle CPUs wait, for `cpus` (default: every online CPU)."""
    poll_ns = _read(system, f"{HALTPOLL}/guest_halt_poll_ns")
    pm_qos = system.pmqos.effective()
    wanted = sorted(system.online_cpus() if cpus is None else cpus)
    return IdleFacts(
        driver=read_driver(system),
        governor=_read(system, f"{CPUIDLE}/current_governor")
        or _read(system, f"{CPUIDLE}/current_governor_ro"),
        states={cpu: states_of(system, cpu) for cpu in wanted},
        poll_ns=int(poll_ns) if poll_ns.isdigit() else None,
        pm_qos_us=pm_qos if pm_qos is not None and 0 <= pm_qos < PM_QOS_NO_LIMIT_US else None,
        resume_us={
            cpu: resume_limit(_read(system, f"{CPU}/cpu{cpu}/power/pm_qos_resume_latency_us"))
            for cpu in wanted
        },
    )
