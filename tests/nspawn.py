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
import shutil
import signal
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
    console: list[str] = field(default_factory=list)
    created_runtime: list[Path] = field(default_factory=list)

    def boot(self, log: Path, timeout: float = 90.0) -> str:
        """Start it and wait for the boot to finish; returns is-system-running's answer."""
        self.created_runtime = [p for p in NSPAWN_RUNTIME if not p.exists()]
        argv = [
            "systemd-nspawn",
            "--directory=/",
            "--volatile=yes",
            "--register=no",
            "--keep-unit",
            "--console=pipe",
            "--quiet",
            "--bind=/dev/cpu_dma_latency",
        ]
        for host, inside, writable in self.binds:
            argv.append(f"--bind{'' if writable else '-ro'}={host}:{inside}")
        argv += ["--boot", "systemd.firstboot=off"]
        env = {"PATH": PATH, "SYSTEMD_NSPAWN_API_VFS_WRITABLE": "1", "LANG": "C.UTF-8"}
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.init_pid:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"systemd-nspawn exited ({self.proc.returncode}):\n"
                    + log.read_text(errors="replace")
                )
            if time.monotonic() > deadline:
                raise RuntimeError("the container's init did not start")
            self.init_pid = self._init()
            time.sleep(0.05)
        # Until PID 1 has its private socket up, systemctl cannot ask it anything.
        while time.monotonic() < deadline:
            state = self.run("systemctl", "is-system-running", "--wait", timeout=timeout)
            if state.stdout.strip():
                return state.stdout.strip()
            time.sleep(0.1)
        raise RuntimeError(f"the container did not finish booting: {state.stderr}")

    def _init(self) -> int:
        """The container's PID 1: nspawn's child once it has become systemd (before that,
        the child is nspawn's own, setting the container up)."""
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
