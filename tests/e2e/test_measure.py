"""`latencyctl measure` end to end, with short runs: its structure, never latency values
(scenarios alternated, the profile in force put back, percentiles ordered, a valid PNG,
its namespaces and processes gone, on success and on Ctrl-C)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from latencyd.kernel.boot import NO_NOHZ_FULL
from latencyd.tools.measure.scratch import scratch_dir
from tests.harness import BIN, Latencyd, wait_for

# Where measure keeps its temporary directories (/run for root: see latencyd.tools.measure.scratch).
SCRATCH = Path(scratch_dir() or tempfile.gettempdir())

ORDER = ("min", "p50", "p90", "p99", "p99.9")


def netns_of_measure() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("ltdm-")]


def tuned_applied(pid: int) -> bool:
    """Whether the TuneD that measure `pid` started has logged that it applied its profile."""
    logs = SCRATCH.glob(f"latencyd-tuned-{pid}-*/tuned.log")
    return any("applied" in log.read_text() for log in logs)


def measure(d: Latencyd, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "latencyctl"), "measure", *args],
        env=d.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def daemon(start_daemon: Callable[..., Latencyd]) -> Latencyd:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    return start_daemon("test-a")


def test_alternates_scenarios_and_puts_back_the_profile(daemon: Latencyd, tmp_path: Path) -> None:
    png, saved = tmp_path / "m.png", tmp_path / "runs"
    r = measure(
        daemon,
        "--profile", "test-b", "--vs", "untuned", "--seconds", "1", "--rounds", "3",
        "--tools", "sockperf,cyclictest", "--plot", str(png), "--save", str(saved), "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    result: dict[str, Any] = json.loads(r.stdout)
    assert result["baseline"] == "test-b"
    assert result["round_order"] == [["test-b", "untuned"], ["untuned", "test-b"],
                                     ["test-b", "untuned"]]  # fmt: skip
    for tool in ("sockperf", "cyclictest"):
        for scenario in ("test-b", "untuned"):
            stats = result["tools"][tool]["stats"][scenario]
            values = [stats[k] for k in ORDER]
            assert values == sorted(values), (tool, scenario, stats)
            assert stats["samples"] > 0 and stats["max"] >= stats["p99.9"]
        ratios = result["tools"][tool]["ratios"]["untuned"]
        assert set(ratios) == {"p50", "p90", "p99", "p99.9"}
        assert all(r["low"] <= r["high"] for r in ratios.values())
    assert set(result["attribution"]) == {"test-b", "untuned"}
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    (json_file,) = saved.glob("measure-*.json")
    assert json.loads(json_file.read_text())["round_order"] == result["round_order"]
    assert json_file.with_suffix(".png").exists()
    # Everything is as before: the profile in force, no namespace, no hold, no tool.
    assert daemon.ctl("active").stdout.strip() == "test-a"
    status = json.loads(daemon.ctl("status", "--json").stdout)
    assert status["holds"] == []
    assert netns_of_measure() == []
    assert "hold 1 on test-b by" in daemon.log() and "hold 2 on untuned by" in daemon.log()

    # --compare sets a new run beside the saved one (text output). Beside it the shipped
    # cpu-partitioning, which shields and watches CPU 1: the tick the noise watch counted
    # there while cyclictest ran (3 s: whole 1 s intervals end within it), and what
    # nohz_full=1 would remove, or why this kernel cannot.
    r = measure(daemon, "--profile", "test-b", "--vs", "cpu-partitioning", "--seconds", "3",
                "--rounds", "1", "--tools", "cyclictest", "--compare", str(json_file))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "cyclictest: this run beside the old one (new / old)" in r.stdout
    assert "test-b: p50 " in r.stdout
    assert "local timer interrupts on the shielded CPUs while the tools ran" in r.stdout, r.stdout
    assert re.search(r"^  cpu-partitioning, CPUs 1 \([\d.]+ s\): CPU 1 [\d,.]+ a second, ",
                     r.stdout, re.M), r.stdout  # fmt: skip
    assert "  test-b, CPUs" not in r.stdout  # no shield, no tick report
    if not Path("/sys/devices/system/cpu/nohz_full").exists():
        assert f"    nohz_full=1: not applicable: {NO_NOHZ_FULL}" in r.stdout
    elif "nohz_full=1 after a reboot: the tick among these, at most CPU 1 " not in r.stdout:
        assert "    nohz_full booted for CPUs 1" in r.stdout


def test_ctrl_c_cleans_up_everything(daemon: Latencyd) -> None:
    proc = subprocess.Popen(
        [str(BIN / "latencyctl"), "measure", "--profile", "test-b", "--vs", "untuned",
         "--seconds", "20", "--rounds", "2", "--tools", "sockperf"],
        env=daemon.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_for(lambda: netns_of_measure() != [] and "hold 1 on test-b" in daemon.log())
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert netns_of_measure() == []
    assert subprocess.run(["pgrep", "-x", "sockperf"], capture_output=True).returncode == 1
    wait_for(lambda: daemon.ctl("active").stdout.strip() == "test-a")
    assert json.loads(daemon.ctl("status", "--json").stdout)["holds"] == []


def test_kill_9_of_measure_ends_its_load_server_and_namespaces(daemon: Latencyd) -> None:
    """SIGKILL leaves measure no clean-up of its own, and its load and sockperf server are
    outside its process tree on purpose (as an application started from a shell is): its
    guard, in a session of its own, ends them. Killed here with its whole process group, as
    a parent's subprocess.run kills it 0.25 s after Ctrl-C."""
    proc = subprocess.Popen(
        [str(BIN / "latencyctl"), "measure", "--profile", "test-b", "--vs", "untuned",
         "--seconds", "20", "--rounds", "2", "--tools", "sockperf",
         "--load-cmd", "exec sleep 9876"],
        env=daemon.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        process_group=0,
    )  # fmt: skip
    try:
        wait_for(lambda: running("-x", "sockperf") and running("-f", "sleep 9876"))
        assert sorted(netns_of_measure()) == [f"ltdm-{proc.pid}-c", f"ltdm-{proc.pid}-s"]
        (workdir,) = SCRATCH.glob(f"latencyd-measure-{proc.pid}-*")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    wait_for(lambda: not running("-x", "sockperf") and not running("-f", "sleep 9876"))
    wait_for(lambda: netns_of_measure() == [] and not workdir.exists())
    wait_for(lambda: json.loads(daemon.ctl("status", "--json").stdout)["holds"] == [])
    assert daemon.ctl("active").stdout.strip() == "test-a"


