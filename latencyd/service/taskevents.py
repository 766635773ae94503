"""Task events: threads and processes being created, renamed and exiting, as they happen.

Sources, best first (measured with bench/kthread.py, see bench/README.md):
- proc connector: netlink process events on a raw socket with a classic-BPF socket
  filter, so the kernel drops what we do not need (user forks, exits, renames no
  section follows) before it wakes us: a fork storm or a rename loop costs the daemon
  ~0 CPU. (pyroute2's ProcEventSocket
  buffers internally, which delayed and lost events under select(); one datagram
  per event needs no buffering.)
- perf: a dummy software event with task=1, comm=1 on every CPU, read from the
  mmap ring. Delivery is faster (20-50 µs after the fork) but perf cannot filter
  side-band records, so every fork, exec, rename and exit on the machine wakes the
  daemon (~90 µs of daemon CPU per user fork+exec here).
Either way a read takes at most READ_BUDGET records: whatever comes faster than the
daemon handles it waits for the next turn of the main loop, after D-Bus's.
- none: the plugins' periodic rescan is all there is.
On this kernel a new kthread shows only as a FORK from kthreadd, already named;
older kernels name it later with a COMM event. Consumers handle both.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from latencyd.core.plugin import TaskEvent

log = logging.getLogger(__name__)


# Records read per wake-up at most: the rest waits for the next turn of the main loop,
# which gives D-Bus its own first (a rename flood must not keep `off` from an answer).
READ_BUDGET = 256


# Rescans after lost events: at least this long apart, and the daemon's time spent in
# them kept to this share (a 2 s rescan of 50,000 tasks waits 18 s for the next).
RESCAN_MIN_GAP_S = 1.0
RESCAN_MAX_SHARE = 0.1


@dataclass
class RescanPace:
    """When the next rescan may run. A source that overflows asks for one each time (a
    flood can overflow it a hundred times a second); each is a walk of every task on the
    machine, so they are coalesced: asked for early, one runs when its turn comes."""

    min_gap_s: float = RESCAN_MIN_GAP_S
    max_share: float = RESCAN_MAX_SHARE
    next_at: float = float("-inf")

    def wait(self, now: float) -> float:
        """Seconds from `now` until a rescan may run (0: now)."""
        return max(0.0, self.next_at - now)

    def ran(self, started: float, ended: float) -> None:
        took = max(0.0, ended - started)
        self.next_at = ended + max(self.min_gap_s, took * (1 / self.max_share - 1))


class TaskSource(Protocol):
    name: str

    def filenos(self) -> list[int]: ...

    def read(self, budget: int = READ_BUDGET) -> list[TaskEvent]: ...

    def close(self) -> None: ...


def coalesce(events: list[TaskEvent]) -> list[TaskEvent]:
    """One event per task and kind in a batch: the consumers read the task as it is when
    they handle the batch, so a task renamed 256 times asks for what one rename asks
    (a process renaming itself in a loop costs one look per wake-up). Order is kept, by
    first occurrence; "lost" events become one."""
    seen: set[tuple[str, int, int]] = set()
    out: list[TaskEvent] = []
    for event in events:
        key = ("lost", 0, 0) if event.lost else (event.kind, event.pid, event.tid)
        if key not in seen:
            seen.add(key)
            out.append(event)
    return out


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
        self.clock_offset_ns = 0
        self.clock_offset_ns = self._calibrate()

    def _calibrate(self) -> int:
        """perf stamps records with its own clock (local_clock), not CLOCK_MONOTONIC, and
        this binding cannot ask for another clockid. Measure the offset with a few forks
        of our own (the error is about the fork's duration, ~0.1 ms) so event-to-pinned
        delays are in CLOCK_MONOTONIC like everything else."""
        offsets = []
        for _ in range(3):
            before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            os.waitpid(pid, 0)
            for ev in self.read():
                if ev.kind == "fork" and ev.pid == pid:
                    offsets.append(ev.time_ns - (before + after) // 2)
        return sorted(offsets)[len(offsets) // 2] if offsets else 0

    def filenos(self) -> list[int]:
        return [f.fileno() for f in self._files]

    def read(self, budget: int = READ_BUDGET) -> list[TaskEvent]:
        events = []
        taken = 0
        for cpu in self.cpus:
            while taken < budget:
                ev = self.evlist.read_on_cpu(cpu)
                if ev is None:
                    break
                taken += 1
                kind = self._types.get(ev.type)
                if kind is not None:
                    ppid = ev.ppid if kind == "fork" else 0
                    stamp = ev.sample_time - self.clock_offset_ns
                    events.append(TaskEvent(kind, ev.pid, ev.tid, ppid, stamp))
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
    try:
        if what == PROC_EVENT_FORK:
            _ppid, ptgid, child_pid, child_tgid = _FOUR.unpack_from(data, body)
            return TaskEvent("fork", child_tgid, child_pid, ptgid, ts)
        if what in (PROC_EVENT_EXEC, PROC_EVENT_COMM):
            tid, tgid = struct.unpack_from("=II", data, body)
            return TaskEvent("comm", tgid, tid, 0, ts)
        if what == PROC_EVENT_EXIT:
            tid, tgid = struct.unpack_from("=II", data, body)
            return TaskEvent("exit", tgid, tid, 0, ts)
    except struct.error:  # a truncated event body: nothing to act on
        return None
    return None


# Classic BPF, to drop uninteresting process events in the kernel (socket filter).
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x15, 0x06
SO_ATTACH_FILTER = 26  # asm-generic/socket.h (not exported by Python's socket module)
_EVENT_AT = _NLMSG.size + _CN_MSG.size  # proc_event.what in the datagram
_FORK_PARENT_TGID_AT = _EVENT_AT + _EVENT_HEAD.size + 4


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _net32(value: int) -> int:
    """BPF word loads are big-endian; the proc connector writes host order."""
    return int.from_bytes(struct.pack("=I", value), "big")


def kernel_filter(user_execs: bool, renames: bool) -> list[tuple[int, int, int, int]]:
    """Keep forks by kthreadd (new kernel threads) and, if wanted, execs and renames
    (PROC_EVENT_COMM: prctl(PR_SET_NAME), and older kernels naming kthreads after the
    fork); drop the rest — exits, every other fork, renames nobody follows — before they
    wake the daemon: a user's fork storm or rename loop then costs it nothing."""
    accept, drop = 0xFFFF, 0
    # Jumps are relative: the target is pc + 1 + jt (if equal) or pc + 1 + jf.
    return [
        (_BPF_LD_W_ABS, 0, 0, _EVENT_AT),  # 0: what
        (_BPF_JEQ_K, 0, 2, _net32(PROC_EVENT_FORK)),  # 1: fork -> 2, else -> 4
        (_BPF_LD_W_ABS, 0, 0, _FORK_PARENT_TGID_AT),  # 2: parent tgid
        (_BPF_JEQ_K, 2, 3, _net32(2)),  # 3: kthreadd -> accept, else -> drop
        (_BPF_JEQ_K, 1 if renames else 2, 0, _net32(PROC_EVENT_COMM)),  # 4: comm, else 5
        (_BPF_JEQ_K, 0 if user_execs else 1, 1, _net32(PROC_EVENT_EXEC)),  # 5: exec
        (_BPF_RET_K, 0, 0, accept),  # 6
        (_BPF_RET_K, 0, 0, drop),  # 7
    ]


class ProcConnectorSource:
    name = "proc-connector"

    def __init__(self, user_execs: bool = True, renames: bool = True) -> None:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            self._attach(sock, kernel_filter(user_execs, renames))
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

    @staticmethod
    def _attach(sock: socket.socket, prog: list[tuple[int, int, int, int]]) -> None:
        insns = (_SockFilter * len(prog))(*[_SockFilter(*i) for i in prog])
        fprog = _SockFprog(len(prog), insns)
        sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(fprog))

    def filenos(self) -> list[int]:
        return [self.sock.fileno()]

    def read(self, budget: int = READ_BUDGET) -> list[TaskEvent]:
        """Up to `budget` datagrams: a flood faster than the daemon must not keep it here."""
        events: list[TaskEvent] = []
        for _ in range(budget):
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
        return events

    def close(self) -> None:
        self.sock.close()


def open_task_source(
    preference: str = "auto", user_execs: bool = True, renames: bool = True
) -> TaskSource | None:
    """The best available source: "auto" tries the proc connector, then perf; "none" opts out.

    `user_execs`: also deliver exec events of user tasks (for shielding CPUs from them);
    `renames`: also renames (the proc connector drops them in the kernel otherwise; perf
    cannot filter, its read budget is what bounds a flood).
    """
    order = {
        "auto": ["proc-connector", "perf"],
        "perf": ["perf"],
        "proc-connector": ["proc-connector"],
        "none": [],
    }[preference]
    for name in order:
        try:
            if name == "perf":
                return PerfTaskSource()
            return ProcConnectorSource(user_execs, renames)
        except ImportError as exc:
            log.info("task events: perf python bindings not importable (%s)", exc)
        except OSError as exc:
            log.info("task events: %s unavailable (%s)", name, exc)
    return None
