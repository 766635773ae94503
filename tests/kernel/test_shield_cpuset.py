"""The cpuset shield on this machine's cgroup v1 cpuset hierarchy, through the engine: the
root's user tasks go to housekeeping (their CPUs the kernel's to keep), a task its user
confined to the shielded CPU goes inside, new tasks are born where their parent is, and
off (also after a kill -9, from the journal) leaves every task, file and cgroup as found
(kernel_guard compares every cpuset and every task's)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from latencyd.plugins.shield import ShieldPlugin

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import validate
from latencyd.cpuset import CpuSet
from latencyd.kernel.system import System
from tests.harness import wait_for

pytestmark = pytest.mark.usefixtures("kernel_guard")

V1 = Path("/sys/fs/cgroup/cpuset")


@pytest.fixture
def system() -> System:
    system = System()
    if system.cgroup_facts().v1_cpuset != "sys/fs/cgroup/cpuset":
        pytest.skip("needs the cpuset controller in a v1 hierarchy at /sys/fs/cgroup/cpuset")
    if not {0, 1} <= os.sched_getaffinity(0) or any(p.is_dir() for p in V1.iterdir()):
        pytest.skip("needs CPUs 0 and 1 and a cpuset hierarchy without child cpusets")
    return system


@pytest.fixture
def tasks() -> Iterator[tuple[int, int]]:
    """A task allowed everywhere, and one its user confined to CPU 1."""
    free = subprocess.Popen(["sleep", "120"])
    confined = subprocess.Popen(["taskset", "-c", "1", "sleep", "120"])
    try:
        wait_for(lambda: Path(f"/proc/{confined.pid}/comm").read_text() == "sleep\n")
        yield free.pid, confined.pid
    finally:
        for proc in (free, confined):
            proc.kill()
            proc.wait()


def shield(system: System, engine: Engine) -> None:
    plugin = engine.plugins["shield"]
    options = plugin.options_of(
        validate(plugin.schema, {"cpus": "1", "mechanism": "cpuset"}, system.machine())
    )
    wanted = plugin.expand(options, {}).settings
    engine.switch({("shield", t): v for t, v in wanted.items()}, "p")


def cpuset_of(pid: int) -> str | None:
    return System().task_cgroup(pid)


def test_the_kernel_keeps_the_shield_and_off_gives_everything_back(
    system: System, tasks: tuple[int, int], tmp_path: Path
) -> None:
    free, confined = tasks
    engine = Engine({"shield": ShieldPlugin(system)}, Journal(tmp_path / "state"))
    shield(system, engine)
    try:
        assert cpuset_of(free) == "/latencyd-housekeeping"
        assert os.sched_getaffinity(free) == {0}
        assert cpuset_of(confined) == "/latencyd-shield"
        assert os.sched_getaffinity(confined) == {1}
        assert cpuset_of(os.getpid()) == "/latencyd-housekeeping"  # this test, too
        assert (V1 / "cpuset.sched_load_balance").read_text().strip() == "0"
        with pytest.raises(OSError):  # not cooperative: the kernel refuses (EINVAL)
            os.sched_setaffinity(free, {1})
        born = subprocess.Popen(["sleep", "60"])  # no daemon, no event: the kernel places it
        try:
            assert cpuset_of(born.pid) == "/latencyd-housekeeping"
            assert os.sched_getaffinity(born.pid) == {0}
        finally:
            born.kill()
            born.wait()
        assert engine.verify() == []
    finally:
        assert engine.off() == []
    assert cpuset_of(free) == "/" and os.sched_getaffinity(free) == {0, 1}
    assert cpuset_of(confined) == "/" and os.sched_getaffinity(confined) == {1}
    assert not (V1 / "latencyd-housekeeping").exists() and not (V1 / "latencyd-shield").exists()


def test_a_killed_run_is_adopted_from_the_journal_and_put_back(
    system: System, tasks: tuple[int, int], tmp_path: Path
) -> None:
    free, _ = tasks
    shield(system, Engine({"shield": ShieldPlugin(system)}, Journal(tmp_path / "state")))
    born = subprocess.Popen(["sleep", "60"])  # born in housekeeping, never journaled
    try:
        again = Engine({"shield": ShieldPlugin(system)}, Journal(tmp_path / "state"))
        assert again.adopt() is not None  # what a restart after kill -9 does
        assert again.off() == []
        assert cpuset_of(free) == "/" and cpuset_of(born.pid) == "/"
        assert os.sched_getaffinity(born.pid) == {0, 1}
    finally:
        born.kill()
        born.wait()


def test_a_shield_moved_to_other_cpus_is_made_anew(
    system: System, tasks: tuple[int, int], tmp_path: Path
) -> None:
    """v1's exclusive cpusets cannot trade CPUs in place (either write overlaps the
    exclusive sibling: EINVAL), so a profile shielding other CPUs gives the cpusets back
    first (StartsAfresh) and makes them again: the mis-tuned scenario of `bench
    latency` was the first profile's shield kept, *not applicable*, until then."""
    free, confined = tasks
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    for cpu in (0, 1):
        (profiles / f"on{cpu}.toml").write_text(f'[shield]\ncpus = "{cpu}"\nmechanism = "cpuset"\n')
    engine = Engine({"shield": ShieldPlugin(system)}, Journal(tmp_path / "state"))
    library = ProfileLibrary([profiles], section_schemas(engine.plugins), system.machine())
    try:
        engine.apply(library.load("on1"))
        assert (V1 / "latencyd-shield/cpuset.cpus").read_text().strip() == "1"
        engine.apply(library.load("on0"))
        assert engine.not_applicable == {}
        assert (V1 / "latencyd-shield/cpuset.cpus").read_text().strip() == "0"
        assert (V1 / "latencyd-housekeeping/cpuset.cpus").read_text().strip() == "1"
        assert cpuset_of(free) == "/latencyd-housekeeping"
        assert os.sched_getaffinity(free) == {1}
        assert cpuset_of(confined) == "/latencyd-housekeeping"  # its CPU 1 is not shielded now
        assert engine.verify() == []
    finally:
        assert engine.off() == []
    assert cpuset_of(free) == "/" and os.sched_getaffinity(free) == {0, 1}
    assert cpuset_of(confined) == "/" and os.sched_getaffinity(confined) == {1}


