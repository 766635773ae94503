"""The guard that ends what a killed measurement run started, on real processes (no kernel
setting is touched; namespaces are covered end to end in tests/e2e/test_measure.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from latencyd.tools.runguard import Guard, Leftovers, end_groups
from tests.harness import wait_for


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def detached(tmp_path: Path, script: str) -> int:
    """A process group outside this process tree (reaped by init, as a killed run's are),
    of a shell running `script` and a sleep; returns it once the script has started."""
    pidfile = tmp_path / f"pid-{len(list(tmp_path.glob('pid-*')))}"
    cmd = f"{script}; echo $$ > {pidfile}.new; mv {pidfile}.new {pidfile}; sleep 300 & wait"
    subprocess.run(["setsid", "-f", "sh", "-c", cmd], check=True)
    wait_for(pidfile.exists, timeout=10)
    return int(pidfile.read_text())


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[int]:
    pgid = detached(tmp_path, ":")
    yield pgid
    if group_alive(pgid):
        os.killpg(pgid, 9)


def test_leftovers_follow_what_the_run_said() -> None:
    left = Leftovers()
    for line in ["group 10 3.0\n", "group 11 60\n", "netns ltdm-1-s\n", "ended 10\n",
                 "path /tmp/latencyd-measure-1-x\n", "ended 99\n"]:  # fmt: skip
        left.read(line)
    assert left.groups == {11: 60.0}
    assert left.netns == ["ltdm-1-s"]
    assert left.paths == [Path("/tmp/latencyd-measure-1-x")]
    assert not left.done
    left.read("done\n")
    assert left.done


def test_end_groups_ends_a_whole_group_and_kills_one_that_ignores_sigterm(
    tmp_path: Path,
) -> None:
    stubborn = detached(tmp_path, "trap '' TERM")
    polite = detached(tmp_path, ":")
    try:
        ended = end_groups({stubborn: 0.5, polite: 30.0, 2**22 + 7: 1.0}, reap=10)
        assert sorted(ended) == sorted([stubborn, polite])  # the unknown one was not live
        assert not group_alive(stubborn) and not group_alive(polite)
    finally:
        for pgid in (stubborn, polite):
            if group_alive(pgid):
                os.killpg(pgid, 9)


def test_a_run_that_finishes_leaves_its_groups_to_itself(sleeper: int) -> None:
    guard = Guard()
    guard.group(sleeper, 0.0)
    guard.done()
    assert guard.proc.returncode == 0
    assert group_alive(sleeper)


def test_a_run_that_dies_has_its_groups_and_directories_ended(sleeper: int, tmp_path: Path) -> None:
    workdir = tmp_path / "latencyd-measure-1-x"
    (workdir / "sub").mkdir(parents=True)
    guard = Guard()
    guard.group(sleeper, 30.0)  # a SIGTERM ends it: the guard returns long before
    guard.path(workdir)
    os.close(guard._write)  # as the kernel does when the run dies, whatever killed it
    assert guard.proc.wait(20) == 0
    assert not group_alive(sleeper)
    assert not workdir.exists()


def test_a_run_whose_guard_was_killed_goes_on(sleeper: int) -> None:
    guard = Guard()
    assert guard.proc is not None
    guard.proc.kill()
    guard.proc.wait()
    guard.group(sleeper, 3.0)  # no BrokenPipeError
    guard.ended(sleeper)
    guard.done()
    assert group_alive(sleeper)


def test_a_guard_that_does_not_watch_starts_nothing(sleeper: int) -> None:
    guard = Guard(watch=False)
    assert guard.proc is None
    guard.group(sleeper, 0.0)
    guard.done()
    assert group_alive(sleeper)
