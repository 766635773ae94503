"""The cstate plugin against a fake cpuidle tree and a plain-file /dev/cpu_dma_latency."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import latencyd.plugins.cstate as cstate_module
import pytest
from latencyd.plugins.cstate import CstatePlugin, IdleState, state_matches

from latencyd.engine import Engine
from latencyd.errors import NotApplicable
from latencyd.journal import Journal
from latencyd.schema import Machine, SchemaError, validate
from latencyd.system import PmQosRequest, System
from tests.unit.fakesys import (
    PM_QOS_DEFAULT_US,
    add_cpuidle,
    make_fake_root,
    put,
    tree_values,
)

CPU = "sys/devices/system/cpu"
HALTPOLL_STATES = (("POLL", 0, 0, 0), ("haltpoll idle", 50, 0, 0))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = make_fake_root(tmp_path, cpus="0-3")
    add_cpuidle(root)
    return root


@pytest.fixture
def plugin(root: Path) -> Iterator[CstatePlugin]:
    plugin = CstatePlugin(System(root))
    yield plugin
    plugin.close()


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
    return fds


def dev_value(root: Path) -> int:
    return int(struct.unpack("=i", (root / "dev/cpu_dma_latency").read_bytes())[0])


def expand(plugin: CstatePlugin, machine: Machine, section: dict[str, Any]) -> dict[str, Any]:
    return plugin.expand(validate(plugin.schema, section, machine))


def wanted(plugin: CstatePlugin, machine: Machine, section: dict[str, Any]) -> dict[Any, Any]:
    return {("cstate", k): v for k, v in expand(plugin, machine, section).items()}


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
    assert expand(plugin, machine, {"force_latency_us": value}) == {"pm_qos": expected}


def test_resolved_from_is_remembered_for_describe(plugin: CstatePlugin, machine: Machine) -> None:
    expand(plugin, machine, {"force_latency_us": "shallowest"})
    assert plugin.describe("pm_qos", 2) == (
        "PM QoS CPU latency request held at 2 µs (resolved from 'shallowest')"
    )
    expand(plugin, machine, {"force_latency_us": 7})
    assert plugin.describe("pm_qos", 7) == "PM QoS CPU latency request held at 7 µs"
    assert plugin.describe("pm_qos", None) == "no PM QoS request held"


def test_state_name_matches_its_first_word(tmp_path: Path, machine: Machine) -> None:
    # cpuidle-haltpoll names its state "haltpoll idle"; profiles say "haltpoll".
    root = make_fake_root(tmp_path)
    add_cpuidle(root, states=HALTPOLL_STATES)
    plugin = CstatePlugin(System(root))
    assert expand(plugin, machine, {"force_latency_us": "state:haltpoll"}) == {"pm_qos": 50}
    assert expand(plugin, machine, {"force_latency_us": "state:haltpoll idle"}) == {"pm_qos": 50}
    assert expand(plugin, machine, {"force_latency_us": "shallowest"}) == {"pm_qos": 50}
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
    assert str(info.value) == (
        "force_latency_us = 'state:C9': no idle state 'C9' (have: POLL, C1, C1E, C6)"
    )


def test_no_cpuidle_states(tmp_path: Path) -> None:
    plugin = CstatePlugin(System(make_fake_root(tmp_path)))
    assert plugin.resolve_latency("poll") == 0  # needs no idle table
    with pytest.raises(NotApplicable, match="no cpuidle states on this machine"):
        plugin.resolve_latency("shallowest")


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


# -- force_latency_us: holding the request -----------------------------------------------


def test_apply_holds_the_request_on_an_open_fd(root: Path, plugin: CstatePlugin) -> None:
    dev = root / "dev/cpu_dma_latency"
    assert plugin.capture("pm_qos") is None
    assert plugin.effective_latency_us() == PM_QOS_DEFAULT_US
    plugin.apply("pm_qos", 20)
    assert dev.read_bytes() == struct.pack("=i", 20)  # one binary s32, 4 bytes
    assert plugin.request is not None and held(dev) == [plugin.request.fd]
    assert plugin.capture("pm_qos") == 20
    assert plugin.effective_latency_us() == 20
    plugin.apply("pm_qos", None)
    assert held(dev) == []
    assert plugin.request is None
    assert plugin.capture("pm_qos") is None


def test_changing_the_value_makes_before_it_breaks(root: Path) -> None:
    dev = root / "dev/cpu_dma_latency"

    fds_at_hold: list[list[int]] = []

    class Watching(System):
        def hold_pm_qos(self, value_us: int) -> PmQosRequest:
            fds_at_hold.append(held(dev))
            return super().hold_pm_qos(value_us)

    plugin = CstatePlugin(Watching(root))
    try:
        plugin.apply("pm_qos", 20)
        first = plugin.request.fd if plugin.request else -1
        plugin.apply("pm_qos", 5)
        # The old request was still held while the new one was made; then it went.
        assert fds_at_hold == [[], [first]]
        assert plugin.request is not None and held(dev) == [plugin.request.fd]
        assert plugin.capture("pm_qos") == 5 and dev_value(root) == 5
    finally:
        plugin.close()
    assert held(dev) == []


def test_close_releases_the_request(root: Path, plugin: CstatePlugin) -> None:
    plugin.apply("pm_qos", 0)
    plugin.close()
    assert held(root / "dev/cpu_dma_latency") == []
    assert plugin.capture("pm_qos") is None
    plugin.close()  # twice is fine


# -- [[cstate.cpus]] -------------------------------------------------------------------------


def test_resume_latency_translates_to_the_kernels_spelling(
    root: Path, plugin: CstatePlugin, machine: Machine
) -> None:
    section = {
        "cpus": [
            {"cpus": "1", "resume_latency_us": 0},
            {"cpus": "2", "resume_latency_us": "any"},
            {"cpus": "3", "resume_latency_us": 25},
        ]
    }
    settings = expand(plugin, machine, section)
    assert settings == {
        "cpu1/resume_latency": "n/a",
        "cpu2/resume_latency": "0",
        "cpu3/resume_latency": "25",
    }
    put(root, f"{CPU}/cpu2/power/pm_qos_resume_latency_us", "100")
    for key, value in settings.items():
        plugin.apply(key, value)
        assert plugin.capture(key) == value
    assert read(root, "cpu1/power/pm_qos_resume_latency_us") == "n/a"
    assert read(root, "cpu2/power/pm_qos_resume_latency_us") == "0"
    assert read(root, "cpu3/power/pm_qos_resume_latency_us") == "25"
    assert (
        plugin.describe("cpu1/resume_latency", "n/a") == "cpu1 resume latency = 0 µs: polling only"
    )
    assert plugin.describe("cpu2/resume_latency", "0") == "cpu2 resume latency = no limit"
    assert plugin.describe("cpu3/resume_latency", "25") == "cpu3 resume latency = 25 µs"


def test_disable_states_by_name_glob_and_depth(plugin: CstatePlugin, machine: Machine) -> None:
    assert expand(plugin, machine, {"cpus": [{"cpus": "1", "disable_states": ["C6"]}]}) == {
        "cpu1/state3/disable": "1"
    }
    assert expand(plugin, machine, {"cpus": [{"cpus": "0,2", "disable_states": ["c1*"]}]}) == {
        f"cpu{c}/state{s}/disable": "1" for c in (0, 2) for s in (1, 2)
    }
    # deeper-than:N: every state whose exit latency exceeds N µs (POLL and C1 stay).
    assert expand(
        plugin, machine, {"cpus": [{"cpus": "3", "disable_states": ["deeper-than:2"]}]}
    ) == {"cpu3/state2/disable": "1", "cpu3/state3/disable": "1"}
    assert expand(plugin, machine, {"cpus": [{"cpus": "3", "disable_states": ["C9"]}]}) == {}


def test_later_entries_win_where_cpu_sets_overlap(plugin: CstatePlugin, machine: Machine) -> None:
    section = {
        "cpus": [
            {"cpus": "0-3", "resume_latency_us": 0, "disable_states": ["deeper-than:5"]},
            {"cpus": "2-3", "resume_latency_us": 25, "disable_states": ["C6"]},
            {"cpus": "3", "resume_latency_us": "any"},  # says nothing about disable_states
        ]
    }
    assert expand(plugin, machine, section) == {
        "cpu0/resume_latency": "n/a",
        "cpu0/state2/disable": "1",
        "cpu0/state3/disable": "1",
        "cpu1/resume_latency": "n/a",
        "cpu1/state2/disable": "1",
        "cpu1/state3/disable": "1",
        "cpu2/resume_latency": "25",
        "cpu2/state3/disable": "1",  # the later entry's list, not both lists
        "cpu3/resume_latency": "0",
        "cpu3/state3/disable": "1",
    }


def test_capture_apply_and_exists_for_state_disables(root: Path, plugin: CstatePlugin) -> None:
    plugin.apply("cpu1/state3/disable", "1")
    assert read(root, "cpu1/cpuidle/state3/disable") == "1"
    assert plugin.capture("cpu1/state3/disable") == "1"
    assert plugin.capture("cpu1/state2/disable") == "0"
    assert plugin.exists("cpu1/state3/disable") and plugin.exists("pm_qos")
    assert not plugin.exists("cpu1/state9/disable")
    assert not plugin.exists("cpu7/resume_latency")
    assert plugin.describe("cpu1/state3/disable", "1") == "cpu1 state3/disable = 1"


# -- through the engine ---------------------------------------------------------------------


def test_engine_round_trip_puts_every_original_back(
    tmp_path: Path, root: Path, plugin: CstatePlugin, machine: Machine
) -> None:
    put(root, f"{CPU}/cpu3/power/pm_qos_resume_latency_us", "100")
    put(root, f"{CPU}/cpu3/cpuidle/state3/disable", "1")  # an admin disabled it already
    before = tree_values(root, "sys")
    engine = Engine({"cstate": plugin}, Journal(tmp_path / "state"))
    section = {
        "force_latency_us": "shallowest",
        "cpus": [
            {"cpus": "1-3", "resume_latency_us": 0, "disable_states": ["deeper-than:5"]},
            {"cpus": "3", "resume_latency_us": 25},
        ],
    }
    report = engine.switch(wanted(plugin, machine, section), "p")
    # pm_qos, 3 resume latencies, 5 disables (cpu3/state3 was already "1": recorded, not written)
    assert report.applied == 9 and report.not_applicable == {}
    assert read(root, "cpu1/power/pm_qos_resume_latency_us") == "n/a"
    assert read(root, "cpu3/power/pm_qos_resume_latency_us") == "25"
    assert read(root, "cpu2/cpuidle/state2/disable") == "1"
    assert read(root, "cpu0/cpuidle/state2/disable") == "0"
    assert dev_value(root) == 2 and len(held(root / "dev/cpu_dma_latency")) == 1
    assert engine.verify() == []

    # A second profile: another value is held before the first is released.
    engine.switch(wanted(plugin, machine, {"force_latency_us": "poll"}), "q")
    assert dev_value(root) == 0 and len(held(root / "dev/cpu_dma_latency")) == 1
    assert read(root, "cpu1/power/pm_qos_resume_latency_us") == "0"

    engine.switch(wanted(plugin, machine, section), "p")
    assert engine.off() == []
    assert tree_values(root, "sys") == before
    assert held(root / "dev/cpu_dma_latency") == []
    assert plugin.request is None
    assert Journal(tmp_path / "state").load() is None


def test_engine_unknown_state_fails_the_profile_before_any_write(
    tmp_path: Path, root: Path, plugin: CstatePlugin, machine: Machine
) -> None:
    section = {"force_latency_us": "state:C9", "cpus": [{"cpus": "1", "resume_latency_us": 0}]}
    with pytest.raises(NotApplicable, match=r"have: POLL, C1, C1E, C6"):
        expand(plugin, machine, section)
    assert read(root, "cpu1/power/pm_qos_resume_latency_us") == "0"


# -- residency ------------------------------------------------------------------------------


def test_residency_table_counts_since_profile_applied(
    root: Path, plugin: CstatePlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [100.0]
    monkeypatch.setattr(cstate_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    plugin.on_profile_applied()
    # One second later: CPU1 spent 1% polling, 20% in C1, nothing in C1E, 50% in C6.
    for state, (dt, du) in enumerate([(10_000, 7), (200_000, 30), (0, 0), (500_000, 4)]):
        base = f"{CPU}/cpu1/cpuidle/state{state}"
        put(root, f"{base}/time", str(int(read(root, f"cpu1/cpuidle/state{state}/time")) + dt))
        put(root, f"{base}/usage", str(int(read(root, f"cpu1/cpuidle/state{state}/usage")) + du))
    put(root, f"{CPU}/cpu2/cpuidle/state3/time", str(4000 + 1_000_000))  # idle all along
    now[0] = 101.0
    table = plugin.status()["tables"][0]
    assert table["title"] == "C-state residency since the profile was applied (1.0 s)"
    assert table["columns"] == [
        "CPU", "busy%", "POLL %", "POLL usage", "C1 %", "C1 usage",
        "C1E %", "C1E usage", "C6 %", "C6 usage",
    ]  # fmt: skip
    assert table["rows"] == [
        [0, 100.0, 0.0, 0, 0.0, 0, 0.0, 0, 0.0, 0],
        [1, 29.0, 1.0, 7, 20.0, 30, 0.0, 0, 50.0, 4],
        [2, 0.0, 0.0, 0, 0.0, 0, 0.0, 0, 100.0, 0],
        [3, 100.0, 0.0, 0, 0.0, 0, 0.0, 0, 0.0, 0],
    ]


def test_status_reports_the_request_and_the_effective_value(
    root: Path, plugin: CstatePlugin, machine: Machine
) -> None:
    info = plugin.status()
    assert "pm_qos_requested_us" not in info
    assert info["pm_qos_effective_us"] == PM_QOS_DEFAULT_US
    plugin.apply("pm_qos", expand(plugin, machine, {"force_latency_us": "state:C1E"})["pm_qos"])
    info = plugin.status()
    assert info["pm_qos_requested_us"] == 10
    assert info["pm_qos_resolved_from"] == "state:C1E"
    assert info["pm_qos_effective_us"] == 10
    (root / f"{CPU}/cpu2/cpuidle/state1/usage").unlink()
    info = plugin.status()
    assert "tables" not in info
    assert info["residency_error"].startswith(
        "reading /sys/devices/system/cpu/cpu2/cpuidle/state1/usage: No such file"
    )


# -- schema -----------------------------------------------------------------------------------


def test_schema_accepts_every_form(plugin: CstatePlugin, machine: Machine) -> None:
    out = validate(
        plugin.schema,
        {
            "force_latency_us": "state:haltpoll",
            "cpus": {"cpus": "all - 0", "resume_latency_us": "any", "disable_states": "C6"},
        },
        machine,
    )
    assert out["force_latency_us"] == "state:haltpoll"
    assert [e["cpus"].to_list() for e in out["cpus"]] == ["1-3"]
    assert out["cpus"][0]["disable_states"] == ["C6"]


@pytest.mark.parametrize(
    ("section", "path", "message"),
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
    section: dict[str, Any],
    path: tuple[Any, ...],
    message: str,
) -> None:
    with pytest.raises(SchemaError) as info:
        validate(plugin.schema, section, machine)
    assert info.value.path == path
    assert info.value.message == message
