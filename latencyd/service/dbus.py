"""The D-Bus face of the daemon: org.latencyd.Daemon1 on the system bus.

Reads are open to everyone; mutating calls are checked here against the
caller's uid (root, or a member of the configured admin group) in addition to
the bus policy file, so a permissive policy alone cannot open the door.

Every error a caller sees is a declared `org.latencyd.Error.*` or a standard
`org.freedesktop.DBus.Error.*` with one human line: internal errors are logged in
full and answered as `org.latencyd.Error.Internal` without internals.

Losing the bus loses no control: the tuning stays and is still monitored, and the
connection is re-made (and the name re-owned) when the bus comes back.
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import pwd
import time
from collections.abc import Callable
from typing import Any, TypeVar

import dbus
import dbus.lowlevel
import dbus.service

from latencyd import BUS_NAME, INTERFACE, OBJECT_PATH
from latencyd.core.engine import StepReport, Steps
from latencyd.core.planning import SwitchPlan
from latencyd.core.plugin import encode_target
from latencyd.cpuset import CpuSet, CpuSetError
from latencyd.errors import Internal, LatencydError, Location, PermissionDenied, ProfileError
from latencyd.kernel.noise import Breach
from latencyd.service.config import Config
from latencyd.service.daemon import Caller, Daemon
from latencyd.service.mainloop import MainLoop
from latencyd.service.operations import Operation, Operations
from latencyd.text import printable

log = logging.getLogger("latencyd.service.dbus")
# Settings a switch's reply lists one by one (the rest counted): a shield's first switch
# beside 50,000 tasks would otherwise answer with megabytes.
REPORTED_CHANGES = 10_000
ANSWER_REUSE_S = 1.0  # how old a Status or Verify answer a caller who only reads may get
PROPERTIES = "org.freedesktop.DBus.Properties"
# Open to every caller (the policy file allows exactly these); every other method of
# the interface changes state and checks the caller.
READ_METHODS = frozenset(
    {"ListProfiles", "ProfileFile", "ActiveProfile", "Status", "Verify", "Plan"}
)
INVALID_ARGS = "org.freedesktop.DBus.Error.InvalidArgs"
T = TypeVar("T")


class ServiceError(dbus.DBusException):
    """An error reply with a declared name and one human line (never a traceback)."""

    include_traceback = False

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self._dbus_error_name = name


def _answer(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except Exception as exc:
        raise _error_reply(exc) from exc


def _cpus_of(text: str) -> CpuSet | None:
    """A hold's CPUs as HoldAndPlaceOn gives them ("": none named)."""
    if not text.strip():
        return None
    try:
        return CpuSet.from_list(text.strip()[:4096])
    except CpuSetError as exc:
        raise ProfileError(Location(None), printable(f"CPUs {text[:64]!r}: {exc}")) from exc


def _error_reply(exc: Exception) -> dbus.DBusException:
    """The error a caller sees for `exc`: declared, one line, never internals."""
    if isinstance(exc, LatencydError):
        return ServiceError(exc.dbus_name, str(exc))
    if isinstance(exc, dbus.DBusException):
        return exc
    log.error("internal error while answering a D-Bus call", exc_info=exc)
    internal = Internal()
    return ServiceError(internal.dbus_name, str(internal))


def _operation(in_signature: str, out_signature: str) -> Callable[[Callable[..., None]], Any]:
    """A method run as an operation (latencyd.service.operations): the caller is named
    (`sender`), and it replies through `reply`/`error` once the operation has run (a
    change, Service._run; a read that waits for the change in progress, Verify and Plan),
    not when the method returns."""
    decorator: Callable[[Callable[..., None]], Any] = dbus.service.method(
        INTERFACE,
        in_signature=in_signature,
        out_signature=out_signature,
        sender_keyword="sender",
        async_callbacks=("reply", "error"),
    )
    return decorator


def _at_once(fn: Callable[[], T]) -> Steps[T]:
    """`fn` as an operation of one slice (a read that must wait for the change before it)."""
    return fn()
    yield  # a generator function: run by Operations like any change


