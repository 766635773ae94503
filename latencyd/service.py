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
from latencyd.engine import StepReport
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
        self._holders: dict[str, Any] = {}  # holder's bus name -> its NameOwnerChanged watch
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
        """Set the base profile; returns once it is applied and verified (a JSON step
        report). While a hold is in force the base is only checked, and applied when the
        last hold ends ("held": true in the report)."""

        def run() -> str:
            self._authorize(sender, "SwitchProfile")
            report = self.daemon.switch(str(name))
            return json.dumps(self._report(report))

        return _answer(run)

    @dbus.service.method(INTERFACE, in_signature="ss", out_signature="u", sender_keyword="sender")
    def HoldProfile(self, name: str, reason: str, sender: str | None = None) -> int:
        """Apply a profile while the caller needs it; returns a cookie for ReleaseProfile.
        The hold also ends when the caller leaves the bus (exits or crashes)."""

        def run() -> int:
            self._authorize(sender, "HoldProfile")
            cookie, _ = self.daemon.hold(str(name), str(reason), sender or "")
            if sender and sender not in self._holders:
                self._holders[sender] = self.bus.watch_name_owner(
                    sender, lambda owner, holder=sender: self._holder_changed(holder, owner)
                )
            return cookie

        return _answer(run)

    @dbus.service.method(INTERFACE, in_signature="u", out_signature="", sender_keyword="sender")
    def ReleaseProfile(self, cookie: int, sender: str | None = None) -> None:
        """End a hold; the previous hold, or the base profile, comes back into force."""

        def run() -> None:
            self._authorize(sender, "ReleaseProfile")
            self.daemon.release(int(cookie))

        _answer(run)

    def _holder_changed(self, holder: str, owner: str) -> None:
        if owner:  # the first call reports the current owner: still connected
            return
        watch = self._holders.pop(holder, None)
        if watch is not None:
            watch.cancel()
        self.daemon.release_owner(holder)

    def _report(self, report: StepReport | None) -> dict[str, Any]:
        active = self.daemon.active.name if self.daemon.active else ""
        if report is None:
            return {
                "profile": active,
                "base": self.daemon.base or "",
                "held": True,
                "applied": 0,
                "restored": 0,
                "unchanged": 0,
                "not_applicable": {},
                "apply_ms": 0.0,
            }
        return {
            "profile": active,
            "base": self.daemon.base or "",
            "held": False,
            "applied": report.applied,
            "restored": report.restored,
            "unchanged": report.unchanged,
            "not_applicable": {f"{p}:{k}": r for (p, k), r in report.not_applicable.items()},
            "apply_ms": round(report.seconds * 1000, 3),
        }

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
