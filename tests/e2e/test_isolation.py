"""The affinity shield (the chase), as tuna and RedHawk's `shield` keep one: a task also
allowed on housekeeping CPUs is narrowed to them (and logged); a task confined to the
isolated CPUs was put there on purpose and stays, whether it was started before the
profile, after it with plain `taskset`, moved there later, or under `latencyctl hold`.
The cpuset shield is tests/e2e/test_shield_cpuset.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from latencyd.cpuset import CpuSet
from tests.harness import Latencyd, wait_for, wait_for_child
from tests.nobody import cli_as_nobody

PROFILE = """
[main]
summary = "shield CPU 1 from user tasks"

[shield]
cpus = "1"
allow = ["allowed-*"]
mechanism = "affinity"
"""

FORKS_THEN_WAITS = "(while :; do sleep 1; done) & echo $!; wait"


@pytest.fixture
def two_cpus() -> None:
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")


@pytest.fixture
def spawn(two_cpus: None) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Start `sleep` processes (pinned with taskset when CPUs are given); all are killed."""
    started: list[subprocess.Popen[bytes]] = []

    def start(cpus: str | None = None) -> subprocess.Popen[bytes]:
        argv = ["sleep", "300"]
        proc = subprocess.Popen(["taskset", "-c", cpus, *argv] if cpus else argv)
        started.append(proc)
        want = {int(c) for c in cpus.split(",")} if cpus else None
        wait_for(lambda: _comm(proc.pid) == "sleep")  # taskset ran, sleep exec'd
        if want is not None:
            assert os.sched_getaffinity(proc.pid) == want
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


