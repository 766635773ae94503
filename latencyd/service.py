"""The D-Bus face of the daemon: org.latencyd.Daemon1 on the system bus.

Reads are open to everyone; mutating calls are checked here against the
caller's uid (root, or a member of the configured admin group) in addition to
the bus policy file, so a permissive policy alone cannot open the door.
"""

from __future__ import annotations

import grp
import json
import logging
import pwd
from collections.abc import Callable
from typing import Any, TypeVar

import dbus
import dbus.service

from latencyd import BUS_NAME, INTERFACE, OBJECT_PATH
from latencyd.config import Config
from latencyd.daemon import Daemon, drift_dict
from latencyd.errors import LatencydError, PermissionDenied

log = logging.getLogger("latencyd.service")
PROPERTIES = "org.freedesktop.DBus.Properties"
T = TypeVar("T")


class LatencydDBusError(dbus.DBusException):
    """Carries a LatencydError's D-Bus name and message to the caller."""

    def __init__(self, exc: LatencydError) -> None:
        super().__init__(str(exc))
        self._dbus_error_name = exc.dbus_name


def _answer(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except LatencydError as exc:
        raise LatencydDBusError(exc) from exc


class Service(dbus.service.Object):
    def __init__(self, bus: dbus.Bus, daemon: Daemon, config: Config) -> None:
        super().__init__(bus, OBJECT_PATH)
        self.bus = bus
        self.daemon = daemon
        self.config = config
        self._name: dbus.service.BusName | None = None
        daemon.on_profile_changed.append(self._emit_changed)

    def claim_name(self) -> bool:
        try:
            self._name = dbus.service.BusName(BUS_NAME, self.bus, do_not_queue=True)
        except dbus.DBusException as exc:
            log.error("cannot own %s on the system bus: %s", BUS_NAME, exc.get_dbus_message())
            return False
        return True

    # -- authorization ---------------------------------------------------------
    def _authorize(self, sender: str | None, action: str) -> None:
        if sender is None:  # a call from inside the process
            return
        uid = int(self.bus.get_unix_user(sender))
        if uid == 0 or self._in_admin_group(uid):
            return
        who = _user_name(uid)
        group = (
            f" or members of group {self.config.admin_group!r}" if self.config.admin_group else ""
        )
        raise PermissionDenied(
            f"{action} needs root{group}; user {who} (uid {uid}) may only read state. "
            "Run it with sudo."
        )

    def _in_admin_group(self, uid: int) -> bool:
        if not self.config.admin_group:
            return False
        try:
            group = grp.getgrnam(self.config.admin_group)
            user = pwd.getpwuid(uid)
        except KeyError:
            return False
        return user.pw_gid == group.gr_gid or user.pw_name in group.gr_mem

    # -- reads -----------------------------------------------------------------
    @dbus.service.method(INTERFACE, in_signature="", out_signature="a(sss)")
    def ListProfiles(self) -> list[tuple[str, str, str]]:
        """(name, summary, error) for every profile on the search path; error is '' if valid."""
        return _answer(
            lambda: [(p.name, p.summary, p.error or "") for p in self.daemon.list_profiles()]
        )

    @dbus.service.method(INTERFACE, in_signature="", out_signature="s")
    def ActiveProfile(self) -> str:
        return self.daemon.active.name if self.daemon.active else ""

    @dbus.service.method(INTERFACE, in_signature="", out_signature="s")
    def Status(self) -> str:
        """JSON: the active profile, and per plugin what is applied, refused and measured."""
        return _answer(lambda: json.dumps(self.daemon.status()))

    @dbus.service.method(INTERFACE, in_signature="", out_signature="s")
    def Verify(self) -> str:
        """JSON list of drifts: settings whose kernel value differs from the profile's."""
        return _answer(lambda: json.dumps([drift_dict(d) for d in self.daemon.verify()]))

    # -- changes ---------------------------------------------------------------
    @dbus.service.method(INTERFACE, in_signature="s", out_signature="s", sender_keyword="sender")
    def SwitchProfile(self, name: str, sender: str | None = None) -> str:
        """Apply a profile; returns once it is applied and verified (a JSON step report)."""

        def run() -> str:
            self._authorize(sender, "SwitchProfile")
            report = self.daemon.switch(str(name))
            return json.dumps(
                {
                    "profile": self.daemon.active.name if self.daemon.active else "",
                    "applied": report.applied,
                    "restored": report.restored,
                    "unchanged": report.unchanged,
                    "not_applicable": {
                        f"{p}:{k}": r for (p, k), r in report.not_applicable.items()
                    },
                    "apply_ms": round(report.seconds * 1000, 3),
                }
            )

        return str(_answer(run))

    @dbus.service.method(INTERFACE, in_signature="", out_signature="", sender_keyword="sender")
    def Off(self, sender: str | None = None) -> None:
        """Restore every original value; no profile is active afterwards."""

        def run() -> None:
            self._authorize(sender, "Off")
            self.daemon.off()

        _answer(run)

    @dbus.service.method(INTERFACE, in_signature="", out_signature="", sender_keyword="sender")
    def Reload(self, sender: str | None = None) -> None:
        """Re-read profile files; the active profile is re-applied incrementally if it changed."""

        def run() -> None:
            self._authorize(sender, "Reload")
            self.daemon.reload()

        _answer(run)

    def reload_from_signal(self) -> None:
        try:
            self.daemon.reload()
        except LatencydError as exc:
            log.error("reload failed, the active profile stays: %s", exc)

    # -- signals and properties --------------------------------------------------
    @dbus.service.signal(INTERFACE, signature="s")
    def ProfileChanged(self, name: str) -> None:
        """Emitted after the active profile changed ('' when none is active)."""

    @dbus.service.signal(INTERFACE, signature="s")
    def Drift(self, drifts_json: str) -> None:
        """Settings the profile owns were changed by someone else: a JSON list of
        {plugin, key, wanted, actual, action}, action being "reapplied" or "reported"."""

    @dbus.service.signal(PROPERTIES, signature="sa{sv}as")
    def PropertiesChanged(
        self, interface: str, changed: dict[str, Any], invalidated: list[str]
    ) -> None:
        pass

    @dbus.service.method(PROPERTIES, in_signature="ss", out_signature="v")
    def Get(self, interface: str, prop: str) -> Any:
        return self.GetAll(interface)[prop] if prop in self._properties() else _no_property(prop)

    @dbus.service.method(PROPERTIES, in_signature="s", out_signature="a{sv}")
    def GetAll(self, interface: str) -> dict[str, Any]:
        if interface != INTERFACE:
            return {}
        return self._properties()

    @dbus.service.method(PROPERTIES, in_signature="ssv", out_signature="")
    def Set(self, interface: str, prop: str, value: Any) -> None:
        raise dbus.DBusException(
            f"property {prop} is read-only", name="org.freedesktop.DBus.Error.PropertyReadOnly"
        )

    def _properties(self) -> dict[str, Any]:
        active = self.daemon.active.name if self.daemon.active else ""
        return {"ActiveProfile": dbus.String(active)}

    def _emit_changed(self, name: str) -> None:
        self.ProfileChanged(name)
        self.PropertiesChanged(INTERFACE, {"ActiveProfile": dbus.String(name)}, [])

    # -- the safety-net tick -------------------------------------------------------
    def tick(self) -> bool:
        try:
            records = self.daemon.check()
        except LatencydError as exc:
            log.error("periodic check failed: %s", exc)
            return True
        if records:
            self.Drift(json.dumps(records))
        return True


def _no_property(prop: str) -> Any:
    raise dbus.DBusException(
        f"no property {prop}", name="org.freedesktop.DBus.Error.UnknownProperty"
    )


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
