"""The other owners of a setting, named by the real daemon: a sysctl.d fragment in
status and plan with its file:line, the real systemd-sysctl applying it seen as drift naming it,
and a real TuneD running at start said with what both set.

The daemon runs in a private mount namespace where a staged directory is bound over
/etc/sysctl.d (and /etc/tuned): the host's configuration is never written.
(`systemctl restart systemd-sysctl` under a real systemd: tests/e2e/test_boot.py.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import Latencyd, signal_listener, sysctl, wait_for

SYSTEMD_SYSCTL = Path("/lib/systemd/systemd-sysctl")
PROFILE = '[sysctl]\n"vm.swappiness" = 10\n'
FRAGMENT = "# the admin's old setting\nvm.swappiness = 60\n"
TUNED_PROFILE = "latencyd-owners-test"


def staged(binds: dict[str, Path], argv: list[str]) -> list[str]:
    """`argv` in a private mount namespace with each staged directory over its path."""
    mounts = " && ".join(f'mount --bind "${i}" {target}' for i, target in enumerate(binds, 1))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'{mounts} && shift {len(binds)} && exec "$@"', "staged",
            *map(str, binds.values()), *argv]  # fmt: skip


def owned(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The sysctl plugin's status rows, each row's owners looked up in its table."""
    sysctl = status["plugins"]["sysctl"]
    return [r | {"owners": [sysctl["owners"][i] for i in r["owners"]]} for r in sysctl["applied"]]


def launch_staged(d: Latencyd, binds: dict[str, Path]) -> None:
    d.launcher = lambda argv: (staged(binds, argv), [], {})


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces, sysctls)")


@pytest.fixture
def sysctl_d(tmp_path: Path) -> Path:
    needs_root()
    d = tmp_path / "sysctl.d"
    d.mkdir()
    (d / "90-swap.conf").write_text(FRAGMENT)
    return d


def test_status_names_the_fragment_and_its_line(
    start_daemon: Callable[..., Latencyd], profiles: Path, sysctl_d: Path
) -> None:
    (profiles / "swap10.toml").write_text(PROFILE)
    d = start_daemon("swap10", launch=False)
    launch_staged(d, {"/etc/sysctl.d": sysctl_d})
    d.start()
    assert sysctl("vm.swappiness") == "10"
    result = d.ctl("status", "--json")
    assert result.returncode == 0, result.stderr
    (row,) = owned(json.loads(result.stdout))
    assert [(o["who"], o["where"], o["value"]) for o in row["owners"]] == [
        ("systemd-sysctl", "/etc/sysctl.d/90-swap.conf:2", "60")
    ]
    text = d.ctl("status").stdout
    assert "also set by systemd-sysctl /etc/sysctl.d/90-swap.conf:2: vm.swappiness = 60" in text
    assert "at boot (systemd-sysctl.service)" in text
    # and in a plan: what else would set what the switch sets, and when
    plan = d.ctl("plan", "swap10")
    assert plan.returncode == 0, plan.stderr  # already applied: nothing would change
    assert (
        "      also set by systemd-sysctl /etc/sysctl.d/90-swap.conf:2: vm.swappiness = 60, "
        "at boot (systemd-sysctl.service)" in plan.stdout
    ), plan.stdout


