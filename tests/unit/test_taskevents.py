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
    READ_BUDGET,
    ProcConnectorSource,
    RescanPace,
    TaskEvent,
    coalesce,
    kernel_filter,
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


def test_a_read_takes_at_most_its_budget_and_leaves_the_rest() -> None:
    # A flood faster than the daemon: the socket is never empty, the read still returns.
    source = ProcConnectorSource.__new__(ProcConnectorSource)
    source.sock = FakeSocket([fork(2, 2, 100 + n, 100 + n) for n in range(10)])  # type: ignore[assignment]
    assert [e.pid for e in source.read(4)] == [100, 101, 102, 103]
    assert [e.pid for e in source.read(100)] == list(range(104, 110))
    assert source.read(100) == []


def test_an_overflow_counts_against_the_budget() -> None:
    source = ProcConnectorSource.__new__(ProcConnectorSource)
    overflows: list[bytes | OSError] = [OSError(errno.ENOBUFS, "No buffer space")] * 5
    source.sock = FakeSocket(overflows)  # type: ignore[assignment]
    assert len(source.read(3)) == 3
    assert len(source.read(3)) == 2


def test_coalesce_keeps_one_event_per_task_and_kind_in_order() -> None:
    events = [
        TaskEvent("comm", 7, 7, 0, 1),
        TaskEvent("fork", 9, 9, 2, 2),
        TaskEvent("comm", 7, 7, 0, 3),  # the same process renamed again
        TaskEvent("comm", 7, 8, 0, 4),  # another of its threads
        TaskEvent("lost", 0, 0, lost=True),
        TaskEvent("comm", 7, 7, 0, 5),
        TaskEvent("lost", 0, 0, lost=True),
    ]
    assert coalesce(events) == [
        TaskEvent("comm", 7, 7, 0, 1),
        TaskEvent("fork", 9, 9, 2, 2),
        TaskEvent("comm", 7, 8, 0, 4),
        TaskEvent("lost", 0, 0, lost=True),
    ]
    flood = [TaskEvent("comm", 7, 7, 0, n) for n in range(READ_BUDGET)]
    assert coalesce(flood) == [TaskEvent("comm", 7, 7, 0, 0)]


def test_rescans_are_paced() -> None:
    pace = RescanPace(min_gap_s=1.0, max_share=0.1)
    assert pace.wait(100.0) == 0.0  # the first runs at once
    pace.ran(100.0, 100.05)  # a short one: the minimum gap
    assert pace.wait(100.5) == pytest.approx(0.55)
    assert pace.wait(101.05) == 0.0
    pace.ran(200.0, 202.0)  # 2 s of rescan: 18 s until the next, 10 % of the time
    assert pace.wait(202.0) == pytest.approx(18.0)
    assert pace.wait(220.0) == 0.0


def run_filter(prog: list[tuple[int, int, int, int]], packet: bytes) -> int:
    """The classic BPF the program uses (ld word abs, jeq k, ret k), run on a datagram as
    the kernel runs it: word loads in network order. Returns what the program returns."""
    pc = acc = 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = int.from_bytes(packet[k : k + 4], "big")
            pc += 1
        elif code == 0x15:  # BPF_JMP | BPF_JEQ | BPF_K
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"instruction {code:#x} not modelled")


@pytest.mark.parametrize("execs", [True, False])
@pytest.mark.parametrize("renames", [True, False])
def test_kernel_filter_keeps_what_is_followed(execs: bool, renames: bool) -> None:
    prog = kernel_filter(execs, renames)
    kept = {
        "kthread fork": fork(2, 2, 50, 50),
        "user fork": fork(300, 300, 301, 301),
        "exec": datagram(PROC_EVENT_EXEC, struct.pack("=II", 301, 301)),
        "rename": datagram(PROC_EVENT_COMM, struct.pack("=II16s", 301, 301, b"x")),
        "exit": datagram(PROC_EVENT_EXIT, struct.pack("=IIIIII", 301, 301, 0, 0, 300, 300)),
        "uid": datagram(PROC_EVENT_UID, struct.pack("=IIII", 301, 301, 0, 0)),
    }
    expected = (
        {"kthread fork"} | ({"exec"} if execs else set()) | ({"rename"} if renames else set())
    )
    assert {what for what, packet in kept.items() if run_filter(prog, packet)} == expected
