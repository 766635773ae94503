"""The idle, `recommend` and `status` logic on every kind of machine latencyd has met (issue
15): a haltpoll guest, a guest without a cpuidle driver, bare metal with intel_idle. Each
test takes the `machine_kind` fixture (tests/unit/conftest.py), so it runs once per kind,
whichever kind the suite itself runs on: a claim true on one kind only cannot pass unseen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.cstate import (
    CstatePlugin,
    HaltpollParam,
    IdleGovernor,
    PmQosRequest,
    ResumeLatency,
    StateDisable,
)

from latencyd.core.engine import Engine, plugin_options, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import Expansion, Table, load_plugins
from latencyd.core.profile import Profile, ProfileLibrary
from latencyd.core.schema import validate
from latencyd.kernel.idle import NO_DRIVER, IdleFacts, read_driver, read_idle
from latencyd.kernel.system import System
from latencyd.paths import shipped_profiles_dir
from latencyd.tools import attribute as A
from latencyd.tools.recommend import read_facts, recommend
from tests.unit.fakesys import (
    HALTPOLL_GUEST,
    INTEL_METAL,
    NO_CPUIDLE_GUEST,
    FakeMachine,
    make_fake_root,
    put,
    tree_bytes,
)

CPU = "sys/devices/system/cpu"
NO_STATES = "no cpuidle driver: no idle states to disable (idle CPUs halt)"
HALTPOLL_UNUSED = (
    "no cpuidle driver: the haltpoll governor's parameters are unused (idle CPUs halt)"
)


def expand(system: System, section: dict[str, Any]) -> Expansion:
    plugin = CstatePlugin(system)
    schema = section_schemas({"cstate": plugin})["cstate"]
    options = plugin_options(validate(schema, section, system.machine()))
    return plugin.expand(plugin.options_of(options), {})


def shipped_cstate(system: System, name: str) -> dict[str, Any]:
    """The [cstate] section a shipped profile resolves to on this machine."""
    library = ProfileLibrary(
        [shipped_profiles_dir()], section_schemas(load_plugins(system)), system.machine()
    )
    return dict(library.load(name).sections["cstate"])


def waiting_table(system: System) -> Table:
    [table] = [
        t
        for t in CstatePlugin(system).monitor(None).tables
        if t.title.startswith("How idle CPUs wait here")
    ]
    return table


# -- what the machine says ------------------------------------------------------------------


def test_idle_facts_are_read_as_each_kind_shows_them(machine_kind: FakeMachine) -> None:
    idle = read_idle(machine_kind.system)
    names = {c: [s.name for s in states] for c, states in idle.states.items()}
    if machine_kind.kind == NO_CPUIDLE_GUEST:
        assert (idle.driver, idle.governor) == ("", "menu")  # the file says "none"
        assert names == {0: [], 1: []} and idle.halts_regardless
        assert idle.poll_ns == 0 and not idle.halt_polls  # present, but unused
    elif machine_kind.kind == HALTPOLL_GUEST:
        assert (idle.driver, idle.governor, idle.poll_ns) == ("haltpoll", "haltpoll", 0)
        assert names == {0: ["POLL", "haltpoll idle"], 1: ["POLL", "haltpoll idle"]}
        assert idle.halt_polls and not idle.halts_regardless
    else:
        assert (idle.driver, idle.governor) == ("intel_idle", "menu")
        assert names == {c: ["POLL", "C1", "C1E", "C6"] for c in range(8)}
        assert [s.latency_us for s in idle.states[5]] == [0, 1, 2, 133]
        assert not idle.halt_polls and not idle.halts_regardless
    assert idle.pm_qos_us is None and idle.resume_us == dict.fromkeys(idle.states)


def test_no_cpuidle_at_all_is_no_driver(tmp_path: Path) -> None:
    """A kernel without cpuidle has no current_driver file: the same as "none"."""
    root = make_fake_root(tmp_path, cpus="0-1")
    system = System(root)
    assert read_driver(system) == "" and read_idle(system).halts_regardless
    put(root, f"{CPU}/cpuidle/current_driver", "none")
    assert read_driver(system) == "" and read_idle(system).halts_regardless
    put(root, f"{CPU}/cpuidle/current_driver", "acpi_idle")
    assert read_driver(system) == "acpi_idle" and not read_idle(system).halts_regardless


# -- cstate: what acts, what is not applicable -----------------------------------------------


@pytest.mark.parametrize("value", ["poll", 0, 20, "shallowest", "state:POLL"])
def test_force_latency_acts_only_where_a_cpuidle_driver_chooses_states(
    machine_kind: FakeMachine, value: int | str
) -> None:
    """The shipped realtime-poll's `force_latency_us = "poll"` was *applied* on a guest
    without a cpuidle driver, where the idle loop halts whatever PM QoS says."""
    exp = expand(machine_kind.system, {"force_latency_us": value})
    if machine_kind.kind == NO_CPUIDLE_GUEST:
        assert exp.settings == {}
        assert exp.refused == {"force_latency_us": f"force_latency_us = {value!r}: {NO_DRIVER}"}
        return
    expected = {"poll": 0, 0: 0, 20: 20, "shallowest": 1, "state:POLL": 0}[value]
    assert exp.settings == {PmQosRequest(): expected} and exp.refused == {}


def test_idle_resolves_per_kind(machine_kind: FakeMachine) -> None:
    responsive = expand(machine_kind.system, {"idle": "responsive"})
    poll = expand(machine_kind.system, {"idle": "poll"})
    if machine_kind.kind == HALTPOLL_GUEST:
        assert responsive.settings == {HaltpollParam("ns"): "200000", IdleGovernor(): "haltpoll"}
        assert poll.settings == {PmQosRequest(): 0}
    elif machine_kind.kind == INTEL_METAL:
        assert responsive.settings == {PmQosRequest(): 1}  # C1's exit latency: no C1E, no C6
        assert poll.settings == {PmQosRequest(): 0}
    else:
        for exp, value in ((responsive, "responsive"), (poll, "poll")):
            assert exp.settings == {}
            assert exp.refused == {"idle": f"idle = {value!r}: {NO_DRIVER}"}
        return
    assert responsive.refused == poll.refused == {}


def test_per_cpu_limits_governor_and_haltpoll_parameters_per_kind(
    machine_kind: FakeMachine,
) -> None:
    section = {
        "idle_governor": "menu",
        "haltpoll": {"poll_ns": 100000},
        "cpus": [{"cpus": "1", "resume_latency_us": 0, "disable_states": ["deeper-than:0"]}],
    }
    exp = expand(machine_kind.system, section)
    if machine_kind.kind == NO_CPUIDLE_GUEST:
        assert exp.settings == {}
        assert exp.refused == {
            "idle_governor": "idle_governor = 'menu': no cpuidle driver: no governor chooses "
            "how idle CPUs wait (they halt)",
            "haltpoll": f"haltpoll = {{'poll_ns': 100000}}: {HALTPOLL_UNUSED}",
            "resume_latency_us for CPUs 1": NO_DRIVER,
            "disable_states for CPUs 1": NO_STATES,
        }
        return
    deeper = [1] if machine_kind.kind == HALTPOLL_GUEST else [1, 2, 3]
    assert exp.settings == {
        ResumeLatency(1): "n/a",
        IdleGovernor(): "menu",
        **{StateDisable(1, s): "1" for s in deeper},
    }
    # Under the menu governor (asked for here) the haltpoll parameters act on no kind; on
    # bare metal they exist (a built-in haltpoll governor) but the governor never runs.
    assert exp.refused == {
        "haltpoll": "guest halt-polling parameters act only under the haltpoll cpuidle "
        f"governor (here: governor menu, driver {read_driver(machine_kind.system)})"
    }
    del section["idle_governor"]
    exp = expand(machine_kind.system, section)
    if machine_kind.kind == HALTPOLL_GUEST:
        assert exp.settings[HaltpollParam("ns")] == "100000" and exp.refused == {}
    else:
        assert HaltpollParam("ns") not in exp.settings and "haltpoll" in exp.refused


@pytest.mark.parametrize(
    "profile", ["latency-performance", "cpu-partitioning", "realtime-poll", "realtime"]
)
def test_shipped_profiles_apply_only_what_acts_here(
    machine_kind: FakeMachine, tmp_path: Path, profile: str
) -> None:
    """Through the engine: applied is only what can act on this kind; the rest is not
    applicable with the reason; off leaves the machine byte for byte as it was."""
    system = machine_kind.system
    before = tree_bytes(machine_kind.root, "sys")
    engine = Engine({"cstate": CstatePlugin(system)}, Journal(tmp_path / "state"))
    raw = shipped_cstate(system, profile)
    report = engine.apply(Profile(profile, Path("x"), "", {"cstate": raw}, {}))
    applied = {t: v for (_, t), v in engine.applied.items()}
    refused = engine.sections["cstate"].expansion.refused
    if machine_kind.kind == NO_CPUIDLE_GUEST:
        assert report.applied == 0 and applied == {} and system.pmqos.held() is None
        assert refused and all("no cpuidle driver: " in r for r in refused.values())
    else:
        assert refused == {} and report.not_applicable == {}
        poll = profile == "realtime-poll"  # force_latency_us = "poll", explicit, wins
        if machine_kind.kind == HALTPOLL_GUEST:
            assert applied[HaltpollParam("ns")] == "200000"
            assert applied.get(PmQosRequest()) == (0 if poll else None)
        else:  # responsive on intel_idle holds C1's 1 µs; realtime-poll's "poll" is 0
            assert applied[PmQosRequest()] == (0 if poll else 1)
            assert system.pmqos.held() == (0 if poll else 1)
        # The isolated CPU waits as every CPU does: forcing it to poll measured worse
        # under load (profiles/cpu-partitioning.toml); realtime-poll polls everywhere.
        assert not [t for t in applied if isinstance(t, ResumeLatency)]
    assert engine.off() == []
    assert tree_bytes(machine_kind.root, "sys") == before
    assert system.pmqos.held() is None  # the request ends with its fd


def test_attribution_names_the_idle_group_not_applicable_where_it_cannot_act(
    machine_kind: FakeMachine, tmp_path: Path
) -> None:
    """measure --attribute asks the daemon, holding "untuned plus the group", whether a
    group can act: on a guest without a cpuidle driver latency-performance's idle-wait
    group cannot, and is reported so with the reason instead of being measured."""
    system = machine_kind.system
    schemas = section_schemas(load_plugins(system))
    profile = ProfileLibrary([shipped_profiles_dir()], schemas, system.machine()).load(
        "latency-performance"
    )
    [idle] = [g for g in A.groups_of(profile.written, schemas) if g.name == "cstate.idle"]
    engine = Engine({"cstate": CstatePlugin(system)}, Journal(tmp_path / "state"))
    engine.apply(Profile("alone", Path("x"), "", {"cstate": profile.sections["cstate"]}, {}))
    refused = engine.sections["cstate"].expansion.refused
    status = {"plugins": {"cstate": {  # the rows the daemon's Status gives for the section
        "applied": [{"target": str(t)} for (_, t) in engine.applied],
        "not_applicable": [{"text": w, "reason": r} for w, r in refused.items()],
    }}}  # fmt: skip
    reason = A.not_applicable(status, idle)
    if machine_kind.kind == NO_CPUIDLE_GUEST:
        assert reason is not None and "no cpuidle driver: " in reason
    else:
        assert reason is None
    engine.off()


# -- status: how idle CPUs wait here, and what can change it ---------------------------------


def test_status_says_how_idle_cpus_wait_and_what_can_change_it(machine_kind: FakeMachine) -> None:
    system = machine_kind.system
    table = waiting_table(system)
    monitor = CstatePlugin(system).monitor(None)
    assert table.columns == ("CPU", "an idle CPU", "wake-up limit", "cstate options that act here")
    assert [row[0] for row in table.rows] == sorted(system.online_cpus())
    _, how, limit, acting = table.rows[1]
    if machine_kind.kind == NO_CPUIDLE_GUEST:
        assert table.title == "How idle CPUs wait here (cpuidle driver none, governor menu)"
        assert how == "halt (no cpuidle driver): halted until the next interrupt"
        assert (limit, acting) == ("ignored", f"none ({NO_DRIVER})")
        assert [t.title for t in monitor.tables] == [table.title]  # no residency of nothing
        assert monitor.facts["residency"] == "none: no cpuidle states to count"
        return
    everything = "idle, force_latency_us, resume_latency_us, disable_states, idle_governor"
    assert limit == "none"
    assert monitor.tables[0].title.startswith("C-state residency since the profile was applied")
    if machine_kind.kind == HALTPOLL_GUEST:
        assert table.title == "How idle CPUs wait here (cpuidle driver haltpoll, governor haltpoll)"
        assert how == (
            "halt at once (guest_halt_poll_ns 0): haltpoll governor (POLL 0 µs, haltpoll idle 1 µs)"
        )
        assert acting == f"{everything}, haltpoll"
    else:
        assert table.title == "How idle CPUs wait here (cpuidle driver intel_idle, governor menu)"
        assert how == "the menu governor picks one of: POLL 0 µs, C1 1 µs, C1E 2 µs, C6 133 µs"
        assert acting == everything


def test_status_follows_what_the_profile_changed(machine_kind: FakeMachine, tmp_path: Path) -> None:
    """After idle = "responsive" and a polling-only isolated CPU, the table says what idle
    CPUs do now: CPU 0 under the responsive setting, CPU 1 polling."""
    system = machine_kind.system
    plugin = CstatePlugin(system)
    untuned = waiting_table(system).rows
    engine = Engine({"cstate": plugin}, Journal(tmp_path / "state"))
    raw = {"idle": "responsive", "cpus": [{"cpus": "1", "resume_latency_us": 0,
                                           "disable_states": ["C6"]}]}  # fmt: skip
    schema = section_schemas({"cstate": plugin})["cstate"]
    engine.apply(Profile("p", Path("p"), "", {"cstate": validate(schema, raw, system.machine())},
                         {}))  # fmt: skip
    rows = {row[0]: row[1:] for row in waiting_table(system).rows}
    if machine_kind.kind == NO_CPUIDLE_GUEST:
        halt = "halt (no cpuidle driver): halted until the next interrupt"
        assert rows[0] == rows[1] == (halt, "ignored", f"none ({NO_DRIVER})")
    elif machine_kind.kind == HALTPOLL_GUEST:
        assert rows[0][:2] == (
            "poll up to 200 µs (adaptive), then halt: haltpoll governor (POLL 0 µs, haltpoll "
            "idle 1 µs)",
            "none",
        )
        assert rows[1][:2] == (
            "poll, no deeper state allowed (POLL 0 µs; over the 0 µs limit: haltpoll idle 1 µs)",
            "0 µs",
        )
    else:
        assert rows[0][:2] == (
            "the menu governor picks one of: POLL 0 µs, C1 1 µs; over the 1 µs limit: C1E 2 µs, "
            "C6 133 µs",
            "1 µs",
        )
        assert rows[1][:2] == (
            "poll, no deeper state allowed (POLL 0 µs, C6 133 µs (disabled); over the 0 µs "
            "limit: C1 1 µs, C1E 2 µs)",
            "0 µs",
        )
    assert engine.off() == []
    if machine_kind.kind != INTEL_METAL:  # (the fake /dev/cpu_dma_latency keeps what was held)
        assert waiting_table(system).rows == untuned


# -- recommend: reasons only from what it read, gains only as measured -----------------------


def test_recommend_reasons_from_what_it_read(machine_kind: FakeMachine) -> None:
    """On a guest without a cpuidle driver it said "The cpuidle driver is none (bare metal
    or a passthrough guest): idle = 'responsive' holds a PM QoS limit at the shallowest real
    C-state, so CPUs wake in a few µs without polling"."""
    facts = read_facts(machine_kind.system)
    rec = recommend(facts)
    idle, *rest = rec.reasons
    text = "\n".join(rec.reasons)
    assert "driver is none" not in text and "bare metal or a passthrough guest" not in text
    assert ("Virtual machine" in text) == (machine_kind.kind != INTEL_METAL)
    assert "Measured here" not in text  # nothing was measured
    if machine_kind.kind == NO_CPUIDLE_GUEST:
        assert facts.idle.driver == "" and (rec.profile, str(rec.isolated)) == (
            "network-latency",
            "",
        )
        assert idle.startswith(
            "Idle CPUs: no cpuidle driver and no idle states here, so an idle CPU halts until "
            "the next interrupt whatever PM QoS says: no idle option can change how fast it "
            "wakes"
        )
        assert "PM QoS limit at" not in idle and "wake fast" not in idle
        assert "Expected, not measured here: nothing at idle from any profile" in idle
        assert "this machine is virtual" in idle
    elif machine_kind.kind == HALTPOLL_GUEST:
        assert (rec.profile, str(rec.isolated)) == ("network-latency", "")
        assert idle.startswith(
            "Idle CPUs: cpuidle driver haltpoll, governor haltpoll, states POLL 0 µs, haltpoll "
            "idle 1 µs; guest halt-polling off: an idle vCPU halts: a KVM guest, whose halted "
            "vCPUs wait for the host to wake them."
        )
        assert "Expected, not measured here: faster wake-ups: on haltpoll guests this project " \
               "measured sockperf p50 ~41 -> ~4 µs with it." in idle  # fmt: skip
    else:
        assert (rec.profile, str(rec.isolated)) == ("cpu-partitioning", "2-3,6-7")
        assert idle.startswith(
            "Idle CPUs: cpuidle driver intel_idle, governor menu, states POLL 0 µs, C1 1 µs, "
            "C1E 2 µs, C6 133 µs: a CPU in C6 takes up to 133 µs to wake (the driver's exit "
            "latency). The profiles below set idle = 'responsive': a PM QoS limit at 1 µs (C1"
        )
        assert "(this project has not measured bare metal)" in idle
        # No cgroup hierarchy on this rig: the chase, which keeps a task started there.
        [start] = [r for r in rest if r.startswith("The shield narrows")]
        assert "`taskset -c 2-3,6-7 ./app`" in start and "latencyctl run" in start
    assert "`latencyctl recommend --measure` measures it on this machine." in idle


