"""Holds compose (latencyd.core.compose): CPU lists kept for applications are unioned,
housekeeping lists intersected, every other option must agree, else the newer hold is
refused naming both holds, the setting, both values and their file:line."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.bootloader import BootOptions
from latencyd.plugins.kthread import KthreadOptions, KthreadRule

from latencyd.core.compose import Held, compose
from latencyd.core.engine import section_schemas
from latencyd.core.plugin import Plugin, load_plugins
from latencyd.core.profile import Profile, ProfileLibrary
from latencyd.cpuset import CpuSet
from latencyd.errors import HoldConflict
from latencyd.kernel.cmdline import ArgumentsDiffer, composed_arguments
from latencyd.kernel.system import Machine, System
from latencyd.paths import shipped_profiles_dir
from tests.unit.fakesys import make_fake_root

MACHINE = Machine(CpuSet.from_list("0-3"), 8 << 30)


@pytest.fixture
def plugins(tmp_path: Path) -> dict[str, Plugin[Any, Any, Any]]:
    return load_plugins(System(make_fake_root(tmp_path)))


@pytest.fixture
def lib(pdir: Path, plugins: dict[str, Plugin[Any, Any, Any]]) -> ProfileLibrary:
    return ProfileLibrary([pdir, shipped_profiles_dir()], section_schemas(plugins), MACHINE)


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.toml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def partitioning(pdir: Path, name: str, cpus: str) -> None:
    write(
        pdir,
        name,
        f'[main]\ninclude = ["cpu-partitioning"]\n[variables]\nisolated_cores = "{cpus}"\n',
    )


def held(lib: ProfileLibrary, *names: str) -> list[Held]:
    return [Held(f"hold {n} ({name})", lib.load(name)) for n, name in enumerate(names, 1)]


def refusal(lib: ProfileLibrary, *names: str) -> str:
    """What composing the holds of `names` is refused with."""
    with pytest.raises(HoldConflict) as info:
        compose(held(lib, *names), lib.schemas)
    return str(info.value)


def test_one_hold_is_its_profile_as_it_is(lib: ProfileLibrary) -> None:
    one = held(lib, "cpu-partitioning")
    assert compose(one, lib.schemas) is one[0].profile


def test_a_profile_the_first_includes_changes_nothing_of_it(lib: ProfileLibrary) -> None:
    """The issue's sequence: cpu-partitioning held, then network-latency (which it
    includes): nothing differs, so applying the composition moves nothing."""
    first, second = held(lib, "cpu-partitioning", "network-latency")
    both = compose([first, second], lib.schemas)
    assert both.sections == first.profile.sections
    assert both.name == "cpu-partitioning+network-latency"
    # and in the other order, too
    assert compose([second, first], lib.schemas).sections == first.profile.sections


def test_two_partitioned_holds_shield_the_union_and_keep_housekeeping_common(
    lib: ProfileLibrary, pdir: Path
) -> None:
    partitioning(pdir, "app-one", "1")
    partitioning(pdir, "app-two", "2")
    both = compose(held(lib, "app-one", "app-two"), lib.schemas)
    union, housekeeping = CpuSet.from_list("1-2"), CpuSet.from_list("0,3")
    assert both.sections["shield"]["cpus"] == union
    assert both.sections["irq"]["isolate"] == union
    assert both.sections["monitor"]["cpus"] == union
    assert both.sections["kthread"]["unbound_cpumask"] == housekeeping
    assert both.sections["kthread"]["writeback_cpumask"] == housekeeping
    assert both.sections["kthread"]["rule"][0]["cpus"] == housekeeping
    assert both.sections["net"]["nic"][0]["xps_cpus"] == housekeeping
    # what both say alike stays as it is
    assert both.sections["sysctl"] == lib.load("app-one").sections["sysctl"]


def test_a_conflicting_machine_wide_value_refuses_the_newer_hold_saying_where(
    lib: ProfileLibrary, pdir: Path
) -> None:
    a = write(pdir, "swap-ten", '[sysctl]\n"vm.swappiness" = 10\n')
    b = write(pdir, "swap-sixty", '[main]\nsummary = "x"\n[sysctl]\n"vm.swappiness" = 60\n')
    message = refusal(lib, "swap-ten", "swap-sixty")
    assert message.startswith("hold 2 (swap-sixty) is refused")
    assert "hold 1 (swap-ten)" in message
    assert "[sysctl] vm.swappiness: 60" in message and "against 10" in message
    assert f"{b}:4" in message and f"{a}:2" in message


def test_an_option_left_at_its_default_gives_way_to_one_set(
    lib: ProfileLibrary, pdir: Path
) -> None:
    write(pdir, "cpuset-shield", '[shield]\ncpus = "1"\nmechanism = "cpuset"\n')
    write(pdir, "plain-shield", '[shield]\ncpus = "2"\n')  # mechanism: its default, auto
    both = compose(held(lib, "cpuset-shield", "plain-shield"), lib.schemas)
    assert both.sections["shield"]["mechanism"] == "cpuset"
    assert both.sections["shield"]["cpus"] == CpuSet.from_list("1-2")


def test_housekeeping_lists_with_no_cpu_in_common_are_a_conflict(
    lib: ProfileLibrary, pdir: Path
) -> None:
    write(pdir, "hk-zero", '[kthread]\nunbound_cpumask = "0"\n')
    write(pdir, "hk-three", '[kthread]\nunbound_cpumask = "3"\n')
    with pytest.raises(HoldConflict, match=r"leave no CPU in common .*\[kthread\] unbound_cpumask"):
        compose(held(lib, "hk-zero", "hk-three"), lib.schemas)


def test_exclusive_options_from_two_holds_are_a_conflict(lib: ProfileLibrary, pdir: Path) -> None:
    write(pdir, "by-ratio", "[writeback]\ndirty_ratio = 15\n")
    write(pdir, "by-bytes", '[writeback]\ndirty_bytes = "64M"\n')
    with pytest.raises(HoldConflict, match="kernel keeps only one of them"):
        compose(held(lib, "by-ratio", "by-bytes"), lib.schemas)


def test_tables_whose_later_entries_win_of_different_lengths_are_a_conflict(
    lib: ProfileLibrary, pdir: Path
) -> None:
    """Per-CPU entries, later ones winning where they overlap: another hold's entry after
    this one's could undo it on its CPUs."""
    one = '[[cstate.cpus]]\ncpus = "1"\nresume_latency_us = 0\n'
    write(pdir, "one-entry", one)
    write(pdir, "two-entries", one + '[[cstate.cpus]]\ncpus = "1-2"\nresume_latency_us = 20\n')
    with pytest.raises(HoldConflict, match=r"have 1 and 2 entries"):
        compose(held(lib, "one-entry", "two-entries"), lib.schemas)


