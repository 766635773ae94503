"""Who a process is, on the real kernel (issue 37): a name is anyone's to take."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from latencyd.kernel.system import System

NOBODY = 65534


@pytest.fixture
def named_irqbalance() -> Iterator[Path]:
    """`sleep` under the name irqbalance, in a directory anyone may read (its comm is its
    file's name)."""
    if System("/").root_process("irqbalance") is not None:
        pytest.skip("a real irqbalance runs here")
    where = Path(tempfile.mkdtemp(prefix="latencyd-identity-"))
    where.chmod(0o755)
    try:
        shutil.copy(shutil.which("sleep") or "/bin/sleep", where / "irqbalance")
        yield where / "irqbalance"
    finally:
        shutil.rmtree(where)


def started(argv: list[str], uid: int | None = None) -> subprocess.Popen[bytes]:
    user = {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}
    proc = subprocess.Popen(argv, **user)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{proc.pid}/comm").read_text().strip() != Path(argv[0]).name:
        assert time.monotonic() < deadline, "the process did not start"
        time.sleep(0.01)
    return proc


def test_a_users_process_named_irqbalance_is_not_the_service(named_irqbalance: Path) -> None:
    system = System("/")
    theirs = started([str(named_irqbalance), "30"], uid=NOBODY)
    try:
        assert system.task_uid(theirs.pid) == NOBODY
        assert system.root_process("irqbalance") is None
        ours = started([str(named_irqbalance), "30"])
        try:
            assert system.root_process("irqbalance") == ours.pid
        finally:
            ours.kill()
            ours.wait()
    finally:
        theirs.kill()
        theirs.wait()
