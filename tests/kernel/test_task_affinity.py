"""A task's CPUs written only if it still holds what it was judged by (System.set_affinity
with only_from), on a real process: the shield's write must not undo a pin its user made
since (`taskset -c 1 app` starting while the shield handles its exec)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused
from latencyd.kernel.system import System
from tests.harness import wait_for

BOTH = CpuSet({0, 1})


@pytest.fixture
def task() -> Iterator[int]:
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")
    proc = subprocess.Popen(["taskset", "-c", "0,1", "sleep", "60"])
    try:  # taskset's own pin done: it has become sleep
        wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text() == "sleep\n")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_written_when_it_still_holds_what_it_was_judged_by(task: int) -> None:
    assert System().set_affinity(task, CpuSet({0}), only_from=BOTH) is None
    assert os.sched_getaffinity(task) == {0}


def test_left_when_its_user_pinned_it_since(task: int) -> None:
    os.sched_setaffinity(task, {1})  # its user's pin, after the shield read {0, 1}
    assert System().set_affinity(task, CpuSet({0}), only_from=BOTH) == CpuSet({1})
    assert os.sched_getaffinity(task) == {1}


def test_already_as_wanted_is_found_not_written(task: int) -> None:
    os.sched_setaffinity(task, {0})  # born of a narrowed process: carries them already
    assert System().set_affinity(task, CpuSet({0}), only_from=BOTH) == CpuSet({0})
    assert os.sched_getaffinity(task) == {0}


def test_a_task_gone_is_a_refusal_that_says_so(task: int) -> None:
    os.kill(task, 9)
    os.waitpid(task, 0)
    with pytest.raises(KernelRefused, match=f"setting the CPU affinity of pid {task}"):
        System().set_affinity(task, CpuSet({0}), only_from=BOTH)
