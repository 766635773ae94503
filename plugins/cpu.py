"""cpu: CPU frequency scaling — the governor, the energy/performance preference (EPP) and
bias (EPB), frequency limits per CPU set, and the intel_pstate and boost switches.

Everything is a sysfs file (Documentation/admin-guide/pm/cpufreq.rst, intel_pstate.rst,
amd-pstate.rst; Documentation/ABI/testing/sysfs-devices-system-cpu):

- cpufreq/policyN/{scaling_governor, energy_performance_preference, scaling_min_freq,
  scaling_max_freq, boost}: a policy governs the CPUs that share a clock (its
  affected_cpus), so each file is one target addressed by policy, and CPU sets that
  want different values for one policy are refused rather than fought over.
- cpuN/power/energy_perf_bias: Intel's EPB, per CPU, through the kernel's own file
  (never x86_energy_perf_policy or /dev/cpu/N/msr).
- intel_pstate/{no_turbo, min_perf_pct, max_perf_pct}: machine-wide, intel_pstate only.
- cpufreq/boost: the machine-wide boost switch of acpi-cpufreq and amd-pstate. Where
  every policy has its own boost file (amd_pstate; the cpufreq core on newer kernels)
  and the global switch is on, boost is set per policy, so restore puts back each
  policy's own state exactly; with the global switch off the kernel refuses per-policy
  boost, and the global file is used instead (off, every policy is off too).

Order matters where the kernel clamps one value against another, so settings are listed
in the order that cannot clamp: switches that move cpuinfo_max_freq (boost, no_turbo)
first; the governor before the EPP it constrains; of a min/max pair, the max first unless
the new max is below the current min. The engine restores in reverse.

"min" and "max" frequencies mean cpuinfo_min_freq / cpuinfo_max_freq *when written*:
switching boost or turbo changes cpuinfo_max_freq, and "max" follows it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
)
from latencyd.core.schema import (
    Bool,
    Choice,
    Cpus,
    Int,
    OneOf,
    Pattern,
    Schema,
    option,
    table,
)
from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, Location, NotApplicable, ProfileError
from latencyd.kernel import owners
from latencyd.kernel.owners import Claim
from latencyd.kernel.system import System

CPU = "sys/devices/system/cpu"
CPUFREQ = f"{CPU}/cpufreq"
PSTATE = f"{CPU}/intel_pstate"
GLOBAL_BOOST = f"{CPUFREQ}/boost"
NO_CPUFREQ = "this machine has no CPU frequency scaling (no cpufreq driver)"
# The kernel's names for EPB values (arch/x86/kernel/cpu/intel_epb.c).
EPB_NAMES = {
    "performance": 0,
    "balance-performance": 4,
    "normal": 6,
    "balance-power": 8,
    "power": 15,
}
SYMBOLIC_FREQS = ("min", "max")
POLICY_OPTIONS = ("governor", "energy_performance_preference", "min_freq_khz", "max_freq_khz")


# -- targets ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpufreqFile(FileTarget[str]):
    """A CPU frequency file. The text written is the value's (see FreqLimit for "min" and
    "max"), and the kernel's text is the same when it reads back as written; the file
    comes and goes with its CPU (or policy): missing, the setting is gone."""

    transient: ClassVar[bool] = True

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(owners.CPUFREQ),)

    def same(self, system: System, wanted: str, actual: str) -> bool:
        try:
            return self.text(system, wanted) == str(actual).strip()
        except KernelRefused:
            return False


@dataclass(frozen=True)
class PolicyFile(CpufreqFile):
    """A file of one cpufreq policy: there while the policy governs a CPU (one whose CPUs
    are all offline is inactive: nothing to tune)."""

    policy: int

    def file(self, name: str) -> str:
        return f"{CPUFREQ}/policy{self.policy}/{name}"

    def exists(self, system: System) -> bool:
        if not super().exists(system):
            return False
        try:
            return bool(system.read(self.file("affected_cpus")))
        except KernelRefused:
            return False


@dataclass(frozen=True)
class Governor(PolicyFile):
    """One policy's scaling_governor. Only a governor the policy lists in
    scaling_available_governors is ever written; if the kernel then refuses it (the
    governor fails to start, the policy is being torn down) the kernel is in a state
    nobody asked for, not short of a capability: the profile fails and is rolled back."""

    kind: ClassVar[str] = "cpufreq_governor"

    @property
    def rel(self) -> str:
        return self.file("scaling_governor")

    def describe(self, value: str) -> str:
        return f"cpufreq policy{self.policy} governor = {value}"


@dataclass(frozen=True)
class EnergyPreference(PolicyFile):
    """One policy's energy_performance_preference. Values are checked against
    energy_performance_available_preferences, and the one refusal a listed value meets on a
    healthy machine (anything but "performance" under the performance governor: EBUSY) is
    refused when the section is expanded; any other refusal fails the profile."""

    kind: ClassVar[str] = "cpufreq_epp"

    @property
    def rel(self) -> str:
        return self.file("energy_performance_preference")

    def describe(self, value: str) -> str:
        return f"cpufreq policy{self.policy} energy_performance_preference = {value}"


@dataclass(frozen=True)
class FreqLimit(PolicyFile):
    """scaling_min_freq or scaling_max_freq of one policy ("min" or "max" bound). The file
    shows the effective limit, which the kernel aggregates from every request (firmware
    _PPC, thermal, other tools): one that reads back otherwise lost to another limit.
    A value of "min" or "max" is written as this moment's cpuinfo_min/max_freq."""

    kind: ClassVar[str] = "cpufreq_limit"
    refusal_means: ClassVar[str | None] = (
        "another limit on this CPU's frequency (firmware, thermal or another request) wins"
    )
    bound: str

    @property
    def rel(self) -> str:
        return self.file(f"scaling_{self.bound}_freq")

    def text(self, system: System, value: str) -> str:
        text = str(value)
        if text in SYMBOLIC_FREQS:
            return system.read(self.file(f"cpuinfo_{text}_freq"))
        return text

    def describe(self, value: str) -> str:
        shown = (
            f"{value} (cpuinfo_{value}_freq)" if str(value) in SYMBOLIC_FREQS else f"{value} kHz"
        )
        return f"cpufreq policy{self.policy} scaling_{self.bound}_freq = {shown}"


