"""The directory the agent installs the cluster's profiles into, and the daemon searches
after all of the host's (/run/latencyd-cluster/profiles, the daemon's `cluster_profiles`):
a file per LatencyProfile, and `.digest`, the digest of the set installed (what tells a
restarted agent that the node already holds what the cluster wants).

A set is written whole into a fresh directory beside it (`stage`), checked there by
latencyd's loader exactly as the daemon will load it, and then exchanged with the live
directory in one step (`swap`: renameat2 RENAME_EXCHANGE), so the daemon never reads a
half-installed set nor one other than the set that was checked, and a refusal swaps the
previous set back just as whole. `.digest` is written last, once the daemon took the set:
a crash mid-way leaves a digest that does not match, and the next agent installs again.
The daemon reads the directory only when the agent asks it to reload (or its admin does)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from latencyd.agent.render import SUFFIX
from latencyd.errors import LatencydError

DIGEST_FILE = ".digest"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 1 << 1


class InstallError(LatencydError):
    """The profile directory cannot be used, and why."""


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".new-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)  # a buffered file writes all of it, or raises
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _exchange(a: Path, b: Path) -> None:
    """Swap two directories in one step: each name holds the other's tree after."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE):
        errno = ctypes.get_errno()
        raise InstallError(f"cannot exchange {a} and {b}: {os.strerror(errno)}")


class ProfileDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    def prepare(self) -> None:
        """Create it (0755, root's); refuse one that another user owns or that is a link:
        the daemon runs as root and trusts only root's profiles."""
        self.path.mkdir(mode=0o755, parents=True, exist_ok=True)
        for directory in (self.path.parent, self.path):
            st = os.lstat(directory)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                raise InstallError(
                    f"{directory}: not a directory of this user's (uid {st.st_uid}): not used"
                )

    def digest(self) -> str | None:
        try:
            return (self.path / DIGEST_FILE).read_text().strip() or None
        except FileNotFoundError:
            return None

    def files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in self.path.glob(f"*{SUFFIX}") if p.is_file()}

    def set_digest(self, digest: str) -> None:
        _write(self.path / DIGEST_FILE, digest.encode() + b"\n")

    def stage(self, files: Mapping[str, bytes]) -> Path:
        """A fresh private directory beside this one holding exactly `files` (the caller
        swaps it in or discards it)."""
        staged = Path(tempfile.mkdtemp(dir=self.path.parent, prefix=".latencyd-agent-"))
        try:
            for name, data in files.items():
                _write(staged / name, data)
            os.chmod(staged, 0o755)
        except BaseException:
            self.discard(staged)
            raise
        return staged

    def swap(self, staged: Path) -> None:
        """What `staged` holds is installed and what was installed is in `staged`, at once."""
        _exchange(staged, self.path)

    @staticmethod
    def discard(staged: Path) -> None:
        shutil.rmtree(staged, ignore_errors=True)
