"""The proc connector's socket filter, run by the real kernel (issue 50): renames reach
the daemon only when a section follows them, execs only when asked for, user forks and
exits never. A rename loop by any user then costs a daemon that follows none nothing."""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Iterator

import pytest

from latencyd.core.plugin import TaskEvent
from latencyd.service.taskevents import ProcConnectorSource
from tests.nobody import PR_SET_NAME

RENAMES = 50


@pytest.fixture
def sources() -> Iterator[tuple[ProcConnectorSource, ProcConnectorSource]]:
    """(renames followed, execs not), (execs followed, renames not)."""
    try:
        renames = ProcConnectorSource(user_execs=False, renames=True)
    except OSError as exc:
        pytest.skip(f"no proc connector here: {exc}")
    execs = ProcConnectorSource(user_execs=True, renames=False)
    try:
        yield renames, execs
    finally:
        renames.close()
        execs.close()


def everything(source: ProcConnectorSource) -> list[TaskEvent]:
    """What the socket holds (the kernel queues each event in the sender's context: once
    the child is reaped, all of its are there)."""
    events: list[TaskEvent] = []
    while batch := source.read():
        events += batch
    return events


def test_renames_and_execs_reach_the_socket_only_when_followed(
    sources: tuple[ProcConnectorSource, ProcConnectorSource],
) -> None:
    renames, execs = sources
    true = shutil.which("true") or "/bin/true"
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.fork()
    if pid == 0:
        try:
            for n in range(RENAMES):
                libc.prctl(PR_SET_NAME, f"renamed-{n}".encode())
            os.execv(true, [true])
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    heard = everything(renames)
    told = everything(execs)
    # A rename and an exec are both a "comm" event to the daemon (the task's name changed).
    assert [e for e in heard if e.pid == pid] == [TaskEvent("comm", pid, pid, 0, e.time_ns)
                                                  for e in heard if e.pid == pid]  # fmt: skip
    assert len([e for e in heard if e.pid == pid]) == RENAMES  # no fork, no exec, no exit
    assert [(e.kind, e.pid) for e in told if e.pid == pid] == [("comm", pid)]  # the exec only
    # The child's fork (by this process, not kthreadd) and its exit reached neither.
    assert not [e for e in heard + told if e.kind in ("fork", "exit") and e.pid == pid]
