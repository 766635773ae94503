"""Shielding CPUs from user tasks: tasks already running on the isolated CPUs are moved
off, and the application started with `latencyctl hold PROFILE -- app` stays there."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import Latencyd, wait_for

PROFILE = """
[main]
summary = "shield CPU 1 from user tasks"

[kthread]
isolate_tasks = "1"
allow = ["allowed-*"]
"""


@pytest.fixture
def hog() -> Iterator[subprocess.Popen[bytes]]:
    """A task pinned to CPU 1 before any profile (a CPU hog would do the same)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    proc = subprocess.Popen(["taskset", "-c", "1", "sleep", "300"])
    wait_for(lambda: os.sched_getaffinity(proc.pid) == {1}, timeout=2)
    yield proc
    proc.kill()
    proc.wait()


def test_tasks_already_running_are_moved_off_and_given_back(
    start_daemon: Callable[..., Latencyd], profiles: Path, hog: subprocess.Popen[bytes]
) -> None:
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon("shield")
    assert os.sched_getaffinity(hog.pid) == {0}
    d.stop()
    assert os.sched_getaffinity(hog.pid) == {1}


def test_the_held_application_stays_on_the_isolated_cpu(
    start_daemon: Callable[..., Latencyd], profiles: Path, hog: subprocess.Popen[bytes]
) -> None:
    (profiles / "shield.toml").write_text(PROFILE)
    d = start_daemon(None, config="verify_interval_s = 0.2\n")  # rescans too
    # The application pins itself to CPU 1 once started, as a latency-critical one does.
    app = d.spawn_ctl(
        "hold", "shield", "--", "sh", "-c", "taskset -pc 1 $$ >/dev/null; exec sleep 30"
    )
    try:
        wait_for(lambda: os.sched_getaffinity(hog.pid) == {0}, timeout=5)  # the hog moved
        sleep = wait_for_child(app.pid, "sleep")
        time.sleep(1.0)  # events and several rescans later
        assert os.sched_getaffinity(sleep) == {1}
        status = d.ctl("status", "--json").stdout
        assert f'"pid": {app.pid}' in status  # the hold names its holder's process
    finally:
        app.kill()
        app.wait()
    wait_for(lambda: os.sched_getaffinity(hog.pid) == {1}, timeout=5)  # the hold ended


def wait_for_child(parent: int, comm: str) -> int:
    found: list[int] = []

    def child() -> bool:
        out = subprocess.run(["pgrep", "-P", str(parent), "-x", comm], capture_output=True,
                             text=True).stdout.split()  # fmt: skip
        found[:] = [int(p) for p in out]
        return bool(found)

    wait_for(child, timeout=5)
    return found[0]
