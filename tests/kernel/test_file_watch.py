"""The drift watch's file watch on real files, with the real kernel's fanotify (issue
52): a write by another process comes with that process (pid, comm, command line), the
daemon's own writes do not come at all, a file replaced is noticed and watched again,
and without CAP_SYS_ADMIN the watch falls back to inotify, which sees the writes but not
who made them. Files in a private tmpfs directory: no kernel setting is written."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from latencyd.kernel.system import System, Writer
from latencyd.service.watchers import _FAN_READ_ONE, FileWatcher

SHM = Path("/dev/shm")  # tmpfs


@pytest.fixture
def files() -> Iterator[tuple[Path, Path]]:
    with tempfile.TemporaryDirectory(dir=SHM if SHM.is_dir() else None) as d:
        a, b = Path(d, "a"), Path(d, "b")
        a.write_text("0\n")
        b.write_text("0\n")
        yield a, b


@pytest.fixture
def watcher() -> Iterator[FileWatcher]:
    w = FileWatcher(System(Path("/")).writer)
    if not w.names_writers:
        w.close()
        pytest.skip("no fanotify here (needs CAP_SYS_ADMIN)")
    try:
        yield w
    finally:
        w.close()


def written(w: FileWatcher) -> dict[str, Writer | None]:
    """What the watch reports once its fd is readable (a write queues its event before
    write(2) returns: nothing to wait for but the poll)."""
    assert select.select([w.fileno()], [], [], 10)[0], "no event"
    return w.read()


def a_shell_writes(w: FileWatcher, path: Path) -> None:
    """A shell that writes `path` and waits on its stdin (so it is there to be read) is
    what the watch reports, by its pid, comm and command line."""
    child = subprocess.Popen(
        ["sh", "-c", 'echo 1 > "$0"; read x', str(path)], stdin=subprocess.PIPE
    )
    try:
        changed = written(w)
    finally:
        child.communicate(b"\n", timeout=10)
    assert changed == {str(path): Writer(child.pid, "sh", f'sh -c echo 1 > "$0"; read x {path}')}


def test_a_write_names_the_process_that_made_it(
    watcher: FileWatcher, files: tuple[Path, Path]
) -> None:
    a, b = files
    watcher.sync({str(a), str(b)})
    a_shell_writes(watcher, a)
    # The daemon's own writes (its re-applies) are no one's drift: no event at all.
    b.write_text("2\n")
    a.write_text("2\n")
    assert watcher.read() == {}
    # A writer gone before the read is its pid alone.
    gone = subprocess.run(["sh", "-c", 'echo 3 > "$0"', str(b)], check=True)
    assert gone.returncode == 0
    ((path, writer),) = written(watcher).items()
    assert path == str(b) and writer is not None and writer.comm == ""


def test_a_file_replaced_is_watched_again_at_the_next_sync(
    watcher: FileWatcher, files: tuple[Path, Path]
) -> None:
    a, b = files
    watcher.sync({str(a), str(b)})
    a.unlink()  # an IRQ freed: its files end
    assert written(watcher) == {str(a): None}
    assert watcher.stale
    a.write_text("0\n")  # the IRQ back, its files new
    watcher.sync({str(a), str(b)})
    assert not watcher.stale
    a_shell_writes(watcher, a)


FALLBACK = """
import json, select, subprocess, sys
from latencyd.service.watchers import _FAN_READ_ONE, FileWatcher
w = FileWatcher()
w.sync({sys.argv[1]})
subprocess.run(["sh", "-c", 'echo 1 > "$0"', sys.argv[1]], check=True)
select.select([w.fileno()], [], [], 10)
print(json.dumps({"names_writers": w.names_writers, "changed": list(w.read().items())}))
"""


def test_without_cap_sys_admin_inotify_sees_writes_but_not_writers(
    files: tuple[Path, Path],
) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (a watch without CAP_SYS_ADMIN)")
    a, _ = files
    argv = ["setpriv", "--bounding-set", "-sys_admin", sys.executable, "-c", FALLBACK, str(a)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"names_writers": False, "changed": [[str(a), None]]}


def test_read_one_event_at_a_time_as_before_linux_6_13_every_writer_comes(
    watcher: FileWatcher, files: tuple[Path, Path]
) -> None:
    """Without FAN_REPORT_FD_ERROR the watch reads one event per read(2) (an event whose
    fd cannot be opened is otherwise dropped unseen when it is not the read's first): the
    events of several writers still all come, each with its own writer."""
    a, b = files
    watcher.fan_read = _FAN_READ_ONE
    watcher.sync({str(a), str(b)})
    script = 'echo 1 > "$0"; echo 1 > "$1"'
    done = subprocess.run(["sh", "-c", script, str(a), str(b)], check=True)
    assert done.returncode == 0
    changed = written(watcher)
    assert set(changed) == {str(a), str(b)}
    assert all(w is not None and w.pid > 0 for w in changed.values())
