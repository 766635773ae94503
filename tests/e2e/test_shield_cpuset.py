"""The cpuset shield through the daemon, on this machine's cgroup v1 cpuset hierarchy: the
application placed by `latencyctl run`, `hold -- CMD` and `[shield] apps`, what status
says of the mechanism, and a daemon killed with -9 whose restart puts everything back
(the e2e guard compares every cpuset and every task's)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from latencyd.cpuset import CpuSet
from latencyd.kernel.system import System
from tests.harness import BIN, Latencyd, sysctl, wait_for, wait_for_child

PROFILE = """
[main]
summary = "shield CPU 1 with a cpuset"

[shield]
cpus = "1"
mechanism = "cpuset"
"""
V1 = Path("/sys/fs/cgroup/cpuset")


@pytest.fixture(autouse=True)
def v1_cpuset() -> None:
    if System().cgroup_facts().v1_cpuset != "sys/fs/cgroup/cpuset":
        pytest.skip("needs the cpuset controller in a v1 hierarchy at /sys/fs/cgroup/cpuset")
    if not {0, 1} <= os.sched_getaffinity(0) or any(p.is_dir() for p in V1.iterdir()):
        pytest.skip("needs CPUs 0 and 1 and a cpuset hierarchy without child cpusets")


def cpuset_of(pid: int) -> str | None:
    return System().task_cgroup(pid)


def status(d: Latencyd) -> dict[str, Any]:
    out = d.ctl("status", "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_run_starts_the_command_inside_the_shield_at_the_policy_asked(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon("shield")
    assert cpuset_of(os.getpid()) == "/latencyd-housekeeping"
    run = d.spawn_ctl("run", "--fifo", "5", "--", "sleep", "30")
    try:
        app = wait_for_child(run.pid, "sleep")
        # in a cpuset of its own inside the shield's, on its hold's CPUs (issue 52)
        own = f"/latencyd-shield/latencyd-app-{run.pid}"
        assert cpuset_of(app) == cpuset_of(run.pid) == own and os.sched_getaffinity(app) == {1}
        assert (V1 / own.lstrip("/") / "cpuset.cpus").read_text().strip() == "1"
        assert os.sched_getscheduler(app) == os.SCHED_FIFO
        assert os.sched_getparam(app).sched_priority == 5
        # Only the command is RT: latencyctl gives its policy back once it has forked.
        wait_for(lambda: os.sched_getscheduler(run.pid) == os.SCHED_OTHER)
        shield = status(d)["plugins"]["shield"]
        mechanism, inside, _ = shield["tables"]
        assert mechanism["rows"][0] == ["cpuset-v1", "in use on /sys/fs/cgroup/cpuset"]
        assert "latencyctl run" in mechanism["title"]  # what to use instead of taskset
        assert [app, "sleep", own] in inside["rows"]
        (held,) = status(d)["holds"]
        assert held["cgroups"] == {str(run.pid): own, str(app): own}
        assert f"tasks {run.pid} in {own}, {app} in {own}" in d.ctl("status").stdout
    finally:
        run.kill()
        run.wait()


def test_a_run_that_ends_gives_its_cpu_back_without_an_error(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    """`run -- CMD` whose command ends (issue 51): the hold's release finds its holder in
    the shield, where the kernel refuses it the housekeeping CPU it had before (EINVAL);
    that is no error of the release, which moves it back to housekeeping."""
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon("shield")
    out = d.ctl("run", "--", "true")
    assert out.returncode == 0, out.stderr
    assert "releasing hold" not in out.stderr, out.stderr
    assert status(d)["last_error"] is None, d.log()
    assert d.ctl("verify").returncode == 0, d.log()


def test_run_refuses_cpus_outside_the_shield_in_words(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon("shield")
    out = d.ctl("run", "--cpus", "0", "--", "true")
    assert out.returncode == 2
    assert "has no isolated_cores variable to give CPUs 0" in out.stderr
    assert "not among the CPUs it shields (1)" in out.stderr
    assert d.ctl("active").stdout.strip() == "shield"  # nothing held


def test_hold_places_its_command_and_apps_are_moved_in_as_they_start(
    start_daemon: Callable[..., Latencyd], profiles: Path, tmp_path: Path
) -> None:
    app = tmp_path / "latencyapp"
    shutil.copy("/bin/sleep", app)
    (profiles / "shield.toml").write_text(PROFILE + 'apps = ["latencyapp"]\n')
    d = start_daemon("shield")
    held = d.spawn_ctl("hold", "shield", "--", "sleep", "30")
    started = subprocess.Popen([str(app), "30"])  # from housekeeping, by name
    other = subprocess.Popen(["sleep", "30"])
    try:
        own = f"/latencyd-shield/latencyd-app-{held.pid}"  # the holder's, inside the shield's
        assert cpuset_of(wait_for_child(held.pid, "sleep")) == own
        wait_for(lambda: cpuset_of(started.pid) == "/latencyd-shield")  # by name
        assert os.sched_getaffinity(started.pid) == {1}
        time.sleep(0.3)
        assert cpuset_of(other.pid) == "/latencyd-housekeeping"
    finally:
        for proc in (held, started, other):
            proc.kill()
            proc.wait()


def test_a_rule_onto_the_shielded_cpu_moves_its_tasks_inside(
    start_daemon: Callable[..., Latencyd], profiles: Path, tmp_path: Path
) -> None:
    """A [[shield.rule]] naming the shielded CPU: the kernel refuses that affinity to a
    task outside the shield's cpuset (EINVAL), so the task is moved inside, at the switch
    and as it execs (measure --attribute --control's hog stayed on housekeeping, unsaid)."""
    app = tmp_path / "ltdrule-app"
    shutil.copy("/bin/sleep", app)
    rule = '[[shield.rule]]\nmatch = "^ltdrule-app$"\ncpus = "1"\n'
    (profiles / "shield.toml").write_text(PROFILE + rule)
    before = subprocess.Popen([str(app), "30"])
    d = start_daemon("shield")
    after = subprocess.Popen(["taskset", "-c", "0", str(app), "30"])  # from housekeeping
    other = subprocess.Popen(["sleep", "30"])
    try:
        for proc in (before, after):
            wait_for(lambda p=proc: cpuset_of(p.pid) == "/latencyd-shield")
            assert os.sched_getaffinity(proc.pid) == {1}
        time.sleep(0.3)
        assert cpuset_of(other.pid) == "/latencyd-housekeeping"
        assert "not applicable" not in d.log(), d.log()
    finally:
        for proc in (before, after, other):
            proc.kill()
            proc.wait()


def test_a_daemon_killed_with_the_shield_up_restores_it_on_restart(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    (profiles / "shield.toml").write_text(PROFILE)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        d = start_daemon("shield")
        assert cpuset_of(victim.pid) == "/latencyd-housekeeping"
        d.kill9()
        assert (V1 / "latencyd-shield").is_dir()  # the kernel keeps it while none watches
        d.profile = None
        d.extra = ["--no-profile"]
        d.start()
        d.stop()
        assert cpuset_of(victim.pid) == "/" and os.sched_getaffinity(victim.pid) == {0, 1}
        assert not any(p.is_dir() for p in V1.iterdir())
    finally:
        victim.kill()
        victim.wait()


# What an application and a housekeeping task are given, as one reading: the
# application's cpuset, its CPUs and its cpuset's CPUs; this test's own cpuset and CPUs.
Reading = tuple[str | None, str, str | None, str | None, str]
# Every CPU but the shielded one (1), as the kernel lists them; read before any shield.
OTHERS = CpuSet(os.sched_getaffinity(0) - {1}).to_list()
HOUSEKEEPING = ("/latencyd-housekeeping", OTHERS)  # this test's own, a task like any other


def cpus_of(pid: int) -> str:
    return CpuSet(os.sched_getaffinity(pid)).to_list()


def reading(app: int, own: str) -> Reading:
    try:
        given: str | None = (V1 / own.lstrip("/") / "cpuset.cpus").read_text().strip()
    except OSError:
        given = None
    me = os.getpid()
    return cpuset_of(app), cpus_of(app), given, cpuset_of(me), cpus_of(me)


@contextlib.contextmanager
def watched(app: int, own: str) -> Iterator[set[Reading]]:
    """Every distinct reading of `app` in its cpuset `own` (and of this test's process,
    on housekeeping), read back over and over, without a pause, while the body runs, and
    once before and after: a move and back, however brief, between two readings is the
    only one this can miss."""
    seen = {reading(app, own)}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.add(reading(app, own))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()
    seen.add(reading(app, own))


def alone(own: str) -> Reading:
    """An application in its cpuset `own` on CPU 1 alone, this test on housekeeping."""
    return own, "1", "1", *HOUSEKEEPING


@contextlib.contextmanager
def application_a(d: Latencyd) -> Iterator[tuple[int, int, str]]:
    """A: `sleep` started by `latencyctl run --profile cpu-partitioning` (HoldAndPlace),
    found in a cpuset of its own on CPU 1: (latencyctl's pid, A's pid, A's cpuset)."""
    run = d.spawn_ctl("run", "--profile", "cpu-partitioning", "--", "sleep", "60")
    try:
        app = wait_for_child(run.pid, "sleep")
        own = f"/latencyd-shield/latencyd-app-{run.pid}"
        assert reading(app, own) == alone(own)
        yield run.pid, app, own
    finally:
        run.kill()
        run.wait()


def test_a_held_application_keeps_its_cpu_and_cpuset_through_another_hold(
    start_daemon: Callable[..., Latencyd], profiles: Path, tmp_path: Path
) -> None:
    """Issue 52: app A started by `run --profile cpu-partitioning` runs on CPU 1 in a
    cpuset of its own inside the shield's; another script's `hold network-latency -- CMD`
    composes with it: A is not moved, its cpuset not changed, and no other task is let
    onto CPU 1, neither while that hold starts, lasts nor ends, read back all along
    (today's main before issue 52: network-latency in force machine-wide, the shield
    gone, A moved to / on CPUs 0-1 and left there after). The other hold's command is an
    application like any other, kept on housekeeping. A hold asking a setting A's hold
    sets otherwise (vm.swappiness 60 against 10) is refused with the reason, nothing
    changed."""
    (profiles / "swap-60.toml").write_text('[sysctl]\n"vm.swappiness" = 60\n')
    d = start_daemon(None)
    with application_a(d) as (holder, app, where):
        inside = tmp_path / "inside"
        script = (
            f"cat /proc/{app}/cpuset > {inside}; "
            f"grep Cpus_allowed_list /proc/{app}/status >> {inside}; "
            f"{BIN / 'latencyctl'} active >> {inside}; "
            f"cat /proc/self/cpuset >> {inside}; "
            f"grep Cpus_allowed_list /proc/self/status >> {inside}"
        )
        with watched(app, where) as seen:
            other = d.ctl("hold", "network-latency", "--", "sh", "-c", script)
        assert other.returncode == 0, other.stderr
        assert inside.read_text().split("\n") == [
            where,
            "Cpus_allowed_list:\t1",
            "cpu-partitioning+network-latency",
            "/latencyd-housekeeping",  # the other hold's command: not on A's CPU
            f"Cpus_allowed_list:\t{OTHERS}",
            "",
        ]
        assert seen == {alone(where)}  # through that hold's start, life and end
        assert d.ctl("active").stdout.strip() == "cpu-partitioning"
        held = status(d)["holds"]  # each hold, its CPUs and its application's tasks
        assert [(h["profile"], h["cpus"]) for h in held] == [("cpu-partitioning", "1")]
        assert holder in held[0]["tasks"] and app in held[0]["tasks"]

        before = sysctl("vm.swappiness")
        with watched(app, where) as seen:
            refused = d.ctl("hold", "swap-60", "--", "true")
        assert refused.returncode == 1
        assert "hold 3 (swap-60) is refused" in refused.stderr
        assert "hold 1 (cpu-partitioning)" in refused.stderr
        assert "[sysctl] vm.swappiness: 60" in refused.stderr and "against 10" in refused.stderr
        assert "latency-performance.toml:" in refused.stderr  # where A's 10 comes from
        assert sysctl("vm.swappiness") == before
        assert seen == {alone(where)}
        assert [h["profile"] for h in status(d)["holds"]] == ["cpu-partitioning"]


@pytest.mark.parametrize(
    "second_by",
    [("run", "--profile", "cpu-partitioning"), ("hold", "cpu-partitioning")],
    ids=["run", "hold"],
)
def test_a_second_application_on_the_shield_has_a_cpuset_of_its_own_and_moves_not_the_first(
    start_daemon: Callable[..., Latencyd], second_by: tuple[str, ...]
) -> None:
    """Issue 52 where one CPU can be shielded (this machine): A by `run --profile
    cpu-partitioning` (HoldAndPlace), then B by `run --profile cpu-partitioning --cpus 1`
    or `hold cpu-partitioning --cpus 1 -- CMD` (HoldAndPlaceOn, the hold naming its
    CPUs): B runs in a cpuset of its own beside A's, both on CPU 1; status shows both
    holds, their CPUs and the cgroup of each of their tasks; A's cpuset, its CPUs and its
    cpuset's CPUs, read back all along B's start, life and end, never change, and no
    other task is let onto CPU 1. B's cpuset goes with its hold. (Holds on disjoint CPUs,
    on a machine with more: tests/vm/test_holds.py.)"""
    d = start_daemon(None)
    second: subprocess.Popen[str] | None = None
    with application_a(d) as (holder, app, mine):
        try:
            with watched(app, mine) as seen:
                second = d.spawn_ctl(*second_by, "--cpus", "1", "--", "sleep", "60")
                other = wait_for_child(second.pid, "sleep")
                theirs = f"/latencyd-shield/latencyd-app-{second.pid}"
                assert reading(other, theirs) == alone(theirs)
                held = status(d)["holds"]
                assert [(h["profile"], h["cpus"]) for h in held] == [("cpu-partitioning", "1")] * 2
                assert [h["cgroups"] for h in held] == [
                    {str(holder): mine, str(app): mine},
                    {str(second.pid): theirs, str(other): theirs},
                ]
                text = d.ctl("status").stdout
                assert f"tasks {second.pid} in {theirs}, {other} in {theirs}" in text
                # latencyctl passes SIGTERM to its command, releases the hold once it ended
                second.terminate()
                _, said = second.communicate(timeout=30)
                assert "releasing hold" not in said, said  # released without an error
        finally:
            if second is not None:
                second.kill()
                second.wait()
        assert seen == {alone(mine)}  # through B's start, life and end
        assert not (V1 / theirs.lstrip("/")).exists()
        held = status(d)["holds"]
        assert [(h["profile"], h["cpus"]) for h in held] == [("cpu-partitioning", "1")]
        assert d.ctl("verify").returncode == 0, d.log()


def test_a_realtime_hold_composes_with_a_cpu_partitioning_one(
    start_daemon: Callable[..., Latencyd], tmp_path: Path
) -> None:
    """Issue 52: an application under realtime beside one under cpu-partitioning. Their
    [[kthread.rule]] lists (realtime's four, cpu-partitioning's one: the same first rule)
    compose where the first matching rule wins, where main refused the second hold as
    "not one list". While both hold, realtime's own rules are in force (ksoftirqd at FIFO
    2); A, under cpu-partitioning, is not moved, read back all along; after, A's profile
    alone."""
    d = start_daemon(None)
    with application_a(d) as (_, app, where):
        seen_in = tmp_path / "seen"
        ksoftirqd = "$(pgrep -x ksoftirqd/0)"
        script = f"{BIN / 'latencyctl'} active > {seen_in}; chrt -p {ksoftirqd} >> {seen_in}"
        with watched(app, where) as seen:
            other = d.ctl("hold", "realtime", "--", "sh", "-c", script)
        assert other.returncode == 0, other.stderr
        active, policy, priority = seen_in.read_text().splitlines()
        assert active == "cpu-partitioning+realtime"
        assert policy.endswith("SCHED_FIFO") and priority.endswith(": 2"), (policy, priority)
        assert seen == {alone(where)}
        assert d.ctl("active").stdout.strip() == "cpu-partitioning"
        assert d.ctl("verify").returncode == 0, d.log()