def test_recommend_with_measure_quotes_the_measured_gain_only(machine_kind: FakeMachine) -> None:
    facts = read_facts(machine_kind.system)
    helped = A.GroupResult("cstate.idle", ["cstate.idle"], "helps", {"sockperf": {
        "p50": {"leave_one_out": A.Effect(0.12, 1.04, 1.1, "lower")},
        "p99": {"leave_one_out": A.Effect(0.98, 1.3, 1.4, None)}}})  # fmt: skip
    gains = [f"{helped.name}: {A.quote(helped)}"]
    assert gains == ["cstate.idle: sockperf p50 0.12x (leave-one-out)"]  # only what counted
    idle = recommend(facts, measured=gains).reasons[0]
    assert idle.endswith("Measured here (latency with / without each group that helped): "
                         "cstate.idle: sockperf p50 0.12x (leave-one-out).")  # fmt: skip
    assert "Expected" not in idle and "~41" not in idle and "5.4-5.9" not in idle
    # The proposal itself does not depend on having measured it.
    assert recommend(facts, measured=gains).toml() == recommend(facts).toml()


def test_recommend_without_states_beyond_polling() -> None:
    """A driver that lists no real C-state: responsive cannot act, and recommend says so."""
    from latencyd.cpuset import CpuSet
    from latencyd.kernel.idle import IdleState
    from latencyd.tools.recommend import Facts

    idle = IdleFacts("acpi_idle", "menu", {0: (IdleState(0, "POLL", 0),)})
    one = CpuSet([0])
    reason = recommend(Facts("", idle, one, (one,), (one,), (), False)).reasons[0]
    assert reason == (
        "Idle CPUs: cpuidle driver acpi_idle, governor menu, states POLL 0 µs: no idle state "
        "deeper than polling, so the profiles' idle = 'responsive' will show as not applicable."
    )


