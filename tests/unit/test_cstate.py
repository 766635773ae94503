"""The cstate plugin against a fake cpuidle tree and a plain-file /dev/cpu_dma_latency."""

from __future__ import annotations

import copy
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import latencyd.plugins.cstate as cstate_module
import pytest
from latencyd.plugins.cstate import (
    CstatePlugin,
    CstateRules,
    IdleState,
    PmQosRequest,
    ResumeLatency,
    StateDisable,
    state_matches,
)

from latencyd.core.capabilities import files_to_watch
from latencyd.core.engine import Engine, SettingId, plugin_options, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import Expansion, Value
from latencyd.core.profile import Profile
from latencyd.core.schema import SchemaError, validate
from latencyd.errors import NotApplicable
from latencyd.kernel.system import Machine, System
from tests.unit.fakesys import (
    PM_QOS_DEFAULT_US,
    add_cpuidle,
    make_fake_root,
    put,
    tree_values,
)

CPU = "sys/devices/system/cpu"
HALTPOLL_STATES = (("POLL", 0, 0, 0), ("haltpoll idle", 50, 0, 0))
NO_C9 = "force_latency_us = 'state:C9': no idle state 'C9' (have: POLL, C1, C1E, C6)"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = make_fake_root(tmp_path, cpus="0-3")
    add_cpuidle(root)
    return root


@pytest.fixture
def system(root: Path) -> Iterator[System]:
    system = System(root)
    yield system
    system.pmqos.release()  # no test leaks a request fd


@pytest.fixture
def plugin(system: System) -> CstatePlugin:
    return CstatePlugin(system)


def held(dev: Path) -> list[int]:
    """This process's open fds on `dev` (what keeps a PM QoS request alive)."""
    target = str(dev.resolve())
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == target:
                fds.append(int(fd))
        except OSError:
            continue
    return sorted(fds)


def dev_value(root: Path) -> int:
    return int(struct.unpack("=i", (root / "dev/cpu_dma_latency").read_bytes())[0])


def section(plugin: CstatePlugin, machine: Machine, raw: dict[str, Any]) -> dict[str, Any]:
    """A section as a profile holds it: validated, with the engine's `on_drift` too."""
    return validate(section_schemas({"cstate": plugin})["cstate"], raw, machine)


def expand(plugin: CstatePlugin, machine: Machine, raw: dict[str, Any]) -> Expansion:
    """What the engine asks the plugin: the section without its own options, nothing owned."""
    return plugin.expand(plugin.options_of(plugin_options(section(plugin, machine, raw))), {})


def settings(plugin: CstatePlugin, machine: Machine, raw: dict[str, Any]) -> dict[Any, Value]:
    return expand(plugin, machine, raw).settings


def wanted(plugin: CstatePlugin, machine: Machine, raw: dict[str, Any]) -> dict[SettingId, Value]:
    return {("cstate", t): v for t, v in settings(plugin, machine, raw).items()}


def profile(plugin: CstatePlugin, machine: Machine, name: str, raw: dict[str, Any]) -> Profile:
    return Profile(name, Path(f"{name}.toml"), "", {"cstate": section(plugin, machine, raw)}, {})


def engine_for(tmp_path: Path, plugin: CstatePlugin) -> Engine:
    return Engine({"cstate": plugin}, Journal(tmp_path / "state"))


def read(root: Path, rel: str) -> str:
    return (root / CPU / rel).read_text().strip()


# -- force_latency_us: resolving ----------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (20, 20),
        (0, 0),
        ("poll", 0),
        ("shallowest", 2),  # C1, not POLL's 0
        ("state:C1E", 10),
        ("state:c6", 133),  # names compare case-insensitively
        ("state:C1*", 2),  # a glob takes the first match in index order: C1 before C1E
        ("state:*E", 10),
    ],
)
def test_force_latency_resolves_from_the_idle_table(
    plugin: CstatePlugin, machine: Machine, value: int | str, expected: int
) -> None:
    exp = expand(plugin, machine, {"force_latency_us": value})
    assert exp.settings == {PmQosRequest(): expected}
    symbolic = isinstance(value, str)
    assert exp.notes == ({PmQosRequest(): f"resolved from {value!r}"} if symbolic else {})
    assert exp.rules == CstateRules(value if symbolic else None)
    assert exp.refused == {}


