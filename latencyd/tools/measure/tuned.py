"""TuneD for side-by-side comparisons ("tuned:NAME" scenarios): run in the foreground on
private copies of its configuration, stopped so that it rolls back, and what its rollback
is known to leave put back."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from latencyd.core.plugin import Plugin, Target, decode_target, discover
from latencyd.kernel.system import System
from latencyd.tools.measure import MeasureError
from latencyd.tools.measure.processes import Processes
from latencyd.tools.measure.scratch import scratch_dir

WORKQUEUES = "sys/devices/virtual/workqueue"


class TunedDaemon:
    """TuneD in the foreground without D-Bus or socket, for side-by-side comparisons only
    (latencyd never needs it). Stopped with SIGTERM, on which it rolls back its settings.

    TuneD keeps the originals it must put back only in its memory, so four things make a
    comparison safe even if this process is killed outright: TuneD gets SIGTERM when this
    process dies (PR_SET_PDEATHSIG, through setpriv); with `hold`, it runs under
    `latencyctl hold HOLD`, so latencyd keeps that profile until TuneD has rolled back
    (otherwise latencyd's own hold would end with this process, and latencyd would
    re-apply its profile while TuneD rolls back, recording TuneD's values as originals);
    between the two, `guard_tuned` puts back what TuneD's rollback is known to leave
    (RollbackLeftovers) before the hold ends; and it runs in a mount namespace of its own
    over private copies of /etc/tuned and /etc/modprobe.d, so its notes (active_profile,
    bootcmdline) and the module options its scripts write never reach the machine's
    files. `etc` is the configuration to copy instead of /etc/tuned (a comparison's own
    variables)."""

    FILES = (Path("/etc/tuned"), Path("/etc/modprobe.d"))
    ROLLBACK_S = 60.0  # its rollback joins its plugin threads: seconds, never SIGKILL it
    # Bind the private copies over the real directories, then become TuneD.
    PRIVATE = (
        'mount --bind "$1" /etc/tuned && mount --bind "$2" /etc/modprobe.d && shift 2 && exec "$@"'
    )

    def __init__(self, procs: Processes, etc: Path = FILES[0], hold: str | None = None) -> None:
        self.procs = procs
        self.etc = etc
        self.hold = hold
        self.proc: subprocess.Popen[str] | None = None
        self.workdir: Path | None = None
        self.copied: dict[Path, dict[str, bytes]] = {}  # the private copies as made
        self.wrote: list[str] = []  # the files TuneD changed in its private copies
        self.put_back: list[str] = []  # what TuneD's rollback left, put back

    def start(self, profile: str, timeout: float = 60.0) -> None:
        if shutil.which("tuned") is None:
            raise MeasureError("TuneD is not installed (apt-get install tuned)")
        self.stop()
        self.workdir = Path(
            tempfile.mkdtemp(prefix=f"latencyd-tuned-{os.getpid()}-", dir=scratch_dir())
        )
        self.procs.guard.path(self.workdir)
        copies = [self.workdir / "tuned", self.workdir / "modprobe.d"]
        for source, copy in zip((self.etc, self.FILES[1]), copies, strict=True):
            if source.is_dir():
                shutil.copytree(source, copy, symlinks=True)
            else:
                copy.mkdir()
        self.copied = {f: _files(c) for f, c in zip(self.FILES, copies, strict=True)}
        log = self.workdir / "tuned.log"
        argv = ["setpriv", "--pdeathsig", "TERM", "unshare", "--mount", "--propagation",
                "private", "sh", "-c", self.PRIVATE, "sh", *map(str, copies), "tuned",
                "--no-dbus", "--no-socket", "--profile", profile, "--log", str(log)]  # fmt: skip
        argv = ["setpriv", "--pdeathsig", "TERM", sys.executable, "-m", "latencyd.tools.measure",
                str(self.workdir / "put-back"), *argv]  # fmt: skip
        if self.hold is not None:
            argv = ["setpriv", "--pdeathsig", "TERM", sys.executable, "-m", "latencyd.tools.cli",
                    "hold", "--reason", f"TuneD {profile} (latencyctl measure)", self.hold,
                    "--", *argv]  # fmt: skip
        with open(self.workdir / "stderr", "w") as stderr:
            self.proc = self.procs.start(
                argv, grace=self.ROLLBACK_S, stdout=subprocess.DEVNULL, stderr=stderr
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log.read_text() if log.exists() else ""
            if self.proc.poll() is not None or "applied" in text:
                break
            time.sleep(0.1)
        else:
            text = "(no line says it applied the profile)"
        if self.proc.poll() is not None or "applied" not in text:
            text += (self.workdir / "stderr").read_text()
            self.stop()
            tail = " | ".join(text.strip().splitlines()[-3:]) or "no log"
            raise MeasureError(f"TuneD did not apply {profile}: {tail}")

    def stop(self) -> None:
        """End TuneD (it rolls back, then its guard puts back what the rollback left), note
        what it wrote in its copies, delete them."""
        if self.proc is not None:
            self.procs.end(self.proc, grace=self.ROLLBACK_S)
            with contextlib.suppress(ValueError):
                self.procs.running.remove(self.proc)
            self.proc = None
        if self.workdir is not None:
            report = self.workdir / "put-back"
            self.put_back += report.read_text().splitlines() if report.exists() else []
            for real, copy in zip(self.FILES, ("tuned", "modprobe.d"), strict=True):
                after = _files(self.workdir / copy)
                before = self.copied[real]
                self.wrote += sorted(str(real / f) for f in after.keys() | before.keys()
                                     if after.get(f) != before.get(f))  # fmt: skip
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


class RollbackLeftovers:
    """What TuneD's rollback is known to leave, read before TuneD starts and put back after
    it has exited.

    TuneD writes the writeback workqueue's mask through two paths (the workqueue/*/cpumask
    glob and /sys/bus/workqueue/devices/writeback/cpumask) and its rollback sometimes
    restores the second from a value read after the first was set, which leaves it
    isolated (docs/measurements.md). And it writes back the vm.dirty_*ratio it read: 0 on a
    machine whose limits are in bytes, and the kernel then zeroes the bytes too."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.masks = workqueue_masks(system)
        self.limits = DirtyLimits(system)
        self.limits_before = self.limits.read()

    def put_back(self) -> list[str]:
        """Puts back what differs; says what it wrote."""
        done = []
        masks_now = workqueue_masks(self.system)
        for path, mask in self.masks.items():
            now = masks_now.get(path)
            if now is not None and now != mask:
                self.system.write(path, mask)
                done.append(f"{path}: {now} -> {mask}")
        return done + self.limits.put_back(self.limits_before)


