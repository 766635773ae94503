"""Which directories a root process may trust with its state: the rule sudo and OpenSSH
apply before they believe a file.

A directory is trusted when it and every directory above it (after resolving symlinks
above it; the last component itself must not be one) is owned by root or by this user and
is writable by nobody else — unless it has the sticky bit (as /tmp), where others cannot
rename or remove what is ours. Whoever could write to one of them could swap what lies
below for their own: a planted journal whose "originals" a restore would write, a lock
file that is a symlink to /etc/shadow.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Collection
from pathlib import Path

from latencyd.errors import UnsafePath, describe_oserror

OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def untrusted(
    st: os.stat_result, owners: Collection[int], sticky_allowed: bool = True
) -> str | None:
    """Why a file or directory with this stat could be changed by someone not in `owners`
    (a sticky directory, as /tmp, only where `sticky_allowed`), or None: the one rule by
    which latencyd trusts what is on disk (its state, profiles, dev directories)."""
    if st.st_uid not in owners:
        whose = " or ".join("root" if uid == 0 else f"uid {uid}" for uid in dict.fromkeys(owners))
        return f"owned by uid {st.st_uid}, not {whose}"
    if st.st_mode & OTHERS_WRITE and not (sticky_allowed and st.st_mode & stat.S_ISVTX):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _unsafe_dir(st: os.stat_result, uid: int) -> str | None:
    """Why a directory with this stat is not to be trusted, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    return untrusted(st, (0, uid))


def check_ancestors(path: Path) -> None:
    """UnsafePath unless every directory above `path` (resolved) is trusted."""
    uid = os.geteuid()
    parent = Path(os.path.realpath(path.parent))
    for directory in [*reversed(parent.parents), parent]:
        why = _unsafe_dir(os.stat(directory), uid)
        if why:
            raise UnsafePath(f"{path}: {directory} cannot be trusted: {why}")


def open_private_dir(path: Path, create: bool = True) -> int:
    """A descriptor (O_DIRECTORY, opened without following a symlink) of `path`, made
    with mode 0700 if missing: refused (UnsafePath) when it or a directory above it
    could be changed by another user, or it is not this user's own. Everything kept
    there is then opened relative to the descriptor, so no later rename above it counts."""
    path = Path(os.path.abspath(path))
    try:
        if create:
            os.makedirs(path.parent, mode=0o700, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
        check_ancestors(path)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except UnsafePath:
        raise
    except OSError as exc:
        # O_DIRECTORY | O_NOFOLLOW on a symlink to a directory fails with ENOTDIR.
        what = "it is a symlink" if os.path.islink(path) else describe_oserror(exc, True)
        raise UnsafePath(f"{path} cannot be used: {what}") from exc
    st = os.fstat(fd)
    # Its own: not root's unless we are root, and not writable by others even if sticky.
    why = untrusted(st, (os.geteuid(),), sticky_allowed=False)
    if why:
        os.close(fd)
        raise UnsafePath(f"{path} cannot be trusted: {why}")
    return fd
