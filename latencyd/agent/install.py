"""The directory the agent installs the cluster's profiles into, and the daemon searches
first (/run/latencyd/cluster-profiles, named in the daemon's `profile_dirs`): a file per
LatencyProfile, and `.digest`, the digest of the set installed (what tells a restarted
agent that the node already holds what the cluster wants).

Each file is written beside its name and renamed over it; files of profiles gone from
the cluster are removed; `.digest` is written last, so a crash mid-way leaves a digest
that does not match and the next agent installs again. The daemon reads the directory
only when the agent asks it to reload."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from latencyd.agent.render import SUFFIX
from latencyd.errors import LatencydError

DIGEST_FILE = ".digest"


class InstallError(LatencydError):
    """The profile directory cannot be used, and why."""


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".new-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)  # a buffered file writes all of it, or raises
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class ProfileDir:
    def __init__(self, path: Path) -> None:
        self.path = path

    def prepare(self) -> None:
        """Create it (0755, root's); refuse one that another user owns or that is a link:
        the daemon runs as root and trusts only root's profiles."""
        self.path.mkdir(mode=0o755, parents=True, exist_ok=True)
        st = os.lstat(self.path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise InstallError(
                f"{self.path}: not a directory of this user's (uid {st.st_uid}): not used"
            )

    def digest(self) -> str | None:
        try:
            return (self.path / DIGEST_FILE).read_text().strip() or None
        except FileNotFoundError:
            return None

    def files(self) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in self.path.glob(f"*{SUFFIX}") if p.is_file()}

    def install(self, files: Mapping[str, bytes], digest: str | None) -> None:
        """Make the directory hold exactly `files`, then say `digest`."""
        (self.path / DIGEST_FILE).unlink(missing_ok=True)
        for name, data in files.items():
            if (self.path / name).is_file() and (self.path / name).read_bytes() == data:
                continue  # unchanged: its mtime stays, the daemon's reload reads no news
            _write(self.path / name, data)
        for old in self.path.glob(f"*{SUFFIX}"):
            if old.name not in files:
                old.unlink()
        if digest is not None:
            _write(self.path / DIGEST_FILE, digest.encode() + b"\n")

    def staging(self) -> Path:
        """A fresh private directory beside this one, for checking files before they are
        installed (the caller removes it)."""
        return Path(tempfile.mkdtemp(dir=self.path.parent, prefix=".latencyd-agent-"))
