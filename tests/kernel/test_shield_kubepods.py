"""The cpuset shield beside a kubelet's pod cpusets (cgroup v1, as a kubelet with the
cgroupfs driver makes them: kubepods/ and a pod's cpuset below it): a pod's task is
never moved or narrowed behind the kubelet's back, and the kernel's refusal of an
exclusive shield on CPUs the kubelet's cpuset holds is said with whose they are (v1
exclusive cpusets share no CPU with a sibling; the kernel says only EINVAL).
kernel_guard compares every cpuset and every task's, after the test's own cpusets are
gone."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from latencyd.plugins.shield import ShieldPlugin

from latencyd.core.engine import Engine
from latencyd.core.journal import Journal
from latencyd.kernel.system import System
from tests.harness import wait_for
from tests.kernel.test_shield_cpuset import V1, cpuset_of, shield
from tests.kernel.test_shield_cpuset import system as system  # the fixture: v1, no children

pytestmark = pytest.mark.usefixtures("kernel_guard")


@pytest.fixture
def pod_task() -> Iterator[int]:
    """A task in a pod's cpuset, as the kubelet would have put it (all CPUs: no static
    CPU manager)."""
    cpus, mems = (V1 / "cpuset.cpus").read_text(), (V1 / "cpuset.mems").read_text()
    made = [V1 / "kubepods", V1 / "kubepods" / "pod1234-abcd"]
    for d in made:
        d.mkdir()
        (d / "cpuset.cpus").write_text(cpus)
        (d / "cpuset.mems").write_text(mems)
    proc = subprocess.Popen(["sleep", "120"])
    try:
        wait_for(lambda: Path(f"/proc/{proc.pid}/comm").read_text() == "sleep\n")
        (made[-1] / "tasks").write_text(str(proc.pid))
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        wait_for(lambda: not (made[-1] / "tasks").read_text().strip())
        for d in reversed(made):
            d.rmdir()


def test_a_pods_task_stays_where_the_kubelet_put_it(
    system: System, pod_task: int, tmp_path: Path
) -> None:
    before = os.sched_getaffinity(pod_task)
    engine = Engine({"shield": ShieldPlugin(system)}, Journal(tmp_path / "state"))
    try:
        shield(system, engine)
        assert cpuset_of(pod_task) == "/kubepods/pod1234-abcd"
        assert os.sched_getaffinity(pod_task) == before
        # v1 refuses an exclusive shield on a CPU the kubelet's cpuset has: said, with
        # whose cpuset it is, and not mended by moving the pod
        # (Other tasks' entries may be there too: a task of a busy machine that exited
        # while the shield narrowed it is one. CI's run of 2026-11-29 had two.)
        reasons = [na.reason for na in engine.not_applicable.values()]
        (refused,) = [r for r in reasons if "/kubepods" in r] or [reasons]
        assert "also in /kubepods (kubelet (pod cgroup /kubepods): CPUs 0-1)" in refused
        assert 'mechanism = "affinity"' in refused
        assert not (V1 / "latencyd-shield").exists()  # none half made
    finally:
        assert engine.off() == []
    assert cpuset_of(pod_task) == "/kubepods/pod1234-abcd"
    assert os.sched_getaffinity(pod_task) == before
