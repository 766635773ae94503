"""Issue 19: no D-Bus call waits behind a long change. While a switch narrows 20,000
threads (cpu-partitioning with the affinity shield: a cpuset shield makes the same
switch one move, too short to be caught), `status` and `active` are answered (status
says how far the switch has come), and `off` cancels it: the switch's caller gets a
Cancelled error, nothing of it stays. Shown by the order of replies, never by timing."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import Latencyd, idle_threads, wait_for

THREADS = 20000
CHASE = """[main]
summary = "cpu-partitioning, its shield kept by narrowing each thread"
include = ["cpu-partitioning"]

[shield]
mechanism = "affinity"
"""


@pytest.fixture
def every_cpu() -> set[int]:
    every = os.sched_getaffinity(0)
    if 1 not in every or len(every) < 2:
        pytest.skip("needs CPU 1 and another")
    return every


def in_progress(d: Latencyd) -> dict[str, object] | None:
    r = d.ctl("status", "--json")
    assert r.returncode == 0, r.stderr
    busy = json.loads(r.stdout)["in_progress"]
    assert busy is None or isinstance(busy, dict)
    return busy


@pytest.fixture
def switching(
    start_daemon: Callable[..., Latencyd], every_cpu: set[int], profiles: Path
) -> Iterator[tuple[Latencyd, list[int], subprocess.Popen[str]]]:
    """A daemon, the threads of one process, and a switch to the chase under way."""
    (profiles / "chase.toml").write_text(CHASE)
    with idle_threads(THREADS) as app:
        tids = [int(t) for t in os.listdir(f"/proc/{app.pid}/task")]
        d = start_daemon(None)
        yield d, tids, d.spawn_ctl("switch", "chase")


def test_status_and_active_answer_while_a_20000_thread_switch_runs(
    switching: tuple[Latencyd, list[int], subprocess.Popen[str]], every_cpu: set[int]
) -> None:
    d, tids, switch = switching
    seen: list[dict[str, object]] = []

    def answered_mid_switch() -> bool:
        busy = in_progress(d)
        if busy is not None:
            seen.append(busy)
        return busy is not None

    # status is answered while the switch has not replied yet, and says so
    wait_for(answered_mid_switch)
    assert d.ctl("active").returncode == 0
    assert seen[0]["what"] == "switch to chase"
    _, err = switch.communicate(timeout=120)
    assert switch.returncode == 0, err
    assert in_progress(d) is None
    assert all(os.sched_getaffinity(t) != every_cpu for t in tids[::100])
    assert d.ctl("off").returncode == 0
    assert [t for t in tids if os.sched_getaffinity(t) != every_cpu] == []


def test_off_cancels_a_20000_thread_switch_and_nothing_of_it_stays(
    switching: tuple[Latencyd, list[int], subprocess.Popen[str]], every_cpu: set[int]
) -> None:
    d, tids, switch = switching
    wait_for(lambda: in_progress(d) is not None)
    off = d.ctl("off")  # answered without waiting for the switch to end
    assert off.returncode == 0, off.stderr
    out, err = switch.communicate(timeout=60)
    assert switch.returncode != 0 and "cancelled by off" in err, (out, err)
    assert in_progress(d) is None
    assert d.ctl("active").stdout.strip() == "none (all settings at their originals)"
    assert [t for t in tids if os.sched_getaffinity(t) != every_cpu] == []
    assert "switch to chase: cancelled by off, rolled back" in d.log()
