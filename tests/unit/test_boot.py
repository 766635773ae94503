"""The kernel command line and the booted isolation: parsing as the kernel does, recorded
command lines (the usual isolation, none, conflicting ones), and what the booted state
gives the CPUs a profile shields."""

from __future__ import annotations

import dataclasses

from latencyd.cpuset import CpuSet
from latencyd.kernel.boot import (
    NO_NOHZ_FULL,
    NOT_SHOWN,
    BootReadings,
    Finding,
    booted,
    compare,
    unmet,
)
from latencyd.kernel.cmdline import KernelArg, find, isolation, parse_cmdline, split_isolcpus

FOUR = CpuSet.from_list("0-3")
USUAL = "BOOT_IMAGE=/vmlinuz ro quiet isolcpus=managed_irq,domain,2-3 nohz_full=2-3 rcu_nocbs=2-3"


def test_arguments_are_split_as_the_kernel_does() -> None:
    args = parse_cmdline('a=1 "b=x y" c="p q" flag rcu-nocbs=1 -- init=args after=dash')
    assert args == (
        KernelArg("a", "1"),
        KernelArg("b", "x y"),
        KernelArg("c", "p q"),
        KernelArg("flag"),
        KernelArg("rcu-nocbs", "1"),
    )
    assert args[4].key == "rcu_nocbs"  # "-" and "_" are the same to the kernel
    assert str(args[2]) == 'c="p q"' and str(args[3]) == "flag"
    assert find(parse_cmdline("x=1 x=2"), "x") == KernelArg("x", "2")


def test_the_usual_isolation_line() -> None:
    asked = isolation(parse_cmdline(USUAL), FOUR)
    assert asked.problems == ()
    assert asked.isolcpus == CpuSet([2, 3]) and asked.isolcpus_flags == {"managed_irq", "domain"}
    assert asked.domain_isolated == asked.managed_irq == CpuSet([2, 3])
    assert asked.tickless == asked.nohz_full == CpuSet([2, 3])
    assert asked.rcu_nocbs == CpuSet([2, 3]) and asked.irqaffinity is None


def test_a_line_without_isolation() -> None:
    asked = isolation(parse_cmdline("console=ttyS0 quiet -- isolcpus=1"), FOUR)
    assert asked.isolcpus is None and asked.nohz_full is None and asked.rcu_nocbs is None
    assert not asked.tickless and not asked.domain_isolated and asked.problems == ()


def test_isolcpus_without_flags_is_domain_and_rcu_nocbs_without_a_list_is_every_cpu() -> None:
    asked = isolation(parse_cmdline("isolcpus=1,3 rcu_nocbs irqaffinity=0 nohz_full=N"), FOUR)
    assert asked.isolcpus_flags == {"domain"} and asked.domain_isolated == CpuSet([1, 3])
    assert asked.rcu_nocbs == FOUR and asked.irqaffinity == CpuSet([0])
    assert asked.nohz_full == CpuSet([3])  # N: the last CPU


def test_conflicting_and_broken_arguments_are_what_the_kernel_ignores() -> None:
    # Both stop the tick, on different CPUs: the kernel keeps the first.
    asked = isolation(parse_cmdline("isolcpus=nohz,domain,2-3 nohz_full=1-2"), FOUR)
    assert asked.nohz_full is None and asked.tickless == CpuSet([2, 3])
    assert any("nohz_full=1-2: the kernel ignores it" in p for p in asked.problems)
    # Different kinds of housekeeping may name different CPUs.
    asked = isolation(parse_cmdline("isolcpus=domain,3 nohz_full=1-2"), FOUR)
    assert asked.problems == () and asked.domain_isolated == CpuSet([3])
    assert asked.tickless == CpuSet([1, 2])
    asked = isolation(parse_cmdline("isolcpus=bogus,2 nohz_full=6-7 rcu_nocbs=x"), FOUR)
    assert asked.isolcpus == CpuSet([2]) and asked.nohz_full is None and asked.rcu_nocbs is None
    assert [p.split(":")[0] for p in asked.problems] == [
        "isolcpus=bogus,2",
        "nohz_full=6-7",
        "rcu_nocbs=x",
    ]


