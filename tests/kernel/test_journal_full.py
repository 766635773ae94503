"""The journal on a real file system that fills up (issue 37): a switch whose originals
cannot be journaled is refused before anything changes, nothing journaled before is lost,
and `off` (by this engine, or by the next start's after a crash) restores everything."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from latencyd.plugins.sysctl import Sysctl, SysctlPlugin

from latencyd.core.engine import Engine
from latencyd.core.journal import Journal
from latencyd.errors import LatencydError
from latencyd.kernel.system import System

pytestmark = pytest.mark.usefixtures("kernel_guard")
SWAPPINESS = Sysctl("vm.swappiness")


@contextlib.contextmanager
def tiny_tmpfs(where: Path, size: str = "64k") -> Iterator[Path]:
    where.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                    str(where)], check=True)  # fmt: skip
    try:
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)  # fds may be open yet


def fill(directory: Path) -> Path:
    """Take every free block of the file system `directory` is on."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def many_sysctls() -> dict[tuple[str, Sysctl], str]:
    """Settings enough that their originals take more than the file system has left: the
    loopback's per-interface sysctls, each wanted as it is (so a mistake changes nothing)."""
    wanted = {}
    for family in ("ipv4", "ipv6"):
        conf = Path(f"/proc/sys/net/{family}/conf/lo")
        for f in sorted(conf.iterdir()) if conf.is_dir() else []:
            with contextlib.suppress(OSError):  # some refuse reads (stable_secret: EIO)
                if f.stat().st_mode & 0o200:
                    key = Sysctl(f"net.{family}.conf.lo.{f.name}")
                    wanted[("sysctl", key)] = f.read_text().strip()
    return wanted


def test_a_switch_the_full_disk_cannot_journal_is_refused_and_off_restores(
    tmp_path: Path,
) -> None:
    original = Path("/proc/sys/vm/swappiness").read_text().strip()
    wanted_a = {("sysctl", SWAPPINESS): "7" if original != "7" else "8"}
    with tiny_tmpfs(tmp_path / "fs") as fs:
        state = fs / "state"
        engine = Engine({"sysctl": SysctlPlugin(System("/"))}, Journal(state))
        engine.switch(wanted_a, "A")
        journaled = (state / "journal.jsonl").read_bytes()
        filler = fill(fs)
        wanted_b = {**many_sysctls(), ("sysctl", SWAPPINESS): "9" if original != "9" else "6"}
        assert len(wanted_b) > 40
        with pytest.raises(LatencydError, match="No space left on device"):
            engine.switch(wanted_b, "B")
        # Refused cleanly: the kernel holds A, the journal A's originals, byte for byte.
        swappiness = Path("/proc/sys/vm/swappiness").read_text().strip()
        assert swappiness == wanted_a[("sysctl", SWAPPINESS)]
        assert (state / "journal.jsonl").read_bytes() == journaled
        assert engine.profile == "A" and dict(engine.applied) == wanted_a
        # The next start (a crash now) adopts A's originals and can put them back ...
        after_crash = Engine({"sysctl": SysctlPlugin(System("/"))}, Journal(state))
        assert after_crash.adopt() is not None
        assert dict(after_crash.applied).keys() == wanted_a.keys()
        filler.unlink()
        # ... and so can this one, once there is room again.
        assert engine.off() == []
        assert Path("/proc/sys/vm/swappiness").read_text().strip() == original
        assert not (state / "journal.jsonl").exists()
        engine.journal.close()
        after_crash.journal.close()
