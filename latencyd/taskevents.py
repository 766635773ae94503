"""Task events: threads and processes being created, renamed and exiting, as they happen.

Sources, best first:
- perf: a dummy software event with task=1, comm=1 on every CPU, read from the
  mmap ring (20-50 µs after the fork here);
- proc connector: netlink process events, read with a raw socket (pyroute2's
  ProcEventSocket buffers internally, which delayed and lost events under
  select(); one datagram per event needs no buffering);
- none: the plugins' periodic rescan is all there is.
On this kernel a new kthread shows only as a FORK from kthreadd, already named;
older kernels name it later with a COMM event. Consumers handle both.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskEvent:
    kind: str  # "fork" | "comm" | "exit"
    pid: int  # thread group (process) id
    tid: int  # the thread itself
    ppid: int = 0  # fork: the parent process (2 for kernel threads, made by kthreadd)
    time_ns: int = 0  # kernel timestamp (CLOCK_MONOTONIC scale), 0 when unknown
    lost: bool = False  # the source dropped events: consumers should rescan


class TaskSource(Protocol):
    name: str

    def filenos(self) -> list[int]: ...

    def read(self) -> list[TaskEvent]: ...

    def close(self) -> None: ...


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """libperf prints debug lines on stderr while mmapping; keep them out of the journal."""
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class PerfTaskSource:
    name = "perf"

    def __init__(self) -> None:
        import perf

        self._perf: Any = perf
        self.cpus = perf.cpu_map()
        threads = perf.thread_map(-1)
        evsel = perf.evsel(
            type=perf.TYPE_SOFTWARE,
            config=perf.COUNT_SW_DUMMY,
            task=1,
            comm=1,
            mmap=0,
            freq=0,
            # Side-band records (FORK/COMM/EXIT) do not count towards wakeup_events, only
            # samples do; a 1-byte watermark (the same attr field) wakes us on each record.
            watermark=1,
            wakeup_events=1,
            sample_id_all=1,
            sample_type=perf.SAMPLE_TID | perf.SAMPLE_CPU | perf.SAMPLE_TIME,
        )
        evsel.open(cpus=self.cpus, threads=threads)
        self.evlist = perf.evlist(self.cpus, threads)
        self.evlist.add(evsel)
        with _quiet_stderr():
            self.evlist.mmap()
        self._files = self.evlist.get_pollfd()
        self._types = {perf.RECORD_FORK: "fork", perf.RECORD_COMM: "comm", perf.RECORD_EXIT: "exit"}
        self._lost = perf.RECORD_LOST

    def filenos(self) -> list[int]:
        return [f.fileno() for f in self._files]

    def read(self) -> list[TaskEvent]:
        events = []
        for cpu in self.cpus:
            while True:
                ev = self.evlist.read_on_cpu(cpu)
                if ev is None:
                    break
                kind = self._types.get(ev.type)
                if kind == "fork":
                    events.append(TaskEvent("fork", ev.pid, ev.tid, ev.ppid, ev.sample_time))
                elif kind == "comm":
                    events.append(TaskEvent("comm", ev.pid, ev.tid, 0, ev.sample_time))
                elif kind == "exit":
                    events.append(TaskEvent("exit", ev.pid, ev.tid, 0, ev.sample_time))
                elif ev.type == self._lost:
                    events.append(TaskEvent("lost", 0, 0, lost=True))
        return events

    def close(self) -> None:
        self._files = []


# linux/connector.h and linux/cn_proc.h
NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_EVENT_FORK, PROC_EVENT_EXEC, PROC_EVENT_COMM, PROC_EVENT_EXIT = 1, 2, 0x200, 0x80000000
_NLMSG = struct.Struct("=IHHII")
_CN_MSG = struct.Struct("=IIIIHH")
_EVENT_HEAD = struct.Struct("=IIQ")
_FOUR = struct.Struct("=IIII")


def parse_proc_event(data: bytes) -> TaskEvent | None:
    """One netlink datagram from the proc connector -> a TaskEvent (None for other kinds)."""
    offset = _NLMSG.size + _CN_MSG.size
    if len(data) < offset + _EVENT_HEAD.size:
        return None
    what, _cpu, ts = _EVENT_HEAD.unpack_from(data, offset)
    body = offset + _EVENT_HEAD.size
    if what == PROC_EVENT_FORK:
        _ppid, ptgid, child_pid, child_tgid = _FOUR.unpack_from(data, body)
        return TaskEvent("fork", child_tgid, child_pid, ptgid, ts)
    if what in (PROC_EVENT_EXEC, PROC_EVENT_COMM):
        tid, tgid = struct.unpack_from("=II", data, body)
        return TaskEvent("comm", tgid, tid, 0, ts)
    if what == PROC_EVENT_EXIT:
        tid, tgid = struct.unpack_from("=II", data, body)
        return TaskEvent("exit", tgid, tid, 0, ts)
    return None


class ProcConnectorSource:
    name = "proc-connector"

    def __init__(self) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            sock.bind((0, CN_IDX_PROC))  # 0: the kernel picks a unique port id
            op = struct.pack("=I", PROC_CN_MCAST_LISTEN)
            cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(op), 0)
            msg = cn + op
            sock.send(_NLMSG.pack(_NLMSG.size + len(msg), 3, 0, 0, os.getpid()) + msg)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self.sock = sock

    def filenos(self) -> list[int]:
        return [self.sock.fileno()]

    def read(self) -> list[TaskEvent]:
        events: list[TaskEvent] = []
        while True:
            try:
                data = self.sock.recv(256)
            except BlockingIOError:
                return events
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:  # the kernel dropped events: rescan
                    events.append(TaskEvent("lost", 0, 0, lost=True))
                    continue
                raise
            event = parse_proc_event(data)
            if event is not None:
                events.append(event)

    def close(self) -> None:
        self.sock.close()


def open_task_source(preference: str = "auto") -> TaskSource | None:
    """The best available source: "auto" tries perf then the proc connector; "none" opts out."""
    order = {
        "auto": ["perf", "proc-connector"],
        "perf": ["perf"],
        "proc-connector": ["proc-connector"],
        "none": [],
    }[preference]
    for name in order:
        try:
            if name == "perf":
                return PerfTaskSource()
            return ProcConnectorSource()
        except ImportError as exc:
            log.info("task events: perf python bindings not importable (%s)", exc)
        except OSError as exc:
            log.info("task events: %s unavailable (%s)", name, exc)
    return None