def guard_tuned(system: System, report: Path, argv: list[str]) -> int:
    """Runs TuneD (`argv`) and, once it has exited (rolled back), puts back what its
    rollback left, writing one line per setting to `report`. SIGTERM and SIGHUP are passed
    to TuneD and waited for, never obeyed: the put-back must run after its rollback."""
    leftovers = RollbackLeftovers(system)
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: object) -> None:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, forward)
    child = subprocess.Popen(argv)
    code = child.wait()
    report.write_text("".join(f"{line}\n" for line in leftovers.put_back()))
    return code


def workqueue_masks(system: System) -> dict[str, str]:
    """The unbound-workqueue cpumask and each workqueue's own, by path."""
    masks = [f"{WORKQUEUES}/cpumask"]
    masks += [
        f"{WORKQUEUES}/{wq}/cpumask"
        for wq in system.listdir(WORKQUEUES)
        if system.exists(f"{WORKQUEUES}/{wq}/cpumask")
    ]
    return {f"/{rel}": system.read(rel) for rel in masks}


class DirtyLimits:
    """The two vm dirty limits (dirty, dirty_background) through the writeback plugin, which
    knows the kernel keeps either the ratio or the bytes of each pair."""

    PAIRS = (
        {"kind": "dirty_limit", "pair": "dirty"},
        {"kind": "dirty_limit", "pair": "dirty_background"},
    )

    def __init__(self, system: System) -> None:
        self.plugin: Plugin[Any, Any, Any] = discover()["writeback"](system)
        kinds = {t.kind: t for t in self.plugin.targets}
        self.targets = [decode_target(kinds, pair) for pair in self.PAIRS]

    def read(self) -> dict[Target, Any]:
        return {t: self.plugin.read(t) for t in self.targets}

    def put_back(self, before: dict[Target, Any]) -> list[str]:
        """Writes each limit that differs from `before`; says what it wrote."""
        done = []
        for target, now in self.read().items():
            was = before.get(target)
            if was is not None and now != was:
                self.plugin.write(target, was)
                describe = self.plugin.describe
                done.append(f"{describe(target, now)} -> {describe(target, was)}")
        return done


def _files(root: Path) -> dict[str, bytes]:
    """Every regular file under `root`, by relative path."""
    return {
        str(f.relative_to(root)): f.read_bytes()
        for f in sorted(root.rglob("*"))
        if f.is_file() and not f.is_symlink()
    }
