"""`latencyctl measure --attribute` end to end, with a short run: its structure (every group
named, with its settings, effects and verdict), the control hog really moved onto the
measured CPU by the daemon, and everything put back and removed, on success and on kill -9
(by measure's guard). Never
latency values, nor any other figure the machine's load moves (bench attribute prints them)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from latencyd.tools.measure.load import CONTROL_HOG
from latencyd.tools.measure.scratch import scratch_dir
from tests.e2e.test_measure import netns_of_measure, running
from tests.harness import BIN, Latencyd, wait_for

# Where measure keeps its temporary directories (/run for root: see latencyd.tools.measure.scratch).
SCRATCH = Path(scratch_dir() or tempfile.gettempdir())

VERDICTS = {"helps", "hurts", "no measurable effect"}


@pytest.fixture
def daemon(start_daemon: Callable[..., Latencyd]) -> Latencyd:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    return start_daemon("test-a")


def attribute(d: Latencyd, profiles: Path, *args: str) -> list[str]:
    return [str(BIN / "latencyctl"), "measure", "--attribute", "--profile", "test-b",
            "--profile-dir", str(profiles), "--control", *args]  # fmt: skip


def test_a_short_attribution_names_every_group_and_puts_everything_back(
    daemon: Latencyd, profiles: Path, tmp_path: Path
) -> None:
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    png = tmp_path / "a.png"
    proc = subprocess.Popen(
        attribute(daemon, profiles, "--group", "vm=sysctl.vm.swappiness", "--seconds", "1",
                  "--rounds", "2", "--idle-seconds", "0.5", "--json", "--plot", str(png),
                  "--save", str(tmp_path / "runs")),
        env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    data: dict[str, Any] = json.loads(out)
    groups = {g["name"]: g for g in data["groups"]}
    assert list(groups) == ["vm", "writeback", "sysctl", "control"]
    assert groups["vm"]["settings"] == ["sysctl.vm.swappiness"]
    assert groups["sysctl"]["settings"] == ["sysctl.kernel.timer_migration"]
    assert groups["writeback"]["settings"] == ["writeback.dirty_ratio",
                                               "writeback.dirty_expire_centisecs"]  # fmt: skip
    for g in groups.values():
        assert g["verdict"] in VERDICTS, g
        assert set(g["effects"]) == {"sockperf", "cyclictest"}
        for per_pct in g["effects"].values():
            assert set(per_pct) == {"p50", "p99", "p99.9", "max"}
            for by_dir in per_pct.values():
                assert set(by_dir) == {"leave_one_out", "add_one_in"}
        assert isinstance(g["idle_busy_pct"], float)
    # The control hog was moved onto the measured CPUs by the daemon, as it logs every
    # move. (What the hog then costs there, its duty cycle read as the control group's
    # added busy share, depends on what else runs: a figure, printed by bench attribute.)
    app = data["measure"]["plan"]["app_cpus"]
    moved = rf"user task {CONTROL_HOG} \(pid \d+, [^)]*\): CPUs \S+ -> {re.escape(app)}\n"
    assert re.search(moved, daemon.log()), daemon.log()[-3000:]
    # Every scenario once a round; the baselines at the ends, swapped every other round.
    order = data["measure"]["round_order"]
    assert sorted(order[0]) == sorted(order[1]) and len(order[0]) == len(set(order[0])) == 10
    assert (order[0][0], order[0][-1], order[1][0], order[1][-1]) == (
        "test-b", "untuned", "untuned", "test-b")  # fmt: skip
    assert "test-b-without-vm" in order[0] and "untuned+control" in order[0]
    # Every switch of the run changed one group only (profiles passed through included).
    held = re.findall(r"hold \d+ on \S+/latencyd-attribute-\S+/([^/\s]+)\.toml by", daemon.log())
    last_probe = max(i for i, name in enumerate(held) if name == "alone")  # can each act?
    sets = [group_set(name, list(groups)) for name in held[last_probe + 1 :]]
    assert len(sets) > len(order[0]) * 2
    # (0: a round starts with the scenario the round before ended with.)
    assert all(len(a ^ b) <= 1 for a, b in itertools.pairwise(sets)), held
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert json.loads(Path(data["saved"]).read_text())["groups"] == data["groups"]
    # Everything as before: the profile in force, no hold, no namespace, no hog, no files.
    assert daemon.ctl("active").stdout.strip() == "test-a"
    assert json.loads(daemon.ctl("status", "--json").stdout)["holds"] == []
    assert netns_of_measure() == []
    assert not running("-x", "ltdm-hog")
    assert Path("/proc/sys/vm/swappiness").read_text() == swappiness
    assert not list(SCRATCH.glob(f"latencyd-attribute-{proc.pid}-*"))


def group_set(name: str, order: list[str]) -> frozenset[str]:
    """The groups a scenario profile of test-b holds, from its name."""
    real = frozenset(order[:-1])  # all but the control group
    if name.startswith("via-"):
        return frozenset(order[int(i)] for i in name[4:].split("-") if i)
    if name == "test-b":
        return real
    if name == "untuned":
        return frozenset()
    if name.startswith("test-b-without-"):
        return real - {name.removeprefix("test-b-without-")}
    if name == "test-b+control":
        return real | {"control"}
    return frozenset({name.removeprefix("untuned+")})


def test_killing_attribution_leaves_no_hog_and_no_hold(daemon: Latencyd, profiles: Path) -> None:
    proc = subprocess.Popen(
        attribute(daemon, profiles, "--seconds", "5", "--rounds", "1"),
        env=daemon.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: running("-x", "ltdm-hog") and "hold" in daemon.log())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    wait_for(lambda: not running("-x", "ltdm-hog"))  # it ends with its run
    wait_for(lambda: json.loads(daemon.ctl("status", "--json").stdout)["holds"] == [])
    assert daemon.ctl("active").stdout.strip() == "test-a"
    # Its guard removes its namespaces, its own files and the profiles it held.
    left = [f"latencyd-attribute-{proc.pid}-*", f"latencyd-measure-{proc.pid}-*"]
    wait_for(lambda: not [p for g in left for p in SCRATCH.glob(g)])
    wait_for(lambda: netns_of_measure() == [])


def test_bad_groups_are_usage_errors_before_anything_is_held(
    daemon: Latencyd, profiles: Path
) -> None:
    r = subprocess.run(attribute(daemon, profiles, "--group", "x=sysctl.nope"),
                       env=daemon.env, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2
    assert "'sysctl.nope' names no setting of the profile" in r.stderr
    r = subprocess.run([str(BIN / "latencyctl"), "measure", "--control"],
                       env=daemon.env, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2 and "go with --attribute" in r.stderr
    assert "hold" not in daemon.log()
