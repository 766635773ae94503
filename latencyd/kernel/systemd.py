"""systemd's manager over its private socket: the units' AllowedCPUs= and where processes run.

The shield's way on a machine systemd runs with cpuset in cgroup v2 (latencyd.kernel.cgroups):
the v2 tree is systemd's, so every change goes through its D-Bus API, as `systemctl
set-property --runtime` and `systemd-run --scope` do. The connection is the one systemctl
uses as root, /run/systemd/private (peer to peer: no bus daemon, so also during early boot
and whatever bus the daemon itself serves on), one per call: these are rare, and a
connection kept would break with every `systemctl daemon-reexec`.

Reached through System.systemd (the system facade); a test's rig serves a fake manager on
the socket under its root.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused

if TYPE_CHECKING:
    import dbus.connection

MANAGER_PATH = "/org/freedesktop/systemd1"
MANAGER = "org.freedesktop.systemd1.Manager"
UNIT = "org.freedesktop.systemd1.Unit"
PROPERTIES = "org.freedesktop.DBus.Properties"
CALL_TIMEOUT_S = 5.0
SETTLE_TIMEOUT_S = 5.0  # a job systemd queued for a start or stop to be done
SETTLE_POLL_S = 0.01
NO_SUCH_UNIT = "org.freedesktop.systemd1.NoSuchUnit"


def _interface(unit: str) -> str:
    """The type-specific interface carrying a unit's cgroup properties."""
    kind = unit.rsplit(".", 1)[-1]
    return f"org.freedesktop.systemd1.{kind.capitalize()}"