def test_isolcpus_flags_are_split_off_one_way_for_the_kernel_and_for_profiles() -> None:
    # Known flags only: the rest is CPUs, a profile's expression (which may start with a
    # word), or an unknown flag the kernel skips (isolation() reports it).
    assert split_isolcpus("managed_irq,domain,2-3") == (("managed_irq", "domain"), "2-3")
    assert split_isolcpus("managed_irq,all - 0,3") == (("managed_irq",), "all - 0,3")
    assert split_isolcpus("nohz,bogus,domain,2") == (("nohz",), "bogus,domain,2")
    assert split_isolcpus("domain") == ((), "domain")  # no comma: no flag
    asked = isolation(parse_cmdline("isolcpus=nohz,bogus,managed_irq,2"), FOUR)
    assert asked.isolcpus_flags == {"nohz", "managed_irq"} and asked.isolcpus == CpuSet([2])


def readings(cmdline: str, nohz_full: bool = True, rcu_nocb_capable: bool = True) -> BootReadings:
    """What a kernel booted with `cmdline` shows (with NO_HZ_FULL or not, RCU_NOCB_CPU
    or not), as the sysfs files and kthreads would have it."""
    asked = isolation(parse_cmdline(cmdline), FOUR)
    return BootReadings(
        cmdline,
        FOUR,
        isolated=asked.domain_isolated,
        nohz_full=asked.tickless if nohz_full else None,
        rcu_nocb_capable=rcu_nocb_capable,
        rcu_offloaded=(asked.rcu_nocbs or CpuSet()) if rcu_nocb_capable else CpuSet(),
    )


def states(findings: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.feature, f.cpus, f.state) for f in findings}


def test_a_shield_on_the_booted_cpus_has_everything() -> None:
    state = booted(readings(USUAL))
    assert [str(a) for a in state.args] == ["isolcpus=managed_irq,domain,2-3", "nohz_full=2-3",
                                            "rcu_nocbs=2-3"]  # fmt: skip
    assert states(compare(CpuSet([2, 3]), state)) == {
        ("tick", "2-3", "booted"),
        ("rcu callbacks", "2-3", "booted"),
        ("managed IRQs", "2-3", "booted"),
        ("scheduler domains", "2-3", "booted"),
    }


def test_a_shield_elsewhere_says_what_a_reboot_would_add_and_what_is_isolated_for_nothing() -> None:
    findings = compare(CpuSet([1]), booted(readings(USUAL)))
    assert ("tick", "1", "not booted") in states(findings)
    assert ("tick", "2-3", "mismatch") in states(findings)
    tick = next(f for f in findings if f.feature == "tick" and f.state == "not booted")
    assert tick.argument == "nohz_full=1" and "after a reboot" in tick.detail
    domains = next(
        f for f in findings if f.feature == "scheduler domains" and f.state == "mismatch"
    )
    assert "2-3, which the profile does not shield" in domains.detail


def every_cpu(booted_with: BootReadings) -> BootReadings:
    """The same boot on a kernel since 5.17: an rcuop kthread on every CPU."""
    return dataclasses.replace(booted_with, rcu_offloaded=FOUR)