BOOST_REFUSED = "this CPU or its firmware does not let the OS switch boost"


def _on(value: str) -> str:
    return "on" if str(value) == "1" else "off"


@dataclass(frozen=True)
class PolicyBoost(PolicyFile):
    kind: ClassVar[str] = "cpufreq_policy_boost"
    refusal_means: ClassVar[str | None] = BOOST_REFUSED

    @property
    def rel(self) -> str:
        return self.file("boost")

    def describe(self, value: str) -> str:
        return f"cpufreq policy{self.policy} boost {_on(value)}"


@dataclass(frozen=True)
class Boost(CpufreqFile):
    """The machine-wide boost switch (acpi-cpufreq, amd-pstate)."""

    kind: ClassVar[str] = "cpufreq_boost"
    refusal_means: ClassVar[str | None] = BOOST_REFUSED

    @property
    def rel(self) -> str:
        return GLOBAL_BOOST

    def describe(self, value: str) -> str:
        return f"CPU frequency boost {_on(value)}"


@dataclass(frozen=True)
class EnergyPerfBias(CpufreqFile):
    """cpuN/power/energy_perf_bias. Hypervisors that trap the MSR answer EIO."""

    kind: ClassVar[str] = "energy_perf_bias"
    refusal_means: ClassVar[str | None] = "this CPU does not take an energy/performance bias"
    cpu: int

    @property
    def rel(self) -> str:
        return f"{CPU}/cpu{self.cpu}/power/energy_perf_bias"

    def describe(self, value: str) -> str:
        names = {str(v): k for k, v in EPB_NAMES.items()}
        name = f" ({names[str(value)]})" if str(value) in names else ""
        return f"cpu{self.cpu} energy_perf_bias = {value}{name}"


