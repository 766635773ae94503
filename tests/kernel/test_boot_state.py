"""The booted isolation as this machine shows it: System.boot_readings against the kernel's
own files, read here another way, and against the kernel's build configuration where it
is published (/proc/config.gz): a file that says NO_HZ_FULL is built in must mean the
kernel can honour nohz_full=, and its absence that it cannot. Reads only."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from latencyd.cpuset import CpuSet
from latencyd.kernel.boot import NO_NOHZ_FULL, booted, compare
from latencyd.kernel.system import System

CPU = Path("/sys/devices/system/cpu")


def kernel_config() -> dict[str, str]:
    try:
        text = gzip.decompress(Path("/proc/config.gz").read_bytes()).decode()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if line.startswith("CONFIG_"))


def offloaded_by_ps() -> CpuSet:
    """CPUs with an rcuop kthread, from every task's comm (the facade reads kthreadd's
    children only)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                comm = Path(entry.path, "comm").read_text().strip()
            except OSError:
                continue
            if comm.startswith("rcuop/") and comm[6:].isdigit():
                found.append(int(comm[6:]))
    return CpuSet(found)


def test_the_readings_are_the_kernels_own() -> None:
    readings = System("/").boot_readings()
    assert readings.cmdline == Path("/proc/cmdline").read_text().strip()
    assert readings.possible == CpuSet.from_list((CPU / "possible").read_text())
    assert readings.isolated == CpuSet.from_list((CPU / "isolated").read_text())
    assert (readings.nohz_full is None) == (not (CPU / "nohz_full").exists())
    assert readings.rcu_offloaded == offloaded_by_ps()
    config = kernel_config()
    if config:  # the build configuration agrees with what the files say
        assert (readings.nohz_full is not None) == (config.get("CONFIG_NO_HZ_FULL") == "y")
        assert readings.rcu_nocb_capable == (config.get("CONFIG_RCU_NOCB_CPU") == "y")
        assert (readings.isolated is not None) == (config.get("CONFIG_CPU_ISOLATION") == "y")


def test_what_a_shield_on_the_last_cpu_would_gain_here() -> None:
    readings = System("/").boot_readings()
    state = booted(readings)
    last = CpuSet([max(readings.possible)])
    tick = next(f for f in compare(last, state) if f.feature == "tick")
    if readings.nohz_full is None:
        assert (tick.state, tick.detail) == ("not applicable", NO_NOHZ_FULL)
    elif max(readings.possible) in readings.nohz_full:
        assert tick.state == "booted"
    else:
        assert tick.state == "not booted" and tick.argument == f"nohz_full={last.to_list()}"
