"""`status` under cpu-partitioning with its application running on the shielded CPU: the
booted isolation, what a reboot would add for that CPU (or why this kernel cannot), and
the tick there as the noise watch counts it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from latencyd.kernel.boot import NO_NOHZ_FULL
from latencyd.kernel.system import System
from tests.harness import Latencyd, wait_for

SHIELDED = 1  # cpu-partitioning's isolated_cores on any machine
# Spins until its argument names a file that exists: the hold lasts until the test has
# read status (a fixed spin ended under load before status was read, and took the hold
# with it: CI's fresh-clone run of 2026-11-29 read `shielded` as '').
SPIN = "import os, sys\nwhile not os.path.exists(sys.argv[1]): pass\n"


def status(d: Latencyd) -> dict[str, Any]:
    result = d.ctl("status", "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_status_says_what_a_reboot_would_add_and_counts_the_tick(
    start_daemon: Callable[..., Latencyd], tmp_path: Path
) -> None:
    if SHIELDED not in System("/").online_cpus():
        pytest.skip("needs CPU 1")
    d = start_daemon(None)
    # The application, held and placed on the shielded CPU: one task running there is
    # what nohz_full would let run without the tick.
    app = d.spawn_ctl("hold", "cpu-partitioning", "--", "taskset", "-c", str(SHIELDED),
                      sys.executable, "-c", SPIN, str(tmp_path / "done"))  # fmt: skip
    try:
        wait_for(lambda: status(d)["active_profile"] == "cpu-partitioning")
        # Read until the noise watch has counted an interval (1 s each; later under load)
        # or the tick is booted off: then there is nothing to count.
        read: dict[str, Any] = {}

        def counted() -> bool:
            read["data"], read["text"] = status(d), d.ctl("status").stdout
            return (
                f"ticks on CPU {SHIELDED}" in read["text"] or "tick, CPUs 1: booted" in read["text"]
            )

        wait_for(counted)
        data, text = read["data"], read["text"]
    finally:
        (tmp_path / "done").touch()
        app.wait(timeout=30)
    boot = data["boot"]
    assert boot["shielded"] == str(SHIELDED)
    findings = {f["feature"]: f for f in boot["findings"] if f["state"] != "mismatch"}
    assert set(findings) == {"tick", "rcu callbacks", "managed IRQs", "scheduler domains"}
    tick = findings["tick"]
    if not Path("/sys/devices/system/cpu/nohz_full").exists():
        assert (tick["state"], tick["detail"]) == ("not applicable", NO_NOHZ_FULL)
    elif tick["state"] == "not booted":
        assert tick["argument"] == f"nohz_full={SHIELDED}"
    assert "[boot]  (isolation only a reboot changes)" in text
    assert f"tick, CPUs {SHIELDED}: {tick['state']}: {tick['detail']}" in text
    if tick["state"] != "booted":  # the tick runs under the application: counted
        assert f"ticks on CPU {SHIELDED}" in text, text