def dbus_methods(cls: type) -> dict[tuple[str, str], str]:
    """(interface, member) -> in-signature of every method a service class exports."""
    table: dict[tuple[str, str], str] = {}
    for name in dir(cls):
        fn = getattr(cls, name, None)
        if getattr(fn, "_dbus_is_method", False):
            table[(fn._dbus_interface, name)] = fn._dbus_in_signature or ""  # type: ignore[union-attr]
    return table


class Service(dbus.service.Object):
    # Re-exported on a new connection after the bus comes back. (dbus-python 1.5's
    # remove_from_connection leaves the old connection recorded, so without this the
    # new export is refused; signals go only to the connections still exported on.)
    SUPPORTS_MULTIPLE_CONNECTIONS = True

    def __init__(self, daemon: Daemon, config: Config, operations: Operations) -> None:
        super().__init__()
        self.daemon = daemon
        self.config = config
        self.operations = operations
        self.bus: dbus.bus.BusConnection | None = None
        self._name: dbus.service.BusName | None = None
        self._holders: dict[str, Any] = {}  # holder's bus name -> its NameOwnerChanged watch
        self._methods = dbus_methods(type(self))
        # The last answer to each read an unprivileged caller may be given again (_recent).
        self._answers: dict[str, tuple[float, str]] = {}
        daemon.on_profile_changed.append(self._emit_changed)
        daemon.on_pending_changed.append(self._emit_pending)
        daemon.on_drift.append(lambda records: self._emit(self.Drift, json.dumps(records)))

    # -- the connection ----------------------------------------------------------
    def attach(self, bus: dbus.bus.BusConnection) -> None:
        """Export the object on a (new) connection; holds made on an old bus end."""
        if self.bus is not None:
            self.detach()
        self.bus = bus
        self.add_to_connection(bus, OBJECT_PATH)

    def detach(self) -> None:
        # Never exported, or the connection is already gone: nothing to remove.
        with contextlib.suppress(LookupError, dbus.DBusException):
            self.remove_from_connection()
        for watch in self._holders.values():
            watch.cancel()
        self._holders.clear()
        self._name = None
        self.bus = None

    def claim_name(self) -> bool:
        assert self.bus is not None
        try:
            self._name = dbus.service.BusName(BUS_NAME, self.bus, do_not_queue=True)
        except dbus.DBusException as exc:
            log.error("cannot own %s on the system bus: %s", BUS_NAME, exc.get_dbus_message())
            return False
        return True

    def _message_cb(self, connection: Any, message: Any) -> None:
        """Calls to unknown methods or with the wrong arguments get a standard error with
        one line; dbus-python's own replies to those carry a Python traceback."""
        if isinstance(message, dbus.lowlevel.MethodCallMessage):
            member, interface = message.get_member(), message.get_interface()
            found = [
                sig
                for (iface, name), sig in self._methods.items()
                if name == member and (interface is None or iface == interface)
            ]
            problem = None
            if not found:
                problem = (
                    "org.freedesktop.DBus.Error.UnknownMethod",
                    f"no method {member} on interface {interface or '(none given)'}",
                )
            elif (message.get_signature() or "") not in found:
                problem = (
                    INVALID_ARGS,
                    f"{member} takes arguments of type {found[0]!r}, "
                    f"got {message.get_signature() or 'none'!r}",
                )
            if problem is not None:
                if not message.get_no_reply():
                    connection.send_message(dbus.lowlevel.ErrorMessage(message, *problem))
                return
        super()._message_cb(connection, message)

    # -- authorization ---------------------------------------------------------
    def _caller(self, sender: str | None) -> tuple[Caller, bool]:
        """Who calls, and whether they are privileged: root or in the admin group, who may
        change state and see every user's tasks in Status."""
        if sender is None or self.bus is None:  # a call from inside the process
            return Caller(), True
        uid = int(self.bus.get_unix_user(sender))
        return Caller(uid, _user_name(uid)), uid == 0 or self._in_admin_group(uid)

    def _authorize(self, sender: str | None, action: str) -> Caller:
        caller, privileged = self._caller(sender)
        if privileged:
            return caller
        group = (
            f" or members of group {self.config.admin_group!r}" if self.config.admin_group else ""
        )
        raise PermissionDenied(
            f"{action} needs root{group}; user {caller.name} (uid {caller.uid}) may only read "
            "state. Run it with sudo."
        )

    def _pid(self, sender: str | None) -> int | None:
        """The calling process, as the bus daemon knows it."""
        if sender is None or self.bus is None:
            return None
        try:
            pid = self.bus.call_blocking(
                "org.freedesktop.DBus",
                "/org/freedesktop/DBus",
                "org.freedesktop.DBus",
                "GetConnectionUnixProcessID",
                "s",
                (sender,),
            )
        except dbus.DBusException:
            return None
        return int(pid)

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

    @dbus.service.method(INTERFACE, in_signature="s", out_signature="s")
    def ProfileFile(self, name: str) -> str:
        """The file a profile name resolves to on the daemon's search path (a node agent
        asks whether a name is the cluster's, or one of the host's that comes first)."""
        return _answer(lambda: str(self.daemon.library.find(str(name), by_path=False)))

    @dbus.service.method(INTERFACE, in_signature="", out_signature="s")
    def ActiveProfile(self) -> str:
        return _answer(lambda: self.daemon.active.name if self.daemon.active else "")

    def _recent(self, what: str) -> str | None:
        """The answer to `what` given in the last ANSWER_REUSE_S, if any: what a caller who
        may only read gets. Status and verify cost O(threads) (beside 20,000 of them, a
        tenth of a second each) and anyone may ask for them as fast as the bus allows:
        then at most one of each a second is computed for them, and root's calls do not
        wait behind a queue of them. Root and the admin group always get a fresh answer."""
        answer = self._answers.get(what)
        if answer is None or time.monotonic() - answer[0] > ANSWER_REUSE_S:
            return None
        return answer[1]

    def _answered(self, what: str, text: str) -> str:
        self._answers[what] = (time.monotonic(), text)
        return text

    @dbus.service.method(INTERFACE, in_signature="", out_signature="s", sender_keyword="sender")
    def Status(self, sender: str | None = None) -> str:
        """JSON: the active profile, and per plugin what is applied, refused and measured;
        other users' tasks (pids, names, CPUs) for root and the admin group only."""

        def answer() -> str:
            if self._caller(sender)[1]:
                return json.dumps(self.daemon.status(True))
            recent = self._recent("status")
            return recent or self._answered("status", json.dumps(self.daemon.status(False)))

        return _answer(answer)

    @_operation("", "s")
    def Verify(
        self,
        reply: Callable[[str], None],
        error: Callable[[Exception], None],
        sender: str | None = None,
    ) -> None:
        """JSON list of drifts: settings whose kernel value differs from the profile's.
        Answered after the change in progress, if any (it would read it half done); callers
        asking meanwhile share one verify (Operations.read)."""

        privileged = _answer(lambda: self._caller(sender)[1])
        recent = None if privileged else self._recent("verify")
        if recent is not None:
            reply(recent)
            return

        def verify() -> str:
            drifts = self.daemon.verify()
            self._answered("verify", json.dumps([d.as_json(show_tasks=False) for d in drifts]))
            return json.dumps([d.as_json() for d in drifts])

        def start() -> Steps[str]:
            return _at_once(verify)

        def failed(exc: Exception) -> None:
            error(_error_reply(exc))

        def answer(full: str) -> None:
            # One verify is shared by every caller waiting: those who may only read get
            # its answer without other users' tasks.
            reply(full if privileged else self._answers["verify"][1])

        self.operations.read(Operation("verify", start, answer, failed))

    @_operation("s", "s")
    def Plan(
        self,
        name: str,
        reply: Callable[[str], None],
        error: Callable[[Exception], None],
        sender: str | None = None,
    ) -> None:
        """JSON: what SwitchProfile(name) would do to each setting now, from what the daemon
        holds (latencyd.core.planning.SwitchPlan); nothing is written, journaled or held.
        Open to every caller; other users' tasks for root and the admin group only. Waits
        for the change in progress, like Verify; the same caller's same plans are shared."""
        caller, privileged = _answer(lambda: self._caller(sender))

        def planned(switch_plan: SwitchPlan) -> str:
            return json.dumps(self.daemon.plan_json(switch_plan, show_tasks=privileged))

        def start() -> Steps[str]:
            return planned((yield from self.daemon.plan_steps(str(name), caller)))

        def failed(exc: Exception) -> None:
            error(_error_reply(exc))

        who = "root" if caller.is_root else f"uid {caller.uid}{' (admin)' * privileged}"
        self.operations.read(Operation(f"plan of {name} for {who}", start, reply, failed))

    # -- changes: each runs as an operation (latencyd.service.operations) and replies when done ----
    @_operation("s", "s")
    def SwitchProfile(
        self,
        name: str,
        reply: Callable[[str], None],
        error: Callable[[Exception], None],
        sender: str | None = None,
    ) -> None:
        """Set the base profile; returns once it is applied and verified (a JSON step
        report). While a hold is in force the base is only checked, and applied when the
        last hold ends ("held": true in the report). Non-root callers name profiles on
        the search path; root may also give a file path."""
        caller = _answer(lambda: self._authorize(sender, "SwitchProfile"))
        self._run(
            f"switch to {name}",
            lambda: self.daemon.switch_steps(str(name), caller),
            lambda report: reply(json.dumps(self._report(report))),
            error,
        )

    @_operation("ss", "u")
    def HoldProfile(
        self,
        name: str,
        reason: str,
        reply: Callable[[int], None],
        error: Callable[[Exception], None],
        sender: str | None = None,
    ) -> None:
        """Apply a profile while the caller needs it; returns a cookie for ReleaseProfile.
        The hold also ends when the caller leaves the bus (exits or crashes)."""
        self._hold(name, reason, reply, error, sender, "HoldProfile", placed=False)

    @_operation("ss", "u")
    def HoldAndPlace(
        self,
        name: str,
        reason: str,
        reply: Callable[[int], None],
        error: Callable[[Exception], None],
        sender: str | None = None,
    ) -> None:
        """HoldProfile, and the caller put on the shielded CPUs in the same apply (inside
        the shield's cpuset, or on its CPUs): what it starts next is born there."""
        self._hold(name, reason, reply, error, sender, "HoldAndPlace", placed=True)

    @_operation("sss", "u")
    def HoldAndPlaceOn(
        self,
        name: str,
        reason: str,
        cpus: str,
        reply: Callable[[int], None],
        error: Callable[[Exception], None],
        sender: str | None = None,
    ) -> None:
        """HoldAndPlace on CPUs of the caller's own (a CPU list): the profile's
        isolated_cores, or which of its shielded CPUs; holds on other CPUs compose, each
        application on its own. "" is HoldAndPlace."""
        asked = _answer(lambda: _cpus_of(str(cpus)))
        self._hold(name, reason, reply, error, sender, "HoldAndPlaceOn", True, asked)

    def _hold(
        self,
        name: str,
        reason: str,
        reply: Callable[[int], None],
        error: Callable[[Exception], None],
        sender: str | None,
        method: str,
        placed: bool,
        cpus: CpuSet | None = None,
    ) -> None:
        caller = _answer(lambda: self._authorize(sender, method))
        pid = self._pid(sender)

        def held(result: tuple[int, StepReport]) -> None:
            cookie, _ = result
            if sender and sender not in self._holders and self.bus is not None:
                self._holders[sender] = self.bus.watch_name_owner(
                    sender, lambda owner, holder=sender: self._holder_changed(holder, owner)
                )
            reply(cookie)

        self._run(
            f"hold on {name}",
            lambda: self.daemon.hold_steps(
                str(name), str(reason)[:256], sender or "", caller, pid, placed, cpus
            ),
            held,
            error,
        )

    @_operation("u", "")
    def ReleaseProfile(
        self,
        cookie: int,
        reply: Callable[[], None],
        error: Callable[[Exception], None],
        sender: str | None = None,
    ) -> None:
        """End a hold; the previous hold, or the base profile, comes back into force."""
        _answer(lambda: self._authorize(sender, "ReleaseProfile"))
        self._run(
            f"release of hold {cookie}",
            lambda: self.daemon.release_steps(int(cookie)),
            lambda _: reply(),
            error,
        )

    def _holder_changed(self, holder: str, owner: str) -> None:
        if owner:  # the first call reports the current owner: still connected
            return
        watch = self._holders.pop(holder, None)
        if watch is not None:
            watch.cancel()
        self.release_owners(lambda o: o == holder, "left the bus")

    def release_owners(self, gone: Callable[[str], bool], why: str) -> None:
        """Holds whose holders are gone end, in turn with the other changes."""
        self._run(
            f"end of holds whose holder {why}",
            lambda: self.daemon.release_owners_steps(gone, why),
            lambda _: None,
            lambda exc: log.error("ending holds failed: %s", exc),
        )

    def _run(
        self,
        what: str,
        start: Callable[[], Steps[T]],
        reply: Callable[[T], None],
        error: Callable[[Exception], None],
    ) -> None:
        """Submit a change; its reply (or error reply) is sent when it has ended."""

        def failed(exc: Exception) -> None:
            error(_error_reply(exc))

        self.operations.submit(Operation(what, start, reply, failed))

    def _report(self, report: StepReport | None) -> dict[str, Any]:
        active = self.daemon.active.name if self.daemon.active else ""
        out: dict[str, Any] = {
            "profile": active,
            "base": self.daemon.base or "",
            "held": report is None,
            "applied": 0,
            "restored": 0,
            "unchanged": 0,
            "not_applicable": [],
            "apply_ms": 0.0,
        }
        if report is not None:
            out |= {
                "applied": report.applied,
                "restored": report.restored,
                "unchanged": report.unchanged,
                "not_applicable": [
                    {
                        "plugin": p,
                        "target": encode_target(t),
                        "setting": self.daemon.plugins[p].describe(t, r.wanted),
                        "reason": r.reason,
                    }
                    for (p, t), r in report.not_applicable.items()
                ],
                "apply_ms": round(report.seconds * 1000, 3),
            }
            out |= _written(report)
        return out

    @dbus.service.method(INTERFACE, in_signature="", out_signature="", sender_keyword="sender")
    def Off(self, sender: str | None = None) -> None:
        """Restore every original value; no profile is active afterwards. Never waits: a
        change in progress is cancelled (rolled back) and waiting ones never start."""

        def run() -> None:
            self._authorize(sender, "Off")
            self.operations.cancel("off")
            self.daemon.off()
            self.daemon.run_deferred()

        _answer(run)

    @_operation("", "")
    def Reload(
        self,
        reply: Callable[[], None],
        error: Callable[[Exception], None],
        sender: str | None = None,
    ) -> None:
        """Re-read profile files; the active profile is re-applied incrementally if it changed."""
        _answer(lambda: self._authorize(sender, "Reload"))
        self._run("reload", self.daemon.reload_steps, lambda _: reply(), error)

    def reload_from_signal(self) -> None:
        self._run(
            "reload (SIGHUP)",
            self.daemon.reload_steps,
            lambda _: None,
            lambda exc: log.error("reload failed, the active profile stays: %s", exc),
        )

    # -- signals and properties --------------------------------------------------
    @dbus.service.signal(INTERFACE, signature="s")
    def ProfileChanged(self, name: str) -> None:
        """Emitted after the active profile changed ('' when none is active)."""

    @dbus.service.signal(INTERFACE, signature="s")
    def Drift(self, drifts_json: str) -> None:
        """Settings the profile owns were changed by someone else: a JSON list of
        {plugin, target, setting, wanted, actual, action}, action being "reapplied",
        "reported" or "failed: ..."."""

    @dbus.service.signal(INTERFACE, signature="uts")
    def NoiseExceeded(self, cpu: int, interval_us: int, sources_json: str) -> None:
        """A watched CPU ([monitor]) took more noise in one interval than its budget: the
        CPU, the interval's length, and its top sources as a JSON list of {source, count,
        total_us, max_us}. At most one every 10 s per CPU."""

    def noise_exceeded(self, breach: Breach, interval_s: float) -> None:
        interval_us = dbus.UInt64(round(interval_s * 1e6))
        sources = json.dumps(breach.sources_json())
        self._emit(self.NoiseExceeded, dbus.UInt32(breach.cpu), interval_us, sources)

    @dbus.service.signal(PROPERTIES, signature="sa{sv}as")
    def PropertiesChanged(
        self, interface: str, changed: dict[str, Any], invalidated: list[str]
    ) -> None:
        pass

    @dbus.service.method(PROPERTIES, in_signature="ss", out_signature="v")
    def Get(self, interface: str, prop: str) -> Any:
        properties = self._properties(interface)
        if prop not in properties:
            raise ServiceError(
                "org.freedesktop.DBus.Error.UnknownProperty", f"no property {prop[:80]!r}"
            )
        return properties[prop]

    @dbus.service.method(PROPERTIES, in_signature="s", out_signature="a{sv}")
    def GetAll(self, interface: str) -> dict[str, Any]:
        return self._properties(interface)

    @dbus.service.method(PROPERTIES, in_signature="ssv", out_signature="")
    def Set(self, interface: str, prop: str, value: Any) -> None:
        self._properties(interface)
        raise ServiceError(
            "org.freedesktop.DBus.Error.PropertyReadOnly", f"property {prop[:80]!r} is read-only"
        )

    def _properties(self, interface: str) -> dict[str, Any]:
        if interface not in (INTERFACE, ""):
            raise ServiceError(
                "org.freedesktop.DBus.Error.UnknownInterface",
                f"no interface {interface[:80]!r} (properties are on {INTERFACE})",
            )
        active = self.daemon.active.name if self.daemon.active else ""
        pending = bool(self.daemon.reboot_pending)
        return {"ActiveProfile": dbus.String(active), "RebootPending": dbus.Boolean(pending)}

    def _emit_pending(self, pending: bool) -> None:
        self._emit(self.PropertiesChanged, INTERFACE, {"RebootPending": dbus.Boolean(pending)}, [])

    def _emit_changed(self, name: str) -> None:
        self._emit(self.ProfileChanged, name)
        self._emit(self.PropertiesChanged, INTERFACE, {"ActiveProfile": dbus.String(name)}, [])

    def _emit(self, signal: Callable[..., None], *args: Any) -> None:
        if self.bus is None:  # no bus right now: there is nobody to tell
            return
        try:
            signal(*args)
        except dbus.DBusException as exc:
            log.debug("signal not sent: %s", exc)