def test_a_missing_tool_is_a_clear_error(daemon: Latencyd, tmp_path: Path) -> None:
    path = tmp_path / "bin"
    path.mkdir()
    for tool in ("ip", "taskset", "cyclictest"):  # no sockperf
        found = shutil.which(tool)
        assert found
        (path / tool).symlink_to(found)
    env = daemon.env | {"PATH": str(path)}
    r = subprocess.run(
        [str(BIN / "latencyctl"), "measure", "--tools", "sockperf", "--seconds", "1"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1
    assert "missing measurement tools: sockperf (apt-get install sockperf)" in r.stderr
    assert netns_of_measure() == []


def test_recommend_measures_its_proposal_group_by_group(daemon: Latencyd) -> None:
    """The verdicts depend on the machine; that every group of the proposal is judged, the
    kept ones written with their effect quoted, the rest named with why, and the machine
    left as before, does not."""
    earlier = set(SCRATCH.glob("latencyd-recommend-*"))
    r = subprocess.run(
        [str(BIN / "latencyctl"), "recommend", "--measure", "--seconds", "1", "--rounds", "2",
         "--json"],
        env=daemon.env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stderr
    result: dict[str, Any] = json.loads(r.stdout)
    assert result["profile"] in ("network-latency", "latency-performance", "cpu-partitioning")
    assert result["confirmed"] is (r.returncode == 0) is bool(result["kept"])
    judged = {g["name"]: g["verdict"] for g in result["attribution"]}
    assert "cstate.idle" in judged and "writeback" in judged
    assert set(result["kept"]) == {n for n, v in judged.items() if v == "helps"}
    assert {d["name"] for d in result["dropped"]} == set(judged) - set(result["kept"])
    for name in result["kept"]:
        assert f"# {name} helps: " in result["profile_file"]
    order = result["measured"]["round_order"]
    assert order[0][0] == order[1][-1] == "recommended" and sorted(order[0]) == sorted(order[1])
    assert set(SCRATCH.glob("latencyd-recommend-*")) <= earlier  # its files are gone
    assert daemon.ctl("active").stdout.strip() == "test-a"
    assert json.loads(daemon.ctl("status", "--json").stdout)["holds"] == []
    assert netns_of_measure() == []
    assert "/latencyd-attribute-" in daemon.log()  # its scenarios, held through the daemon


def running(*pgrep: str) -> bool:
    return subprocess.run(["pgrep", *pgrep], stdout=subprocess.DEVNULL).returncode == 0


def etc_files() -> dict[Path, bytes]:
    return {f: f.read_bytes() for d in (Path("/etc/tuned"), Path("/etc/modprobe.d"))
            for f in d.rglob("*") if f.is_file()}  # fmt: skip


def guard_of(pid: int) -> int:
    """The pid of measure `pid`'s guard (runguard)."""
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", "latencyd.tools.runguard"],
                         capture_output=True, text=True).stdout  # fmt: skip
    return int(out.split()[0])


@pytest.mark.skipif(shutil.which("tuned") is None, reason="TuneD is not installed")
@pytest.mark.parametrize("guard", ["alive", "killed too"])
def test_killing_measure_during_tuned_rolls_tuned_back_and_leaves_etc_alone(
    daemon: Latencyd, kernel_guard: None, guard: str
) -> None:
    """TuneD keeps its originals in memory: if measure is killed outright, TuneD must still
    roll back (it gets SIGTERM when measure dies), and what it writes to /etc/tuned must
    never have reached the machine's files (it runs over private copies). What the killed
    run could not remove (its namespaces, TuneD's copies) its guard removes once TuneD has
    rolled back; with the guard killed too, the next run removes them."""
    swappiness = Path("/proc/sys/vm/swappiness")
    original, files = swappiness.read_text(), etc_files()
    assert original.strip() != "10", "test-a's value is latency-performance's"
    proc = subprocess.Popen(
        [str(BIN / "latencyctl"), "measure", "--profile", "tuned:latency-performance",
         "--vs", "untuned", "--seconds", "3", "--rounds", "1", "--tools", "cyclictest"],
        env=daemon.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # TuneD says it applied the profile in its log (swappiness cannot tell: the hold on
        # "untuned" puts back the machine's own, which may already be TuneD's 10).
        wait_for(lambda: tuned_applied(proc.pid))
        assert swappiness.read_text().strip() == "10"
        assert sorted(netns_of_measure()) == [f"ltdm-{proc.pid}-c", f"ltdm-{proc.pid}-s"]
        copies = list(SCRATCH.glob(f"latencyd-tuned-{proc.pid}-*"))
        copies += SCRATCH.glob(f"latencyd-measure-{proc.pid}-*")
        assert len(copies) == 2, copies
    finally:
        if guard == "killed too":
            os.kill(guard_of(proc.pid), signal.SIGKILL)
        proc.kill()
        proc.wait(10)
        # TuneD rolled back before latencyd put its profile back: nothing of TuneD's stays.
        wait_for(lambda: not running("-f", "bin/tuned "))
        wait_for(lambda: not running("-x", "cyclictest"))
    wait_for(lambda: swappiness.read_text() == original)
    assert etc_files() == files
    if guard == "alive":
        wait_for(lambda: netns_of_measure() == [] and not any(c.exists() for c in copies))
    else:
        assert [c.name for c in copies if (c / "tuned" / "active_profile").exists()], copies
        assert all(c.exists() for c in copies) and netns_of_measure() != []
        r = measure(daemon, "--profile", "test-b", "--vs", "untuned", "--seconds", "1",
                    "--rounds", "1", "--tools", "cyclictest")  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert netns_of_measure() == []  # its own, and the killed run's
        assert not any(c.exists() for c in copies)
    wait_for(lambda: json.loads(daemon.ctl("status", "--json").stdout)["holds"] == [])


@pytest.mark.skipif(shutil.which("tuned") is None, reason="TuneD is not installed")
def test_what_tunes_rollback_leaves_is_put_back(
    daemon: Latencyd, kernel_guard: None, tmp_path: Path
) -> None:
    """TuneD's cpu-partitioning rollback sometimes leaves the writeback workqueue on the
    housekeeping CPUs (it writes that mask through two paths), and on a machine whose dirty
    limits are in bytes it leaves no limit at all (it writes back the ratio it read, 0):
    measure puts both back, and the guard checks every workqueue mask, IRQ and sysctl is
    as before."""
    etc = tmp_path / "etc-tuned"
    shutil.copytree("/etc/tuned", etc, symlinks=True)
    (etc / "cpu-partitioning-variables.conf").write_text("isolated_cores=1\n")
    r = measure(daemon, "--profile", "tuned:cpu-partitioning", "--vs", "untuned",
                "--seconds", "1", "--rounds", "1", "--tools", "cyclictest",
                "--tuned-etc", str(etc), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    put_back = json.loads(r.stdout).get("tuned_left_put_back", [])
    assert all("cpumask" in line or "vm.dirty_" in line for line in put_back), put_back
