"""cstate: keep CPUs out of deep idle states — globally with a PM QoS request, per CPU set
with resume latency limits and cpuidle state disables — and show residency like turbostat.

`force_latency_us` is held on an open /dev/cpu_dma_latency fd for as long as the
profile is active; closing the fd is the restore (and a crash restores it too).
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from latencyd.core.plugin import (
    CPU_ACTIONS,
    Expansion,
    FileTarget,
    Follows,
    Json,
    Monitor,
    Plugin,
    Settings,
    Table,
    Target,
    Value,
    plain_path,
)
from latencyd.core.schema import (
    Bool,
    Choice,
    Cpus,
    Fields,
    Int,
    Kind,
    ListOf,
    OneOf,
    Pattern,
    Schema,
    Str,
    option,
    table,
)
from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.kernel.idle import (
    NO_CONSTRAINT,
    NO_DRIVER,
    RESPONSIVE_POLL_NS,
    ZERO_TOLERANCE,
    IdleFacts,
    IdleState,
    read_driver,
    read_idle,
    state_counters,
    states_of,
)
from latencyd.kernel.owners import PM_QOS, Claim
from latencyd.kernel.system import System

CPU = "sys/devices/system/cpu"
SYMBOLIC = Pattern(r"poll|shallowest|state:.+", '"poll", "shallowest" or "state:NAME"')
STATE_SELECTOR = Pattern(r"deeper-than:\d+|[^:]+", 'a state name (glob) or "deeper-than:µs"')
# Why each option is not applicable where the idle loop halts (no cpuidle driver).
WITHOUT_DRIVER = {
    "force_latency_us": NO_DRIVER,
    "idle": NO_DRIVER,
    "resume_latency_us": NO_DRIVER,
    "disable_states": "no cpuidle driver: no idle states to disable (idle CPUs halt)",
    "idle_governor": "no cpuidle driver: no governor chooses how idle CPUs wait (they halt)",
    "haltpoll": "no cpuidle driver: the haltpoll governor's parameters are unused (idle CPUs halt)",
}


def state_matches(state: IdleState, selector: str) -> bool:
    """By exact name, by glob, or by the name's first word ("haltpoll" for "haltpoll idle")."""
    name = state.name.lower()
    sel = selector.lower()
    if sel.startswith("deeper-than:"):
        return state.latency_us > int(sel.split(":", 1)[1])
    return name == sel or fnmatch.fnmatchcase(name, sel) or name.split()[0] == sel


CPUIDLE = f"{CPU}/cpuidle"
HALTPOLL = "sys/module/haltpoll/parameters"


def available_governors(system: System) -> list[str]:
    try:
        return system.read(f"{CPUIDLE}/available_governors").split()
    except KernelRefused:
        return []


@dataclass(frozen=True)
class PmQosRequest(Target[int | None]):
    """The machine-wide CPU latency request, held on an open /dev/cpu_dma_latency fd;
    its value is µs, or None for no request (closing the fd is the restore)."""

    kind: ClassVar[str] = "pm_qos"

    def read(self, system: System) -> int | None:
        return system.pmqos.held()

    def write(self, system: System, value: int | None) -> None:
        if value is None:
            system.pmqos.release()
        else:
            system.pmqos.hold(int(value))

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(PM_QOS),)

    def describe(self, value: int | None) -> str:
        if value is None:
            return "no PM QoS request held"
        return f"PM QoS CPU latency request held at {value} µs"


@dataclass(frozen=True)
class ResumeLatency(FileTarget[str]):
    kind: ClassVar[str] = "resume_latency"
    transient: ClassVar[bool] = True
    cpu: int

    @property
    def rel(self) -> str:
        return f"{CPU}/cpu{self.cpu}/power/pm_qos_resume_latency_us"

    def describe(self, value: str) -> str:
        meaning = {ZERO_TOLERANCE: "0 µs: polling only", NO_CONSTRAINT: "no limit"}
        return f"cpu{self.cpu} resume latency = {meaning.get(str(value), f'{value} µs')}"


