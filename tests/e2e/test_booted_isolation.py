"""`status` under cpu-partitioning with its application running on the shielded CPU: the
booted isolation, what a reboot would add for that CPU (or why this kernel cannot), and
the tick there as the noise watch counts it."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from latencyd.kernel.boot import NO_NOHZ_FULL
from latencyd.kernel.system import System
from tests.harness import Latencyd, wait_for

SHIELDED = 1  # cpu-partitioning's isolated_cores on any machine
SPIN = "import time\nend = time.monotonic() + 8\nwhile time.monotonic() < end: pass\n"


def status(d: Latencyd) -> dict[str, Any]:
    result = d.ctl("status", "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_status_says_what_a_reboot_would_add_and_counts_the_tick(
    start_daemon: Callable[..., Latencyd],
) -> None:
    if SHIELDED not in System("/").online_cpus():
        pytest.skip("needs CPU 1")
    d = start_daemon(None)
    # The application, held and placed on the shielded CPU: one task running there is
    # what nohz_full would let run without the tick.
    app = d.spawn_ctl("hold", "cpu-partitioning", "--", "taskset", "-c", str(SHIELDED),
                      sys.executable, "-c", SPIN)  # fmt: skip
    try:
        wait_for(lambda: status(d)["active_profile"] == "cpu-partitioning", timeout=15)
        time.sleep(2.5)  # two intervals of the noise watch
        data = status(d)
        text = d.ctl("status").stdout
    finally:
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
