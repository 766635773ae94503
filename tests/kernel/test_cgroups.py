"""The system facade's cgroup operations on this machine's v1 cpuset hierarchy: a cgroup
made, a task moved in and out (its own affinity given back by the kernel), a cgroup with
tasks in it removed by moving them to the parent first."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from latencyd.errors import KernelRefused
from latencyd.kernel.cgroups import HOUSEKEEPING
from latencyd.kernel.system import System
from tests.harness import wait_for

V1 = "sys/fs/cgroup/cpuset"
GROUP = f"{V1}/{HOUSEKEEPING}"


@pytest.fixture
def v1() -> Iterator[System]:
    system = System()
    if system.cgroup_facts().v1_cpuset != V1 or not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs the cpuset controller in a v1 hierarchy at /sys/fs/cgroup/cpuset")
    if Path("/", GROUP).exists():
        pytest.skip(f"/{GROUP} exists already: not this test's to touch")
    try:
        yield system
    finally:
        if Path("/", GROUP).exists():
            system.remove_cgroup(GROUP)


def test_a_task_moved_into_a_cpuset_and_back_keeps_its_own_affinity(v1: System) -> None:
    v1.make_cgroup(GROUP)
    v1.write(f"{GROUP}/cpuset.cpus", "0")
    v1.write(f"{GROUP}/cpuset.mems", v1.read(f"{V1}/cpuset.effective_mems"))
    pinned = subprocess.Popen(["taskset", "-c", "1", "sleep", "60"])
    try:
        _wait_exec(pinned.pid)
        v1.write(f"{GROUP}/cgroup.procs", str(pinned.pid))
        assert v1.task_cgroup(pinned.pid) == f"/{HOUSEKEEPING}"
        assert os.sched_getaffinity(pinned.pid) == {0}
        with pytest.raises(OSError):  # outside its cpuset: EINVAL
            os.sched_setaffinity(pinned.pid, {1})
        v1.write(f"{V1}/cgroup.procs", str(pinned.pid))
        assert v1.task_cgroup(pinned.pid) == "/"
        assert os.sched_getaffinity(pinned.pid) == {1}  # its user's, from the kernel
    finally:
        pinned.kill()
        pinned.wait()


def test_removing_a_cgroup_moves_its_tasks_to_the_parent(v1: System) -> None:
    v1.make_cgroup(GROUP)
    v1.write(f"{GROUP}/cpuset.cpus", "0")
    v1.write(f"{GROUP}/cpuset.mems", v1.read(f"{V1}/cpuset.effective_mems"))
    task = subprocess.Popen(["sleep", "60"])
    try:
        v1.write(f"{GROUP}/cgroup.procs", str(task.pid))
        v1.remove_cgroup(GROUP)
        assert not Path("/", GROUP).exists()
        assert v1.task_cgroup(task.pid) == "/"
        assert os.sched_getaffinity(task.pid) == {0, 1}
    finally:
        task.kill()
        task.wait()


def test_a_cgroup_whose_tasks_fork_all_along_is_removed(v1: System) -> None:
    """Four shells in the cgroup, each forking and exiting children without pause (the
    housekeeping cpuset of a busy machine: builds, CI jobs): every round of moves leaves
    children born meanwhile, and exiting ones that cannot be moved; the cgroup is still
    removed, and every task of the storm ends up in the parent."""
    v1.make_cgroup(GROUP)
    v1.write(f"{GROUP}/cpuset.cpus", "0")
    v1.write(f"{GROUP}/cpuset.mems", v1.read(f"{V1}/cpuset.effective_mems"))
    storm = [
        subprocess.Popen(["sh", "-c", "while :; do /bin/true; sh -c /bin/true; done"])
        for _ in range(4)
    ]
    try:
        for shell in storm:
            v1.write(f"{GROUP}/cgroup.procs", str(shell.pid))
        v1.remove_cgroup(GROUP)
        assert not Path("/", GROUP).exists()
        assert {v1.task_cgroup(shell.pid) for shell in storm} == {"/"}
    finally:
        for shell in storm:
            shell.kill()
            shell.wait()


def test_only_cgroups_below_a_hierarchy_are_made_or_removed(v1: System) -> None:
    for where in ("sys/fs/cgroup/cpuset", "sys/fs/cgroup/../../etc/x", "proc/x/y/z/w"):
        with pytest.raises(KernelRefused, match="not a cgroup under /sys/fs/cgroup"):
            v1.remove_cgroup(where)
        with pytest.raises(KernelRefused, match="not a cgroup under /sys/fs/cgroup"):
            v1.make_cgroup(where)


def _wait_exec(pid: int) -> None:
    wait_for(lambda: Path(f"/proc/{pid}/comm").read_text() == "sleep\n")
