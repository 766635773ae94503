"""cstate plugin on the real /dev/cpu_dma_latency and cpuidle sysfs (restored afterwards)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from latencyd.plugins.cstate import CstatePlugin

from latencyd.core.engine import Engine
from latencyd.core.journal import Journal
from latencyd.cpuset import CpuSet
from latencyd.kernel.idle import read_driver
from latencyd.kernel.system import System
from tests.machine_state import pm_qos_holders
from tests.wanted import wanted

pytestmark = pytest.mark.usefixtures("kernel_guard")
CPU1 = Path("/sys/devices/system/cpu/cpu1")


@pytest.fixture
def plugin() -> CstatePlugin:
    system = System("/")
    if not read_driver(system) or not (CPU1 / "cpuidle").exists():
        # Every option is then not applicable: the e2e status test checks the reasons.
        pytest.skip("no cpuidle driver (or none on CPU 1) on this machine")
    if not Path("/dev/cpu_dma_latency").exists():
        pytest.skip("no /dev/cpu_dma_latency on this machine")
    return CstatePlugin(system)


@pytest.fixture
def engine(plugin: CstatePlugin, tmp_path: Path) -> Engine:
    return Engine({"cstate": plugin}, Journal(tmp_path / "state"))


def poll_share(cpu: int, seconds: float, min_idle_s: float = 0.1) -> float:
    """Share of CPU `cpu`'s idle time spent in its POLL idle state, over at least `seconds`
    and until it was idle `min_idle_s` (another load on the CPU leaves it little idle
    time: a CI run beside a busy neighbour once saw none in 0.5 s and read 0 % held).
    A CPU another load keeps busy for 10 s has no idle time to share out: the test is
    skipped, saying so, as it cannot say anything of the plugin then (issue 53, part 6)."""
    states = Path(f"/sys/devices/system/cpu/cpu{cpu}/cpuidle")
    assert (states / "state0/name").read_text().strip() == "POLL"

    def times() -> list[int]:
        return [int((d / "time").read_text()) for d in sorted(states.glob("state[0-9]*"))]

    t0, start = times(), time.monotonic()
    time.sleep(seconds)
    while True:
        spent = [b - a for a, b in zip(t0, times(), strict=True)]
        idle_s = sum(spent) / 1e6
        if idle_s >= min_idle_s:
            return spent[0] / sum(spent)
        if time.monotonic() - start >= 10:
            pytest.skip(f"CPU {cpu} was idle only {idle_s:.3f} s in 10 s: the machine's load")
        time.sleep(0.1)


def test_symbolic_targets_resolve_from_this_machines_idle_table(plugin: CstatePlugin) -> None:
    states = plugin.states(0)
    real = [s for s in states if not s.is_poll]
    assert plugin.resolve_latency("poll") == 0
    assert plugin.resolve_latency("shallowest") == min(s.latency_us for s in real)
    first_word = real[0].name.split()[0]  # "haltpoll" names "haltpoll idle"
    assert plugin.resolve_latency(f"state:{first_word}") == real[0].latency_us


def test_force_latency_is_held_while_applied_and_released_on_restore(
    engine: Engine, plugin: CstatePlugin
) -> None:
    before = plugin.system.pmqos.effective()
    assert os.getpid() not in pm_qos_holders()
    engine.switch(wanted(plugin, {"force_latency_us": "poll"}), "t")
    assert plugin.system.pmqos.effective() == 0
    holders = [int(p) for p in os.listdir("/proc/self/fd") if _is_qos(f"/proc/self/fd/{p}")]
    assert holders, "the request must live on an fd we hold open"
    assert engine.verify() == []
    engine.off()
    assert plugin.system.pmqos.effective() == before
    assert not [p for p in os.listdir("/proc/self/fd") if _is_qos(f"/proc/self/fd/{p}")]


def _is_qos(link: str) -> bool:
    try:
        return os.readlink(link) == "/dev/cpu_dma_latency"
    except OSError:
        return False


def test_holding_poll_moves_cpu1_into_the_polling_state(
    engine: Engine, plugin: CstatePlugin
) -> None:
    idle_before = poll_share(1, 0.5)
    engine.switch(wanted(plugin, {"force_latency_us": "poll"}), "t")
    try:
        held = poll_share(1, 0.5)
    finally:
        engine.off()
    after = poll_share(1, 0.5)
    # Measured here: ~0 % of idle time in POLL normally, ~100 % while "poll" is held.
    assert held > idle_before + 0.4, (idle_before, held)
    assert held > after + 0.4, (held, after)


def test_per_cpu_resume_latency_and_state_disable_are_applied_and_restored(
    engine: Engine, plugin: CstatePlugin
) -> None:
    resume = CPU1 / "power/pm_qos_resume_latency_us"
    states = plugin.states(1)
    deep = [s for s in states if not s.is_poll]
    original_resume = resume.read_text().strip()
    original_disable = {
        s.index: (CPU1 / f"cpuidle/state{s.index}/disable").read_text().strip() for s in states
    }
    options = {
        "cpus": [{"cpus": CpuSet([1]), "resume_latency_us": 0, "disable_states": ["deeper-than:0"]}]
    }
    engine.switch(wanted(plugin, options), "t")
    assert resume.read_text().strip() == "n/a"  # the kernel's spelling of "0 µs tolerated"
    for s in deep:
        assert (CPU1 / f"cpuidle/state{s.index}/disable").read_text().strip() == "1"
    assert (CPU1 / "cpuidle/state0/disable").read_text().strip() == original_disable[0]
    assert engine.verify() == []
    engine.off()
    assert resume.read_text().strip() == original_resume
    for s in states:
        assert (CPU1 / f"cpuidle/state{s.index}/disable").read_text().strip() == original_disable[
            s.index
        ]


def test_residency_table_counts_since_apply(engine: Engine, plugin: CstatePlugin) -> None:
    """While "poll" is held, the table's POLL share takes most of CPU 1's idle time since
    the apply (its share of wall time is what is idle: another load on the CPU lowers it,
    so the test waits for some idle time rather than a fixed share of the clock, and is
    skipped, saying so, when the load leaves CPU 1 under 10 % idle for a minute: issue
    53, part 6; in `make test` the VM tier's emulator once kept it 99 % busy for 10 s).
    POLL's share is judged against the idle time the table counts (busy% is 100 minus
    the states' shares), which the load does not move."""
    engine.switch(wanted(plugin, {"force_latency_us": "poll"}), "t")
    try:
        plugin.on_applied(None)
        start = time.monotonic()
        while True:
            time.sleep(0.3)
            table = plugin.monitor(None).tables[0]
            row1 = next(r for r in table.rows if r[0] == 1)
            if 100 - row1[1] >= 10 or time.monotonic() - start > 60:
                break
    finally:
        engine.off()
    assert table.columns[:3] == ("CPU", "busy%", "POLL %")
    if 100 - row1[1] < 10:
        pytest.skip(f"CPU 1 was busy {row1[1]} % for 60 s (the machine's load): no idle time")
    assert row1[2] > 0.5 * (100 - row1[1]), row1  # POLL: most of the idle time while held
    assert row1[3] > 0  # POLL usage count since apply
