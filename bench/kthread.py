"""kthread benchmark: pinning kernel threads as they appear, and the cost of watching forks.

For each task-event source (perf, proc connector, none = periodic rescan only):
- creates >= 200 kernel threads (ext4 mounts on loop devices: each starts jbd2/loopN-8),
  and reports the share pinned and the delay from creation to pinned:
  * daemon-side: the kernel's event timestamp -> settings applied (from `status`);
  * outside view: mount(8) returned -> the bench sees the thread's affinity changed;
- runs a fork storm (>= 2000 fork+exec of /bin/true) and reports the daemon's CPU time
  per fork+exec (utime+stime of the daemon process, from /proc/PID/stat).

Then under an affinity shield (`[shield] cpus` = the last CPU, the chase: bench shield
compares it with the cpuset shield) with CPU hogs beside the daemon on
the housekeeping CPUs (the bench and all it starts are narrowed there):
- an exec storm the shield must narrow (`taskset -c ALL /bin/true`, each exec wide again):
  the daemon's CPU time per narrowed exec;
- self-pinning starts, `taskset -c ISOLATED app`, and how many of them the shield moved
  off the CPU they chose: started wide (`taskset -c ALL` first), so the shield narrows
  the inner taskset's exec as it pins itself; and started narrowed, under a daemon
  rescanning every 0.1 s (task_events = "none"), whose rescans find them mid-start.

    python -m bench kthread [--threads 210] [--forks 2000] [--sources perf,proc-connector,none]
                            [--execs 1000] [--pins 400]
    python -m bench kthread --quick      # 9 threads, 100 forks: that it runs, not figures

Targets from the issue: 100 % pinned, p99 <= 2 ms, <= 40 µs of daemon CPU per fork+exec.
Benchmarks print figures; they do not judge (exit 0 unless the bench itself cannot run).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import arguments, not_root
from latencyd.cpuset import CpuSet
from scripts.private_bus import PrivateBus
from tests.harness import POLICY, Latencyd
from tests.loopfs import LoopFs, jbd2_pids

PROFILE = """
[main]
summary = "bench: jbd2 threads to CPU 0"

[[kthread.rule]]
match = "^(flush-|jbd2/)"
cpus = "0"
"""
SHIELD_PROFILE = """
[main]
summary = "bench: CPU {isolated} shielded from user tasks"

[shield]
cpus = "{isolated}"
mechanism = "affinity"
"""
CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGET_P99_MS = 2.0
TARGET_FORK_US = 40.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def pin_threads(d: Latencyd, filesystems: list[LoopFs], count: int) -> dict[str, Any]:
    outside_ms: list[float] = []
    finding_ms: list[float] = []
    pinned = 0
    made = 0
    while made < count:
        for fs in filesystems:
            if made >= count:
                break
            returned = fs.mount()
            (pid,) = jbd2_pids(fs.device)
            finding_ms.append((time.monotonic() - returned) * 1000)
            made += 1
            deadline = returned + 5.0
            while time.monotonic() < deadline:
                if os.sched_getaffinity(pid) == {0}:
                    pinned += 1
                    outside_ms.append((time.monotonic() - returned) * 1000)
                    break
                time.sleep(0.0002)
        for fs in filesystems:
            fs.umount()
    status = json.loads(d.ctl("status", "--json").stdout)
    facts = status["plugins"].get("kthread", {}).get("facts", {})
    daemon_side = facts.get("event_to_applied_us")
    return {
        "threads": made,
        "pinned_share": pinned / made,
        "outside_p50_ms": percentile(outside_ms, 0.5),
        "outside_p99_ms": percentile(outside_ms, 0.99),
        "finding_p50_ms": percentile(finding_ms, 0.5),
        "daemon_event_to_pinned_us": daemon_side,
        "source": status.get("task_events"),
    }


def fork_storm(d: Latencyd, forks: int) -> dict[str, Any]:
    assert d.proc is not None
    before = cpu_seconds(d.proc.pid)
    start = time.monotonic()
    subprocess.run(
        ["sh", "-c", f"i=0; while [ $i -lt {forks} ]; do /bin/true; i=$((i+1)); done"], check=True
    )
    wall = time.monotonic() - start
    time.sleep(0.3)  # let the daemon drain the last events
    used = cpu_seconds(d.proc.pid) - before
    return {
        "forks": forks,
        "storm_seconds": wall,
        "daemon_cpu_us_per_fork_exec": used / forks * 1e6,
    }


def exec_storm(d: Latencyd, every: str, execs: int) -> dict[str, Any]:
    """Wide execs the shield narrows, one after another: the daemon's CPU per exec."""
    assert d.proc is not None
    before = cpu_seconds(d.proc.pid)
    loop = f"i=0; while [ $i -lt {execs} ]; do taskset -c {every} /bin/true; i=$((i+1)); done"
    start = time.monotonic()
    subprocess.run(["sh", "-c", loop], check=True)
    wall = time.monotonic() - start
    time.sleep(0.5)  # let the daemon drain the last events
    used = cpu_seconds(d.proc.pid) - before
    return {"execs": execs, "exec_seconds": wall, "daemon_cpu_us_per_exec": used / execs * 1e6}