# The application: waits for `go`, starts a child, then every 2 ms writes a line "cpuset
# CPUs" read of itself, until `stop` exists.
SAMPLER = r"""
import os, subprocess, sys, time
out, go, stop = sys.argv[1:4]
while not os.path.exists(go):
    time.sleep(0.005)
child = subprocess.Popen(["sleep", "120"])
with open(out, "w") as f:
    f.write(f"child {child.pid}\n")
    f.flush()
    while not os.path.exists(stop):
        with open("/proc/self/cpuset") as c:
            cpuset = c.read().strip()
        f.write(f"{cpuset} {','.join(map(str, sorted(os.sched_getaffinity(0))))}\n")
        f.flush()
        time.sleep(0.002)
child.kill()
child.wait()
"""


def hold(engine: Engine, system: System, holders: dict[int, str]) -> None:
    """What the daemon does as holds start and end: each holder placed on its hold's CPUs
    (PlacesApplications.holders), the shield the union, and the plugin's settings switched
    to."""
    plugin = engine.plugins["shield"]
    assert isinstance(plugin, ShieldPlugin)
    plugin.holders(frozenset(holders), {pid: CpuSet.from_list(c) for pid, c in holders.items()})
    shielded = ",".join(sorted(set(holders.values()))) or "1"
    options = plugin.options_of(
        validate(plugin.schema, {"cpus": shielded, "mechanism": "cpuset"}, system.machine())
    )
    wanted = plugin.expand(options, engine.owned("shield")).settings
    engine.switch({("shield", t): v for t, v in wanted.items()}, "p")


def test_a_held_application_has_a_cpuset_of_its_own_another_holds_start_and_end_leave(
    system: System, tmp_path: Path
) -> None:
    """Issue 52 on v1: the application of a hold on CPU 1 runs in a cpuset of its own
    inside the shield's (CPUs 1, read back from the kernel), with what it starts; a
    second hold's start and end make and remove that one's own and write nothing of the
    first's: its samples of its own cpuset and CPUs, taken all along, never change. Its
    own cpuset goes when its hold ends, and off leaves the machine as found."""
    go, stop, out = tmp_path / "go", tmp_path / "stop", tmp_path / "samples"
    app = subprocess.Popen([sys.executable, "-c", SAMPLER, str(out), str(go), str(stop)])
    other = subprocess.Popen(["sleep", "120"])
    engine = Engine({"shield": ShieldPlugin(system)}, Journal(tmp_path / "state"))
    mine, theirs = (
        f"latencyd-shield/latencyd-app-{app.pid}",
        f"latencyd-shield/latencyd-app-{other.pid}",
    )
    try:
        hold(engine, system, {app.pid: "1"})
        assert cpuset_of(app.pid) == f"/{mine}"
        assert (V1 / mine / "cpuset.cpus").read_text().strip() == "1"
        assert (V1 / mine / "cpuset.mems").read_text() == (V1 / "cpuset.mems").read_text()
        assert os.sched_getaffinity(app.pid) == {1}
        go.touch()
        wait_for(lambda: out.exists() and len(out.read_text().splitlines()) > 2)
        child = int(out.read_text().splitlines()[0].split()[1])
        assert cpuset_of(child) == f"/{mine}"  # born there
        tasks = {int(t) for t in (V1 / mine / "tasks").read_text().split()}
        assert {app.pid, child} <= tasks

        hold(engine, system, {app.pid: "1", other.pid: "1"})  # a second hold starts
        assert cpuset_of(other.pid) == f"/{theirs}"
        assert (V1 / mine / "cpuset.cpus").read_text().strip() == "1"
        assert cpuset_of(app.pid) == cpuset_of(child) == f"/{mine}"
        assert engine.verify() == []
        hold(engine, system, {app.pid: "1"})  # and ends
        assert not (V1 / theirs).exists()
        assert cpuset_of(other.pid) == "/latencyd-housekeeping"
        assert cpuset_of(app.pid) == cpuset_of(child) == f"/{mine}"
        assert (V1 / mine / "cpuset.cpus").read_text().strip() == "1"

        stop.touch()
        app.wait(10)
        samples = out.read_text().splitlines()[1:]
        assert samples and set(samples) == {f"/{mine} 1"}  # not moved, not for a moment
        hold(engine, system, {})  # its hold ends: its own cpuset goes
        assert not (V1 / mine).exists()
    finally:
        for proc in (app, other):
            proc.kill()
            proc.wait()
        assert engine.off() == []
    assert not any(p.is_dir() for p in V1.iterdir())
