"""Real ext4 file systems on loop devices: each mount starts a jbd2/loopN-8 kernel thread."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path


def run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def jbd2_pids(device: str) -> list[int]:
    """PIDs of the jbd2 thread(s) journaling `device` (e.g. /dev/loop3 -> jbd2/loop3-8)."""
    name = f"jbd2/{Path(device).name}-"
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith(name):
                pids.append(int(entry))
    return pids


class LoopFs:
    """One ext4 image attached to a loop device; mount() and umount() as often as needed."""

    def __init__(self, workdir: Path, index: int, size_mb: int = 8) -> None:
        self.image = workdir / f"latencyd-test-{index}.img"
        self.mountpoint = workdir / f"latencyd-mnt-{index}"
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as f:
            f.truncate(size_mb << 20)
        run("mkfs.ext4", "-q", "-F", "-J", "size=1", str(self.image))
        self.device = run("losetup", "--find", "--show", str(self.image))
        self.mounted = False

    def mount(self) -> float:
        """Mount; returns the monotonic time when mount(8) returned."""
        run("mount", "-t", "ext4", "-o", "noatime", self.device, str(self.mountpoint))
        self.mounted = True
        return time.monotonic()

    def umount(self) -> None:
        if self.mounted:
            run("umount", str(self.mountpoint))
            self.mounted = False

    def close(self) -> None:
        self.umount()
        subprocess.run(["losetup", "-d", self.device], check=False)
        self.image.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.mountpoint.rmdir()