class SystemdManager:
    """systemd as PID 1, reached on `socket` (its private socket)."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    @contextmanager
    def _connection(self, doing: str) -> Iterator[dbus.connection.Connection]:
        import dbus
        import dbus.connection
        import dbus.lowlevel

        try:
            conn = dbus.connection.Connection(f"unix:path={self.socket}")
        except dbus.exceptions.DBusException as exc:
            raise KernelRefused(doing, f"systemd cannot be reached: {_said(exc)}") from exc
        try:
            # The first message goes out with the authentication, and systemd (252, on its
            # private socket) leaves it unread until more arrives: half the connections'
            # first calls timed out in the boot test. A ping that wants no answer is that
            # first message, so every call that matters is a later one.
            ping = dbus.lowlevel.MethodCallMessage(None, "/", "org.freedesktop.DBus.Peer", "Ping")
            ping.set_no_reply(True)
            conn.send_message(ping)
            yield conn
        except dbus.exceptions.DBusException as exc:
            raise KernelRefused(doing, f"systemd refused it: {_said(exc)}") from exc
        finally:
            conn.close()

    @staticmethod
    def _call(
        conn: dbus.connection.Connection,
        path: str,
        interface: str,
        method: str,
        signature: str,
        *args: object,
    ) -> object:
        return conn.call_blocking(
            None, path, interface, method, signature, args, timeout=CALL_TIMEOUT_S
        )

    def _unit_path(self, conn: dbus.connection.Connection, unit: str) -> str | None:
        import dbus

        try:
            return str(self._call(conn, MANAGER_PATH, MANAGER, "GetUnit", "s", unit))
        except dbus.exceptions.DBusException as exc:
            if exc.get_dbus_name() == NO_SUCH_UNIT:
                return None
            raise

    def _state(self, conn: dbus.connection.Connection, unit: str) -> str | None:
        """The unit's ActiveState, None when systemd has not loaded it."""
        path = self._unit_path(conn, unit)
        if path is None:
            return None
        return str(self._call(conn, path, PROPERTIES, "Get", "ss", UNIT, "ActiveState"))

    def _settle(self, conn: dbus.connection.Connection, unit: str, done: set[str | None]) -> None:
        """Wait for the job just queued for `unit` to leave it in one of `done` states."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while (state := self._state(conn, unit)) not in done:
            if time.monotonic() > deadline:
                raise KernelRefused(f"waiting for {unit}", f"it stayed {state}")
            time.sleep(SETTLE_POLL_S)

    # -- what the shield asks ------------------------------------------------------------
    def allowed_cpus(self, unit: str) -> CpuSet | None:
        """The unit's AllowedCPUs= (empty: not set), None when no such unit is loaded."""
        with self._connection(f"reading {unit}'s AllowedCPUs=") as conn:
            path = self._unit_path(conn, unit)
            if path is None:
                return None
            state = self._call(conn, path, PROPERTIES, "Get", "ss", UNIT, "ActiveState")
            if str(state) in ("inactive", "failed"):
                return None
            mask = self._call(conn, path, PROPERTIES, "Get", "ss", _interface(unit), "AllowedCPUs")
            return CpuSet.from_bytes(bytes(mask))  # type: ignore[call-overload]

    def set_allowed_cpus(self, unit: str, cpus: CpuSet) -> None:
        """AllowedCPUs= until the next boot (`systemctl set-property --runtime`); an empty
        set unsets it."""
        import dbus

        with self._connection(f"setting {unit}'s AllowedCPUs={cpus}") as conn:
            mask = dbus.Array(cpus.to_bytes(), signature="y")
            self._call(
                conn, MANAGER_PATH, MANAGER, "SetUnitProperties", "sba(sv)",
                unit, True, [("AllowedCPUs", mask)],
            )  # fmt: skip

    def start_slice(self, unit: str, cpus: CpuSet, description: str) -> None:
        """A transient slice with AllowedCPUs=, started (there until stopped or reboot)."""
        import dbus

        with self._connection(f"starting {unit} with AllowedCPUs={cpus}") as conn:
            properties = [
                ("Description", dbus.String(description)),
                ("AllowedCPUs", dbus.Array(cpus.to_bytes(), signature="y")),
            ]
            self._call(
                conn, MANAGER_PATH, MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))",
                unit, "fail", properties, [],
            )  # fmt: skip
            self._settle(conn, unit, {"active"})

    def start_scope(self, unit: str, slice_: str, pids: list[int], description: str) -> None:
        """A transient scope in `slice_` holding `pids` (`systemd-run --scope`): systemd
        moves them; the scope goes once they have all left or exited."""
        import dbus

        with self._connection(f"moving pids {pids} to {slice_}") as conn:
            properties = [
                ("Description", dbus.String(description)),
                ("Slice", dbus.String(slice_)),
                ("PIDs", dbus.Array([dbus.UInt32(p) for p in pids], signature="u")),
            ]
            self._call(
                conn, MANAGER_PATH, MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))",
                unit, "fail", properties, [],
            )  # fmt: skip
            self._settle(conn, unit, {"active", "failed"})
            if self._state(conn, unit) == "failed":
                raise KernelRefused(f"moving pids {pids} to {slice_}", f"{unit} failed")

    def attach(self, unit: str, subcgroup: str, pids: list[int]) -> None:
        """Move `pids` into a running service or scope (AttachProcessesToUnit, systemd >=
        238), into its sub-cgroup `subcgroup` ("" for its own)."""
        import dbus

        with self._connection(f"moving pids {pids} back to {unit}") as conn:
            self._call(
                conn, MANAGER_PATH, MANAGER, "AttachProcessesToUnit", "ssau",
                unit, f"/{subcgroup}" if subcgroup else "",
                dbus.Array([dbus.UInt32(p) for p in pids], signature="u"),
            )  # fmt: skip

    def stop(self, unit: str) -> None:
        """Stop a unit latencyd started and wait until it is gone."""
        with self._connection(f"stopping {unit}") as conn:
            if self._state(conn, unit) in (None, "inactive"):
                return
            self._call(conn, MANAGER_PATH, MANAGER, "StopUnit", "ss", unit, "fail")
            self._settle(conn, unit, {None, "inactive", "failed"})


def _said(exc: BaseException) -> str:
    import dbus

    if isinstance(exc, dbus.exceptions.DBusException):
        return exc.get_dbus_message() or exc.get_dbus_name() or str(exc)
    return str(exc)