def test_systemd_sysctl_applying_it_is_drift_naming_the_fragment(
    start_daemon: Callable[..., Latencyd], profiles: Path, sysctl_d: Path
) -> None:
    if not SYSTEMD_SYSCTL.exists():
        pytest.skip("no systemd-sysctl")
    (profiles / "swap10.toml").write_text(PROFILE)
    d = start_daemon("swap10", launch=False, config="verify_interval_s = 0\n")
    launch_staged(d, {"/etc/sysctl.d": sysctl_d})
    d.start()
    assert d.proc is not None
    monitor = signal_listener(d.address, "Drift")
    try:
        # The real systemd-sysctl, in the daemon's namespace (its /etc/sysctl.d), applying
        # the fragment by name as it does at boot.
        # nsenter execs systemd-sysctl in place: the writer the drift names is its pid.
        applying = subprocess.Popen(
            ["nsenter", "-t", str(d.proc.pid), "-m", str(SYSTEMD_SYSCTL), "90-swap.conf"],
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert applying.wait(timeout=30) == 0, applying.communicate()[1]
        # Both who wrote it (the process, by its pid; its name too unless it had exited by
        # the time the daemon read it) and whose value it is (the fragment, file:line).
        line = re.compile(
            r"drift: \[sysctl\] sysctl vm\.swappiness = 10, but it is '60', written by "
            rf"{applying.pid}( \(systemd-sysctl\))?, the value systemd-sysctl sets from "
            r"/etc/sysctl\.d/90-swap\.conf:2"
        )
        wait_for(lambda: line.search(d.log()) is not None)
        wait_for(lambda: sysctl("vm.swappiness") == "10")
        wait_for(lambda: "changed_by" in monitor.heard())
    finally:
        signalled = monitor.stop()
    assert '"changed_by": {"who": "systemd-sysctl", "where": "/etc/sysctl.d/90-swap.conf:2"' in (
        signalled
    )


@pytest.fixture
def tuned(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A real TuneD (not through D-Bus: the machine's bus is never touched) applying a
    profile of one sysctl from a staged /etc/tuned, stopped after (it puts that back)."""
    needs_root()
    if shutil.which("tuned") is None or not Path("/etc/tuned").is_dir():
        pytest.skip("TuneD is not installed")
    if subprocess.run(["pgrep", "-x", "tuned"], capture_output=True).returncode == 0:
        pytest.skip("TuneD runs on this machine already")
    stage = tmp_path / "tuned"
    shutil.copytree("/etc/tuned", stage)
    # Only the profile's own sysctl: no re-applying the machine's sysctl.d, no dynamic tuning.
    (stage / "tuned-main.conf").write_text("daemon = 1\ndynamic_tuning = 0\nreapply_sysctl = 0\n")
    (stage / TUNED_PROFILE).mkdir()
    (stage / TUNED_PROFILE / "tuned.conf").write_text(
        "[main]\nsummary=owners test\n\n[sysctl]\nvm.swappiness=30\n"
    )
    (stage / "active_profile").write_text(f"{TUNED_PROFILE}\n")
    (stage / "profile_mode").write_text("manual\n")
    run_dir_existed = Path("/run/tuned").exists()
    before = sysctl("vm.swappiness")
    argv = ["tuned", "--no-dbus", "--no-socket", "--profile", TUNED_PROFILE]
    proc = subprocess.Popen(
        staged({"/etc/tuned": stage}, argv),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: sysctl("vm.swappiness") == "30")
        yield stage, proc
    finally:
        proc.terminate()
        proc.wait(30)
        if not run_dir_existed:
            shutil.rmtree("/run/tuned", ignore_errors=True)
        if sysctl("vm.swappiness") != before:  # TuneD's rollback failed: put it back
            Path("/proc/sys/vm/swappiness").write_text(before)


def test_a_running_tuned_is_named_at_start_with_what_both_set(
    start_daemon: Callable[..., Latencyd],
    profiles: Path,
    tuned: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    stage, proc = tuned
    (profiles / "swap10.toml").write_text(PROFILE)
    d = start_daemon("swap10", launch=False)
    launch_staged(d, {"/etc/tuned": stage})
    d.start()
    said = (
        f"TuneD is running (pid {proc.pid}, profile {TUNED_PROFILE}): it and latencyd both "
        f"set sysctl vm.swappiness (/etc/tuned/{TUNED_PROFILE}/tuned.conf:5 [sysctl] "
        "vm.swappiness); they will undo each other's writes"
    )
    assert said in d.log()
    status = json.loads(d.ctl("status", "--json").stdout)
    (tuner,) = status["other_tuners"]
    assert (tuner["name"], tuner["pid"], tuner["profile"]) == ("TuneD", proc.pid, TUNED_PROFILE)
    (row,) = owned(status)
    (owner,) = row["owners"]
    assert owner["who"] == "TuneD" and f"running: pid {proc.pid}" in owner["when"]
    # Stopped before TuneD, latencyd puts back what it found: TuneD's value.
    assert d.stop() == 0
    assert sysctl("vm.swappiness") == "30"
