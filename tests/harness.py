"""Run the real latencyd and latencyctl against a private bus (used by e2e tests and bench/)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from latencyd.kernel.trust import open_private_dir

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
POLICY = REPO / "systemd" / "org.latencyd.Daemon1.conf"
BUS_NAME = "org.latencyd.Daemon1"
# Each daemon started on the real machine is recorded here (PID of the run that started
# it, its argv): a run killed outright cannot restore what its daemons hold, so the next
# run does, from their journals, before it takes its snapshot of the machine. Root's own
# directory under /run, checked before each use (latencyd/kernel/trust.py): a record is a
# state directory whose journal a root daemon restores, never to be planted by another
# user in a world-writable /tmp.
STARTED_DAEMONS = Path("/run/latencyd-test-daemons")


def started_daemons() -> Path:
    """STARTED_DAEMONS, made or checked (UnsafePath if another user could change it)."""
    os.close(open_private_dir(STARTED_DAEMONS))
    return STARTED_DAEMONS


IDLE_THREADS = """
import sys, threading, time
threading.stack_size(256 * 1024)
ev = threading.Event()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=ev.wait, daemon=True).start()
print("ready", flush=True)
time.sleep(3600)
"""


# Profiles under which a rename flood reaches the daemon (issue 50): a shield rule by
# name follows renames (the kernel does not drop them), and the affinity shield under a
# hold asks of each renamed task whether it descends from the holder.
RENAMES_FOLLOWED = """[main]
summary = "cpu-partitioning with a shield rule by name: renames are followed"
include = ["cpu-partitioning"]

[[shield.rule]]
match = "^no-such-task$"
cpus = "0"
"""
HELD_CHASE = """[main]
summary = "the affinity shield, renames followed, held by an application"
include = ["renames-followed"]

