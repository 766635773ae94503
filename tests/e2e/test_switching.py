"""Switching between profiles: every pair of shipped profiles, many clients at once, and a
rejected switch that must leave no trace."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from latencyd.paths import shipped_profiles_dir
from tests.harness import Latencyd, wait_for
from tests.loopfs import LoopFs, jbd2_pids

SHIPPED = sorted(p.stem for p in shipped_profiles_dir().glob("*.toml"))


def test_switch_between_every_pair_of_shipped_profiles_then_off(
    start_daemon: Callable[..., Latencyd],
) -> None:
    """Each ordered pair (a, b) is one step; each step applies and verifies. Switching
    away from a profile that watches devices ([irq], [cstate]) once failed every time."""
    steps = [p for a in SHIPPED for b in SHIPPED if a != b for p in (a, b)]
    d = start_daemon(SHIPPED[0])
    for target in steps:
        r = d.ctl("switch", target, "--json")
        assert r.returncode == 0, (target, r.stderr)
        assert json.loads(r.stdout)["profile"] == target
        v = d.ctl("verify")
        assert v.returncode == 0, (target, v.stdout)
    r = d.ctl("off")
    assert r.returncode == 0, r.stderr
    assert d.ctl("active").stdout.startswith("none")
    assert "Traceback" not in d.log() and "ERROR" not in d.log()


def test_concurrent_clients_all_succeed(start_daemon: Callable[..., Latencyd]) -> None:
    """8 clients switching at once between a device-watching profile and another. Their
    switches run one at a time, in order; client 0's `off` cancels the switches running
    or waiting when it comes (their callers are told so), and nothing else fails."""
    d = start_daemon("network-latency")
    failures: list[str] = []

    def client(index: int) -> None:
        for i in range(12):
            target = "cpu-partitioning" if (index + i) % 2 else "network-latency"
            r = d.ctl("switch", target)
            if r.returncode != 0 and "cancelled by off" not in r.stderr:
                failures.append(f"{target}: {r.returncode} {r.stderr.strip()}")
        r = d.ctl("off") if index == 0 else d.ctl("status")
        if r.returncode != 0:
            failures.append(f"off/status: {r.stderr.strip()}")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert d.ctl("verify").returncode == 0
    assert "Traceback" not in d.log()


PINNED = """
[kthread]
[[kthread.rule]]
match = "^jbd2/"
cpus = "0"
"""

REJECTED = """
[sysctl]
"vm.swappiness" = 500

[kthread]
[[kthread.rule]]
match = "^jbd2/"
cpus = "1"
"""


@pytest.fixture
def loopfs(tmp_path: Path) -> Iterator[LoopFs]:
    fs = LoopFs(tmp_path / "loops", 0)
    try:
        yield fs
    finally:
        fs.close()


def test_a_rejected_switch_leaves_no_trace(
    start_daemon: Callable[..., Latencyd], profiles: Path, loopfs: LoopFs
) -> None:
    """The kernel refuses the new profile's swappiness: the switch is rolled back, and a
    thread created afterwards gets the active profile's rule, not the rejected one's."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    (profiles / "pinned.toml").write_text(PINNED)
    (profiles / "rejected.toml").write_text(REJECTED)
    d = start_daemon("pinned", config="verify_interval_s = 3600\n")  # events only
    r = d.ctl("switch", "rejected")
    assert r.returncode == 1 and "Invalid argument" in r.stderr and "rolled back" in r.stderr
    assert d.ctl("active").stdout.strip() == "pinned"
    loopfs.mount()
    (pid,) = jbd2_pids(loopfs.device)
    wait_for(lambda: os.sched_getaffinity(pid) == {0})