def self_pinned_starts(prefix: list[str], isolated: str, starts: int) -> dict[str, Any]:
    """Applications that pin themselves inside the shield as they start (`prefix` then
    `taskset -c ISOLATED app`), 8 at a time: how many end on the CPUs they chose."""
    app = "sleep 0.2; grep Cpus_allowed_list: /proc/$$/status"
    argv = [*prefix, "taskset", "-c", isolated, "sh", "-c", app]
    kept = moved = 0
    for first in range(0, starts, 8):
        batch = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
                 for _ in range(min(8, starts - first))]  # fmt: skip
        for proc in batch:
            out, _ = proc.communicate()
            if out.split()[-1:] == [isolated]:
                kept += 1
            else:
                moved += 1
    return {"starts": kept + moved, "moved_by_shield": moved}


@contextlib.contextmanager
def shield(bus: str, workdir: Path, isolated: str, config: str) -> Iterator[Latencyd]:
    """A daemon shielding CPU `isolated`, and a CPU hog for each usable CPU: started
    after the switch narrowed the bench, they compete with the daemon for the
    housekeeping CPUs, as an application's own load would."""
    profiles = workdir / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "shield-bench.toml").write_text(SHIELD_PROFILE.format(isolated=isolated))
    daemon_dir = Path(tempfile.mkdtemp(prefix="latencyd-kbench-shield-", dir="/dev/shm"))
    d = Latencyd(bus, daemon_dir, "shield-bench", [profiles], config=config)
    hog = None
    try:
        d.start()
        hog = subprocess.Popen(["stress-ng", "--cpu", str(os.cpu_count()), "--quiet"])
        yield d
    finally:
        if hog is not None:
            hog.terminate()
            hog.wait()
        d.stop()
        shutil.rmtree(daemon_dir, ignore_errors=True)


def run_shield(bus: str, workdir: Path, execs: int, pins: int) -> dict[str, Any]:
    usable = os.sched_getaffinity(0)  # read before the shield narrows the bench
    every, last = CpuSet(usable).to_list(), str(max(usable))
    with shield(bus, workdir / "events", last, "") as d:
        result = exec_storm(d, every, execs)
        # Each start wide (the outer taskset): the shield narrows its exec on the event.
        on_exec = self_pinned_starts(["taskset", "-c", every], last, pins)
    # Each start narrowed (born of the narrowed bench), judged by rescans every 0.1 s.
    rescans = 'task_events = "none"\nverify_interval_s = 0.1\n'
    with shield(bus, workdir / "rescans", last, rescans):
        on_rescan = self_pinned_starts([], last, pins)
    return result | {"pins_on_exec": on_exec, "pins_on_rescan": on_rescan}


