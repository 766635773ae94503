"""Drift is put back as it happens, with the safety-net tick switched off: settings in
files through inotify, settings in no file (thread affinities) by the 1 s poll."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import Latencyd, wait_for
from tests.loopfs import LoopFs, jbd2_pids

NO_TICK = "verify_interval_s = 0\n"  # only events and the poll of file-less settings

PROFILE = """
[sysctl]
"vm.swappiness" = 11

[writeback]
dirty_bytes = "64M"

[kthread]
writeback_cpumask = "0"

[[kthread.rule]]
match = "^jbd2/"
cpus = "0"
"""


def read(path: str) -> str:
    return Path(path).read_text().strip()


@pytest.fixture
def loopfs(tmp_path: Path) -> Iterator[LoopFs]:
    fs = LoopFs(tmp_path / "loops", 0)
    try:
        yield fs
    finally:
        fs.close()


@pytest.fixture
def kept(start_daemon: Callable[..., Latencyd], profiles: Path) -> Latencyd:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    (profiles / "kept.toml").write_text(PROFILE)
    return start_daemon("kept", config=NO_TICK)


@pytest.mark.parametrize(
    ("path", "rogue", "wanted"),
    [
        ("/proc/sys/vm/swappiness", "42", "11"),
        ("/sys/devices/virtual/workqueue/writeback/cpumask", "3", "1"),
        # The kernel zeroes dirty_bytes when dirty_ratio is written: the pair is one setting.
        ("/proc/sys/vm/dirty_ratio", "20", "0"),
    ],
)
def test_a_rewritten_file_is_put_back_at_once(
    kept: Latencyd, path: str, rogue: str, wanted: str
) -> None:
    Path(path).write_text(rogue)
    wait_for(lambda: read(path) == wanted)
    assert read("/proc/sys/vm/dirty_bytes") == str(64 << 20)
    wait_for(lambda: "reapplied" in kept.log())  # logged after the write


def test_a_moved_thread_is_put_back_by_the_poll(kept: Latencyd, loopfs: LoopFs) -> None:
    loopfs.mount()
    (pid,) = jbd2_pids(loopfs.device)
    wait_for(lambda: os.sched_getaffinity(pid) == {0})
    os.sched_setaffinity(pid, {1})  # what `taskset` (or tuna) by someone else does
    wait_for(lambda: os.sched_getaffinity(pid) == {0})
    line = f"jbd2/{Path(loopfs.device).name}-8 (pid {pid}) CPUs = 0, but it is '1'"
    wait_for(lambda: line in kept.log())  # logged after the write


def test_without_file_less_settings_nothing_polls(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    """The default kind of profile (files only) costs no wake-ups at all while idle."""
    (profiles / "files.toml").write_text('[sysctl]\n"vm.swappiness" = 11\n')
    d = start_daemon("files", config=NO_TICK)
    assert d.proc is not None
    pid = d.proc.pid

    def wakeups() -> int:
        status = Path(f"/proc/{pid}/status").read_text()
        return sum(
            int(line.split()[1])
            for line in status.splitlines()
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
        )

    import time

    time.sleep(0.2)
    before = wakeups()
    time.sleep(1.5)
    assert wakeups() == before
    Path("/proc/sys/vm/swappiness").write_text("42")
    wait_for(lambda: read("/proc/sys/vm/swappiness") == "11")