@dataclass(frozen=True)
class StateDisable(FileTarget[str]):
    kind: ClassVar[str] = "state_disable"
    transient: ClassVar[bool] = True
    cpu: int
    state: int

    @property
    def rel(self) -> str:
        return f"{CPU}/cpu{self.cpu}/cpuidle/state{self.state}/disable"

    def describe(self, value: str) -> str:
        return f"cpu{self.cpu} state{self.state}/disable = {value}"


@dataclass(frozen=True)
class IdleGovernor(FileTarget[str]):
    """The cpuidle governor (/sys/devices/system/cpu/cpuidle/current_governor). Machine-wide:
    missing means not applicable, and a governor the kernel lacks is not applicable either;
    both are said before the file is touched."""

    kind: ClassVar[str] = "idle_governor"

    @property
    def rel(self) -> str:
        return f"{CPUIDLE}/current_governor"

    def lacking(self, system: System) -> str | None:
        return None if system.exists(self.rel) else "this kernel cannot switch cpuidle governors"

    def text(self, system: System, value: str) -> str:
        available = available_governors(system)
        if value is not None and value not in available:
            raise NotApplicable(f"no cpuidle governor {value!r} (available: {' '.join(available)})")
        return str(value)

    def describe(self, value: str) -> str:
        return f"cpuidle governor = {value}"


@dataclass(frozen=True)
class HaltpollParam(FileTarget[str]):
    """A guest halt-polling parameter of the haltpoll cpuidle governor (KVM guests):
    /sys/module/haltpoll/parameters/guest_halt_poll_<name>. Missing (no haltpoll here) is
    not applicable, said before the file is touched."""

    kind: ClassVar[str] = "haltpoll"
    name: str

    def problem(self) -> str | None:
        return None if plain_path(self.name, 1) else f"no haltpoll parameter {self.name!r}"

    @property
    def rel(self) -> str:
        return f"{HALTPOLL}/guest_halt_poll_{self.name}"

    def lacking(self, system: System) -> str | None:
        if system.exists(self.rel):
            return None
        return (
            "no haltpoll cpuidle governor here (it exists in KVM guests with "
            f"cpuidle-haltpoll; cpuidle driver: {read_driver(system) or 'none'})"
        )

    def describe(self, value: str) -> str:
        return f"guest_halt_poll_{self.name} = {value}"


CstateTarget = PmQosRequest | ResumeLatency | StateDisable | IdleGovernor | HaltpollParam


@dataclass(frozen=True)
class CstateRules:
    resolved_from: str | None  # the symbolic force_latency_us, if one was given
    idle: str = ""  # what `idle` resolved to on this machine, and why


HALTPOLL_KEYS: dict[str, tuple[str, Kind[int | bool]]] = {  # key in profiles -> (file suffix, kind)
    "poll_ns": ("ns", Int(0, 2**32 - 1)),
    "grow": ("grow", Int(0, 2**32 - 1)),
    "shrink": ("shrink", Int(0, 2**32 - 1)),
    "grow_start": ("grow_start", Int(0, 2**32 - 1)),
    "allow_shrink": ("allow_shrink", Bool()),
}


@dataclass(frozen=True)
class CstateCpus:
    """One [[cstate.cpus]] entry."""

    cpus: CpuSet = option(Cpus(), "CPUs this entry applies to", required=True, compose="union")
    resume_latency_us: int | str | None = option(
        OneOf((Int(0), Choice(("any",)))),
        'Per-CPU wake-up latency limit (0 = polling only; "any" = none)',
        unit="µs",
    )
    disable_states: list[str] | None = option(
        ListOf(STATE_SELECTOR), 'cpuidle states to disable: names (globs) or "deeper-than:µs"'
    )


