"""The cpu and sysfs plugins in the real daemon on this machine: a VM without cpufreq,
so [cpu] is not applicable, says why, and does not fail the profile; [sysfs] writes the
kernel's bracketed-choice file and restores it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness import Latencyd

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

PROFILE = """
[main]
summary = "cpu and sysfs"

[cpu]
governor = "performance"
energy_perf_bias = "performance"

[sysfs]
"/sys/kernel/mm/transparent_hugepage/enabled" = "{thp}"

[sysctl]
"vm.swappiness" = 13
"""


def chosen(text: str) -> str:
    return text.split("[", 1)[1].split("]", 1)[0]


def test_cpu_is_not_applicable_here_and_sysfs_applies(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    if Path("/sys/devices/system/cpu/cpufreq").is_dir() and any(
        Path("/sys/devices/system/cpu/cpufreq").glob("policy*")
    ):
        pytest.skip("this machine has cpufreq: the not-applicable path is for VMs without it")
    original = THP.read_text()
    choices = original.replace("[", "").replace("]", "").split()
    wanted = next(c for c in choices if c != chosen(original))  # a change, whatever is set
    (profiles / "cs.toml").write_text(PROFILE.format(thp=wanted))
    d = start_daemon("cs")
    assert chosen(THP.read_text()) == wanted
    assert Path("/proc/sys/vm/swappiness").read_text().strip() == "13"
    status = json.loads(d.ctl("status", "--json").stdout)
    assert status["active_profile"] == "cs"
    cpu = status["plugins"]["cpu"]
    assert cpu["applied"] == []
    reasons = {item["reason"] for item in cpu["not_applicable"]}
    assert reasons == {"this machine has no CPU frequency scaling (no cpufreq driver)"}
    assert d.ctl("verify").returncode == 0  # not applicable is not drift
    text = d.ctl("status").stdout
    assert "no cpufreq driver" in text
    d.stop()
    assert THP.read_text() == original
