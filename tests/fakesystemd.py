"""A fake systemd manager on a rig's private socket, for what cannot run here: systemd
as PID 1 with the cpuset controller in cgroup v2 (this VM's cpuset is held by a v1
hierarchy that cannot be released, and nspawn hands a container no controller the host's
v2 tree lacks). tests/e2e/test_boot.py calls the same client against the real systemd in
a container, where it checks every call's signature and effect systemd shows.

It speaks systemd's bus API (org.freedesktop.systemd1(5)) peer to peer on
ROOT/run/systemd/private, as PID 1 does, for the calls latencyd.kernel.systemd makes, and
keeps the rig's cgroupfs as systemd would (tests/unit/fakesys.py's layout): a unit's
AllowedCPUs= is its cgroup's cpuset.cpus, a transient scope's PIDs and an attach move
the processes (cgroup.procs, proc/PID/cgroup), a stopped slice loses its cgroup and a
scope whose processes all left goes. Every call is logged to ROOT/run/systemd/calls.

    python -m tests.fakesystemd ROOT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import dbus
import dbus.mainloop.glib
import dbus.server
import dbus.service

from latencyd.cpuset import CpuSet
from latencyd.service.mainloop import MainLoop

MANAGER = "org.freedesktop.systemd1.Manager"
PROPS = "org.freedesktop.DBus.Properties"
UNIFIED = "sys/fs/cgroup/unified"
PERPETUAL = ("-.slice", "init.scope", "system.slice", "user.slice")


def object_path(unit: str) -> str:
    """systemd's escaping of a unit name into its object path."""
    escaped = "".join(c if c.isalnum() else f"_{ord(c):02x}" for c in unit)
    return f"/org/freedesktop/systemd1/unit/{escaped}"


class Error(dbus.exceptions.DBusException):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message, name=name)


class Rig:
    """The rig's files as systemd keeps them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls = root / "run/systemd/calls"

    def log(self, *call: object) -> None:
        with self.calls.open("a") as out:
            out.write(json.dumps([str(c) if not isinstance(c, list) else c for c in call]) + "\n")

    def cgroup(self, unit: str, slice_: str = "") -> Path:
        """A unit's cgroup: slices nest by their dashes (a-b.slice in a.slice)."""
        if unit.endswith(".slice"):
            return self.root / UNIFIED / unit
        for existing in (self.root / UNIFIED).rglob(unit):
            return existing
        return self.root / UNIFIED / (slice_ or "system.slice") / unit

    def procs(self, cgroup: Path) -> list[int]:
        path = cgroup / "cgroup.procs"
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def move(self, pid: int, into: Path) -> None:
        if not (self.root / f"proc/{pid}").exists():
            raise Error("org.freedesktop.DBus.Error.UnixProcessIdUnknown", f"no pid {pid}")
        for procs in (self.root / UNIFIED).rglob("cgroup.procs"):
            kept = [p for p in procs.read_text().split() if p != str(pid)]
            procs.write_text("\n".join(kept))
        into.mkdir(parents=True, exist_ok=True)
        pids = sorted({*self.procs(into), pid})
        (into / "cgroup.procs").write_text("\n".join(map(str, pids)))
        relative = into.relative_to(self.root / UNIFIED)
        (self.root / f"proc/{pid}/cgroup").write_text(f"0::/{relative}\n")

    def collect(self, transient: set[str]) -> None:
        """A transient scope whose processes have all gone is gone (a login session's
        stays here, as logind keeps it while the session lasts)."""
        for procs in list((self.root / UNIFIED).rglob("*.scope/cgroup.procs")):
            scope = procs.parent
            if scope.name in transient and not procs.read_text().split():
                procs.unlink()
                for rest in scope.iterdir():
                    rest.unlink()
                scope.rmdir()


class Unit(dbus.service.Object):
    def __init__(self, conn: dbus.connection.Connection, manager: Manager, name: str) -> None:
        super().__init__(conn, object_path(name))
        self.manager, self.name = manager, name

    @dbus.service.method(PROPS, in_signature="ss", out_signature="v")
    def Get(self, interface: str, prop: str) -> object:
        state = self.manager.units.get(self.name)
        if state is None:
            raise Error("org.freedesktop.systemd1.NoSuchUnit", f"Unit {self.name} not loaded.")
        if prop == "ActiveState":
            return dbus.String(state["active"])
        if prop == "AllowedCPUs":
            kind = self.name.rsplit(".", 1)[-1].capitalize()
            if interface != f"org.freedesktop.systemd1.{kind}":
                raise Error("org.freedesktop.DBus.Error.UnknownProperty", f"{interface}.{prop}")
            return dbus.Array(CpuSet.from_list(state["cpus"]).to_bytes(), signature="y")
        raise Error("org.freedesktop.DBus.Error.UnknownProperty", prop)