@dataclass(frozen=True)
class PerfPct(CpufreqFile):
    """intel_pstate's min_perf_pct or max_perf_pct ("min" or "max" bound); the driver clamps
    them to the CPU's range of P-states."""

    kind: ClassVar[str] = "intel_pstate_perf_pct"
    refusal_means: ClassVar[str | None] = "intel_pstate keeps it within this CPU's P-states"
    bound: str

    @property
    def rel(self) -> str:
        return f"{PSTATE}/{self.bound}_perf_pct"

    def describe(self, value: str) -> str:
        return f"intel_pstate {self.bound}_perf_pct = {value} %"


@dataclass(frozen=True)
class NoTurbo(CpufreqFile):
    """intel_pstate's no_turbo; "0" is EPERM where the firmware disabled turbo."""

    kind: ClassVar[str] = "intel_pstate_no_turbo"
    refusal_means: ClassVar[str | None] = "turbo is disabled by the firmware or absent on this CPU"

    @property
    def rel(self) -> str:
        return f"{PSTATE}/no_turbo"

    def describe(self, value: str) -> str:
        return f"intel_pstate turbo {'off' if str(value) == '1' else 'on'} (no_turbo = {value})"


CpuTarget = (
    Governor
    | EnergyPreference
    | FreqLimit
    | PolicyBoost
    | Boost
    | EnergyPerfBias
    | PerfPct
    | NoTurbo
)


# -- the machine -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """One active cpufreq policy as sysfs shows it."""

    number: int
    cpus: CpuSet  # affected_cpus: the online CPUs it governs
    driver: str
    governor: str
    governors: tuple[str, ...]
    preferences: tuple[str, ...] | None  # None: the driver has no EPP
    cpuinfo: tuple[int, int]  # cpuinfo_min_freq, cpuinfo_max_freq (kHz)
    scaling: tuple[int, int]  # scaling_min_freq, scaling_max_freq now (kHz)
    boost: bool  # has its own boost file


def _cpus(cpus: Iterable[int]) -> str:
    s = CpuSet(cpus)
    return f"CPU {s.to_list()}" if len(s) == 1 else f"CPUs {s.to_list()}"