@dataclass(frozen=True)
class CstateOptions:
    force_latency_us: int | str | None = option(
        OneOf((Int(0, 2_000_000_000), SYMBOLIC)),
        "CPU wake-up latency limit for the whole machine, held via /dev/cpu_dma_latency: "
        'µs, or "poll" (only the polling state), "shallowest" (the shallowest real idle '
        'state), "state:NAME" (no state deeper than NAME)',
        unit="µs",
    )
    idle: str | None = option(
        Choice(("responsive", "poll")),
        'How idle CPUs wait, for this machine: "responsive" wakes fast without '
        "burning idle CPUs (guest halt-polling on haltpoll KVM guests; a PM QoS limit "
        'at the shallowest real C-state on bare metal); "poll" always polls (every '
        "idle CPU at 100 %). Explicit options win over what it resolves to",
    )
    idle_governor: str | None = option(
        Str(), "cpuidle governor (cpuidle/current_governor): one of available_governors"
    )
    haltpoll: dict[str, int | bool] | None = option(
        Fields(
            tuple((k, kind) for k, (_, kind) in HALTPOLL_KEYS.items()),
            what="haltpoll parameter",
        ),
        "Guest halt-polling of the haltpoll cpuidle governor (KVM guests): "
        "poll_ns (the polling window), grow, shrink, grow_start, allow_shrink",
    )
    cpus: tuple[CstateCpus, ...] = table(
        CstateCpus, "Per-CPU-set settings; later entries win where CPU sets overlap"
    )


