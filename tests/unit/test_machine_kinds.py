"""The idle, `recommend` and `status` logic on every kind of machine latencyd has met (issue
15): a haltpoll guest, a guest without a cpuidle driver, bare metal with intel_idle. One
fake rig per kind (tests/unit/fakesys.py MACHINE_KINDS); the suite runs each whichever
kind it runs on, so a claim true on one kind only cannot pass unseen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.cstate import CstatePlugin, HaltpollParam, PmQosRequest, ResumeLatency

from latencyd.config import shipped_profiles_dir
from latencyd.engine import Engine, plugin_options, section_schemas
from latencyd.idle import NO_DRIVER
from latencyd.journal import Journal
from latencyd.plugin import Expansion, load_plugins
from latencyd.profile import Profile, ProfileLibrary
from latencyd.recommend import read_facts, recommend
from latencyd.schema import validate
from latencyd.system import System
from tests.unit.fakesys import MACHINE_KINDS, make_fake_root

HALTPOLL, NONE, METAL = MACHINE_KINDS


@pytest.fixture(params=list(MACHINE_KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def machine(tmp_path: Path, kind: str) -> System:
    cpus = 2 if kind != METAL else 4
    root = make_fake_root(tmp_path, cpus=f"0-{cpus - 1}")
    MACHINE_KINDS[kind](root)
    return System(root)


def expand(system: System, section: dict[str, Any]) -> Expansion:
    plugin = CstatePlugin(system)
    schema = section_schemas({"cstate": plugin})["cstate"]
    return plugin.expand(plugin_options(validate(schema, section, system.machine())), {})


def test_force_latency_acts_only_where_a_cpuidle_driver_chooses_states(
    tmp_path: Path, kind: str
) -> None:
    """The shipped realtime-poll's `force_latency_us = "poll"` reported *applied* on a guest
    without a cpuidle driver, where the idle loop halts whatever PM QoS says."""
    exp = expand(machine(tmp_path, kind), {"force_latency_us": "poll"})
    if kind == NONE:
        assert exp.settings == {}
        assert exp.refused == {"force_latency_us": f"force_latency_us = 'poll': {NO_DRIVER}"}
    else:
        assert exp.settings == {PmQosRequest(): 0} and exp.refused == {}


def test_idle_responsive_resolves_per_kind(tmp_path: Path, kind: str) -> None:
    exp = expand(machine(tmp_path, kind), {"idle": "responsive"})
    if kind == HALTPOLL:
        assert exp.settings[HaltpollParam("ns")] == "200000"
        assert PmQosRequest() not in exp.settings
    elif kind == METAL:
        assert exp.settings == {PmQosRequest(): 1}  # C1's exit latency: no C1E, no C6
    else:
        assert exp.settings == {} and exp.refused == {"idle": f"idle = 'responsive': {NO_DRIVER}"}


def test_per_cpu_limits_and_haltpoll_parameters_per_kind(tmp_path: Path, kind: str) -> None:
    section = {
        "haltpoll": {"poll_ns": 100000},
        "cpus": [{"cpus": "1", "resume_latency_us": 0, "disable_states": ["deeper-than:0"]}],
    }
    exp = expand(machine(tmp_path, kind), section)
    if kind == NONE:
        assert exp.settings == {}
        assert exp.refused == {
            "haltpoll": f"haltpoll = {{'poll_ns': 100000}}: {NO_DRIVER}",
            "resume_latency_us for CPUs 1": NO_DRIVER,
            "disable_states for CPUs 1": NO_DRIVER,
        }
        return
    assert exp.settings[ResumeLatency(1)] == "n/a"
    disabled = sorted(t.state for t in exp.settings if type(t).kind == "state_disable")
    assert disabled == ([1] if kind == HALTPOLL else [1, 2, 3])
    if kind == HALTPOLL:
        assert exp.settings[HaltpollParam("ns")] == "100000" and exp.refused == {}
    else:  # the module's parameters act only under its own driver
        assert HaltpollParam("ns") not in exp.settings
        assert exp.refused["haltpoll"].startswith("the haltpoll parameters act only under")


def test_status_says_how_idle_cpus_wait_and_what_can_change_it(tmp_path: Path, kind: str) -> None:
    system = machine(tmp_path, kind)
    monitor = CstatePlugin(system).monitor(None)
    waiting = next(t for t in monitor.tables if t.title.startswith("How idle CPUs wait"))
    assert [row[0] for row in waiting.rows] == sorted(system.online_cpus())
    how, acting = waiting.rows[0][1], waiting.rows[0][2]
    if kind == NONE:
        assert "no cpuidle driver" in how and acting == f"none ({NO_DRIVER})"
        assert monitor.facts["residency"] == "no cpuidle states to count"
        assert len(monitor.tables) == 1  # no residency table claiming 100 % busy
    else:
        assert "force_latency_us" in acting and "idle" in acting
        assert ("haltpoll" in acting.split(", ")) == (kind == HALTPOLL)
        assert ("POLL 0 µs" in how) and (("C6 170 µs" in how) == (kind == METAL))


def test_recommend_reasons_from_what_it_read(tmp_path: Path, kind: str) -> None:
    """On a guest without a cpuidle driver it said "The cpuidle driver is none (bare metal
    or a passthrough guest): idle = 'responsive' ... wake in a few µs without polling"."""
    facts = read_facts(machine(tmp_path, kind))
    text = "\n".join(recommend(facts).reasons)
    assert "driver is none" not in text
    assert ("Virtual machine" in text) == (kind != METAL)
    if kind == NONE:
        assert facts.idle_driver == "" and "No cpuidle driver" in text
        assert "responsive" not in text.split("No cpuidle driver")[1].split(".")[0]
        assert "wake fast" not in text and "µs" not in text.split("Virtual machine")[0]
    else:
        assert "not measured here" in text  # a gain it expects, said as such
    if kind == METAL:
        assert "intel_idle" in text and "C6" in text and "170 µs" in text
    if kind == HALTPOLL:
        assert "haltpoll" in text and "responsive" in text


def test_the_shipped_realtime_poll_claims_nothing_it_cannot_do(tmp_path: Path, kind: str) -> None:
    """Through the engine: what is applied is only what can act here; the rest is not
    applicable with the reason; off leaves the fake machine as it was."""
    system = machine(tmp_path, kind)
    plugin = CstatePlugin(system)
    schemas = section_schemas(load_plugins(system))
    library = ProfileLibrary([shipped_profiles_dir()], schemas, system.machine())
    raw = library.load("realtime-poll").sections.get("cstate")  # only cstate is applied
    assert raw is not None
    engine = Engine({"cstate": plugin}, Journal(tmp_path / "state"))
    report = engine.apply(Profile("realtime-poll", Path("x"), "", {"cstate": raw}, {}))
    section = engine.sections["cstate"].expansion
    if kind == NONE:
        assert report.applied == 0 and engine.applied == {}
        assert section.refused and all(NO_DRIVER in r for r in section.refused.values())
    else:
        assert report.applied > 0 and not section.refused
    assert engine.off() == []
    assert system.pmqos.held() is None
