"""What latencyd asks of systemd: its file-descriptor store, spoken directly
(sd_notify(3), sd_listen_fds(3)), and whether a stop is the first half of a restart.

A PM QoS request lives only as long as its file descriptor. Under systemd the
daemon hands that fd to the service manager (`FDSTORE=1`), which passes it back
on the next start (`LISTEN_FDS`, `LISTEN_FDNAMES`), so a restart or a crash never
lets the CPUs fall into deep idle states in between. Requires `NotifyAccess=main`
and `FileDescriptorStoreMax=` in the unit. Without NOTIFY_SOCKET this is a no-op.
"""

from __future__ import annotations

import array
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

SYSTEMD = "org.freedesktop.systemd1"
PROPERTIES = "org.freedesktop.DBus.Properties"
# Job types under which systemd stops a service to start it again.
RESTART_JOBS = frozenset({"restart", "try-restart", "reload-or-restart", "reload-or-try-restart"})

LISTEN_FDS_START = 3


def passed_fds(environ: Mapping[str, str]) -> dict[str, list[int]]:
    """Name -> fds systemd passed to this process (LISTEN_FDS for our pid), in order."""
    try:
        if int(environ.get("LISTEN_PID", "0")) != os.getpid():
            return {}
        count = int(environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return {}
    names = environ.get("LISTEN_FDNAMES", "").split(":") if count else []
    out: dict[str, list[int]] = {}
    for i in range(count):
        fd = LISTEN_FDS_START + i
        name = names[i] if i < len(names) else "unknown"
        out.setdefault(name, []).append(fd)
    return out


class FdStore:
    """The service manager's fd store, and the fds it passed to this start."""

    def __init__(self, notify_socket: str, passed: dict[str, list[int]]) -> None:
        self.notify_socket = notify_socket
        self.passed = passed

    @classmethod
    def from_environment(cls) -> FdStore | None:
        """The store systemd offers this process, if any; takes the LISTEN_* variables out
        of the environment (children must not think the fds are theirs)."""
        passed = passed_fds(os.environ)
        for fds in passed.values():
            for fd in fds:
                os.set_inheritable(fd, False)
        for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            os.environ.pop(var, None)
        notify = os.environ.get("NOTIFY_SOCKET", "")
        if not notify:
            for fds in passed.values():
                for fd in fds:
                    os.close(fd)
            return None
        return cls(notify, passed)

    def take(self, prefix: str) -> list[tuple[str, int]]:
        """(name, fd) of every passed fd whose name starts with `prefix`; now the caller's."""
        taken = [(n, fd) for n, fds in self.passed.items() if n.startswith(prefix) for fd in fds]
        for name, _ in taken:
            self.passed.pop(name, None)
        return taken

    def store(self, fd: int, name: str) -> bool:
        return self._send(f"FDSTORE=1\nFDNAME={name}", [fd])

    def remove(self, name: str) -> bool:
        return self._send(f"FDSTOREREMOVE=1\nFDNAME={name}", [])

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for `seconds` more before the start (or stop) in progress times out; while
        running, a no-op (the unit sets no RuntimeMaxSec=). sd_notify(3)."""
        return self._send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}", [])

    def _send(self, message: str, fds: list[int]) -> bool:
        address = self.notify_socket
        if address.startswith("@"):
            address = "\0" + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                ancillary = (
                    [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
                    if fds
                    else []
                )
                sock.sendmsg([message.encode()], ancillary, 0, address)
        except OSError as exc:
            log.warning("cannot reach the service manager's fd store (%s): %s", address, exc)
            return False
        return True


def restart_pending(bus: Any) -> bool:
    """Whether systemd is stopping this service to start it again (`systemctl restart`).
    Then the stop is not the end of the tuning: restoring would flip every setting back
    for the moment between the two processes, so the caller keeps it and the next start
    adopts it. systemd says so in the job queued on our unit, a restart job until the new
    process starts. False outside systemd, or when systemd does not answer within a second
    (then the stop restores, as asked)."""
    if bus is None or "INVOCATION_ID" not in os.environ:
        return False
    import dbus

    try:
        manager = bus.get_object(SYSTEMD, "/org/freedesktop/systemd1")
        unit = manager.GetUnitByPID(
            dbus.UInt32(os.getpid()), dbus_interface=f"{SYSTEMD}.Manager", timeout=1.0
        )
        job_id, job = bus.get_object(SYSTEMD, unit).Get(
            f"{SYSTEMD}.Unit", "Job", dbus_interface=PROPERTIES, timeout=1.0
        )
        if not job_id:
            return False
        kind = bus.get_object(SYSTEMD, job).Get(
            f"{SYSTEMD}.Job", "JobType", dbus_interface=PROPERTIES, timeout=1.0
        )
    except dbus.DBusException as exc:
        log.warning("cannot ask systemd whether this stop is a restart: %s", exc)
        return False
    return str(kind) in RESTART_JOBS