class Manager(dbus.service.Object):
    def __init__(self, conn: dbus.connection.Connection, rig: Rig, units: dict) -> None:
        super().__init__(conn, "/org/freedesktop/systemd1")
        self.conn, self.rig, self.units = conn, rig, units
        self.objects: dict[str, Unit] = {}

    def _loaded(self, name: str) -> dict[str, str]:
        name = str(name)  # a dbus.String is not a path part (pathlib interns those)
        self.rig.collect({u for u, state in self.units.items() if state.get("transient")})
        for gone in [u for u in self.units if u.endswith(".scope") and u not in PERPETUAL]:
            if not self.rig.cgroup(gone).exists():
                del self.units[gone]
        if name not in self.units:
            raise Error("org.freedesktop.systemd1.NoSuchUnit", f"Unit {name} not loaded.")
        if name not in self.objects:
            self.objects[name] = Unit(self.conn, self, name)
        return self.units[name]

    def _realize(self, name: str) -> None:
        cgroup = self.rig.cgroup(name)
        cgroup.mkdir(parents=True, exist_ok=True)
        (cgroup / "cpuset.cpus").write_text(self.units[name]["cpus"])
        partition = cgroup / "cpuset.cpus.partition"  # the kernel's, kept by no unit setting
        if not partition.exists():
            partition.write_text("member")

    @dbus.service.method(MANAGER, in_signature="s", out_signature="o")
    def GetUnit(self, name: str) -> str:
        self._loaded(name)
        return object_path(name)

    @dbus.service.method(MANAGER, in_signature="sba(sv)", out_signature="")
    def SetUnitProperties(self, name: str, runtime: bool, props: list) -> None:
        name = str(name)
        self.rig.log("SetUnitProperties", name, bool(runtime), [str(k) for k, _ in props])
        state = self._loaded(name)
        for key, value in props:
            if key != "AllowedCPUs" or value.signature != "y":
                raise Error("org.freedesktop.DBus.Error.InvalidArgs", f"not here: {key}")
            state["cpus"] = CpuSet.from_bytes(bytes(value)).to_list()
        self._realize(name)

    @dbus.service.method(MANAGER, in_signature="ssa(sv)a(sa(sv))", out_signature="o")
    def StartTransientUnit(self, name: str, mode: str, props: list, aux: list) -> str:
        name, given = str(name), {str(k): v for k, v in props}
        self.rig.log("StartTransientUnit", name, mode, sorted(given))
        if name in self.units and self.units[name]["active"] == "active":
            raise Error("org.freedesktop.systemd1.UnitExists", f"Unit {name} already exists.")
        cpus = CpuSet.from_bytes(bytes(given.get("AllowedCPUs", b""))).to_list()
        if name.endswith(".slice"):
            self.units[name] = {"active": "active", "cpus": cpus}
            self._realize(name)
        elif name.endswith(".scope"):
            pids = [int(p) for p in given.get("PIDs", [])]
            if not pids:
                raise Error("org.freedesktop.DBus.Error.InvalidArgs", "No PIDs to add to scope")
            slice_ = str(given.get("Slice", "system.slice"))
            if slice_ not in self.units:
                raise Error("org.freedesktop.systemd1.NoSuchUnit", f"Unit {slice_} not loaded.")
            self.units[name] = {"active": "active", "cpus": cpus, "transient": "yes"}
            for pid in pids:
                self.rig.move(pid, self.rig.cgroup(slice_) / name)
        else:
            raise Error("org.freedesktop.DBus.Error.InvalidArgs", f"not here: {name}")
        return "/org/freedesktop/systemd1/job/1"

    @dbus.service.method(MANAGER, in_signature="ss", out_signature="o")
    def StopUnit(self, name: str, mode: str) -> str:
        name = str(name)
        self.rig.log("StopUnit", name, mode)
        self._loaded(name)
        cgroup = self.rig.cgroup(name)
        for procs in cgroup.rglob("cgroup.procs"):  # systemd would kill them: a test's bug
            assert not procs.read_text().split(), f"stopping {name} would kill what runs in it"
        for path in sorted(cgroup.rglob("*"), key=lambda p: -len(p.parts)):
            path.unlink() if path.is_file() else path.rmdir()
        cgroup.rmdir()
        del self.units[name]
        return "/org/freedesktop/systemd1/job/2"

    @dbus.service.method(MANAGER, in_signature="ssau", out_signature="")
    def AttachProcessesToUnit(self, name: str, sub: str, pids: list) -> None:
        name, sub = str(name), str(sub)
        self.rig.log("AttachProcessesToUnit", name, sub, [int(p) for p in pids])
        self._loaded(name)
        if not name.endswith((".scope", ".service")):
            raise Error("org.freedesktop.DBus.Error.NotSupported", f"{name} holds no process")
        if not self.units[name].get("delegate"):  # as systemd 252 answers
            raise Error(
                "org.freedesktop.DBus.Error.InvalidArgs",
                "Process migration not available on non-delegated units.",
            )
        for pid in pids:
            self.rig.move(int(pid), self.rig.cgroup(name) / sub.strip("/"))


def serve(root: Path) -> None:
    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    rig = Rig(root)
    units = {u: {"active": "active", "cpus": ""} for u in PERPETUAL}
    for existing in (root / UNIFIED).rglob("*"):
        if not existing.name.endswith((".scope", ".service")):
            continue
        delegated = (existing / "cgroup.delegated").exists()  # the rig's mark of Delegate=yes
        units.setdefault(existing.name, {"active": "active", "cpus": "", "delegate": delegated})
    socket = root / "run/systemd/private"
    socket.parent.mkdir(parents=True, exist_ok=True)
    keep: list[Manager] = []

    class Server(dbus.server.Server):
        def _on_new_connection(self, conn: dbus.connection.Connection) -> None:
            keep.append(Manager(conn, rig, units))

    (root / "run/systemd/system").mkdir(exist_ok=True)  # what says systemd runs it
    # Last, its socket says the rig is ready; bound and listening under another name first,
    # then renamed: libdbus binds the path before it listens, and a client that saw the
    # path in between was refused (ECONNREFUSED: seen under load, 1-2 runs in 3).
    listening = socket.with_name(f"{socket.name}.listening")
    server = Server(f"unix:path={listening}")
    listening.rename(socket)
    loop = MainLoop()
    try:
        loop.run()
    finally:
        server.disconnect()


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