def _written(report: StepReport) -> dict[str, Any]:
    """What a step wrote, setting by setting ("changed": plugin, target, before, after),
    at most REPORTED_CHANGES of them ("changed_left_off": how many more): what a plan
    (Plan) said it would change, to compare."""
    changed = [
        {"plugin": p, "target": encode_target(t), "before": before, "after": after}
        for p, changes in report.changes.items()
        for t, before, after in changes
    ]
    return {
        "changed": changed[:REPORTED_CHANGES],
        "changed_left_off": max(0, len(changed) - REPORTED_CHANGES),
    }


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def system_bus_address() -> str:
    return os.environ.get("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/run/dbus/system_bus_socket")


class BusLink:
    """The service's place on the system bus, kept: when the bus goes away (restarted,
    crashed) the daemon goes on tuning and monitoring, and reconnects every second,
    re-owning its name, until the bus is back."""

    RETRY_MS = 1000

    def __init__(self, service: Service, loop: MainLoop) -> None:
        self.service = service
        self.loop = loop
        self.address = system_bus_address()
        self.retrying = False

    def connect(self) -> bool:
        """Connect, export the service and own the name; False if the bus is not there."""
        try:
            bus = dbus.bus.BusConnection(self.address)
        except dbus.DBusException as exc:
            log.debug("system bus not reachable: %s", exc.get_dbus_message())
            return False
        bus.set_exit_on_disconnect(False)
        bus.add_signal_receiver(
            self._disconnected,
            signal_name="Disconnected",
            dbus_interface="org.freedesktop.DBus.Local",
            path="/org/freedesktop/DBus/Local",
        )
        self.service.attach(bus)
        return True

    def _disconnected(self, *args: Any) -> None:
        log.warning("lost the system bus: tuning stays in force; reconnecting every second")
        self.service.detach()
        self.retry()

    def retry(self) -> None:
        if not self.retrying:
            self.retrying = True
            self.loop.timeout_add(self.RETRY_MS, self._try_again)

    def _try_again(self) -> bool:
        if not self.connect():
            return True
        if not self.service.claim_name():
            self.service.detach()
            return True
        self.retrying = False
        log.warning("system bus is back: %s owned again", BUS_NAME)
        # Holders were connections on the old bus; their unique names mean nothing now.
        self.service.release_owners(lambda owner: bool(owner), "is gone: the bus restarted")
        return False
