"""The cpu plugin on fake intel_pstate, amd-pstate-epp and acpi-cpufreq trees whose writes
behave like the drivers' (refusals, clamping), and on a machine without cpufreq."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.cpu import (
    NO_CPUFREQ,
    Boost,
    CpuPlugin,
    EnergyPerfBias,
    EnergyPreference,
    FreqLimit,
    Governor,
    NoTurbo,
    PerfPct,
    PolicyBoost,
)

from latencyd.core.capabilities import files_to_watch
from latencyd.core.engine import SECTION, Engine, Refused
from latencyd.core.journal import Journal
from latencyd.core.plugin import Target, Value
from latencyd.core.schema import SchemaError
from latencyd.errors import ApplyFailed, NotApplicable
from tests.unit.fakesys import (
    ACPI_GOVERNORS,
    CpufreqLikeSystem,
    add_acpi_cpufreq,
    add_amd_pstate,
    add_intel_pstate,
    make_fake_root,
    put,
)
from tests.unit.pluginrig import PluginRig

CPU = "sys/devices/system/cpu"
CPUFREQ = f"{CPU}/cpufreq"
PREFERENCES = "default performance balance_performance balance_power power"
EPERM = "the kernel refused it: Operation not permitted (EPERM)"
EIO = "the kernel refused it: Input/output error (EIO)"
EINVAL = "the kernel refused it: Invalid argument (EINVAL)"
EBUSY = "the kernel refused it: Device or resource busy (EBUSY)"


class Rig(PluginRig):
    """A fake 4-CPU machine built by one of the fakesys cpufreq builders."""

    def __init__(self, tmp_path: Path, build: Callable[..., None] | None, **kw: Any) -> None:
        root = make_fake_root(tmp_path, cpus="0-3")
        if build is not None:
            build(root, **kw)
        system = CpufreqLikeSystem(root, turbo_disabled=kw.get("turbo_disabled", False))
        super().__init__(tmp_path, root, "cpu", system, CpuPlugin(system))

    def file(self, rel: str) -> str:
        return (self.root / CPU / rel).read_text().strip()

    def put(self, rel: str, text: str) -> None:
        put(self.root, f"{CPU}/{rel}", text)


@pytest.fixture
def intel(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "intel", add_intel_pstate)


@pytest.fixture
def amd(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "amd", add_amd_pstate)


@pytest.fixture
def acpi(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "acpi", add_acpi_cpufreq)


def policies(cls: Callable[[int], Target], value: Value, cpus: range = range(4)) -> dict[Any, Any]:
    return {cls(n): value for n in cpus}


# -- no cpufreq ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        {"governor": "performance"},
        {"boost": False, "cpus": [{"cpus": "1", "max_freq_khz": "max"}]},
        {"energy_perf_bias": 6},  # EPB needs no cpufreq, but this machine has none either
        {},
    ],
)
def test_a_machine_without_cpufreq_is_not_applicable_with_the_reason(
    tmp_path: Path, raw: dict[str, Any]
) -> None:
    rig = Rig(tmp_path, None)  # like this VM: no policies, cpufreq/ empty, no cpuN/cpufreq
    (rig.root / CPUFREQ).mkdir(parents=True)
    with pytest.raises(NotApplicable) as err:
        rig.expand(raw)
    assert (
        str(err.value)
        == NO_CPUFREQ
        == ("this machine has no CPU frequency scaling (no cpufreq driver)")
    )
    engine = rig.engine()
    before = rig.snapshot()
    report = engine.apply(rig.profile(raw))
    assert report.applied == 0
    assert engine.sections["cpu"].expansion.refused == {SECTION: NO_CPUFREQ}
    assert engine.profile == "p" and rig.snapshot() == before


def test_without_cpufreq_the_bias_still_applies_and_the_rest_is_refused(tmp_path: Path) -> None:
    """EPB is not cpufreq (intel_pstate=disable, no acpi-cpufreq): it applies alone."""
    rig = Rig(tmp_path, None)
    for cpu in range(4):
        rig.put(f"cpu{cpu}/power/energy_perf_bias", "6")
    raw = {"governor": "performance", "energy_perf_bias": "performance", "no_turbo": True}
    exp = rig.expand(raw)
    assert exp.settings == policies(EnergyPerfBias, "0")
    assert exp.refused == {"governor on CPUs 0-3": NO_CPUFREQ, "no_turbo": NO_CPUFREQ}
    rig.round_trip(raw)


# -- intel_pstate --------------------------------------------------------------------------------


def test_intel_pstate_every_option(intel: Rig) -> None:
    raw = {
        "governor": "powersave",
        "energy_performance_preference": "balance_power",
        "energy_perf_bias": "balance-performance",
        "min_freq_khz": 1_200_000,
        "max_freq_khz": "max",
        "min_perf_pct": 30,
        "max_perf_pct": 90,
        "no_turbo": True,
    }
    exp = intel.expand(raw)
    assert exp.refused == {}
    assert exp.settings == {
        NoTurbo(): "1",
        PerfPct("max"): "90",
        PerfPct("min"): "30",
        **{
            t: v
            for n in range(4)
            for t, v in {
                Governor(n): "powersave",
                EnergyPreference(n): "balance_power",
                FreqLimit(n, "max"): "max",
                FreqLimit(n, "min"): "1200000",
            }.items()
        },
        **policies(EnergyPerfBias, "4"),
    }
    assert exp.notes[EnergyPerfBias(2)] == "resolved from 'balance-performance'"
    # The order the kernel needs: switches first, max before min, governor before EPP.
    order = list(exp.settings)
    assert order[:3] == [NoTurbo(), PerfPct("max"), PerfPct("min")]
    assert order.index(Governor(0)) < order.index(EnergyPreference(0))
    assert order.index(FreqLimit(0, "max")) < order.index(FreqLimit(0, "min"))

    engine = intel.engine()
    before = intel.snapshot()
    engine.apply(intel.profile(raw))
    assert intel.file("cpufreq/policy3/scaling_governor") == "powersave"
    assert intel.file("cpufreq/policy3/energy_performance_preference") == "balance_power"
    assert intel.file("cpufreq/policy3/scaling_min_freq") == "1200000"
    assert intel.file("cpufreq/policy3/scaling_max_freq") == "3700000"
    assert intel.file("cpu3/power/energy_perf_bias") == "4"
    assert intel.file("intel_pstate/no_turbo") == "1"
    assert (intel.file("intel_pstate/min_perf_pct"), intel.file("intel_pstate/max_perf_pct")) == (
        "30",
        "90",
    )
    assert engine.verify() == []
    assert engine.off() == []
    assert intel.snapshot() == before


def test_intel_pstate_has_no_boost_switch(intel: Rig) -> None:
    exp = intel.expand({"boost": False})
    assert exp.settings == {}
    assert exp.refused == {
        "boost": "the intel_pstate cpufreq driver has no boost switch; "
        "intel_pstate switches turbo with no_turbo"
    }


def test_epb_by_number_and_every_name(intel: Rig) -> None:
    for raw, number in [(9, "9"), ("performance", "0"), ("balance-performance", "4"),
                        ("normal", "6"), ("balance-power", "8"), ("power", "15")]:  # fmt: skip
        assert intel.expand({"energy_perf_bias": raw}).settings == policies(EnergyPerfBias, number)
    intel.round_trip({"energy_perf_bias": "power"})
    assert intel.plugin.describe(EnergyPerfBias(1), "15") == "cpu1 energy_perf_bias = 15 (power)"


def test_turbo_the_firmware_disabled_is_not_applicable(tmp_path: Path) -> None:
    rig = Rig(tmp_path, add_intel_pstate, turbo_disabled=True)
    assert rig.file("intel_pstate/no_turbo") == "1"
    engine = rig.engine()
    before = rig.snapshot()
    report = engine.apply(rig.profile({"no_turbo": False, "governor": "performance"}))
    assert report.applied == 4
    assert report.not_applicable == {
        ("cpu", NoTurbo()): Refused(
            "0", f"turbo is disabled by the firmware or absent on this CPU: {EPERM}"
        )
    }
    assert rig.file("cpufreq/policy0/scaling_governor") == "performance"
    # Wanting what the firmware already did is no write at all.
    assert engine.apply(rig.profile({"no_turbo": True})).unchanged == 1
    assert engine.off() == []
    assert rig.snapshot() == before


def test_a_bias_the_cpu_refuses_is_not_applicable_on_that_cpu(intel: Rig) -> None:
    """A hypervisor that traps the EPB MSR answers EIO: that CPU cannot, the rest applies."""
    intel.system.refuse[f"{CPU}/cpu2/power/energy_perf_bias"] = 5  # EIO
    engine = intel.engine()
    report = engine.apply(intel.profile({"energy_perf_bias": 0}))
    assert report.applied == 3
    assert report.not_applicable == {
        ("cpu", EnergyPerfBias(2)): Refused(
            "0", f"this CPU does not take an energy/performance bias: {EIO}"
        )
    }
    assert [intel.file(f"cpu{n}/power/energy_perf_bias") for n in range(4)] == ["0", "0", "6", "0"]
    assert engine.off() == []
    assert intel.file("cpu0/power/energy_perf_bias") == "6"


def test_perf_limits_are_written_in_the_order_intel_pstate_does_not_clamp(intel: Rig) -> None:
    intel.put("intel_pstate/min_perf_pct", "80")
    lowering = {"min_perf_pct": 30, "max_perf_pct": 50}  # max 50 < min 80 now: min first
    assert list(intel.expand(lowering).settings) == [PerfPct("min"), PerfPct("max")]
    intel.round_trip(lowering)
    raising = {"min_perf_pct": 90, "max_perf_pct": 95}
    assert list(intel.expand(raising).settings) == [PerfPct("max"), PerfPct("min")]
    intel.round_trip(raising)


def test_a_perf_limit_below_the_cpus_range_is_not_applicable(intel: Rig) -> None:
    engine = intel.engine()
    report = engine.apply(intel.profile({"min_perf_pct": 10}))  # floor: 22 %
    assert report.not_applicable == {
        ("cpu", PerfPct("min")): Refused(
            "10",
            "intel_pstate keeps it within this CPU's P-states: "
            "the kernel accepted the write but kept '22'",
        )
    }
    assert intel.file("intel_pstate/min_perf_pct") == "22"
    assert engine.off() == []


def test_contradicting_perf_limits_fail_before_anything_changes(intel: Rig) -> None:
    before = intel.snapshot()
    with pytest.raises(ApplyFailed, match=r"\[cpu\]: min_perf_pct = 60 is above max_perf_pct = 50"):
        intel.engine().apply(intel.profile({"min_perf_pct": 60, "max_perf_pct": 50}))
    assert intel.snapshot() == before


# -- energy_performance_preference ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (
            {"energy_performance_preference": "turbo"},
            f"not offered here (energy_performance_available_preferences: {PREFERENCES})",
        ),
        (
            {"energy_performance_preference": "default"},
            "'default' reads back as the firmware's own preference, so it cannot be verified: "
            f"name one (energy_performance_available_preferences: {PREFERENCES})",
        ),
        (
            {"governor": "performance", "energy_performance_preference": "power"},
            "the intel_pstate driver holds EPP at 'performance' under the performance "
            'governor; set governor = "powersave" to choose another',
        ),
    ],
)
def test_epp_the_driver_would_refuse_is_not_applicable(
    intel: Rig, raw: dict[str, Any], reason: str
) -> None:
    exp = intel.expand(raw)
    epp = raw["energy_performance_preference"]
    assert exp.refused == {f"energy_performance_preference = {epp!r} on CPUs 0-3": reason}
    assert not any(isinstance(t, EnergyPreference) for t in exp.settings)


def test_epp_under_the_current_performance_governor(intel: Rig) -> None:
    intel.put("cpufreq/policy1/scaling_governor", "performance")  # set by someone else
    exp = intel.expand({"energy_performance_preference": "balance_power"})
    assert set(exp.settings) == {EnergyPreference(0), EnergyPreference(2), EnergyPreference(3)}
    assert list(exp.refused) == ["energy_performance_preference = 'balance_power' on CPU 1"]
    # ...and what the profile itself switches to powersave is free again.
    raw = {"governor": "powersave", "energy_performance_preference": "balance_power"}
    assert intel.expand(raw).refused == {}
    intel.round_trip(raw)


def test_an_epp_the_kernel_refuses_anyway_fails_and_rolls_back(intel: Rig) -> None:
    """Listed and allowed, yet refused: not a missing capability, so the profile fails."""
    intel.system.refuse[f"{CPUFREQ}/policy2/energy_performance_preference"] = 16  # EBUSY
    before = intel.snapshot()
    engine = intel.engine()
    with pytest.raises(ApplyFailed, match="policy2 energy_performance_preference = power"):
        engine.apply(
            intel.profile({"energy_perf_bias": 15, "energy_performance_preference": "power"})
        )
    assert intel.snapshot() == before
    assert engine.applied == {}


# -- governors ---------------------------------------------------------------------------------


def test_acpi_cpufreq_governors_and_a_governor_the_driver_lacks(acpi: Rig, amd: Rig) -> None:
    for governor in ACPI_GOVERNORS:
        assert acpi.expand({"governor": governor}).settings == policies(Governor, governor)
    acpi.round_trip({"governor": "ondemand"})
    exp = amd.expand({"governor": "ondemand"})
    assert exp.settings == {}
    assert exp.refused == {
        "governor = 'ondemand' on CPUs 0-3": "the amd-pstate-epp driver does not offer it "
        "(scaling_available_governors: performance powersave)"
    }


def test_a_listed_governor_the_kernel_refuses_fails_and_rolls_back(acpi: Rig) -> None:
    acpi.system.refuse[f"{CPUFREQ}/policy2/scaling_governor"] = 16  # EBUSY
    before = acpi.snapshot()
    engine = acpi.engine()
    with pytest.raises(ApplyFailed) as err:
        engine.apply(acpi.profile({"governor": "performance"}))
    assert "[cpu] cpufreq policy2 governor = performance: writing 'performance'" in str(err.value)
    assert EBUSY in str(err.value) and "rolled back" in str(err.value)
    assert acpi.snapshot() == before
    assert engine.applied == {} and engine.originals == {}


# -- per CPU set ---------------------------------------------------------------------------------


def test_cpu_sets_override_the_top_level_and_later_entries_win(acpi: Rig) -> None:
    raw = {
        "governor": "powersave",
        "max_freq_khz": 2_100_000,
        "cpus": [
            {
                "cpus": "2-3",
                "governor": "performance",
                "min_freq_khz": "max",
                "max_freq_khz": "max",
            },
            {"cpus": "3", "governor": "schedutil"},
        ],
    }
    exp = acpi.expand(raw)
    assert exp.refused == {}
    assert exp.settings == {
        Governor(0): "powersave",
        FreqLimit(0, "max"): "2100000",
        Governor(1): "powersave",
        FreqLimit(1, "max"): "2100000",
        Governor(2): "performance",
        FreqLimit(2, "max"): "max",
        FreqLimit(2, "min"): "max",
        Governor(3): "schedutil",
        FreqLimit(3, "max"): "max",
        FreqLimit(3, "min"): "max",
    }
    engine = acpi.engine()
    before = acpi.snapshot()
    engine.apply(acpi.profile(raw))
    assert acpi.file("cpufreq/policy3/scaling_min_freq") == "2800000"
    assert acpi.file("cpufreq/policy1/scaling_max_freq") == "2100000"
    assert engine.verify() == []
    assert engine.off() == []
    assert acpi.snapshot() == before


def test_cpus_sharing_a_policy_take_one_value(tmp_path: Path) -> None:
    rig = Rig(tmp_path, add_acpi_cpufreq, per_policy=2)  # policy0: CPUs 0-1, policy2: 2-3
    exp = rig.expand({"cpus": [{"cpus": "0", "governor": "performance"}]})
    assert exp.settings == {Governor(0): "performance"}
    assert exp.notes == {Governor(0): "also CPU 1: they share policy0"}
    exp = rig.expand({"governor": "powersave", "cpus": [{"cpus": "1", "governor": "performance"}]})
    assert exp.settings == {Governor(2): "powersave"}
    assert exp.notes == {Governor(2): "CPUs 2-3"}
    assert exp.refused == {
        "governor on CPUs 0-1": "these CPUs share cpufreq policy0 and so take one value, but "
        "the profile wants 'powersave' for CPU 0 and 'performance' for CPU 1"
    }


def test_schema(intel: Rig) -> None:
    assert (
        intel.section({"cpus": [{"cpus": "0-1", "energy_perf_bias": "normal"}]})["cpus"][0][
            "energy_perf_bias"
        ]
        == "normal"
    )
    cases: list[tuple[dict[str, Any], str]] = [
        ({"energy_perf_bias": 16}, "energy_perf_bias: 16 is above the maximum 15"),
        ({"min_freq_khz": "fastest"}, "expected one of min, max; got 'fastest'"),
        ({"max_perf_pct": 101}, "101 is above the maximum 100"),
        ({"governor": "perf ormance"}, "expected a governor name"),
        ({"cpus": [{"governor": "performance"}]}, "missing required option 'cpus'"),
        ({"cpus": [{"cpus": "1", "no_turbo": True}]}, "unknown option 'no_turbo'"),
    ]
    for raw, message in cases:
        with pytest.raises(SchemaError, match=message):
            intel.section(raw)


# -- frequency limits ----------------------------------------------------------------------------


def test_limits_outside_the_cpus_range_are_not_applicable(intel: Rig) -> None:
    exp = intel.expand({"max_freq_khz": 5_000_000, "cpus": [{"cpus": "1", "min_freq_khz": 100}]})
    assert exp.settings == {}
    assert exp.refused == {
        "max_freq_khz = 5000000 on CPUs 0-3": "outside this CPU's range, 800000-3700000 kHz "
        "(cpuinfo_min_freq-cpuinfo_max_freq)",
        "min_freq_khz = 100 on CPU 1": "outside this CPU's range, 800000-3700000 kHz "
        "(cpuinfo_min_freq-cpuinfo_max_freq)",
    }


def test_limits_are_written_in_the_order_the_kernel_does_not_clamp(intel: Rig) -> None:
    for n in range(4):  # someone pinned them high: the new max is below the current min
        intel.system.write(f"{CPUFREQ}/policy{n}/scaling_min_freq", "3000000")
    intel.system.requests.clear()
    lowering = {"min_freq_khz": 1_000_000, "max_freq_khz": 2_000_000}
    order = list(intel.expand(lowering).settings)
    assert order[:2] == [FreqLimit(0, "min"), FreqLimit(0, "max")]
    intel.round_trip(lowering)
    intel.system.write(f"{CPUFREQ}/policy0/scaling_min_freq", "800000")
    raising = {"cpus": [{"cpus": "0", "min_freq_khz": "max", "max_freq_khz": "max"}]}
    assert list(intel.expand(raising).settings) == [FreqLimit(0, "max"), FreqLimit(0, "min")]
    intel.round_trip(raising)


def test_contradicting_limits_fail_before_anything_changes(intel: Rig) -> None:
    raw = {"min_freq_khz": "max", "cpus": [{"cpus": "2", "max_freq_khz": 2_000_000}]}
    with pytest.raises(ApplyFailed, match=r"min_freq_khz = 'max' is above max_freq_khz = 2000000"):
        intel.engine().apply(intel.profile(raw))


def test_max_means_cpuinfo_max_freq_when_written(acpi: Rig) -> None:
    """Boost off lowers cpuinfo_max_freq: "max" follows it rather than what expand saw."""
    engine = acpi.engine()
    profile = acpi.profile({"cpus": [{"cpus": "1", "min_freq_khz": "max"}]})
    acpi.put("cpufreq/policy1/cpuinfo_max_freq", "2100000")  # after expand, before the write
    engine.apply(profile)
    assert acpi.file("cpufreq/policy1/scaling_min_freq") == "2100000"
    assert engine.verify() == []
    acpi.put("cpufreq/policy1/cpuinfo_max_freq", "2800000")  # boost on again: "max" moved
    (drift,) = engine.verify()
    assert (drift.wanted, drift.actual) == ("max", "2100000")
    assert engine.off() == []
    assert acpi.file("cpufreq/policy1/scaling_min_freq") == "1500000"


def test_a_limit_another_request_overrides_is_not_applicable(intel: Rig) -> None:
    intel.system.write(f"{CPUFREQ}/policy0/scaling_max_freq", "3000000")  # thermal, an admin
    engine = intel.engine()
    report = engine.apply(intel.profile({"cpus": [{"cpus": "0", "min_freq_khz": "max"}]}))
    assert report.not_applicable == {
        ("cpu", FreqLimit(0, "min")): Refused(
            "max",
            "another limit on this CPU's frequency (firmware, thermal or another request) "
            "wins: the kernel accepted the write but kept '3000000'",
        )
    }
    assert intel.file("cpufreq/policy0/scaling_min_freq") == "800000"  # given back at once


# -- boost ---------------------------------------------------------------------------------------


def test_acpi_cpufreq_boost_is_the_global_switch(acpi: Rig) -> None:
    assert acpi.expand({"boost": False}).settings == {Boost(): "0"}
    acpi.round_trip({"boost": False})
    acpi.system.refuse[f"{CPUFREQ}/boost"] = 22  # "not supported by this processor or SBIOS"
    report = acpi.engine().apply(acpi.profile({"boost": False}))
    assert report.not_applicable == {
        ("cpu", Boost()): Refused(
            "0", f"this CPU or its firmware does not let the OS switch boost: {EINVAL}"
        )
    }


def test_amd_pstate_boost_is_set_per_policy(amd: Rig) -> None:
    assert amd.expand({"boost": False}).settings == policies(PolicyBoost, "0")
    engine = amd.engine()
    amd.put("cpufreq/policy2/boost", "0")  # an admin's own per-CPU choice is kept exactly
    before = amd.snapshot()
    engine.apply(amd.profile({"boost": True}))
    assert [amd.file(f"cpufreq/policy{n}/boost") for n in range(4)] == ["1"] * 4
    assert amd.file("cpufreq/boost") == "1"
    assert engine.off() == []
    assert amd.snapshot() == before


def test_amd_pstate_boost_with_the_global_switch_off_uses_it(tmp_path: Path) -> None:
    """Per-policy boost is refused while the global switch is off: the global one is set."""
    rig = Rig(tmp_path, add_amd_pstate, boost="0")
    assert rig.expand({"boost": True}).settings == {Boost(): "1"}
    before = rig.snapshot()
    engine = rig.engine()
    engine.apply(rig.profile({"boost": True}))
    assert [rig.file(f"cpufreq/policy{n}/boost") for n in range(4)] == ["1"] * 4
    assert engine.verify() == []
    assert engine.off() == []
    assert rig.snapshot() == before


def test_amd_pstate_every_option_and_the_intel_only_ones(amd: Rig) -> None:
    raw = {
        "governor": "powersave",
        "energy_performance_preference": "balance_power",
        "energy_perf_bias": 6,
        "min_freq_khz": "min",
        "max_freq_khz": 3_000_000,
        "boost": False,
        "no_turbo": True,
        "min_perf_pct": 20,
        "max_perf_pct": 80,
    }
    exp = amd.expand(raw)
    assert exp.refused == {
        "no_turbo": "an intel_pstate setting, and this machine's cpufreq driver is "
        "amd-pstate-epp (no /sys/devices/system/cpu/intel_pstate/no_turbo); use boost",
        "min_perf_pct": "an intel_pstate setting, and this machine's cpufreq driver is "
        "amd-pstate-epp (no /sys/devices/system/cpu/intel_pstate/min_perf_pct)",
        "max_perf_pct": "an intel_pstate setting, and this machine's cpufreq driver is "
        "amd-pstate-epp (no /sys/devices/system/cpu/intel_pstate/max_perf_pct)",
        "energy_perf_bias on CPUs 0-3": "no energy/performance bias on this CPU (an Intel "
        "feature: no /sys/devices/system/cpu/cpuN/power/energy_perf_bias)",
    }
    assert set(exp.settings) == {
        *policies(PolicyBoost, "0"),
        *policies(Governor, "powersave"),
        *policies(EnergyPreference, "balance_power"),
        *(FreqLimit(n, b) for n in range(4) for b in ("min", "max")),
    }
    engine = amd.engine()
    before = amd.snapshot()
    report = engine.apply(amd.profile(raw))
    assert report.not_applicable == {}
    assert amd.file("cpufreq/policy0/scaling_max_freq") == "3000000"
    assert amd.file("cpufreq/policy0/scaling_min_freq") == "400000"
    assert amd.file("cpufreq/policy0/energy_performance_preference") == "balance_power"
    assert engine.verify() == []
    assert engine.off() == []
    assert amd.snapshot() == before


def test_acpi_cpufreq_has_no_epp(acpi: Rig) -> None:
    assert acpi.expand({"energy_performance_preference": "power"}).refused == {
        "energy_performance_preference = 'power' on CPUs 0-3": "the acpi-cpufreq driver has no "
        "energy_performance_preference (intel_pstate and amd-pstate-epp have one)"
    }


# -- the engine around it ------------------------------------------------------------------------


def test_expand_stores_nothing_on_the_plugin(intel: Rig) -> None:
    """A rejected switch must leave no trace: expand only reads."""
    first = {"governor": "performance", "cpus": [{"cpus": "1", "min_freq_khz": "max"}]}
    second = {"energy_perf_bias": "power", "no_turbo": True, "boost": True}
    plugin = intel.plugin
    state = {k: v if k == "system" else copy.deepcopy(v) for k, v in vars(plugin).items()}
    files = intel.snapshot()
    expanded = intel.expand(first)
    intel.expand(second)
    assert {k: v if k == "system" else copy.deepcopy(v) for k, v in vars(plugin).items()} == state
    assert intel.expand(first) == expanded
    assert intel.snapshot() == files and intel.system.writes == []


def test_restart_adopts_the_journal_and_restores_every_file(intel: Rig) -> None:
    before = intel.snapshot()
    raw = {"governor": "performance", "energy_perf_bias": 0, "no_turbo": True, "max_perf_pct": 80}
    intel.engine().apply(intel.profile(raw))
    after_restart = Engine({"cpu": CpuPlugin(intel.system)}, Journal(intel.tmp_path / "state"))
    assert after_restart.adopt() is not None
    assert len(after_restart.applied) == 10
    assert after_restart.off() == []
    assert intel.snapshot() == before


def test_a_policy_whose_cpus_went_offline_is_gone(intel: Rig) -> None:
    intel.put("cpufreq/policy3/affected_cpus", "")  # inactive: its files stay, it governs none
    assert [p.number for p in intel.plugin.policies()] == [0, 1, 2]
    assert not intel.plugin.exists(Governor(3))
    assert intel.plugin.exists(Governor(2)) and intel.plugin.exists(NoTurbo())
    assert not intel.plugin.exists(Boost())


def test_watch_files_and_describe(intel: Rig) -> None:
    p = intel.plugin
    cases: list[tuple[Any, Value, str, str]] = [
        (Governor(1), "performance", "cpufreq/policy1/scaling_governor",
         "cpufreq policy1 governor = performance"),
        (EnergyPreference(1), "power", "cpufreq/policy1/energy_performance_preference",
         "cpufreq policy1 energy_performance_preference = power"),
        (FreqLimit(1, "min"), "max", "cpufreq/policy1/scaling_min_freq",
         "cpufreq policy1 scaling_min_freq = max (cpuinfo_max_freq)"),
        (FreqLimit(1, "max"), "2000000", "cpufreq/policy1/scaling_max_freq",
         "cpufreq policy1 scaling_max_freq = 2000000 kHz"),
        (PolicyBoost(1), "0", "cpufreq/policy1/boost", "cpufreq policy1 boost off"),
        (Boost(), "1", "cpufreq/boost", "CPU frequency boost on"),
        (EnergyPerfBias(1), "7", "cpu1/power/energy_perf_bias", "cpu1 energy_perf_bias = 7"),
        (PerfPct("max"), "90", "intel_pstate/max_perf_pct", "intel_pstate max_perf_pct = 90 %"),
        (NoTurbo(), "1", "intel_pstate/no_turbo", "intel_pstate turbo off (no_turbo = 1)"),
    ]  # fmt: skip
    for target, value, rel, text in cases:
        assert files_to_watch(p, target) == (f"{CPU}/{rel}",)
        assert p.describe(target, value) == text


def test_monitor_shows_each_policy(amd: Rig, tmp_path: Path) -> None:
    (table,) = amd.plugin.monitor(None).tables
    assert table.rows[0] == (
        "policy0", "0", "amd-pstate-epp", "powersave", "balance_performance", 400000, 5759000,
        "400000",
    )  # fmt: skip
    assert amd.plugin.monitor(None).facts == {"boost": "1"}
    bare = Rig(tmp_path / "bare", None)
    assert bare.plugin.monitor(None).facts == {"cpufreq": NO_CPUFREQ}
