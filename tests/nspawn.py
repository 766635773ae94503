"""Boot a real systemd as PID 1 in a container on the host's own root, for the boot test.

`systemd-nspawn --directory=/ --volatile=yes` boots the host's /usr (read-only) on a tmpfs
root: a fresh machine with the host's software and an empty /etc. What the test
installs into /etc is bound in from a staging directory. The kernel is the host's, and
/proc/sys, /proc/irq and /sys are writable in it (SYSTEMD_NSPAWN_API_VFS_WRITABLE=1), so
latencyd under the container's systemd tunes the host kernel, which is the point.

A container on a shared kernel must not change what belongs to the host, so the staging
directory also holds what isolates it (none of it touches how latencyd is installed):
- /etc/machine-id: not a first boot, so no `systemctl preset-all`, which would enable every
  installed unit (networkd would configure eth0; TuneD would start);
- masks (links to /dev/null) for units that write the host's kernel on every boot:
  systemd-sysctl (sysctl.d), udev (rules run on the host's devices), modules-load, binfmt,
  networkd, timesyncd.
PID 1 itself raises fs.file-max, fs.nr_open and net.unix.max_dgram_qlen at start;
`PID1_SYSCTLS` names them so the test can put them back after the container is gone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

MASKED = (
    "systemd-sysctl.service",
    "systemd-udevd.service",
    "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket",
    "systemd-udev-trigger.service",
    "systemd-udev-settle.service",
    "systemd-modules-load.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "systemd-networkd.service",
    "systemd-networkd.socket",
    "systemd-timesyncd.service",
)
PID1_SYSCTLS = (
    "/proc/sys/fs/file-max",
    "/proc/sys/fs/nr_open",
    "/proc/sys/net/unix/max_dgram_qlen",
)
# What nspawn leaves on the host's /run (created on first use, never removed).
NSPAWN_RUNTIME = (Path("/run/systemd/nspawn"), Path("/run/systemd/nspawn-root"))
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


Bind = tuple[Path, str, bool]  # host path, path in the container, writable


def isolate(stage: Path) -> list[Bind]:
    """Add the container's isolation (see the module docstring) to a staged /etc: the
    masks go into its /etc/systemd/system; returns the other files to bind."""
    (stage / "etc").mkdir(parents=True, exist_ok=True)
    (stage / "etc/machine-id").write_text(secrets.token_hex(16) + "\n")
    units = stage / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    for unit in MASKED:
        (units / unit).symlink_to("/dev/null")
    return [
        (stage / "etc/machine-id", "/etc/machine-id", False),
        # The dynamic linker's cache, as on any installed system: without it, ctypes'
        # find_library (pyudev's libudev) finds nothing.
        (Path("/etc/ld.so.cache"), "/etc/ld.so.cache", False),
    ]


@dataclass
class Container:
    """One booted container, with the host paths it binds."""

    binds: list[Bind]
    proc: subprocess.Popen[bytes] | None = None
    init_pid: int = 0
    created_runtime: list[Path] = field(default_factory=list)

    def boot(self, log: Path, timeout: float = 90.0) -> str:
        """Start it and wait for the boot to finish; returns is-system-running's answer.

        nspawn says when: with --notify-ready=yes it passes PID 1's READY=1 (sent once
        the boot transaction is done) to $NOTIFY_SOCKET, after X_NSPAWN_LEADER_PID=
        (PID 1 as the host sees it). Asking PID 1 itself instead races its start: for
        a few ms after its exec `systemctl is-system-running --wait` answers "offline"
        (/run/systemd/system not made yet), which a CI run once hit."""
        self.created_runtime = [p for p in NSPAWN_RUNTIME if not p.exists()]
        argv = [
            "systemd-nspawn",
            "--directory=/",
            "--volatile=yes",
            "--register=no",
            "--keep-unit",
            "--console=pipe",
            "--quiet",
            "--notify-ready=yes",
            "--bind=/dev/cpu_dma_latency",
        ]
        for host, inside, writable in self.binds:
            argv.append(f"--bind{'' if writable else '-ro'}={host}:{inside}")
        argv += ["--boot", "systemd.firstboot=off"]
        notify_path = log.with_name("notify")
        with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)) as notify:
            notify.bind(str(notify_path))
            env = {
                "PATH": PATH,
                "SYSTEMD_NSPAWN_API_VFS_WRITABLE": "1",
                "LANG": "C.UTF-8",
                "NOTIFY_SOCKET": str(notify_path),
            }
            with open(log, "wb") as out:
                self.proc = subprocess.Popen(
                    argv,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            self._wait_ready(notify, log, time.monotonic() + timeout)
        notify_path.unlink()
        return self.run("systemctl", "is-system-running").stdout.strip()

    def _wait_ready(self, notify: socket.socket, log: Path, deadline: float) -> None:
        """Read nspawn's notifications until READY=1, keeping the leader's PID."""
        assert self.proc is not None
        ready = False
        while not ready:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"systemd-nspawn exited ({self.proc.returncode}):\n"
                    + log.read_text(errors="replace")
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    "the container did not finish booting:\n" + log.read_text(errors="replace")
                )
            if not select.select([notify], [], [], 0.2)[0]:
                continue
            for line in notify.recv(4096).decode(errors="replace").splitlines():
                key, _, value = line.partition("=")
                if key == "X_NSPAWN_LEADER_PID":
                    self.init_pid = int(value)
                ready = ready or (key == "READY" and value == "1")
        assert self.init_pid, "nspawn said READY=1 before naming the container's PID 1"

    def _init(self) -> int:
        """The container's PID 1 found without nspawn's word (for poweroff, when the boot
        failed before nspawn named it): nspawn's child once it has become systemd."""
        assert self.proc is not None
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        try:
            for pid in children.read_text().split():
                if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                    return int(pid)
        except OSError:
            pass
        return 0

    def run(
        self, *argv: str, user: int | None = None, timeout: float = 60.0, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """A command inside (every namespace of the container's init); as `user` if given."""
        cmd = ["nsenter", "-t", str(self.init_pid), "-a"]
        if user is not None:
            cmd += ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
        return subprocess.run(
            [*cmd, *argv],
            env={"PATH": PATH, "LANG": "C.UTF-8"},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=check,
        )

    def poweroff(self, timeout: float = 90.0) -> None:
        """Shut it down cleanly (its services stop as on any shutdown: latencyd restores),
        then remove what nspawn left on the host's /run. nspawn asks the container to power
        off on SIGTERM; if nspawn is gone but the container is not (it must never outlive
        the test), its init gets systemd's poweroff signal, then SIGKILL."""
        if self.proc is None:
            return
        self.init_pid = self.init_pid or self._init()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for sig in (signal.SIGRTMIN + 4, signal.SIGKILL):
            if not self.init_pid or not Path(f"/proc/{self.init_pid}").exists():
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, sig)
            deadline = time.monotonic() + timeout
            while Path(f"/proc/{self.init_pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        for path in reversed(self.created_runtime):
            shutil.rmtree(path, ignore_errors=True)