@dataclass
class _Found:
    """An expansion being built; refusals per CPU are merged into one line per reason."""

    settings: Settings = field(default_factory=dict)
    notes: dict[Target, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    refused_cpus: dict[tuple[str, str], set[int]] = field(default_factory=dict)

    def set(self, target: CpuTarget, value: str, note: str = "") -> None:
        self.settings[target] = value
        if note:
            self.notes[target] = note

    def refuse(self, what: str, reason: str, cpus: Iterable[int] = ()) -> None:
        cpus = set(cpus)
        if cpus:
            self.refused_cpus.setdefault((what, reason), set()).update(cpus)
        else:
            self.refused[what] = reason

    def expansion(self) -> Expansion[None]:
        refused = dict(self.refused)
        for (what, reason), cpus in self.refused_cpus.items():
            refused[f"{what} on {_cpus(cpus)}"] = reason
        return Expansion(self.settings, None, self.notes, refused)


# -- the options --------------------------------------------------------------------------------

FREQ = OneOf((Int(1, 2**32 - 1), Choice(SYMBOLIC_FREQS)))


@dataclass(frozen=True)
class PerCpu:
    """What a CPU may be given, by the section's top level or a [[cpu.cpus]] entry."""

    governor: str | None = option(
        Pattern(r"[A-Za-z0-9_-]+", 'a governor name ("performance", "powersave", "schedutil")'),
        "cpufreq governor (scaling_governor); one the CPU lists in scaling_available_governors",
    )
    energy_performance_preference: str | None = option(
        Pattern(r"[a-z_]+", 'an EPP name ("performance", "balance_performance", ...)'),
        "Energy/performance preference (intel_pstate, amd-pstate-epp): one the CPU lists in "
        "energy_performance_available_preferences; the performance governor allows only "
        '"performance"',
    )
    energy_perf_bias: int | str | None = option(
        OneOf((Int(0, 15), Choice(tuple(EPB_NAMES)))),
        "Intel energy/performance bias (cpuN/power/energy_perf_bias): 0 (performance) to 15 "
        '(power), or "performance" (0), "balance-performance" (4), "normal" (6), '
        '"balance-power" (8), "power" (15)',
    )
    min_freq_khz: int | str | None = option(
        FREQ,
        'Lowest frequency (scaling_min_freq): kHz, or "min" / "max" (cpuinfo_min_freq / '
        'cpuinfo_max_freq when written); "max" pins the CPU at its top speed',
        unit="kHz",
    )
    max_freq_khz: int | str | None = option(
        FREQ, 'Highest frequency (scaling_max_freq): kHz, or "min" / "max"', unit="kHz"
    )

    def given(self) -> dict[str, Any]:
        """The per-CPU options this layer sets, by name (each of its field's type): CPUs
        sharing a policy are merged and refused by option."""
        return {
            f.name: value
            for f in dataclasses.fields(PerCpu)
            if (value := getattr(self, f.name)) is not None
        }


@dataclass(frozen=True)
class _EntryCpus:
    cpus: CpuSet = option(Cpus(), "CPUs this entry applies to", required=True, compose="union")


@dataclass(frozen=True)
class CpuEntry(PerCpu, _EntryCpus):
    """One [[cpu.cpus]] entry: its CPUs (the first of its options), then what they get."""


@dataclass(frozen=True)
class CpuOptions(PerCpu):
    min_perf_pct: int | None = option(
        Int(0, 100), "intel_pstate: lowest performance, % of the highest (machine-wide)", unit="%"
    )
    max_perf_pct: int | None = option(
        Int(0, 100), "intel_pstate: highest performance, % of the highest (machine-wide)", unit="%"
    )
    no_turbo: bool | None = option(
        Bool(), "intel_pstate: keep the CPUs out of turbo (machine-wide)"
    )
    boost: bool | None = option(
        Bool(),
        "Frequency boost on or off (acpi-cpufreq, amd-pstate: cpufreq/boost, or each "
        "policy's boost file where there is one); intel_pstate uses no_turbo",
    )
    cpus: tuple[CpuEntry, ...] = table(
        CpuEntry, "Per-CPU-set settings; later entries win where CPU sets overlap"
    )


SCHEMA = Schema(section=CpuOptions)


def per_cpu_options(options: CpuOptions, online: CpuSet) -> dict[int, PerCpu]:
    """What each online CPU wants: the top level, then [[cpu.cpus]] entries, later ones winning."""
    wanted = {cpu: PerCpu() for cpu in online}
    layers: list[tuple[CpuSet, PerCpu]] = [(online, options), *((e.cpus, e) for e in options.cpus)]
    for cpus, layer in layers:
        mine = layer.given()
        if not mine:
            continue
        for cpu in cpus:
            if cpu in wanted:
                wanted[cpu] = dataclasses.replace(wanted[cpu], **mine)
    return wanted


class CpuPlugin(Plugin[CpuTarget, None, CpuOptions]):
    name = "cpu"
    summary = "CPU frequency: governor, EPP/EPB, frequency limits, intel_pstate and boost"
    targets = (Governor, EnergyPreference, FreqLimit, PolicyBoost, Boost, EnergyPerfBias, PerfPct,
               NoTurbo)  # fmt: skip
    schema = SCHEMA
    # CPUs coming online bring their policies back: the daemon expands the profile again.
    follows = Follows(udev={"cpu": CPU_ACTIONS})
    example: ClassVar[dict[str, Any]] = {
        "governor": "performance",
        "energy_perf_bias": "performance",
        "min_perf_pct": 100,
        "cpus": [{"cpus": "1", "min_freq_khz": "max"}],
    }

    # -- the machine's cpufreq policies -------------------------------------------------------
    def _maybe(self, rel: str) -> str | None:
        return self.system.read(rel) if self.system.exists(rel) else None

    def policy(self, number: int) -> Policy:
        base = f"{CPUFREQ}/policy{number}"

        def khz(name: str) -> int:
            return int(self.system.read(f"{base}/{name}"))

        preferences = self._maybe(f"{base}/energy_performance_available_preferences")
        return Policy(
            number,
            CpuSet(int(c) for c in self.system.read(f"{base}/affected_cpus").split()),
            self.system.read(f"{base}/scaling_driver"),
            self.system.read(f"{base}/scaling_governor"),
            tuple(self.system.read(f"{base}/scaling_available_governors").split()),
            None if preferences is None else tuple(preferences.split()),
            (khz("cpuinfo_min_freq"), khz("cpuinfo_max_freq")),
            (khz("scaling_min_freq"), khz("scaling_max_freq")),
            self.system.exists(f"{base}/boost"),
        )

    def policies(self) -> list[Policy]:
        """The active policies (an inactive one, all of whose CPUs are offline, governs none)."""
        out = []
        for entry in self.system.listdir(CPUFREQ):
            m = re.fullmatch(r"policy(\d+)", entry)
            if not m:
                continue
            try:
                policy = self.policy(int(m.group(1)))
            except (KernelRefused, ValueError):  # going away as we look
                continue
            if policy.cpus:
                out.append(policy)
        return sorted(out, key=lambda p: p.number)

    # -- what a section wants ---------------------------------------------------------------
    def expand(self, options: CpuOptions, owned: Mapping[Target, Value]) -> Expansion[None]:
        wanted = per_cpu_options(options, self.system.online_cpus())
        policies = self.policies()
        if not policies and not any(
            w.energy_perf_bias is not None and self.system.exists(EnergyPerfBias(cpu).rel)
            for cpu, w in wanted.items()
        ):  # only EPB works without cpufreq, and it is not asked for (or absent) here
            raise NotApplicable(NO_CPUFREQ)
        found = _Found()
        if options.boost is not None:
            self._boost(options.boost, policies, found)
        self._pstate(options, policies, found)
        covered = CpuSet()
        for policy in policies:
            self._policy(policy, wanted, found)
            covered |= policy.cpus
        given = {cpu: w.given() for cpu, w in wanted.items()}
        for name in POLICY_OPTIONS:
            missing = [cpu for cpu, g in given.items() if name in g and cpu not in covered]
            if missing:
                reason = NO_CPUFREQ if not policies else "no cpufreq policy governs it"
                found.refuse(name, reason, missing)
        self._bias(wanted, found)
        return found.expansion()

    def _boost(self, on: bool, policies: list[Policy], found: _Found) -> None:
        value = "1" if on else "0"
        has_global = self.system.exists(GLOBAL_BOOST)
        per_policy = bool(policies) and all(p.boost for p in policies)
        # The kernel refuses per-policy boost while the global switch is off.
        if per_policy and (not has_global or self.system.read(GLOBAL_BOOST) == "1"):
            for p in policies:
                found.set(PolicyBoost(p.number), value)
        elif has_global:
            found.set(Boost(), value)
        elif not policies:
            found.refuse("boost", NO_CPUFREQ)
        else:
            driver = policies[0].driver
            hint = "; intel_pstate switches turbo with no_turbo" if driver == "intel_pstate" else ""
            found.refuse("boost", f"the {driver} cpufreq driver has no boost switch{hint}")

    def _has_boost(self, policies: list[Policy]) -> bool:
        return self.system.exists(GLOBAL_BOOST) or any(p.boost for p in policies)

    def _pstate(self, options: CpuOptions, policies: list[Policy], found: _Found) -> None:
        given = {
            "no_turbo": options.no_turbo,
            "min_perf_pct": options.min_perf_pct,
            "max_perf_pct": options.max_perf_pct,
        }
        for name, value in given.items():
            if value is None or self.system.exists(f"{PSTATE}/{name}"):
                continue
            if not policies:
                found.refuse(name, NO_CPUFREQ)
                continue
            found.refuse(
                name,
                f"an intel_pstate setting, and this machine's cpufreq driver is "
                f"{policies[0].driver} (no /{PSTATE}/{name})"
                + ("; use boost" if name == "no_turbo" and self._has_boost(policies) else ""),
            )
        if options.no_turbo is not None and self.system.exists(NoTurbo().rel):
            found.set(NoTurbo(), "1" if options.no_turbo else "0")
        pct = {
            bound: value
            for bound, value in (("min", options.min_perf_pct), ("max", options.max_perf_pct))
            if value is not None and self.system.exists(PerfPct(bound).rel)
        }
        if len(pct) == 2 and pct["min"] > pct["max"]:
            raise ProfileError(
                Location(None), f"min_perf_pct = {pct['min']} is above max_perf_pct = {pct['max']}"
            )
        # intel_pstate clamps max_perf_pct to at least the current min_perf_pct.
        max_first = "max" in pct and pct["max"] >= int(self.system.read(PerfPct("min").rel))
        for bound in ("max", "min") if max_first else ("min", "max"):
            if bound in pct:
                found.set(PerfPct(bound), str(pct[bound]))

    def _policy(self, policy: Policy, wanted: Mapping[int, PerCpu], found: _Found) -> None:
        values: dict[str, Any] = {}
        notes: dict[str, str] = {}
        given = {cpu: wanted[cpu].given() for cpu in policy.cpus if cpu in wanted}
        for name in POLICY_OPTIONS:
            asked = {cpu: g[name] for cpu, g in given.items() if name in g}
            if not asked:
                continue
            by_value: dict[Any, list[int]] = {}
            for cpu, value in asked.items():
                by_value.setdefault(value, []).append(cpu)
            if len(by_value) > 1:
                wants = " and ".join(f"{v!r} for {_cpus(c)}" for v, c in by_value.items())
                found.refuse(
                    name,
                    f"these CPUs share cpufreq policy{policy.number} and so take one value, "
                    f"but the profile wants {wants}",
                    policy.cpus,
                )
                continue
            values[name] = next(iter(by_value))
            # Say which CPUs a policy file reaches where that is not just "cpuN".
            others = policy.cpus - CpuSet(asked)
            notes[name] = (
                f"also {_cpus(others)}: they share policy{policy.number}"
                if others
                else (_cpus(policy.cpus) if policy.cpus != CpuSet([policy.number]) else "")
            )

        agreed = PerCpu(**values)
        governor = agreed.governor
        if governor is not None and governor not in policy.governors:
            found.refuse(
                f"governor = {governor!r}",
                f"the {policy.driver} driver does not offer it "
                f"(scaling_available_governors: {' '.join(policy.governors)})",
                policy.cpus,
            )
            governor = None
        if governor is not None:
            found.set(Governor(policy.number), governor, notes["governor"])

        epp = agreed.energy_performance_preference
        if epp is not None:
            problem = self._epp_problem(policy, epp, governor or policy.governor)
            if problem:
                found.refuse(f"energy_performance_preference = {epp!r}", problem, policy.cpus)
            else:
                target = EnergyPreference(policy.number)
                found.set(target, epp, notes["energy_performance_preference"])

        self._limits(policy, agreed, notes, found)

    @staticmethod
    def _epp_problem(policy: Policy, epp: str, governor: str) -> str | None:
        if policy.preferences is None:
            return (
                f"the {policy.driver} driver has no energy_performance_preference "
                "(intel_pstate and amd-pstate-epp have one)"
            )
        listed = " ".join(policy.preferences)
        if epp == "default":
            return (
                "'default' reads back as the firmware's own preference, so it cannot be "
                f"verified: name one (energy_performance_available_preferences: {listed})"
            )
        if epp not in policy.preferences:
            return f"not offered here (energy_performance_available_preferences: {listed})"
        if governor == "performance" and epp != "performance":
            return (
                f"the {policy.driver} driver holds EPP at 'performance' under the performance "
                'governor; set governor = "powersave" to choose another'
            )
        return None

    def _limits(
        self, policy: Policy, agreed: PerCpu, notes: Mapping[str, str], found: _Found
    ) -> None:
        lo, hi = policy.cpuinfo
        limits: dict[str, tuple[int | str, int]] = {}  # bound -> (as the profile says, kHz now)
        for bound, raw in (("min", agreed.min_freq_khz), ("max", agreed.max_freq_khz)):
            if raw is None:
                continue
            if isinstance(raw, str):
                limits[bound] = (raw, lo if raw == "min" else hi)
            elif lo <= raw <= hi:
                limits[bound] = (raw, raw)
            else:
                found.refuse(
                    f"{bound}_freq_khz = {raw}",
                    f"outside this CPU's range, {lo}-{hi} kHz (cpuinfo_min_freq-cpuinfo_max_freq)",
                    policy.cpus,
                )
        if len(limits) == 2 and limits["min"][1] > limits["max"][1]:
            raise ProfileError(
                Location(None),
                f"min_freq_khz = {limits['min'][0]!r} is above max_freq_khz = "
                f"{limits['max'][0]!r} on {_cpus(policy.cpus)} ({limits['min'][1]} > "
                f"{limits['max'][1]} kHz)",
            )
        # The kernel clamps the effective min to the max: lower the min first only when
        # the new max is below the current min.
        max_first = "max" not in limits or limits["max"][1] >= policy.scaling[0]
        for bound in ("max", "min") if max_first else ("min", "max"):
            if bound in limits:
                raw = limits[bound][0]
                note = notes[f"{bound}_freq_khz"]
                found.set(FreqLimit(policy.number, bound), str(raw), note)

    def _bias(self, wanted: Mapping[int, PerCpu], found: _Found) -> None:
        for cpu, w in sorted(wanted.items()):
            raw = w.energy_perf_bias
            if raw is None:
                continue
            target = EnergyPerfBias(cpu)
            if not self.system.exists(target.rel):
                found.refuse(
                    "energy_perf_bias",
                    "no energy/performance bias on this CPU (an Intel feature: no "
                    f"/{CPU}/cpuN/power/energy_perf_bias)",
                    [cpu],
                )
                continue
            value = EPB_NAMES[raw] if isinstance(raw, str) else raw
            found.set(target, str(value), f"resolved from {raw!r}" if isinstance(raw, str) else "")

    # -- monitoring ---------------------------------------------------------------------------
    def monitor(self, rules: None) -> Monitor:
        rows = []
        for p in self.policies():
            base = f"{CPUFREQ}/policy{p.number}"
            try:
                current = self._maybe(f"{base}/scaling_cur_freq") or "-"
                epp = self._maybe(f"{base}/energy_performance_preference") or "-"
            except KernelRefused:
                continue
            rows.append(
                (
                    f"policy{p.number}",
                    p.cpus.to_list(),
                    p.driver,
                    p.governor,
                    epp,
                    *p.scaling,
                    current,
                )
            )
        facts: dict[str, Json] = {}
        for name in ("status", "no_turbo", "min_perf_pct", "max_perf_pct"):
            value = self._maybe(f"{PSTATE}/{name}")
            if value is not None:
                facts[f"intel_pstate_{name}"] = value
        boost = self._maybe(GLOBAL_BOOST)
        if boost is not None:
            facts["boost"] = boost
        if not rows:
            return Monitor((), facts | {"cpufreq": NO_CPUFREQ})
        table = Table(
            "CPU frequency policies",
            ("policy", "CPUs", "driver", "governor", "EPP", "min kHz", "max kHz", "now kHz"),
            tuple(rows),
        )
        return Monitor((table,), facts)