class CstatePlugin(Plugin[CstateTarget, CstateRules, CstateOptions]):
    name = "cstate"
    summary = "C-states: PM QoS latency request, per-CPU resume latency, cpuidle state disables"
    targets = (PmQosRequest, ResumeLatency, StateDisable, IdleGovernor, HaltpollParam)
    example: ClassVar[dict[str, Any]] = {
        "force_latency_us": 10,
        "cpus": [{"cpus": "1", "resume_latency_us": 0, "disable_states": ["deeper-than:5"]}],
    }
    follows = Follows(udev={"cpu": CPU_ACTIONS})
    schema = Schema(
        section=CstateOptions,
        groups=(
            ("idle", ("idle", "force_latency_us", "haltpoll", "idle_governor")),  # how CPUs wait
            ("cpus", ("cpus",)),  # per-CPU resume latency and state disables
        ),
    )

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.baseline: dict[int, dict[int, tuple[int, int]]] = {}
        self.baseline_at = 0.0

    # -- the machine's idle states ---------------------------------------------------
    def states(self, cpu: int) -> list[IdleState]:
        return list(states_of(self.system, cpu))

    def resolve_latency(self, value: int | str) -> int:
        """Symbolic targets from this machine's own cpuidle table."""
        if isinstance(value, int):
            return value
        if value == "poll":
            return 0
        cpu = min(self.system.online_cpus())
        states = self.states(cpu)
        if not states:
            raise NotApplicable(f"force_latency_us = {value!r}: no cpuidle states on this machine")
        if value == "shallowest":
            real = [s for s in states if not s.is_poll]
            if not real:
                raise NotApplicable("force_latency_us = 'shallowest': only a polling state exists")
            return min(s.latency_us for s in real)
        wanted = value.split(":", 1)[1]
        for s in states:
            if state_matches(s, wanted):
                return s.latency_us
        names = ", ".join(s.name for s in states)
        raise NotApplicable(
            f"force_latency_us = {value!r}: no idle state {wanted!r} (have: {names})"
        )

    # -- plugin verbs -----------------------------------------------------------------
    def expand(
        self, options: CstateOptions, owned: Mapping[Target, Value]
    ) -> Expansion[CstateRules]:
        facts = read_idle(self.system, [min(self.system.online_cpus())])
        if facts.halts_regardless:
            return self._nothing_acts(options)
        settings: Settings = {}
        notes: dict[Target, str] = {}
        refused: dict[str, str] = {}
        raw = options.force_latency_us
        if raw is not None:
            try:
                settings[PmQosRequest()] = self.resolve_latency(raw)
                if isinstance(raw, str):
                    notes[PmQosRequest()] = f"resolved from {raw!r}"
            except NotApplicable as exc:
                refused["force_latency_us"] = str(exc)
        for entry in options.cpus:
            for cpu in entry.cpus:
                lat = entry.resume_latency_us
                if lat is not None:
                    value = (
                        NO_CONSTRAINT
                        if lat == "any"
                        else (ZERO_TOLERANCE if lat == 0 else str(lat))
                    )
                    settings[ResumeLatency(cpu)] = value
                if entry.disable_states is None:
                    continue
                states = self.states(cpu)
                # Later entries win: this entry's list replaces an earlier one's for this CPU.
                for state in states:
                    settings.pop(StateDisable(cpu, state.index), None)
                for state in states:
                    if any(state_matches(state, sel) for sel in entry.disable_states):
                        settings[StateDisable(cpu, state.index)] = "1"
        idle = self._idle(options, facts.driver, settings, notes, refused)
        if options.idle_governor is not None:
            settings[IdleGovernor()] = options.idle_governor
        haltpoll = options.haltpoll or {}
        governor = settings.get(IdleGovernor(), facts.governor)
        if haltpoll and governor != "haltpoll":
            refused["haltpoll"] = (
                "guest halt-polling parameters act only under the haltpoll cpuidle governor "
                f"(here: governor {governor or 'none'}, driver {facts.driver})"
            )
            haltpoll = {}
        for key, param in haltpoll.items():
            settings[HaltpollParam(HALTPOLL_KEYS[key][0])] = (
                "Y" if param is True else ("N" if param is False else str(param))
            )
        rules = CstateRules(raw if isinstance(raw, str) else None, idle)
        return Expansion(settings, rules, notes, refused)

    @staticmethod
    def _nothing_acts(options: CstateOptions) -> Expansion[CstateRules]:
        """Without a cpuidle driver the idle loop halts whatever PM QoS, resume latency
        limits, state disables, governors or halt-polling say: every option the section
        gives is not applicable, with the reason, instead of "applied" for nothing."""
        refused: dict[str, str] = {}
        given = {
            "force_latency_us": options.force_latency_us,
            "idle": options.idle,
            "idle_governor": options.idle_governor,
            "haltpoll": options.haltpoll,
        }
        for key, value in given.items():
            if value is not None:
                refused[key] = f"{key} = {value!r}: {WITHOUT_DRIVER[key]}"
        for entry in options.cpus:
            per_cpu = {
                "resume_latency_us": entry.resume_latency_us,
                "disable_states": entry.disable_states,
            }
            for key, asked in per_cpu.items():
                if asked is not None:
                    refused[f"{key} for CPUs {entry.cpus}"] = WITHOUT_DRIVER[key]
        return Expansion(rules=CstateRules(None), refused=refused)

    def _idle(
        self,
        options: CstateOptions,
        driver: str,
        settings: Settings,
        notes: dict[Target, str],
        refused: dict[str, str],
    ) -> str:
        """Resolve `idle` from this machine's cpuidle driver into settings (explicit
        options win); returns what it resolved to and why."""
        wanted = options.idle
        if wanted is None:
            return ""
        sets_pm_qos = wanted == "poll" or driver != "haltpoll"
        if sets_pm_qos and PmQosRequest() in settings:
            return f"idle = {wanted!r}: force_latency_us, given explicitly, wins"
        if wanted == "poll":
            settings[PmQosRequest()] = 0
            why = "idle = 'poll': every idle CPU polls (PM QoS 0 µs), at 100 % of each"
        elif driver == "haltpoll":
            settings[HaltpollParam("ns")] = str(RESPONSIVE_POLL_NS)
            if "haltpoll" in available_governors(self.system):
                settings[IdleGovernor()] = "haltpoll"
            why = (
                f"idle = 'responsive' on cpuidle driver haltpoll (a KVM guest): idle CPUs "
                f"poll up to {RESPONSIVE_POLL_NS // 1000} µs before halting, adaptively, so "
                "a wake-up soon after idle entry costs no VM exit and a quiet CPU does not poll"
            )
            for target in (HaltpollParam("ns"), IdleGovernor()):
                if target in settings:
                    notes[target] = "from idle = 'responsive'"
            return why
        else:
            try:
                limit = self.resolve_latency("shallowest")
            except NotApplicable as exc:
                refused["idle"] = f"idle = 'responsive': {exc}"
                return refused["idle"]
            settings[PmQosRequest()] = limit
            why = (
                f"idle = 'responsive' on cpuidle driver {driver or '(unnamed)'}: PM QoS limit at "
                f"{limit} µs (the shallowest real C-state's exit latency): no deeper state, "
                "fast wake-ups, no polling"
            )
        notes[PmQosRequest()] = f"from idle = {wanted!r}"
        return why

    # -- monitoring ---------------------------------------------------------------------
    def counters(
        self, states: Mapping[int, Sequence[IdleState]] | None = None
    ) -> dict[int, dict[int, tuple[int, int]]]:
        """cpu -> state index -> (time µs, usage), for the states given (already read) or
        every online CPU's."""
        if states is None:
            states = {cpu: self.states(cpu) for cpu in self.system.online_cpus()}
        return {
            cpu: {s.index: state_counters(self.system, cpu, s.index) for s in cpu_states}
            for cpu, cpu_states in states.items()
        }

    def on_applied(self, rules: CstateRules | None) -> None:
        try:
            self.baseline = self.counters()
        except KernelRefused:  # no cpuidle counters here: monitor() says so
            self.baseline = {}
        self.baseline_at = time.monotonic()

    def residency(self, idle_states: Mapping[int, Sequence[IdleState]] | None = None) -> Table:
        now = self.counters(idle_states)
        elapsed_us = max((time.monotonic() - self.baseline_at) * 1e6, 1.0)
        cpu0 = min(now) if now else 0
        listed = idle_states[cpu0] if idle_states and cpu0 in idle_states else self.states(cpu0)
        names = {s.index: s.name for s in listed}
        columns = ["CPU", "busy%"]
        for idx in sorted(names):
            columns += [f"{names[idx]} %", f"{names[idx]} usage"]
        rows = []
        for cpu, states in sorted(now.items()):
            base = self.baseline.get(cpu, {})
            cells: list[Any] = []
            idle = 0.0
            for idx in sorted(names):
                t, u = states.get(idx, (0, 0))
                t0, u0 = base.get(idx, (t, u))
                share = 100.0 * (t - t0) / elapsed_us
                idle += share
                cells += [round(share, 2), u - u0]
            rows.append((cpu, round(max(0.0, 100.0 - idle), 2), *cells))
        return Table(
            f"C-state residency since the profile was applied ({elapsed_us / 1e6:.1f} s)",
            tuple(columns),
            tuple(rows),
        )

    def monitor(self, rules: CstateRules | None) -> Monitor:
        facts: dict[str, Json] = {}
        held = self.system.pmqos.held()
        if held is not None:
            facts["pm_qos_requested_us"] = held
            if rules is not None and rules.resolved_from:
                facts["pm_qos_resolved_from"] = rules.resolved_from
        effective = self.system.pmqos.effective()
        if effective is not None:
            facts["pm_qos_effective_us"] = effective
        if rules is not None and rules.idle:
            facts["idle"] = rules.idle
        idle = read_idle(self.system)
        facts["cpuidle_driver"] = idle.driver or "none"
        waiting = how_idle_cpus_wait(idle)
        if idle.halts_regardless:
            return Monitor((waiting,), facts | {"residency": "none: no cpuidle states to count"})
        try:
            return Monitor((self.residency(idle.states), waiting), facts)
        except KernelRefused as exc:
            return Monitor((waiting,), facts | {"residency_error": str(exc)})


def how_idle_cpus_wait(idle: IdleFacts) -> Table:
    """Per CPU: how an idle CPU waits on this machine, under which wake-up limit, and which
    cstate options can change that."""
    acting = ", ".join(idle.options_that_act()) or f"none ({NO_DRIVER})"
    rows = []
    for cpu in sorted(idle.states):
        limit = idle.limit_us(cpu)
        shown = "ignored" if idle.halts_regardless else ("none" if limit is None else f"{limit} µs")
        rows.append((cpu, idle.waits(cpu), shown, acting))
    return Table(
        f"How idle CPUs wait here (cpuidle driver {idle.driver or 'none'}, "
        f"governor {idle.governor or 'none'})",
        ("CPU", "an idle CPU", "wake-up limit", "cstate options that act here"),
        tuple(rows),
    )