def run_source(bus: str, workdir: Path, source: str, threads: int, forks: int) -> dict[str, Any]:
    profiles = workdir / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "kthread-bench.toml").write_text(PROFILE)
    # The journal lives on a tmpfs, as /run/latencyd does under systemd (here /run is on
    # disk, where each journal fsync would add ~0.7 ms to every pin).
    daemon_dir = Path(tempfile.mkdtemp(prefix=f"latencyd-kbench-{source}-", dir="/dev/shm"))
    filesystems = [LoopFs(workdir / "loops", i) for i in range(3)]
    d = Latencyd(
        bus,
        daemon_dir,
        profile="kthread-bench",
        profile_dirs=[profiles],
        config=f'task_events = "{source}"\nverify_interval_s = 1.0\n',
    )
    try:
        d.start()
        result = pin_threads(d, filesystems, threads)
        result.update(fork_storm(d, forks))
    finally:
        d.stop()
        for fs in filesystems:
            fs.close()
        shutil.rmtree(daemon_dir, ignore_errors=True)
    return result


def report(results: dict[str, dict[str, Any]]) -> None:
    shield = results.pop("shield", None)
    for source, r in results.items():
        daemon = r["daemon_event_to_pinned_us"]
        print(f"[{source}] (daemon says: task events from {r['source']})")
        print(
            f"  kernel threads created: {r['threads']}, pinned: {r['pinned_share']:.1%}"
            f"  (goal 100 %)"
        )
        if daemon:
            p99_ms = daemon["p99"] / 1000
            verdict = "PASS" if p99_ms <= TARGET_P99_MS else "MISS"
            print(
                f"  creation -> pinned (kernel event stamp, daemon side): p50 "
                f"{daemon['p50'] / 1000:.3f} ms, p99 {p99_ms:.3f} ms, max "
                f"{daemon['max'] / 1000:.3f} ms over {daemon['count']}  [{verdict} p99 <= 2 ms]"
            )
        print(
            f"  mount returned -> seen pinned (outside view): p50 {r['outside_p50_ms']:.3f} ms,"
            f" p99 {r['outside_p99_ms']:.3f} ms (includes the bench's own /proc scan to find the"
            f" thread: p50 {r['finding_p50_ms']:.3f} ms)"
        )
        per = r["daemon_cpu_us_per_fork_exec"]
        verdict = "PASS" if per <= TARGET_FORK_US else "MISS"
        print(
            f"  fork storm: {r['forks']} fork+exec in {r['storm_seconds']:.2f} s; daemon CPU "
            f"{per:.1f} µs per fork+exec  [{verdict} <= 40 µs]"
        )
    if shield:
        print("[shield] (cpus = the last CPU, a CPU hog on the others)")
        print(
            f"  exec storm: {shield['execs']} wide execs narrowed in "
            f"{shield['exec_seconds']:.2f} s; daemon CPU {shield['daemon_cpu_us_per_exec']:.0f}"
            " µs per narrowed exec"
        )
        for key, how in (("pins_on_exec", "exec events"), ("pins_on_rescan", "rescans")):
            pins = shield[key]
            print(
                f"  self-pinning starts ({how}): {pins['starts']}, moved off the CPU they "
                f"chose by the shield: {pins['moved_by_shield']}  (goal 0)"
            )


def main(argv: list[str]) -> int:
    parser = arguments("kthread", __doc__, quick="a few threads and forks")
    parser.add_argument("--threads", type=int, default=210)
    parser.add_argument("--forks", type=int, default=2000)
    parser.add_argument("--sources", default="perf,proc-connector,none")
    parser.add_argument("--execs", type=int, default=1000, help="shielded execs (0: none)")
    parser.add_argument("--pins", type=int, default=400, help="self-pinning starts")
    args = parser.parse_args(argv)
    if args.quick:
        args.threads, args.forks, args.execs, args.pins = 9, 100, 50, 16
    if not_root("kthread", "loop devices, mounts, a tuning daemon"):
        return 2
    results: dict[str, dict[str, Any]] = {}
    with PrivateBus(POLICY) as bus, tempfile.TemporaryDirectory(prefix="latencyd-kbench-") as tmp:
        for source in args.sources.split(","):
            results[source] = run_source(
                bus.address, Path(tmp) / source, source, args.threads, args.forks
            )
        if (args.execs or args.pins) and len(os.sched_getaffinity(0)) > 1:
            results["shield"] = run_shield(bus.address, Path(tmp) / "shield", args.execs, args.pins)
    if args.json:
        print(json.dumps({"benchmark": "kthread", "results": results}))
    else:
        report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