def test_resolution_is_a_note_not_part_of_the_setting(
    tmp_path: Path, plugin: CstatePlugin, machine: Machine
) -> None:
    """describe says what is held; where it came from is the applied section's note."""
    assert plugin.describe(PmQosRequest(), 2) == "PM QoS CPU latency request held at 2 µs"
    assert plugin.describe(PmQosRequest(), None) == "no PM QoS request held"
    engine = engine_for(tmp_path, plugin)
    engine.apply(profile(plugin, machine, "p", {"force_latency_us": "shallowest"}))
    applied = engine.sections["cstate"].expansion
    assert applied.notes == {PmQosRequest(): "resolved from 'shallowest'"}
    assert applied.rules == CstateRules("shallowest")
    engine.apply(profile(plugin, machine, "q", {"force_latency_us": 7}))
    assert engine.sections["cstate"].expansion.notes == {}
    assert engine.off() == []


def test_state_name_matches_its_first_word(tmp_path: Path, machine: Machine) -> None:
    # cpuidle-haltpoll names its state "haltpoll idle"; profiles say "haltpoll".
    root = make_fake_root(tmp_path)
    add_cpuidle(root, states=HALTPOLL_STATES)
    plugin = CstatePlugin(System(root))
    for value in ("state:haltpoll", "state:haltpoll idle", "shallowest"):
        assert settings(plugin, machine, {"force_latency_us": value}) == {PmQosRequest(): 50}
    with pytest.raises(NotApplicable, match="no idle state 'idle'"):
        plugin.resolve_latency("state:idle")  # only the first word, not any word


def test_states_are_ordered_by_index_not_by_name(tmp_path: Path) -> None:
    # state10 lists before state2; "C1?*" matches C1E (state2) and C10 (state10).
    states = tuple((f"C{i}" if i != 2 else "C1E", i * 10, 0, 0) for i in range(11))
    root = make_fake_root(tmp_path)
    add_cpuidle(root, cpus=[0], states=states)
    plugin = CstatePlugin(System(root))
    assert [s.index for s in plugin.states(0)] == list(range(11))
    assert plugin.resolve_latency("state:C1?*") == 20


def test_symbolic_targets_use_the_first_online_cpu(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, cpus="2-3")
    add_cpuidle(root, cpus=[2, 3], states=(("POLL", 0, 0, 0), ("C1", 7, 0, 0)))
    assert CstatePlugin(System(root)).resolve_latency("shallowest") == 7


def test_unknown_state_is_not_applicable_and_lists_the_states(plugin: CstatePlugin) -> None:
    with pytest.raises(NotApplicable) as info:
        plugin.resolve_latency("state:C9")
    assert str(info.value) == NO_C9


def test_unknown_state_is_refused_and_the_rest_of_the_section_stays(
    plugin: CstatePlugin, machine: Machine
) -> None:
    raw = {"force_latency_us": "state:C9", "cpus": [{"cpus": "1", "resume_latency_us": 0}]}
    exp = expand(plugin, machine, raw)
    assert exp.refused == {"force_latency_us": NO_C9}
    assert exp.settings == {ResumeLatency(1): "n/a"}
    assert exp.notes == {}


def test_no_cpuidle_states(tmp_path: Path, machine: Machine) -> None:
    plugin = CstatePlugin(System(make_fake_root(tmp_path)))
    assert plugin.resolve_latency("poll") == 0  # needs no idle table
    with pytest.raises(NotApplicable, match="no cpuidle states on this machine"):
        plugin.resolve_latency("shallowest")
    exp = expand(plugin, machine, {"force_latency_us": "shallowest"})
    assert exp.settings == {}
    assert exp.refused == {
        "force_latency_us": "force_latency_us = 'shallowest': no cpuidle driver: idle CPUs "
        "halt whatever PM QoS says"
    }


