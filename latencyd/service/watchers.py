"""Watchers: kernel events that mean "look at these settings now".

Each watcher exposes a file descriptor for the main loop and a non-blocking
`read()`. The periodic tick in the daemon is the safety net behind all of them.

- UdevWatcher: device events (add, remove, bind, unbind, move = rename, CPU
  online/offline) for the subsystems the active profile's plugins follow.
- FileWatcher: inotify on the procfs/sysfs files the engine owns. The kernel
  reports every write(2) to them (fsnotify runs in the VFS for any file system),
  so when irqbalance, an admin or a script rewrites a setting, the daemon knows at
  once and costs nothing while nobody does. Changes the kernel makes on its own
  (CPU hotplug) come as udev events or are caught by the tick.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import struct
from collections.abc import Iterable
from typing import Any

from latencyd.core.plugin import DeviceEvent

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
IN_IGNORED = 0x00008000
_EVENT = struct.Struct("iIII")
_libc = ctypes.CDLL(None, use_errno=True)


class FileWatcher:
    """inotify IN_MODIFY watches on a set of files that follows what the engine owns."""

    def __init__(self) -> None:
        fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        self.fd = int(fd)
        self.by_path: dict[str, int] = {}
        self.by_wd: dict[int, str] = {}
        # A wanted file is not watched (missing, or gone since): the next sync must look.
        self.stale = False

    def fileno(self) -> int:
        return self.fd

    def sync(self, paths: Iterable[str]) -> None:
        """Watch exactly `paths` (absolute); files that do not exist are skipped."""
        wanted = paths if isinstance(paths, set | frozenset | dict) else set(paths)
        self.stale = False
        for path in [p for p in self.by_path if p not in wanted]:
            wd = self.by_path.pop(path)
            self.by_wd.pop(wd, None)
            _libc.inotify_rm_watch(self.fd, wd)
        for path in wanted - self.by_path.keys():
            wd = _libc.inotify_add_watch(self.fd, os.fsencode(path), IN_MODIFY)
            if wd < 0:
                if ctypes.get_errno() not in (errno.ENOENT, errno.ENOTDIR):
                    log.debug("cannot watch %s: %s", path, os.strerror(ctypes.get_errno()))
                self.stale = True  # not there yet: tried again on the next sync
                continue
            self.by_path[path] = wd
            self.by_wd[wd] = path

    def read(self) -> set[str]:
        """Paths written to since the last read."""
        changed: set[str] = set()
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return changed
            offset = 0
            while offset + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                path = self.by_wd.get(wd)
                if path is None:
                    continue
                if mask & IN_IGNORED:  # the file went away (an IRQ freed): re-added on sync
                    del self.by_wd[wd]
                    self.by_path.pop(path, None)
                    self.stale = True
                changed.add(path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.by_path.clear()
        self.by_wd.clear()
