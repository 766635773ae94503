"""The agent's side of the daemon's D-Bus API: what it holds, and a switch. The daemon's
errors come back as `DaemonRefused` with the daemon's D-Bus error name (a bad profile is
org.latencyd.Error.BadProfile, its message `file:line: what`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from latencyd import BUS_NAME, INTERFACE, OBJECT_PATH

BAD_PROFILE = ("org.latencyd.Error.BadProfile", "org.latencyd.Error.NoSuchProfile")
SWITCH_TIMEOUT_S = 300.0  # a switch on a server moves tens of thousands of threads


class DaemonRefused(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name

    @property
    def bad_profile(self) -> bool:
        return self.name in BAD_PROFILE


@dataclass(frozen=True)
class DaemonState:
    active: str
    reboot_pending: bool
    last_error: str


class Daemon:
    """latencyd on the system bus named by DBUS_SYSTEM_BUS_ADDRESS (the host's, mounted
    into the agent's pod)."""

    def _call(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        import dbus

        try:
            bus = dbus.SystemBus()
            proxy = bus.get_object(BUS_NAME, OBJECT_PATH, introspect=False)
            return getattr(proxy, method)(*args, dbus_interface=INTERFACE, timeout=timeout)
        except dbus.DBusException as exc:
            name, message = exc.get_dbus_name() or "", exc.get_dbus_message() or str(exc)
            raise DaemonRefused(name, message) from exc

    def state(self) -> DaemonState:
        status = json.loads(str(self._call("Status")))
        return DaemonState(
            active=str(status.get("active_profile", "")),
            reboot_pending=bool(status.get("reboot_pending")),
            last_error=str(status.get("last_error") or ""),
        )

    def reload(self) -> None:
        self._call("Reload", timeout=SWITCH_TIMEOUT_S)

    def switch(self, profile: str) -> None:
        self._call("SwitchProfile", profile, timeout=SWITCH_TIMEOUT_S)