[shield]
mechanism = "affinity"
"""


@contextlib.contextmanager
def idle_threads(n: int) -> Iterator[subprocess.Popen[str]]:
    """One process holding `n` idle threads (a JVM's worth), allowed on every CPU; killed
    on leaving the block."""
    proc = subprocess.Popen([sys.executable, "-c", IDLE_THREADS, str(n)],
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def name_has_owner(address: str) -> bool:
    import dbus

    conn = dbus.bus.BusConnection(address)
    try:
        return bool(conn.name_has_owner(BUS_NAME))
    finally:
        conn.close()


class Latencyd:
    """One latencyd process with its own state dir and config, on a given bus."""

    def __init__(
        self,
        bus_address: str,
        workdir: Path,
        profile: str | None = None,
        profile_dirs: list[Path] | None = None,
        extra: list[str] | None = None,
        config: str | None = "",  # None: the workdir's config as it is (a recovery)
        environment: dict[str, str] | None = None,
    ) -> None:
        self.address = bus_address
        self.workdir = workdir
        self.state_dir = workdir / "state"
        self.config = workdir / "latencyd.conf"
        if config is not None:
            self.config.write_text(config)
        self.profile = profile
        self.profile_dirs = profile_dirs or []
        self.extra = extra or []
        self.environment = environment or {}
        self.launcher: Callable[[list[str]], tuple[list[str], list[int], dict[str, str]]] | None
        self.launcher = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "latencyd.log"
        self.record = STARTED_DAEMONS / f"{os.getpid()}-{id(self)}.json"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ) | self.environment
        env["DBUS_SYSTEM_BUS_ADDRESS"] = self.address
        return env

    def argv(self) -> list[str]:
        args = [
            str(BIN / "latencyd"),
            "--state-dir",
            str(self.state_dir),
            "--keep-dir",  # never the machine's /var/lib/latencyd
            str(self.workdir / "keep"),
            "--config",
            str(self.config),
        ]
        for d in self.profile_dirs:
            args += ["--profile-dir", str(d)]
        if self.profile:
            args += ["--profile", self.profile]
        return args + self.extra

    # 60 s: a deadline, not a figure (bench daemon measures start-up); on a machine loaded
    # to 12 a daemon's Python start took more than 15 s (CI's run of 2026-11-29).
    def start(self, timeout: float = 60.0) -> Latencyd:
        argv, env = self.argv(), self.env
        fds: list[int] = []
        if self.launcher is not None:  # e.g. as systemd would, passing stored fds
            argv, fds, extra = self.launcher(argv)
            env = env | extra
        if "--root" not in argv:  # a fake /proc+/sys is nothing to restore
            started_daemons()
            record = {"workdir": str(self.workdir), "extra": self.extra,
                      "profile_dirs": [str(d) for d in self.profile_dirs]}  # fmt: skip
            self.record.write_text(json.dumps(record))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, pass_fds=fds)
        deadline = time.monotonic() + timeout
        while not name_has_owner(self.address):
            if self.proc.poll() is not None:
                raise RuntimeError(f"latencyd exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"latencyd did not claim its bus name:\n{self.log()}")
            time.sleep(0.01)
        return self

    def ctl(self, *args: str, user: int | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "latencyctl"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def spawn_ctl(self, *args: str) -> subprocess.Popen[str]:
        """latencyctl running in the background (e.g. `hold PROFILE -- CMD`)."""
        return subprocess.Popen(
            [str(BIN / "latencyctl"), *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        if not (self.state_dir / "journal.jsonl").exists():
            self.record.unlink(missing_ok=True)  # nothing left for a later run to restore
        return code

    def recover(self) -> None:
        """If a killed daemon left a journal, restore it: start on the same state dir
        without a profile (the start restores what it adopts), then stop."""
        if self.proc is not None and self.proc.poll() is None:
            return
        if not (self.state_dir / "journal.jsonl").exists():
            return
        self.profile = None
        self.extra = [a for a in self.extra if a != "--no-profile"] + ["--no-profile"]
        self.start()
        self.stop()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


def recover_killed_runs(bus_address: str) -> list[str]:
    """Restore what the daemons of runs that are gone (killed before their clean-up) left
    applied: each is started again on its state dir with no profile, which restores the
    journal it adopts, and stopped (Latencyd.recover). Returns the state dirs recovered."""
    recovered = []
    records = sorted(started_daemons().glob("*.json")) if STARTED_DAEMONS.exists() else []
    for record in records:
        if Path(f"/proc/{record.name.split('-')[0]}").exists():
            continue  # a live run's
        was = json.loads(record.read_text())
        dirs = [Path(d) for d in was["profile_dirs"]]
        daemon = Latencyd(bus_address, Path(was["workdir"]), None, dirs, was["extra"], config=None)
        if (daemon.state_dir / "journal.jsonl").exists():
            daemon.recover()
            recovered.append(str(daemon.state_dir))
        record.unlink()
    return recovered


def sysctl(key: str) -> str:
    return Path("/proc/sys", key.replace(".", "/")).read_text().strip()


def unlike_machine(key: str, value: str, alternative: str) -> str:
    """`value`, or `alternative` where the machine already has `value` (a profile that
    set it would change nothing there, and a test could not see it apply)."""
    return alternative if sysctl(key) == value else value


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The longest a test waits for what must happen. A pass returns at once, so only a failure
# pays it. How soon something happens is a benchmark's figure, never a test's limit: in
# `make test` the VM tier's emulator runs beside the host suites, and a 0.5 s limit on
# pinning new kernel threads failed there (stop 61's CI).
SETTLE_S = 60.0


def wait_for(cond: Callable[[], bool], timeout: float = SETTLE_S) -> float:
    """Poll cond every 0.5 ms until true; returns the seconds it took."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout} s")
        time.sleep(0.0005)
    return time.monotonic() - start


def wait_for_child(parent: int, comm: str) -> int:
    """The pid of `parent`'s child that has become `comm` (waited for as long as any: under
    load a `latencyctl run` took longer than 5 s to start its command)."""
    found: list[int] = []

    def child() -> bool:
        out = subprocess.run(["pgrep", "-P", str(parent), "-x", comm], capture_output=True,
                             text=True).stdout.split()  # fmt: skip
        found[:] = [int(p) for p in out]
        return bool(found)

    wait_for(child)
    return found[0]


class BusListener:
    """A bus monitor read as it prints. A test waits until the bus has made it a listener
    and until it heard what it must, instead of sleeping and hoping that it kept up: on a
    loaded machine it can take longer than any fixed sleep to connect, or to print."""

    def __init__(self, cmd: list[str], ready: str) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)  # fmt: skip
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_for(lambda: ready in self.heard() or self.proc.poll() is not None)
        assert ready in self.heard(), f"{cmd[0]} never listened: {self.heard()}"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)

    def heard(self) -> str:
        return "".join(self._lines)

    def stop(self) -> str:
        """Everything it printed (it is stopped first)."""
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)
        return self.heard()


def signal_listener(address: str, member: str) -> BusListener:
    """dbus-monitor for latencyd's signal `member`; listening once the bus has made it a
    monitor (it then prints the NameLost of its own unique name)."""
    rule = f"type='signal',interface='org.latencyd.Daemon1',member='{member}'"
    return BusListener(["dbus-monitor", "--address", address, rule], ready="member=NameLost")
