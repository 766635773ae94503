"""`make check` as any user (README, Quick start): a user who is not root, in a clone of
their own, gets a .venv of their own and the unit tests and lint, with no root and no
daemon; root is needed only for Debian packages that are missing (scripts/setup.sh).

Run for real: a clone of this repository's HEAD given to nobody (uid 65534), its HOME a
directory of its own, the machine's environment otherwise. It installs the .venv from
the package index as a new user would (minutes), so the unit tests it runs are a few
(PYTEST_ADDOPTS): the full suite runs as root beside it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import harness

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.fixture
def clone() -> Iterator[Path]:
    """A clone of HEAD, and a HOME, nobody owns, in a directory nobody may enter."""
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv (util-linux) to run as another user")
    top = Path(tempfile.mkdtemp(prefix="latencyd-check-", dir="/var/tmp"))
    try:
        top.chmod(0o755)
        subprocess.run(["git", "clone", "-q", str(harness.REPO), str(top / "repo")],
                       check=True, capture_output=True, timeout=120)  # fmt: skip
        (top / "home").mkdir()
        for path in (top / "repo", top / "home"):
            for below, dirs, files in os.walk(path):
                for name in [below, *(Path(below, n) for n in dirs + files)]:
                    os.lchown(name, NOBODY, NOBODY)
        yield top / "repo"
    finally:
        shutil.rmtree(top)


def as_nobody(repo: Path, *command: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTEST"))}
    env.update(HOME=str(repo.parent / "home"), USER="nobody", LOGNAME="nobody", **extra)
    return subprocess.run([*AS_NOBODY, *command], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=1800, stdin=subprocess.DEVNULL)  # fmt: skip


def test_make_check_runs_as_a_user_in_a_clone_of_their_own(clone: Path) -> None:
    r = as_nobody(clone, "make", "check", PYTEST_ADDOPTS="-k test_layout")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "creating .venv" in r.stdout
    assert (clone / ".venv" / "pyvenv.cfg").stat().st_uid == NOBODY  # (its python: a link)
    assert "passed" in r.stdout and "Success: no issues found" in r.stdout  # tests, mypy
    # Set up once: a second run has nothing to set up, and says nothing of it.
    r = as_nobody(clone, "bash", "scripts/setup.sh", LATENCYD_SKIP_PERF="1")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