def test_rules_where_the_first_match_wins_compose_up_to_the_shorter_then_the_longers(
    lib: ProfileLibrary, pdir: Path, plugins: dict[str, Plugin[Any, Any, Any]]
) -> None:
    """Issue 52: cpu-partitioning's one [[kthread.rule]] and realtime's four (the same
    first rule, then policy rules) were refused as not one list, so an application under
    realtime beside one under cpu-partitioning could not hold. Where the first matching
    rule wins, the rules merge one by one as far as the shorter list goes and the longer's
    follow: they match only threads none of the other's rules match."""
    partitioning(pdir, "app-one", "1")
    realtime(pdir, "rt-two", "2")
    one, two = lib.load("app-one"), lib.load("rt-two")
    assert len(one.sections["kthread"]["rule"]) == 1 < len(two.sections["kthread"]["rule"])
    for names in (("app-one", "rt-two"), ("rt-two", "app-one")):
        rules = compose(held(lib, *names), lib.schemas).sections["kthread"]["rule"]
        housekeeping = CpuSet.from_list("0,3")
        assert rules == [
            {**two.sections["kthread"]["rule"][0], "cpus": housekeeping},
            *two.sections["kthread"]["rule"][1:],
        ]
    # and the plugin reads the composed section as its options class, each rule its own
    typed = plugins["kthread"].options_of(
        compose(held(lib, "app-one", "rt-two"), lib.schemas).sections["kthread"]
    )
    assert isinstance(typed, KthreadOptions)
    assert [type(r) for r in typed.rule] == [KthreadRule] * len(two.sections["kthread"]["rule"])
    assert typed.rule[0].cpus == CpuSet.from_list("0,3")
    assert (typed.rule[1].policy, typed.rule[1].priority) == ("fifo", 2)
    # rules that differ where both have one are still a conflict
    write(pdir, "rule-a", '[[kthread.rule]]\nmatch = "^a"\ncpus = "0"\n')
    two_rules = '[[kthread.rule]]\nmatch = "^b"\ncpus = "0"\n[[kthread.rule]]\nmatch = "^a"\n'
    write(pdir, "rules-b-a", two_rules + 'cpus = "0"\n')
    refused = refusal(lib, "rule-a", "rules-b-a")
    assert "select other things in one entry for [kthread] rule.0.match: '^b'" in refused


def test_composed_profile_names_every_file(lib: ProfileLibrary, pdir: Path) -> None:
    partitioning(pdir, "app-one", "1")
    partitioning(pdir, "app-two", "2")
    both: Profile = compose(held(lib, "app-one", "app-two"), lib.schemas)
    assert pdir / "app-one.toml" in both.files and pdir / "app-two.toml" in both.files


def realtime(pdir: Path, name: str, cpus: str, extra: str = "") -> Path:
    return write(
        pdir,
        name,
        f'[main]\ninclude = ["realtime"]\n[variables]\nisolated_cores = "{cpus}"\n{extra}',
    )


