"""Watchers: kernel events that mean "look at these settings now".

Each watcher exposes a file descriptor for the main loop and a non-blocking
`read()`. The periodic tick in the daemon is the safety net behind all of them.

- UdevWatcher: device events (add, remove, bind, unbind, move = rename, CPU
  online/offline) for the subsystems the active profile's plugins follow.
- FileWatcher: fanotify (inotify without CAP_SYS_ADMIN) on the procfs/sysfs files
  the engine owns. The kernel reports every write(2) to them (fsnotify runs in the
  VFS for any file system), so when irqbalance, an admin or a script rewrites a
  setting, the daemon knows at once, and costs nothing while nobody does; fanotify
  also says who wrote (the pid), so drift names its writer. Changes the kernel makes
  on its own (CPU hotplug) come as udev events or are caught by the tick.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from latencyd.core.plugin import DeviceEvent
from latencyd.kernel.system import Writer

log = logging.getLogger(__name__)


class UdevWatcher:
    """udev events for some subsystems; from udevd when it runs, else from the kernel."""

    def __init__(self, subsystems: Iterable[str]) -> None:
        import pyudev

        self.subsystems = frozenset(subsystems)
        self.source = "udev" if os.path.exists("/run/udev/control") else "kernel"
        self.monitor: Any = pyudev.Monitor.from_netlink(pyudev.Context(), source=self.source)
        for subsystem in sorted(self.subsystems):
            self.monitor.filter_by(subsystem)
        self.monitor.start()
        log.info("watching device events from %s (%s)", self.source, ", ".join(sorted(subsystems)))

    def fileno(self) -> int:
        return int(self.monitor.fileno())

    def read(self) -> list[DeviceEvent]:
        events: list[DeviceEvent] = []
        while True:
            device = self.monitor.poll(timeout=0)
            if device is None:
                return events
            if device.subsystem not in self.subsystems or not device.action:
                continue
            old = device.properties.get("DEVPATH_OLD", "")
            events.append(
                DeviceEvent(
                    device.subsystem,
                    device.action,
                    device.sys_name,
                    old.rpartition("/")[2],
                    device.device_path,
                )
            )

    def close(self) -> None:
        # pyudev's Monitor has no stop(): the netlink socket goes with the last reference
        # (pyudev 0.24 unrefs the libudev monitor in __del__), which is this one.
        self.monitor = None


# inotify(7)
IN_MODIFY = 0x00000002
IN_DELETE_SELF = 0x00000400
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
_EVENT = struct.Struct("iIII")
# fanotify(7): notification only, file descriptors (FID mode does not work on procfs).
FAN_CLOEXEC = 0x00000001
FAN_NONBLOCK = 0x00000002
FAN_UNLIMITED_MARKS = 0x00000020  # a mark per owned file: 256 CPUs' IRQs exceed 8192
FAN_REPORT_FD_ERROR = 0x00002000  # Linux 6.13: an fd the kernel cannot open is an event
FAN_MARK_ADD = 0x00000001
FAN_MARK_REMOVE = 0x00000002
FAN_MODIFY = 0x00000002
FAN_Q_OVERFLOW = 0x00004000
AT_FDCWD = -100
_FAN_EVENT = struct.Struct("IBBHQii")  # event_len, vers, reserved, metadata_len, mask, fd, pid
# Each fanotify event read holds an open fd: a read takes at most 64 of them at a time.
_FAN_READ = 64 * _FAN_EVENT.size
# Before FAN_REPORT_FD_ERROR (Linux 6.13), an event whose fd the kernel cannot open fails
# the read(2) only when it comes first: later in a read it is dropped with no trace. One
# event per read makes every such failure the read's, seen as "events were lost".
_FAN_READ_ONE = _FAN_EVENT.size
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fanotify_mark.argtypes = [
    ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p
]  # fmt: skip

Ident = tuple[int, int]  # (st_dev, st_ino): a file, whichever path leads to it


@dataclass(frozen=True)
class FanEvent:
    """One fanotify event: `fd` is open on the file written (the reader closes it), or
    negative (FAN_NOFD for an overflow, -errno where the kernel could not open it)."""

    mask: int
    fd: int
    pid: int


def parse_fanotify(data: bytes) -> list[FanEvent]:
    """The events of one read(2) of a fanotify fd (struct fanotify_event_metadata)."""
    events = []
    offset = 0
    while offset + _FAN_EVENT.size <= len(data):
        length, _version, _, _, mask, fd, pid = _FAN_EVENT.unpack_from(data, offset)
        events.append(FanEvent(mask, fd, pid))
        offset += max(length, _FAN_EVENT.size)
    return events


def parse_inotify(data: bytes) -> Iterator[tuple[int, int]]:
    """(watch descriptor, mask) of each event of one read(2) of an inotify fd."""
    offset = 0
    while offset + _EVENT.size <= len(data):
        wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
        offset += _EVENT.size + length
        yield wd, mask


def writers_of(
    written: Iterable[tuple[Ident | None, int]], files: Mapping[Ident, Iterable[str]], own_pid: int
) -> tuple[dict[str, int], bool]:
    """Which watched paths were written and by which pid (the last writer of each), from
    fanotify's (file written, pid) in order; a file not known (None) means any may have
    changed (True). The daemon's own writes are no one's drift and are left out."""
    pids: dict[str, int] = {}
    unknown = False
    for ident, pid in written:
        if pid == own_pid:
            continue
        if ident is None:
            unknown = True
            continue
        for path in files.get(ident, ()):
            pids[path] = pid
    return pids, unknown


@dataclass
class _Watch:
    wd: int  # inotify's: IN_MODIFY, or with fanotify's mark only the file's end (IN_IGNORED)
    ident: Ident
    marked: bool  # fanotify's FAN_MODIFY mark is on the file


def _fanotify_init() -> tuple[int, str, int]:
    """A fanotify fd and how many bytes one read(2) of it may take, or -1 and why not
    (EPERM without CAP_SYS_ADMIN, ENOSYS)."""
    flags = FAN_CLOEXEC | FAN_NONBLOCK | FAN_UNLIMITED_MARKS
    event_flags = os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC
    fd = _libc.fanotify_init(flags | FAN_REPORT_FD_ERROR, event_flags)
    if fd >= 0:
        return int(fd), "", _FAN_READ
    if ctypes.get_errno() == errno.EINVAL:  # before Linux 6.13
        fd = _libc.fanotify_init(flags, event_flags)
        if fd >= 0:
            return int(fd), "", _FAN_READ_ONE
    return -1, os.strerror(ctypes.get_errno()), 0


class FileWatcher:
    """Writes to a set of files that follows what the engine owns, with who wrote them:
    fanotify FAN_MODIFY marks, which name the writer's pid, where the daemon may use
    fanotify (CAP_SYS_ADMIN), beside an inotify watch per file for its end (IN_IGNORED:
    an IRQ freed, a file replaced), which fanotify's fd mode does not report; without
    fanotify, inotify's IN_MODIFY alone, and writers are not named. `describe` turns a
    writer's pid into what /proc says of it, read at once: a writer may exit right after
    (an `echo` from a shell)."""

    def __init__(self, describe: Callable[[int], Writer] = Writer) -> None:
        fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd = int(fd)
        self.fanotify, why, self.fan_read = _fanotify_init()
        self.describe = describe
        self.own_pid = os.getpid()
        self.poller = select.epoll()  # one fd for the main loop, readable when either is
        self.poller.register(self.fd, select.EPOLLIN)
        if self.fanotify >= 0:
            self.poller.register(self.fanotify, select.EPOLLIN)
            log.info("watching owned files with fanotify: drift names its writer")
        else:
            log.info("watching owned files with inotify (no fanotify: %s): writers not named", why)
        self.by_path: dict[str, _Watch] = {}
        self.by_wd: dict[int, set[str]] = {}
        self.by_ident: dict[Ident, set[str]] = {}
        # A wanted file is not watched (missing, or gone since): the next sync must look.
        self.stale = False
        # Events were lost (an inotify overflow): a file may have ended unseen, so the next
        # sync compares every watched path with its file (once, not per event).
        self.recheck = False

    def fileno(self) -> int:
        return self.poller.fileno()

    @property
    def names_writers(self) -> bool:
        return self.fanotify >= 0

    def sync(self, paths: Iterable[str]) -> None:
        """Watch exactly `paths` (absolute); files that do not exist are skipped."""
        wanted = paths if isinstance(paths, set | frozenset | dict) else set(paths)
        self.stale = False
        if self.recheck:
            self.recheck = False
            for path, watch in list(self.by_path.items()):
                if _ident(path) != watch.ident:  # gone, or another file now
                    self._unwatch(path)
        for path in [p for p in self.by_path if p not in wanted]:
            self._unwatch(path)
        for path in wanted - self.by_path.keys():
            self._watch(path)

    def _watch(self, path: str) -> None:
        name = os.fsencode(path)
        marked = self.fanotify >= 0
        if marked and _libc.fanotify_mark(self.fanotify, FAN_MARK_ADD, FAN_MODIFY, AT_FDCWD, name):
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR):
                self.stale = True  # not there yet: tried again on the next sync
                return
            log.debug("no fanotify mark on %s (%s): inotify watches it", path, os.strerror(err))
            marked = False
        # With a mark, inotify only tells the file's end (IN_IGNORED comes with any mask).
        wd = _libc.inotify_add_watch(self.fd, name, IN_DELETE_SELF if marked else IN_MODIFY)
        ident = _ident(path) if wd >= 0 else None
        if wd < 0 or ident is None:
            if wd < 0 and ctypes.get_errno() not in (errno.ENOENT, errno.ENOTDIR):
                log.debug("cannot watch %s: %s", path, os.strerror(ctypes.get_errno()))
            if marked:
                _libc.fanotify_mark(self.fanotify, FAN_MARK_REMOVE, FAN_MODIFY, AT_FDCWD, name)
            self.stale = True  # not there yet: tried again on the next sync
            return
        self.by_path[path] = _Watch(wd, ident, marked)
        self.by_wd.setdefault(wd, set()).add(path)
        self.by_ident.setdefault(ident, set()).add(path)

    def _unwatch(self, path: str, ended: bool = False) -> None:
        """Forget `path`; its file's watches go unless another watched path leads to it, or
        the file `ended` (the kernel dropped them)."""
        watch = self.by_path.pop(path)
        paths = self.by_wd.get(watch.wd, set())
        paths.discard(path)
        if not paths:
            self.by_wd.pop(watch.wd, None)
            if not ended:
                _libc.inotify_rm_watch(self.fd, watch.wd)
        same = self.by_ident.get(watch.ident, set())
        same.discard(path)
        if not same:
            self.by_ident.pop(watch.ident, None)
            if watch.marked and not ended:
                name = os.fsencode(path)
                _libc.fanotify_mark(self.fanotify, FAN_MARK_REMOVE, FAN_MODIFY, AT_FDCWD, name)

    def read(self) -> dict[str, Writer | None]:
        """Paths written to since the last read, each with who wrote it last where
        fanotify said (None where it did not: inotify, a lost event, a file's end)."""
        changed: dict[str, Writer | None] = {}
        everything = self._read_inotify(changed)
        if self.fanotify >= 0:
            pids, unknown = writers_of(self._read_fanotify(), self.by_ident, self.own_pid)
            everything = everything or unknown
            described: dict[int, Writer] = {}
            for path, pid in pids.items():
                if pid not in described:
                    described[pid] = self.describe(pid)
                changed[path] = described[pid]
        if everything:  # events were lost: any watched file may have been written
            for path in self.by_path:
                changed.setdefault(path, None)
        return changed

    def _read_inotify(self, changed: dict[str, Writer | None]) -> bool:
        """Files written (inotify's IN_MODIFY) or ended into `changed`; True if events
        were lost."""
        lost = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return lost
            for wd, mask in parse_inotify(data):
                if mask & IN_Q_OVERFLOW:
                    lost = self.recheck = self.stale = True
                    continue
                paths = self.by_wd.get(wd, set())
                for path in list(paths):
                    if mask & IN_IGNORED:  # the file went away (an IRQ freed): re-added on sync
                        self._unwatch(path, ended=True)
                        self.stale = True
                    changed.setdefault(path, None)

    def _read_fanotify(self) -> list[tuple[Ident | None, int]]:
        """(file, pid) of each write fanotify reported, in order; None: a file not known
        (the queue overflowed, the kernel could not open it)."""
        written: list[tuple[Ident | None, int]] = []
        while True:
            try:
                data = os.read(self.fanotify, self.fan_read)
            except BlockingIOError:
                return written
            except OSError:  # an event whose fd the kernel could not open, lost
                written.append((None, 0))
                return written
            for event in parse_fanotify(data):
                if event.mask & FAN_Q_OVERFLOW or event.fd < 0:
                    written.append((None, event.pid))
                    continue
                try:
                    st = os.fstat(event.fd)
                    written.append(((st.st_dev, st.st_ino), event.pid))
                finally:
                    os.close(event.fd)

    def close(self) -> None:
        for fd in (self.fd, self.fanotify):
            if fd >= 0:
                os.close(fd)
        self.fd = self.fanotify = -1
        self.poller.close()
        self.by_path.clear()
        self.by_wd.clear()
        self.by_ident.clear()


def _ident(path: str) -> Ident | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino
