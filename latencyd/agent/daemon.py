"""The agent's side of the daemon's D-Bus API: what it holds, Reload and SwitchProfile,
and the signals the agent reports from (NoiseExceeded, ProfileChanged). The daemon's
errors come back as `DaemonRefused` with the daemon's D-Bus error name (a bad profile is
org.latencyd.Error.BadProfile, its message `file:line: what`). Called from the agent's
main thread only, which runs the GLib loop the signals arrive on."""

from __future__ import annotations

import json
from collections.abc import Callable
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

    @property
    def unreachable(self) -> bool:
        return self.name in (
            "org.freedesktop.DBus.Error.ServiceUnknown",
            "org.freedesktop.DBus.Error.NameHasNoOwner",
            "org.freedesktop.DBus.Error.NoReply",
            "org.freedesktop.DBus.Error.NoServer",
            "org.freedesktop.DBus.Error.FileNotFound",
            "",
        )


@dataclass(frozen=True)
class DaemonState:
    base: str  # the profile the daemon holds when no hold is in force: what the agent sets
    active: str  # in force now (a hold's, while one is)
    reboot_pending: tuple[str, ...]  # settings that take effect at the next boot, said
    last_error: str


def state_of(status: dict[str, Any]) -> DaemonState:
    active = str(status.get("active_profile") or "")
    return DaemonState(
        base=str(status.get("base_profile") or active),
        active=active,
        reboot_pending=tuple(
            f"{p.get('plugin')}: {p.get('text')}" for p in status.get("reboot_pending") or ()
        ),
        last_error=str(status.get("last_error") or ""),
    )


class Daemon:
    """latencyd on the system bus named by DBUS_SYSTEM_BUS_ADDRESS (the host's, mounted
    into the agent's pod). The GLib main loop must be the default before the first call."""

    def __init__(self) -> None:
        self._bus: Any = None

    def _connection(self) -> Any:
        import dbus

        if self._bus is None:
            self._bus = dbus.SystemBus()
        return self._bus

    def _call(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        import dbus

        try:
            proxy = self._connection().get_object(BUS_NAME, OBJECT_PATH, introspect=False)
            return getattr(proxy, method)(*args, dbus_interface=INTERFACE, timeout=timeout)
        except dbus.DBusException as exc:
            name, message = exc.get_dbus_name() or "", exc.get_dbus_message() or str(exc)
            raise DaemonRefused(name, message) from exc

    def state(self) -> DaemonState:
        return state_of(json.loads(str(self._call("Status"))))

    def reload(self) -> None:
        self._call("Reload", timeout=SWITCH_TIMEOUT_S)

    def profile_file(self, name: str) -> str | None:
        """The file `name` resolves to on the daemon's search path; None: no such profile."""
        try:
            return str(self._call("ProfileFile", name))
        except DaemonRefused as exc:
            if exc.name == "org.latencyd.Error.NoSuchProfile":
                return None
            raise

    def switch(self, profile: str) -> None:
        self._call("SwitchProfile", profile, timeout=SWITCH_TIMEOUT_S)

    def on_noise(self, handler: Callable[[int, str], None]) -> None:
        """handler(cpu, top sources as text) on each NoiseExceeded."""

        def received(cpu: int, _interval_us: int, sources_json: str) -> None:
            try:
                sources = json.loads(str(sources_json))
                text = ", ".join(f"{s['source']} x{s['count']}" for s in sources[:3])
            except (ValueError, KeyError, TypeError):
                text = "sources not readable"
            handler(int(cpu), text)

        self._connection().add_signal_receiver(
            received, "NoiseExceeded", INTERFACE, BUS_NAME, OBJECT_PATH
        )

    def on_profile_changed(self, handler: Callable[[], None]) -> None:
        self._connection().add_signal_receiver(
            lambda _name: handler(), "ProfileChanged", INTERFACE, BUS_NAME, OBJECT_PATH
        )
