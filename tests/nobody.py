"""Calls as an unprivileged user (uid/gid 65534), for the least-privilege tests.

The Python in use lives under /root (mode 700), so the child forks after its
imports and drops privileges, instead of exec'ing a new interpreter.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import pkgutil
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

PR_SET_NAME = 15  # linux/prctl.h

# A policy that lets anyone call anything: the daemon's own uid check must still hold.
PERMISSIVE_POLICY = """<!DOCTYPE busconfig PUBLIC
 "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <policy user="root"><allow own="org.latencyd.Daemon1"/></policy>
  <policy context="default"><allow send_destination="org.latencyd.Daemon1"/></policy>
</busconfig>
"""


def as_nobody(fn: Callable[[], int]) -> int:
    """Run fn in a forked child that dropped to uid/gid 65534 (imports already done)."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def cli_as_nobody(address: str, *args: str, capture: Path) -> int:
    import dbus  # noqa: F401  (imported before dropping privileges)

    import latencyd.kernel
    import latencyd.tools
    from latencyd.tools import cli

    # What latencyctl imports only when it needs it (status's boot lines import
    # latencyd.kernel.noise) is read as nobody, who may not read a checkout under a
    # private directory: the suite passed only when an earlier test had imported it.
    for package in (latencyd.kernel, latencyd.tools):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)

    # Opened before dropping privileges: pytest's tmp dir is private to root.
    fd = os.open(capture, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def run() -> int:
        os.environ["DBUS_SYSTEM_BUS_ADDRESS"] = address
        out = open(fd, "w", closefd=False)  # noqa: SIM115  (pytest replaced sys.stdout)
        sys.stdout = sys.stderr = out
        code = cli.main(list(args))
        out.flush()
        return code

    try:
        return as_nobody(run)
    finally:
        os.close(fd)


@contextlib.contextmanager
def renaming_as_nobody(depth: int = 0) -> Iterator[int]:
    """A process of nobody's renaming itself (prctl PR_SET_NAME) as fast as it can until
    the block ends, `depth` generations below the one forked here (each parent waiting
    for its child), as any local user can. Yields the process group, killed on leaving."""
    libc = ctypes.CDLL(None, use_errno=True)
    pid = os.fork()
    if pid == 0:
        try:
            os.setpgid(0, 0)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            for _ in range(depth):
                if os.fork():
                    os.wait()
                    os._exit(0)
            names = [b"rename-a", b"rename-b"]
            while True:
                for name in names:
                    libc.prctl(PR_SET_NAME, name)
        finally:
            os._exit(0)
    with contextlib.suppress(PermissionError):  # the child may have done it first
        os.setpgid(pid, pid)
    try:
        yield pid
    finally:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
