"""Where a measurement's temporary directories go, and what runs killed outright left
(their namespaces and directories), removed by the next run."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from latencyd.kernel.system import System


def scratch_dir() -> str | None:
    """Where measure's temporary directories go: /run for root, whose /tmp the daemon's
    unit hides from it (PrivateTmp=yes) though the daemon must read the scenario profiles
    kept there; the usual temporary directory otherwise."""
    return "/run" if os.geteuid() == 0 and os.access("/run", os.W_OK) else None


def remove_what_dead_runs_left(system: System) -> list[str]:
    """A run killed outright (SIGKILL) cannot remove its namespaces or temporary
    directories, so each run removes those of runs whose process is gone. Their names
    carry the run's PID (ltdm-PID-s, latencyd-measure-PID-*, latencyd-tuned-PID-*,
    latencyd-attribute-PID-*, latencyd-recommend-PID-*); a live run's are left alone."""
    names = fnmatch.filter(system.listdir("run/netns"), "ltdm-*-[sc]")
    dirs = [
        path
        for tmp in {Path(tempfile.gettempdir()), Path(scratch_dir() or tempfile.gettempdir())}
        for kind in ("measure", "tuned", "attribute", "recommend")
        for path in tmp.glob(f"latencyd-{kind}-*-*")
    ]
    removed = []
    for name, path in [(n, None) for n in names] + [(d.name, d) for d in dirs]:
        pid = re.search(r"-(\d+)-", name)
        if pid is None or system.exists(f"proc/{pid[1]}"):
            continue
        if path is not None and not _ours(path):
            continue  # another user's, by the same name: not a dead run's to remove
        if path is None:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    return removed


def _ours(path: Path) -> bool:
    """Whether `path` is a directory of this user's (not a symlink): what a run made."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
