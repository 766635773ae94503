"""`make run` (scripts/run-dev.sh) and the test harness run a root daemon: they keep its
lock, bus address and journal only where no other user can plant anything (issue 37)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from latencyd.errors import UnsafePath
from tests import harness

NOBODY = 65534
RUN_DEV = harness.REPO / "scripts" / "run-dev.sh"
DEFAULT_DEV_DIR = Path("/run/latencyd-dev")
OLD_DEV_DIR = Path("/tmp/latencyd-dev")  # where it lived before: world-writable /tmp


def run_dev(dev_dir: Path | None) -> subprocess.CompletedProcess[str]:
    """run-dev.sh with `true` in the daemon's place: it sets up, starts the bus, "runs"."""
    env = dict(os.environ, LATENCYD="/bin/true")
    env.pop("LATENCYD_DEV_DIR", None)
    if dev_dir is not None:
        env["LATENCYD_DEV_DIR"] = str(dev_dir)
    return subprocess.run(["bash", str(RUN_DEV)], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


@pytest.fixture
def planted_in_tmp(victim: Path) -> Iterator[Path]:
    """The attack on the old fixed path: a local user's /tmp/latencyd-dev whose lock is a
    symlink to a file root cares about."""
    if OLD_DEV_DIR.exists() or OLD_DEV_DIR.is_symlink():
        pytest.skip(f"{OLD_DEV_DIR} exists: not ours to replace")
    OLD_DEV_DIR.mkdir()
    (OLD_DEV_DIR / "lock").symlink_to(victim)
    (OLD_DEV_DIR / "state").mkdir()
    os.chown(OLD_DEV_DIR, NOBODY, NOBODY)
    try:
        yield OLD_DEV_DIR
    finally:
        shutil.rmtree(OLD_DEV_DIR)


def test_make_run_keeps_nothing_in_tmp(planted_in_tmp: Path, victim: Path) -> None:
    made = not DEFAULT_DEV_DIR.exists()
    try:
        r = run_dev(None)
        assert r.returncode == 0, r.stderr
        assert victim.read_text() == "precious\n"
        assert not (planted_in_tmp / "bus-address").exists()
        st = DEFAULT_DEV_DIR.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
    finally:
        if made:
            shutil.rmtree(DEFAULT_DEV_DIR, ignore_errors=True)


@pytest.mark.parametrize("how", ["another-owner", "loose-mode", "symlink", "loose-parent"])
def test_make_run_refuses_a_directory_another_user_could_change(
    tmp_path: Path, victim: Path, how: str
) -> None:
    dev = tmp_path / "dev"
    if how == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        dev.symlink_to(tmp_path / "real")
    elif how == "loose-parent":
        (tmp_path / "open").mkdir()
        (tmp_path / "open").chmod(0o777)
        dev = tmp_path / "open" / "dev"
    else:
        dev.mkdir(mode=0o700)
        (dev / "lock").symlink_to(victim)
        if how == "another-owner":
            os.chown(dev, NOBODY, NOBODY)
        else:
            dev.chmod(0o777)
    r = run_dev(dev)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "refusing" in r.stderr and "run-dev: not started" in r.stderr
    assert victim.read_text() == "precious\n"
    assert "DBUS_SYSTEM_BUS_ADDRESS" not in r.stdout  # nothing started


def test_the_harness_records_its_daemons_only_where_root_alone_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert not str(harness.STARTED_DAEMONS).startswith(tempfile.gettempdir())
    where = Path(tempfile.mkdtemp(dir="/run", prefix="latencyd-test-"))
    records = where / "records"
    monkeypatch.setattr(harness, "STARTED_DAEMONS", records)
    try:
        records.mkdir(mode=0o700)
        os.chown(records, NOBODY, NOBODY)  # as if another user had made it first
        with pytest.raises(UnsafePath, match=f"owned by uid {NOBODY}"):
            harness.started_daemons()
        with pytest.raises(UnsafePath):
            harness.recover_killed_runs("unix:path=/nonexistent")
    finally:
        shutil.rmtree(where)
