"""Issue 50, defect 4: any local user renaming a process in a loop (prctl PR_SET_NAME, as
fast as a CPU allows) must not keep the daemon from answering root. On main the task-event
read drained the socket until it was empty, at a priority above D-Bus: a renamer faster
than the daemon kept it there, and `off` was never answered.

Under the shipped cpu-partitioning (no section follows renames: the kernel drops them),
under a profile whose shield rules follow renames (they reach the daemon: its read budget,
the coalescing and its D-Bus-level priority keep it answering), and under the affinity
shield with a hold in force and the renamer 60 generations deep (each rename a walk up the
ancestors on main). Root's Off must be answered at all (a generous bound, no timing
figure: those are `python -m bench flood`'s), and the daemon must still be right after."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import BIN, HELD_CHASE, RENAMES_FOLLOWED, Latencyd, wait_for
from tests.nobody import renaming_as_nobody

ANSWERED_WITHIN_S = 30  # "at all": the daemon answers in milliseconds when it is not stalled


@pytest.fixture(autouse=True)
def two_cpus() -> None:
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1 (cpu-partitioning isolates CPU 1)")


@pytest.fixture
def profiles_with_renames(profiles: Path) -> Path:
    (profiles / "renames-followed.toml").write_text(RENAMES_FOLLOWED)
    (profiles / "held-chase.toml").write_text(HELD_CHASE)
    return profiles


@pytest.fixture
def holder(start_daemon: Callable[..., Latencyd]) -> Iterator[Callable[[Latencyd, str], None]]:
    """Root's application holding a profile (latencyctl hold PROFILE -- sleep) while the
    test runs: its hold is what makes each user task's check walk up its ancestors."""
    held: list[subprocess.Popen[str]] = []

    def hold(d: Latencyd, profile: str) -> None:
        held.append(d.spawn_ctl("hold", profile, "--", "sleep", "600"))
        wait_for(lambda: bool(status(d)["holds"]))

    yield hold
    for proc in held:  # its command first: killed alone, latencyctl left it orphaned
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        for child in children.read_text().split() if proc.poll() is None else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
        proc.kill()
        proc.wait()


def status(d: Latencyd) -> dict[str, object]:
    r = d.ctl("status", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert isinstance(out, dict)
    return out


def off_within(d: Latencyd, seconds: float) -> subprocess.CompletedProcess[str] | None:
    """root's `latencyctl off`, or None if it got no answer in `seconds`."""
    try:
        return subprocess.run([str(BIN / "latencyctl"), "off"], env=d.env,
                              capture_output=True, text=True, timeout=seconds)  # fmt: skip
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.parametrize(
    ("profile", "held", "depth"),
    [
        ("cpu-partitioning", False, 0),
        ("renames-followed", False, 0),
        ("held-chase", True, 60),
    ],
)
def test_off_is_answered_while_a_user_renames_a_process_in_a_loop(
    start_daemon: Callable[..., Latencyd],
    profiles_with_renames: Path,
    holder: Callable[[Latencyd, str], None],
    profile: str,
    held: bool,
    depth: int,
) -> None:
    d = start_daemon(profile, profile_dirs=[profiles_with_renames])
    if held:
        holder(d, profile)
    assert status(d)["active_profile"] == profile
    with renaming_as_nobody(depth) as renamer:
        wait_for(lambda: any(renamed(renamer)))  # the loop is under way
        off = off_within(d, ANSWERED_WITHIN_S)
        still_renaming = any(renamed(renamer))
    assert off is not None, f"root's off got no answer in {ANSWERED_WITHIN_S} s:\n{d.log()[-3000:]}"
    assert off.returncode == 0, off.stderr
    assert still_renaming  # answered during the flood, not after it
    # Still right after: nothing applied, nothing held, and it still answers.
    after = status(d)
    assert after["active_profile"] == "" and after["holds"] == []
    assert d.ctl("active").stdout.strip() == "none (all settings at their originals)"
    assert d.proc is not None and d.proc.poll() is None


def renamed(group: int) -> list[int]:
    """The processes of `group` that carry one of the renamer's names."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != group:
                continue
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() in ("rename-a", "rename-b"):
                    found.append(int(entry))
        except OSError:
            continue
    return found