def test_latencyctl_recommend_quotes_the_gain_only_with_measure(
    machine_kind: FakeMachine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`latencyctl recommend` as wired in the CLI: without --measure the gain is expected;
    with it, the reasons quote the figures of the run (measure itself is faked here)."""
    import json

    import latencyd.tools.recommend
    from latencyd.tools import cli

    monkeypatch.setattr(
        latencyd.tools.recommend, "read_facts", lambda _: read_facts(machine_kind.system)
    )
    assert cli.main(["recommend", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "Expected, not measured here" in plain["reasons"][0] and "measured" not in plain

    written = {"cstate": {"idle": "responsive"}, "sysctl": {"vm.swappiness": 10}}
    settings = [A.Setting("cstate", "idle"), A.Setting("sysctl", "vm.swappiness")]
    groups = [A.Group("cstate.idle", (settings[0],)), A.Group("sysctl", (settings[1],))]
    at = A.Attribution("recommended", written, settings, groups)
    effect = {"sockperf": {"p50": {"add_one_in": A.Effect(0.2, 1.1, 1.2, "lower")}}}
    judged = [
        A.GroupResult("cstate.idle", ["cstate.idle"], "helps", effect, 0.0),
        A.GroupResult("sysctl", ["sysctl.vm.swappiness"], "no measurable effect", {}, 0.0),
    ]

    def attributed(profile: str, app: Any, online: Any, args: Any, system: Any) -> Any:
        assert profile == plain["profile_file"]  # what it measures is what it proposes
        return at, judged, {"plan": {"tools": ["sockperf"]}}, "a fake machine"

    monkeypatch.setattr(cli, "_attribute_recommendation", attributed)
    assert cli.main(["recommend", "--measure", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["kept"], data["confirmed"]) == (["cstate.idle"], True)
    assert data["dropped"] == [{"name": "sysctl", "why": "no measurable effect (what it costs "
                                "is not worth reviewing for nothing)"}]  # fmt: skip
    assert data["reasons"][0].endswith("cstate.idle: sockperf p50 0.20x (add-one-in).")
    assert "Expected" not in data["reasons"][0]
    # The profile holds the group that helped, with its effect quoted, and not the other.
    text = data["profile_file"]
    assert "# cstate.idle helps: sockperf p50 0.20x (add-one-in)\n[cstate]" in text
    assert "swappiness" not in text.split("[main]")[1]
    assert "# dropped sysctl (sysctl.vm.swappiness): no measurable effect" in text
    # Nothing helped: not confirmed, and no profile to write.
    judged[0] = A.GroupResult("cstate.idle", ["cstate.idle"], "no measurable effect", {}, 30.0)
    assert cli.main(["recommend", "--measure", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["profile_file"] == "" and data["confirmed"] is False
    assert "keeps the measured CPUs +30.0 % busier" in data["dropped"][0]["why"]
    assert data["profile"] == plain["profile"]
