"""Proc-connector datagrams -> TaskEvents, on hand-built netlink messages."""

from __future__ import annotations

import errno
import struct

import pytest

from latencyd.service.taskevents import (
    CN_IDX_PROC,
    CN_VAL_PROC,
    PROC_EVENT_COMM,
    PROC_EVENT_EXEC,
    PROC_EVENT_EXIT,
    PROC_EVENT_FORK,
    ProcConnectorSource,
    TaskEvent,
    parse_proc_event,
)

NLMSG_DONE = 3
TS = 123_456_789_012  # ns since boot
PROC_EVENT_UID, PROC_EVENT_SID = 0x4, 0x80


def datagram(what: int, body: bytes, cpu: int = 3, ts: int = TS) -> bytes:
    """nlmsghdr + cn_msg + proc_event, laid out as linux/netlink.h, connector.h, cn_proc.h."""
    event = struct.pack("=IIQ", what, cpu, ts) + body  # what, cpu, timestamp_ns, union
    cn = struct.pack("=IIIIHH", CN_IDX_PROC, CN_VAL_PROC, 7, 0, len(event), 0) + event
    return struct.pack("=IHHII", 16 + len(cn), NLMSG_DONE, 0, 7, 0) + cn


def fork(parent_pid: int, parent_tgid: int, child_pid: int, child_tgid: int) -> bytes:
    return datagram(
        PROC_EVENT_FORK, struct.pack("=IIII", parent_pid, parent_tgid, child_pid, child_tgid)
    )


def test_header_sizes_match_the_kernel() -> None:
    assert len(datagram(PROC_EVENT_FORK, b"")) == 16 + 20 + 16


def test_fork_of_a_kernel_thread() -> None:
    assert parse_proc_event(fork(2, 2, 1234, 1234)) == TaskEvent("fork", 1234, 1234, 2, TS)


def test_fork_of_a_thread_names_process_and_thread() -> None:
    # Thread 401 of process 400 creates thread 405 in the same process.
    assert parse_proc_event(fork(401, 400, 405, 400)) == TaskEvent("fork", 400, 405, 400, TS)


def test_exec_is_reported_as_comm() -> None:
    data = datagram(PROC_EVENT_EXEC, struct.pack("=II", 501, 500))
    assert parse_proc_event(data) == TaskEvent("comm", 500, 501, 0, TS)


def test_comm() -> None:
    body = struct.pack("=II16s", 77, 77, b"kworker/0:1H")
    assert parse_proc_event(datagram(PROC_EVENT_COMM, body, ts=5)) == TaskEvent(
        "comm", 77, 77, 0, 5
    )


def test_exit() -> None:
    body = struct.pack("=IIIIII", 402, 400, 0, 17, 1, 1)  # pid tgid code signal parent
    assert parse_proc_event(datagram(PROC_EVENT_EXIT, body)) == TaskEvent("exit", 400, 402, 0, TS)


@pytest.mark.parametrize("what", [0, PROC_EVENT_UID, PROC_EVENT_SID, 0x12345])
def test_other_kinds_are_ignored(what: int) -> None:
    # 0 is PROC_EVENT_NONE: the kernel's acknowledgement of the listen request.
    assert parse_proc_event(datagram(what, struct.pack("=IIII", 1, 2, 3, 4))) is None


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\0" * 16,  # a bare nlmsghdr
        fork(2, 2, 9, 9)[: 16 + 20 + 15],  # the event header cut short
        fork(2, 2, 9, 9)[:-4],  # the fork body cut short
        datagram(PROC_EVENT_EXIT, b"\1\0\0\0"),
        datagram(PROC_EVENT_COMM, b""),
    ],
)
def test_too_short_is_none(data: bytes) -> None:
    assert parse_proc_event(data) is None


class FakeSocket:
    """recv() hands out queued datagrams or raises queued errors, then would block."""

    def __init__(self, items: list[bytes | OSError]) -> None:
        self.items = items
        self.closed = False

    def recv(self, size: int) -> bytes:
        if not self.items:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        item = self.items.pop(0)
        if isinstance(item, OSError):
            raise item
        return item[:size]

    def fileno(self) -> int:
        return 99

    def close(self) -> None:
        self.closed = True


def test_proc_connector_read_drains_the_socket() -> None:
    source = ProcConnectorSource.__new__(ProcConnectorSource)
    sock = FakeSocket(
        [
            datagram(0, b""),  # the listen ack: skipped
            fork(2, 2, 30, 30),
            OSError(errno.ENOBUFS, "No buffer space available"),  # the kernel dropped some
            datagram(PROC_EVENT_EXIT, struct.pack("=IIII", 30, 30, 0, 0)),
        ]
    )
    source.sock = sock  # type: ignore[assignment]
    assert source.filenos() == [99]
    assert source.read() == [
        TaskEvent("fork", 30, 30, 2, TS),
        TaskEvent("lost", 0, 0, lost=True),
        TaskEvent("exit", 30, 30, 0, TS),
    ]
    assert source.read() == []
    sock.items.append(OSError(errno.EBADF, "Bad file descriptor"))
    with pytest.raises(OSError):
        source.read()
    source.close()
    assert sock.closed