def test_two_realtime_holds_compose_their_kernel_arguments(
    lib: ProfileLibrary, pdir: Path, plugins: dict[str, Plugin[Any, Any, Any]]
) -> None:
    """Issue 52 with the shipped realtime profile: each hold's boot arguments name its own
    CPUs (nohz_full=1, nohz_full=2), so two applications each on its own CPUs were
    refused as asking [bootloader] cmdline two ways. Kernel arguments compose: the CPUs
    either isolates, those both leave to housekeeping, every other argument as it is."""
    realtime(pdir, "rt-one", "1")
    realtime(pdir, "rt-two", "2")
    both = compose(held(lib, "rt-one", "rt-two"), lib.schemas)
    one = lib.load("rt-one").sections["bootloader"]["cmdline"]
    composed = {
        "isolcpus": "isolcpus=managed_irq,domain,1-2",
        "nohz_full": "nohz_full=1-2",
        "rcu_nocbs": "rcu_nocbs=1-2",
        "irqaffinity": "irqaffinity=0,3",
        "systemd.cpu_affinity": "systemd.cpu_affinity=0,3",
    }
    assert set(composed) <= {a.partition("=")[0] for a in one}
    assert both.sections["bootloader"]["cmdline"] == [
        composed.get(a.partition("=")[0], a) for a in one
    ]
    assert both.sections["shield"]["cpus"] == CpuSet.from_list("1-2")
    # the plugin reads the composed arguments as its options class
    typed = plugins["bootloader"].options_of(both.sections["bootloader"])
    assert isinstance(typed, BootOptions)
    assert typed.cmdline == both.sections["bootloader"]["cmdline"]
    # the same hold twice, or one CPU's: its arguments as they are
    same = compose(held(lib, "rt-one", "rt-one"), lib.schemas)
    assert same.sections["bootloader"] == lib.load("rt-one").sections["bootloader"]


def test_a_kernel_argument_asked_two_ways_is_a_conflict_naming_it(
    lib: ProfileLibrary, pdir: Path
) -> None:
    realtime(pdir, "rt-one", "1")
    other = realtime(pdir, "rt-prio", "2", '[bootloader]\ncmdline = ["rcutree.kthread_prio=20"]\n')
    message = refusal(lib, "rt-one", "rt-prio")
    assert message.startswith("hold 2 (rt-prio) is refused: it and hold 1 (rt-one) set ")
    assert "rcutree.kthread_prio two ways (rcutree.kthread_prio=20 against " in message
    assert "rcutree.kthread_prio=11)" in message and "[bootloader] cmdline" in message
    assert f"{other}:6" in message


@pytest.mark.parametrize(
    ("first", "second", "one"),
    [
        (["nohz_full=1", "quiet"], ["nohz_full=2", "skew_tick=1"],
         ["nohz_full=1-2", "quiet", "skew_tick=1"]),
        (["rcu-nocbs=1"], ["rcu_nocbs=3"], ["rcu-nocbs=1,3"]),  # - and _ alike
        (["isolcpus=1"], ["isolcpus=domain,2"], ["isolcpus=1-2"]),  # no flag: domain
        (["irqaffinity=0-2"], ["irqaffinity=0,3"], ["irqaffinity=0"]),
        (["kthread_cpus=0,2"], ["kthread_cpus=0-1"], ["kthread_cpus=0"]),
        (["a", "b=1"], ["b=1", "a"], ["a", "b=1"]),
    ],
)  # fmt: skip
def test_kernel_arguments_compose_into_one_list(
    first: list[str], second: list[str], one: list[str]
) -> None:
    assert composed_arguments(first, second) == one


@pytest.mark.parametrize(
    ("first", "second", "why"),
    [
        (["a=1"], ["a=2"], "set a two ways (a=2 against a=1)"),
        (["isolcpus=managed_irq,1"], ["isolcpus=domain,2"], "other kinds of isolation"),
        (["irqaffinity=0"], ["irqaffinity=1"], "leave no CPU in common to irqaffinity"),
        (["rcu_nocbs"], ["rcu_nocbs=1"], "set rcu_nocbs two ways"),  # bare: every CPU
    ],
)
def test_kernel_arguments_that_cannot_be_one_say_which(
    first: list[str], second: list[str], why: str
) -> None:
    with pytest.raises(ArgumentsDiffer, match=re.escape(why)):
        composed_arguments(first, second)


def test_entries_that_choose_other_things_are_a_conflict_not_one_narrowed(
    lib: ProfileLibrary, pdir: Path
) -> None:
    """Two holds' first [[net.nic]] entries, one for every NIC and one naming a driver:
    merged into one, the driver would narrow the first hold's entry to that driver's
    NICs (its RPS setting gone from every other NIC, unsaid). Refused, naming the
    selector; entries choosing alike merge."""
    every = write(pdir, "nic-every", '[[net.nic]]\nrps_cpus = "none"\n')
    write(pdir, "nic-driver", '[[net.nic]]\ndriver = ["e1000e"]\nrps_cpus = "none"\n')
    refused = refusal(lib, "nic-every", "nic-driver")
    assert "it and hold 1 (nic-every) select other things in one entry for [net] nic.0.driver" in (
        refused
    )
    assert "['e1000e']" in refused and "against (not named)" in refused and f"{every}:1" in refused
    write(pdir, "nic-gro", "[[net.nic]]\ngro_flush_timeout = 0\n")
    both = compose(held(lib, "nic-every", "nic-gro"), lib.schemas).sections["net"]["nic"]
    assert len(both) == 1 and both[0]["rps_cpus"] is not None
    assert both[0]["gro_flush_timeout"] == 0