@pytest.fixture
def hog(spawn: Callable[..., subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """A task pinned to CPU 1 before any profile."""
    return spawn("1")


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _status(d: Latencyd) -> dict[str, Any]:
    out = d.ctl("status", "--json")
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def _shielded_pids(d: Latencyd) -> dict[int, str]:
    """pid -> why, from status's table of user tasks on the isolated CPUs."""
    _, table = _status(d)["plugins"]["shield"]["tables"]  # after the mechanism's
    return {row[0]: row[4] for row in table["rows"]}


def test_floating_tasks_are_narrowed_logged_and_given_back(
    start_daemon: Callable[..., Latencyd],
    profiles: Path,
    spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    floating = spawn()  # allowed on every CPU: a hog that could land on CPU 1
    before = os.sched_getaffinity(floating.pid)
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon("shield")
    assert os.sched_getaffinity(floating.pid) == before - {1}
    assert f"(pid {floating.pid}, thread {floating.pid}): CPUs " in d.log()
    applied = [a["text"] for a in _status(d)["plugins"]["shield"]["applied"]]
    narrowed = CpuSet(before - {1})
    assert (
        f"user task sleep (pid {floating.pid}, thread {floating.pid}) CPUs = {narrowed}" in applied
    )
    d.stop()
    assert os.sched_getaffinity(floating.pid) == before


def test_a_task_confined_to_the_isolated_cpus_before_the_profile_stays(
    start_daemon: Callable[..., Latencyd], profiles: Path, hog: subprocess.Popen[bytes]
) -> None:
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon("shield", config="verify_interval_s = 0.2\n")  # rescans every tick
    time.sleep(1.0)
    assert os.sched_getaffinity(hog.pid) == {1}
    assert "on purpose" in _shielded_pids(d)[hog.pid]


def test_an_application_started_with_plain_taskset_after_the_profile_stays(
    start_daemon: Callable[..., Latencyd],
    profiles: Path,
    spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """The issue's case: `taskset -c 1 ./app` after `switch cpu-partitioning` was moved to
    CPU 0 within 2 s, silently; the exec event and the rescans must leave it alone."""
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon("shield", config="verify_interval_s = 0.2\n")
    app = spawn("1")
    time.sleep(2.5)  # task events, and a dozen rescans and drift checks
    assert os.sched_getaffinity(app.pid) == {1}
    assert "on purpose" in _shielded_pids(d)[app.pid]
    d.stop()
    assert os.sched_getaffinity(app.pid) == {1}


def test_a_narrowed_task_moved_back_inside_by_its_user_is_left_there(
    start_daemon: Callable[..., Latencyd],
    profiles: Path,
    spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    """`taskset -p -c 1 PID` on a task the shield narrowed is a deliberate placement: no
    drift put back, and `off` does not spread it over every CPU again."""
    floating = spawn()
    before = os.sched_getaffinity(floating.pid)
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon("shield", config="verify_interval_s = 0.2\n")
    assert os.sched_getaffinity(floating.pid) == before - {1}
    os.sched_setaffinity(floating.pid, {1})
    time.sleep(1.5)  # several drift checks and rescans
    assert os.sched_getaffinity(floating.pid) == {1}
    assert "on purpose" in d.log()
    applied = [a["text"] for a in _status(d)["plugins"]["shield"]["applied"]]
    assert not [a for a in applied if f"(pid {floating.pid}," in a]
    d.stop()
    assert os.sched_getaffinity(floating.pid) == {1}


def test_the_held_application_stays_on_the_isolated_cpu(
    start_daemon: Callable[..., Latencyd],
    profiles: Path,
    spawn: Callable[..., subprocess.Popen[bytes]],
) -> None:
    hog = spawn()  # floating: moved off CPU 1 while the shield holds
    everywhere = os.sched_getaffinity(hog.pid)
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon(None, config="verify_interval_s = 0.2\n")  # rescans too
    # The application pins itself to CPU 1 once started, as a latency-critical one does.
    app = d.spawn_ctl(
        "hold", "shield", "--", "sh", "-c", "taskset -pc 1 $$ >/dev/null; exec sleep 30"
    )
    try:
        wait_for(lambda: os.sched_getaffinity(hog.pid) == everywhere - {1})
        sleep = wait_for_child(app.pid, "sleep")
        time.sleep(1.0)  # events and several rescans later
        assert os.sched_getaffinity(sleep) == {1}
        status = d.ctl("status", "--json").stdout
        assert f'"pid": {app.pid}' in status  # the hold names its holder's process
    finally:
        app.kill()
        app.wait()
    wait_for(lambda: os.sched_getaffinity(hog.pid) == everywhere)  # the hold ended


def test_status_names_the_shields_tasks_and_the_holder_to_root_only(
    start_daemon: Callable[..., Latencyd],
    profiles: Path,
    spawn: Callable[..., subprocess.Popen[bytes]],
    tmp_path: Path,
) -> None:
    """Issue 37: Status to a user neither root nor in the admin group names no task, as
    hidepid would have it: not the tasks the shield moved, not the holder's process; it
    counts them."""
    floating = spawn()
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon(None)
    app = d.spawn_ctl("hold", "shield", "--", "sleep", "30")
    try:
        wait_for(lambda: 1 not in os.sched_getaffinity(floating.pid))
        moved, holder = f"(pid {floating.pid}, thread {floating.pid})", f'"pid": {app.pid}'
        root = d.ctl("status", "--json").stdout
        assert moved in root and holder in root
        out = tmp_path / "status.json"
        assert cli_as_nobody(d.address, "status", "--json", capture=out) == 0, out.read_text()
        shown = out.read_text()
        assert moved not in shown and holder not in shown
        status = json.loads(shown)
        assert status["plugins"]["shield"]["hidden"] >= 1
        assert [(h["pid"], h["owner"]) for h in status["holds"]] == [(None, None)]
        assert cli_as_nobody(d.address, "status", capture=out) == 0
        assert " of tasks: shown to root and the admin group only)" in out.read_text()
    finally:
        app.kill()
        app.wait()


SHELL_THAT_FORKS = """
read go                       # the profile is applied before this shell forks
sleep 300 & echo $!           # a child, born with the narrowed CPUs
read done
"""


def test_children_born_narrowed_get_their_parents_cpus_back(
    start_daemon: Callable[..., Latencyd], profiles: Path, two_cpus: None
) -> None:
    """A process the shield narrowed forks after the switch: its child inherits the
    narrowed CPUs. Off gives the child what the parent gets back, not the housekeeping
    CPUs for ever (a narrowed shell would otherwise leave every later command there)."""
    shell = subprocess.Popen(["sh", "-c", SHELL_THAT_FORKS], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert shell.stdin is not None and shell.stdout is not None
    try:
        before = os.sched_getaffinity(shell.pid)
        assert 1 in before and len(before) > 1
        (profiles / "shield.toml").write_text(PROFILE)
        # No task events: every 0.2 s tick rescans, as the periodic rescan would.
        d = start_daemon("shield", config='verify_interval_s = 0.2\ntask_events = "none"\n')
        assert os.sched_getaffinity(shell.pid) == before - {1}
        shell.stdin.write("go\n")
        shell.stdin.flush()
        child = int(shell.stdout.readline())
        assert os.sched_getaffinity(child) == before - {1}  # born narrowed
        wait_for(lambda: f"pid {child}" in json.dumps(_status(d)["plugins"]["shield"]))
        d.stop()
        assert os.sched_getaffinity(shell.pid) == before
        assert os.sched_getaffinity(child) == before  # given back with its parent's
    finally:
        subprocess.run(["pkill", "-P", str(shell.pid)], check=False)
        shell.kill()
        shell.wait()


def test_children_started_before_their_parent_was_narrowed_are_narrowed_too(
    start_daemon: Callable[..., Latencyd], profiles: Path, two_cpus: None
) -> None:
    """stress-ng forks its workers right after its exec, before the shield has handled
    that exec: they inherited every CPU (forks are not heard of) and one ran on the
    isolated CPU until the next switch. Made certain here by stopping the daemon while
    the process starts and forks; once it runs again, parent and child are narrowed."""
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon("shield")
    assert d.proc is not None
    os.kill(d.proc.pid, signal.SIGSTOP)
    try:
        parent = subprocess.Popen(["taskset", "-c", "0-1", "sh", "-c", FORKS_THEN_WAITS],
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert parent.stdout is not None
        child = int(parent.stdout.readline())  # a subshell: a fork, no exec of its own
        assert os.sched_getaffinity(child) == {0, 1}
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)
    try:
        wait_for(lambda: os.sched_getaffinity(parent.pid) == {0})
        wait_for(lambda: os.sched_getaffinity(child) == {0})  # else: a rescan, 60 s
        moved = f"user task sh (pid {child}, thread {child}): CPUs 0-1 -> 0"
        wait_for(lambda: moved in d.log())  # logged just after the write
    finally:
        subprocess.run(["pkill", "-P", str(child)], check=False)
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()