def test_rcuop_kthreads_on_every_cpu_are_not_every_cpu_offloaded() -> None:
    """Since Linux 5.17 the kernel makes an rcuop kthread for every CPU once rcu_nocbs= or
    nohz_full= is given (so offloading can change at run time): booted with rcu_nocbs=2-3
    on 4 CPUs, rcuop/0..3 run (issue 51, 4c: status said "rcu callbacks, CPUs 0-1:
    mismatch"). Offloaded are the CPUs asked, rcu_nocbs= and nohz_full= together."""
    usual = booted(every_cpu(readings(USUAL)))
    assert usual.rcu_offloaded == CpuSet([2, 3])
    assert ("rcu callbacks", "2-3", "booted") in states(compare(CpuSet([2, 3]), usual))
    assert not [f for f in compare(CpuSet([2, 3]), usual) if f.state == "mismatch"]
    line = "ro quiet rcu_nocbs=2-3"  # on a kernel without NO_HZ_FULL, as issue 51's was not
    only = booted(every_cpu(readings(line, nohz_full=False)))
    assert only.rcu_offloaded == CpuSet([2, 3])
    assert ("rcu callbacks", "2-3", "booted") in states(compare(CpuSet([2, 3]), only))
    # nohz_full= offloads its CPUs too; both: their union.
    tick = booted(every_cpu(readings("nohz_full=3")))
    assert tick.rcu_offloaded == CpuSet([3])
    both = booted(every_cpu(readings("nohz_full=3 rcu_nocbs=1")))
    assert both.rcu_offloaded == CpuSet([1, 3])
    # Neither asked: kthreads only where the kernel offloads every CPU by its build
    # (RCU_NOCB_CPU_DEFAULT_ALL), and none elsewhere.
    assert booted(every_cpu(readings("ro"))).rcu_offloaded == FOUR
    assert booted(readings("ro")).rcu_offloaded == CpuSet()
    # A kernel older than 5.17 has rcuop kthreads for the offloaded CPUs only.
    assert booted(readings(USUAL)).rcu_offloaded == CpuSet([2, 3])


def test_a_kernel_without_nohz_full_makes_it_not_applicable_never_pending() -> None:
    state = booted(readings("nohz_full=1", nohz_full=False))
    assert state.unsupported["nohz_full"] == NO_NOHZ_FULL
    assert any("nohz_full=1 was asked" in p for p in state.problems)
    tick = next(f for f in compare(CpuSet([1]), state) if f.feature == "tick")
    assert (tick.state, tick.detail) == ("not applicable", NO_NOHZ_FULL)
    rcu = next(f for f in compare(CpuSet([1]), booted(readings("", rcu_nocb_capable=False))) if
               f.feature == "rcu callbacks")  # fmt: skip
    assert rcu.state == "not applicable" and "CONFIG_RCU_NOCB_CPU" in rcu.detail


def test_no_shield_no_findings() -> None:
    assert compare(CpuSet(), booted(readings(USUAL))) == []


# -- booted_isolation = "require": what refuses a profile ----------------------------------


def test_require_is_met_only_by_the_shield_booted_exactly() -> None:
    assert unmet(CpuSet([2, 3]), booted(readings(USUAL))) is None
    assert unmet(CpuSet(), booted(readings(""))) is None  # nothing shielded, nothing required


def test_require_names_what_is_not_booted_and_the_arguments_that_fix_it() -> None:
    why = unmet(CpuSet([1]), booted(readings("BOOT_IMAGE=/vmlinuz nohz_full=1")))
    assert why == (
        "rcu callbacks not booted for CPUs 1; managed IRQs not booted for CPUs 1; "
        "scheduler domains not booted for CPUs 1 "
        "(boot with rcu_nocbs=1 isolcpus=managed_irq,domain,1)"
    )


def test_require_refuses_isolation_booted_for_cpus_the_profile_does_not_shield() -> None:
    # Booted for 2-3, the profile shields 2 only: every feature is a mismatch on 3.
    why = unmet(CpuSet([2]), booted(readings(USUAL)))
    assert why is not None
    assert why.startswith("tick booted for CPUs 3, not shielded; rcu callbacks booted for CPUs 3")
    assert why.endswith("(boot with nohz_full=2 rcu_nocbs=2 isolcpus=managed_irq,domain,2)")


def test_what_no_reboot_brings_does_not_refuse_and_an_unknown_boot_always_does() -> None:
    # Without NO_HZ_FULL and RCU_NOCB_CPU: the tick and callbacks are not applicable.
    state = booted(readings("isolcpus=managed_irq,domain,1", nohz_full=False,
                            rcu_nocb_capable=False))  # fmt: skip
    assert unmet(CpuSet([1]), state) is None
    assert unmet(CpuSet([1]), None) == NOT_SHOWN