def test_shallowest_with_only_a_polling_state(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    add_cpuidle(root, states=(("POLL", 0, 0, 0),))
    with pytest.raises(NotApplicable, match="only a polling state exists"):
        CstatePlugin(System(root)).resolve_latency("shallowest")


@pytest.mark.parametrize(
    ("name", "selector", "matches"),
    [
        ("C1E", "C1E", True),
        ("C1E", "c1e", True),
        ("C1E", "C1", False),
        ("C1E", "C1*", True),
        ("C6", "deeper-than:100", True),
        ("C6", "deeper-than:133", False),  # strictly deeper
        ("haltpoll idle", "haltpoll", True),
        ("haltpoll idle", "idle", False),
    ],
)
def test_state_matches(name: str, selector: str, matches: bool) -> None:
    latency = {"C6": 133}.get(name, 10)
    assert state_matches(IdleState(3, name, latency), selector) is matches


def test_expand_stores_nothing_on_the_plugin(plugin: CstatePlugin, machine: Machine) -> None:
    """A rejected switch must leave no trace: everything an expansion needs later is in it."""
    first = {
        "force_latency_us": "shallowest",
        "cpus": [{"cpus": "1-2", "resume_latency_us": 0, "disable_states": ["C6"]}],
    }
    second = {
        "force_latency_us": "state:C9",
        "cpus": [{"cpus": "3", "resume_latency_us": "any", "disable_states": ["C1*"]}],
    }
    before = {k: v if k == "system" else copy.deepcopy(v) for k, v in vars(plugin).items()}
    expanded = expand(plugin, machine, first)
    expand(plugin, machine, second)
    assert {k: v if k == "system" else copy.deepcopy(v) for k, v in vars(plugin).items()} == before
    assert expand(plugin, machine, first) == expanded


# -- force_latency_us: holding the request -----------------------------------------------


def test_write_holds_the_request_on_an_open_fd(
    root: Path, system: System, plugin: CstatePlugin
) -> None:
    dev = root / "dev/cpu_dma_latency"
    assert plugin.read(PmQosRequest()) is None
    assert system.pmqos.effective() == PM_QOS_DEFAULT_US
    plugin.write(PmQosRequest(), 20)
    assert dev.read_bytes() == struct.pack("=i", 20)  # one binary s32, 4 bytes
    assert held(dev) == [system.pmqos.fd]
    assert plugin.read(PmQosRequest()) == 20
    assert system.pmqos.effective() == 20
    plugin.write(PmQosRequest(), None)
    assert held(dev) == []
    assert plugin.read(PmQosRequest()) is None


def test_changing_the_value_makes_before_it_breaks(
    root: Path, system: System, plugin: CstatePlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = root / "dev/cpu_dma_latency"
    open_at_close: list[list[int]] = []
    real_close = os.close

    def close(fd: int) -> None:  # what was held each time a request fd was closed
        if fd in held(dev):
            open_at_close.append(held(dev))
        real_close(fd)

    plugin.write(PmQosRequest(), 20)
    first = system.pmqos.fd
    monkeypatch.setattr(os, "close", close)
    plugin.write(PmQosRequest(), 5)
    monkeypatch.undo()
    # The old request was closed only once the new one was held.
    assert open_at_close == [sorted([first, system.pmqos.fd])]
    assert held(dev) == [system.pmqos.fd]
    assert plugin.read(PmQosRequest()) == 5 and dev_value(root) == 5


def test_release_drops_the_request(root: Path, system: System, plugin: CstatePlugin) -> None:
    plugin.write(PmQosRequest(), 0)
    system.pmqos.release()
    assert held(root / "dev/cpu_dma_latency") == []
    assert plugin.read(PmQosRequest()) is None
    system.pmqos.release()  # twice is fine


# -- [[cstate.cpus]] -------------------------------------------------------------------------


def test_resume_latency_translates_to_the_kernels_spelling(
    root: Path, plugin: CstatePlugin, machine: Machine
) -> None:
    raw = {
        "cpus": [
            {"cpus": "1", "resume_latency_us": 0},
            {"cpus": "2", "resume_latency_us": "any"},
            {"cpus": "3", "resume_latency_us": 25},
        ]
    }
    wanted_here = settings(plugin, machine, raw)
    assert wanted_here == {ResumeLatency(1): "n/a", ResumeLatency(2): "0", ResumeLatency(3): "25"}
    put(root, f"{CPU}/cpu2/power/pm_qos_resume_latency_us", "100")
    for target, value in wanted_here.items():
        plugin.write(target, value)
        assert plugin.read(target) == value
    assert read(root, "cpu1/power/pm_qos_resume_latency_us") == "n/a"
    assert read(root, "cpu2/power/pm_qos_resume_latency_us") == "0"
    assert read(root, "cpu3/power/pm_qos_resume_latency_us") == "25"
    assert plugin.describe(ResumeLatency(1), "n/a") == "cpu1 resume latency = 0 µs: polling only"
    assert plugin.describe(ResumeLatency(2), "0") == "cpu2 resume latency = no limit"
    assert plugin.describe(ResumeLatency(3), "25") == "cpu3 resume latency = 25 µs"


def test_disable_states_by_name_glob_and_depth(plugin: CstatePlugin, machine: Machine) -> None:
    def disables(cpus: str, states: list[str]) -> dict[Any, Value]:
        return settings(plugin, machine, {"cpus": [{"cpus": cpus, "disable_states": states}]})

    assert disables("1", ["C6"]) == {StateDisable(1, 3): "1"}
    assert disables("0,2", ["c1*"]) == {StateDisable(c, s): "1" for c in (0, 2) for s in (1, 2)}
    # deeper-than:N: every state whose exit latency exceeds N µs (POLL and C1 stay).
    assert disables("3", ["deeper-than:2"]) == {StateDisable(3, 2): "1", StateDisable(3, 3): "1"}
    assert disables("3", ["C9"]) == {}


def test_later_entries_win_where_cpu_sets_overlap(plugin: CstatePlugin, machine: Machine) -> None:
    raw = {
        "cpus": [
            {"cpus": "0-3", "resume_latency_us": 0, "disable_states": ["deeper-than:5"]},
            {"cpus": "2-3", "resume_latency_us": 25, "disable_states": ["C6"]},
            {"cpus": "3", "resume_latency_us": "any"},  # says nothing about disable_states
        ]
    }
    assert settings(plugin, machine, raw) == {
        ResumeLatency(0): "n/a",
        StateDisable(0, 2): "1",
        StateDisable(0, 3): "1",
        ResumeLatency(1): "n/a",
        StateDisable(1, 2): "1",
        StateDisable(1, 3): "1",
        ResumeLatency(2): "25",
        StateDisable(2, 3): "1",  # the later entry's list, not both lists
        ResumeLatency(3): "0",
        StateDisable(3, 3): "1",
    }


def test_read_write_and_exists_for_state_disables(root: Path, plugin: CstatePlugin) -> None:
    plugin.write(StateDisable(1, 3), "1")
    assert read(root, "cpu1/cpuidle/state3/disable") == "1"
    assert plugin.read(StateDisable(1, 3)) == "1"
    assert plugin.read(StateDisable(1, 2)) == "0"
    assert plugin.exists(StateDisable(1, 3)) and plugin.exists(PmQosRequest())
    assert not plugin.exists(StateDisable(1, 9))
    assert not plugin.exists(ResumeLatency(7))
    assert plugin.describe(StateDisable(1, 3), "1") == "cpu1 state3/disable = 1"


def test_watch_files(plugin: CstatePlugin) -> None:
    # The PM QoS request lives in this process's fd: nothing to watch.
    assert files_to_watch(plugin, PmQosRequest()) == ()
    assert files_to_watch(plugin, ResumeLatency(2)) == (
        f"{CPU}/cpu2/power/pm_qos_resume_latency_us",
    )
    assert files_to_watch(plugin, StateDisable(1, 3)) == (f"{CPU}/cpu1/cpuidle/state3/disable",)


# -- through the engine ---------------------------------------------------------------------


def test_engine_round_trip_puts_every_original_back(
    tmp_path: Path, root: Path, system: System, plugin: CstatePlugin, machine: Machine
) -> None:
    dev = root / "dev/cpu_dma_latency"
    put(root, f"{CPU}/cpu3/power/pm_qos_resume_latency_us", "100")
    put(root, f"{CPU}/cpu3/cpuidle/state3/disable", "1")  # an admin disabled it already
    before = tree_values(root, "sys")
    engine = engine_for(tmp_path, plugin)
    raw = {
        "force_latency_us": "shallowest",
        "cpus": [
            {"cpus": "1-3", "resume_latency_us": 0, "disable_states": ["deeper-than:5"]},
            {"cpus": "3", "resume_latency_us": 25},
        ],
    }
    p = profile(plugin, machine, "p", raw)
    report = engine.apply(p)
    # pm_qos, 3 resume latencies, 5 disables (cpu3/state3 was already "1": recorded, not written)
    assert report.applied == 9 and report.unchanged == 1 and report.not_applicable == {}
    assert read(root, "cpu1/power/pm_qos_resume_latency_us") == "n/a"
    assert read(root, "cpu3/power/pm_qos_resume_latency_us") == "25"
    assert read(root, "cpu2/cpuidle/state2/disable") == "1"
    assert read(root, "cpu0/cpuidle/state2/disable") == "0"
    assert dev_value(root) == 2 and len(held(dev)) == 1
    assert engine.verify() == []

    # A second profile: another value is held before the first is released.
    engine.apply(profile(plugin, machine, "q", {"force_latency_us": "poll"}))
    assert dev_value(root) == 0 and len(held(dev)) == 1
    assert read(root, "cpu1/power/pm_qos_resume_latency_us") == "0"

    engine.apply(p)
    assert engine.off() == []
    assert tree_values(root, "sys") == before
    assert held(dev) == []
    assert system.pmqos.held() is None
    assert Journal(tmp_path / "state").load() is None


def test_restart_adopts_the_journal_and_puts_every_original_back(
    tmp_path: Path, root: Path, plugin: CstatePlugin, machine: Machine
) -> None:
    """Targets round-trip through the journal: a new daemon can give back what the last set."""
    before = tree_values(root, "sys")
    raw = {"cpus": [{"cpus": "1", "resume_latency_us": 0, "disable_states": ["C6"]}]}
    engine_for(tmp_path, plugin).apply(profile(plugin, machine, "p", raw))
    assert read(root, "cpu1/cpuidle/state3/disable") == "1"
    after_restart = engine_for(tmp_path, CstatePlugin(System(root)))
    assert after_restart.adopt() is not None
    assert set(after_restart.applied) == {
        ("cstate", ResumeLatency(1)),
        ("cstate", StateDisable(1, 3)),
    }
    assert after_restart.off() == []
    assert tree_values(root, "sys") == before


def test_engine_unknown_state_is_refused_and_the_rest_applies(
    tmp_path: Path, root: Path, system: System, plugin: CstatePlugin, machine: Machine
) -> None:
    engine = engine_for(tmp_path, plugin)
    raw = {"force_latency_us": "state:C9", "cpus": [{"cpus": "1", "resume_latency_us": 0}]}
    report = engine.apply(profile(plugin, machine, "p", raw))
    assert report.applied == 1 and report.not_applicable == {}
    assert engine.profile == "p"
    assert engine.sections["cstate"].expansion.refused == {"force_latency_us": NO_C9}
    assert read(root, "cpu1/power/pm_qos_resume_latency_us") == "n/a"
    assert system.pmqos.held() is None and held(root / "dev/cpu_dma_latency") == []
    assert engine.off() == []
    assert read(root, "cpu1/power/pm_qos_resume_latency_us") == "0"


# -- monitoring -----------------------------------------------------------------------------


def test_residency_table_counts_since_profile_applied(
    root: Path, plugin: CstatePlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(cstate_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    plugin.on_applied(CstateRules(None))
    # One second later: CPU1 spent 1% polling, 20% in C1, nothing in C1E, 50% in C6.
    for state, (dt, du) in enumerate([(10_000, 7), (200_000, 30), (0, 0), (500_000, 4)]):
        base = f"{CPU}/cpu1/cpuidle/state{state}"
        put(root, f"{base}/time", str(int(read(root, f"cpu1/cpuidle/state{state}/time")) + dt))
        put(root, f"{base}/usage", str(int(read(root, f"cpu1/cpuidle/state{state}/usage")) + du))
    put(root, f"{CPU}/cpu2/cpuidle/state3/time", str(4000 + 1_000_000))  # idle all along
    now[0] = 101.0
    table, waiting = plugin.monitor(CstateRules(None)).tables
    assert waiting.title.startswith("How idle CPUs wait here")
    assert table.title == "C-state residency since the profile was applied (1.0 s)"
    assert table.columns == (
        "CPU", "busy%", "POLL %", "POLL usage", "C1 %", "C1 usage",
        "C1E %", "C1E usage", "C6 %", "C6 usage",
    )  # fmt: skip
    assert table.rows == (
        (0, 100.0, 0.0, 0, 0.0, 0, 0.0, 0, 0.0, 0),
        (1, 29.0, 1.0, 7, 20.0, 30, 0.0, 0, 50.0, 4),
        (2, 0.0, 0.0, 0, 0.0, 0, 0.0, 0, 100.0, 0),
        (3, 100.0, 0.0, 0, 0.0, 0, 0.0, 0, 0.0, 0),
    )


def test_monitor_reports_the_request_and_the_effective_value(
    root: Path, plugin: CstatePlugin, machine: Machine
) -> None:
    facts = plugin.monitor(None).facts
    assert "pm_qos_requested_us" not in facts
    assert facts["pm_qos_effective_us"] == PM_QOS_DEFAULT_US
    exp = expand(plugin, machine, {"force_latency_us": "state:C1E"})
    plugin.write(PmQosRequest(), exp.settings[PmQosRequest()])
    facts = plugin.monitor(exp.rules).facts
    assert facts == {
        "pm_qos_requested_us": 10,
        "pm_qos_resolved_from": "state:C1E",  # from the rules, not from the plugin
        "pm_qos_effective_us": 10,
        "cpuidle_driver": "none",  # the fake machine has states but no current_driver file
    }
    assert "pm_qos_resolved_from" not in plugin.monitor(CstateRules(None)).facts
    (root / f"{CPU}/cpu2/cpuidle/state1/usage").unlink()
    monitor = plugin.monitor(exp.rules)
    assert [t.title for t in monitor.tables] == [
        "How idle CPUs wait here (cpuidle driver none, governor none)"
    ]
    assert monitor.facts["pm_qos_requested_us"] == 10
    assert monitor.facts["residency_error"].startswith(
        "reading /sys/devices/system/cpu/cpu2/cpuidle/state1/usage: No such file"
    )


# -- schema -----------------------------------------------------------------------------------


def test_schema_accepts_every_form(plugin: CstatePlugin, machine: Machine) -> None:
    out = section(
        plugin,
        machine,
        {
            "force_latency_us": "state:haltpoll",
            "cpus": {"cpus": "all - 0", "resume_latency_us": "any", "disable_states": "C6"},
            "on_drift": "report",  # the engine's option, valid in every section
        },
    )
    assert out["force_latency_us"] == "state:haltpoll"
    assert [e["cpus"].to_list() for e in out["cpus"]] == ["1-3"]
    assert out["cpus"][0]["disable_states"] == ["C6"]
    assert out["on_drift"] == "report" and "on_drift" not in plugin_options(out)


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        (
            {"force_latency_us": "deepest"},
            ("force_latency_us",),
            "force_latency_us: expected an integer, got 'deepest'; "
            'expected "poll", "shallowest" or "state:NAME", got \'deepest\'',
        ),
        (
            {"force_latency_us": -5},
            ("force_latency_us",),
            "force_latency_us: -5 is below the minimum 0; "
            'expected "poll", "shallowest" or "state:NAME", got -5',
        ),
        (
            {"cpus": [{"cpus": "1"}, {"resume_latency_us": 0}]},
            ("cpus", 1),
            "missing required option 'cpus'",
        ),
        (
            {"cpus": [{"cpus": "1", "resume_latency_us": -1}]},
            ("cpus", 0, "resume_latency_us"),
            "resume_latency_us: -1 is below the minimum 0; expected one of any; got -1",
        ),
        (
            {"cpus": [{"cpus": "1", "disable_states": ["deeper-than:x"]}]},
            ("cpus", 0, "disable_states"),
            'disable_states: expected a state name (glob) or "deeper-than:µs", '
            "got 'deeper-than:x'",
        ),
        (
            {"cpus": [{"cpus": "9"}]},
            ("cpus", 0, "cpus"),
            "cpus: CPU list '9' names CPUs 9 that are not online (online: 0-3)",
        ),
    ],
)
def test_schema_errors(
    plugin: CstatePlugin,
    machine: Machine,
    raw: dict[str, Any],
    path: tuple[Any, ...],
    message: str,
) -> None:
    with pytest.raises(SchemaError) as info:
        section(plugin, machine, raw)
    assert info.value.path == path
    assert info.value.message == message
