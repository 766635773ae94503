"""kthread benchmark: pinning kernel threads as they appear, and the cost of watching forks.

For each task-event source (perf, proc connector, none = periodic rescan only):
- creates >= 200 kernel threads (ext4 mounts on loop devices: each starts jbd2/loopN-8),
  and reports the share pinned and the delay from creation to pinned:
  * daemon-side: the kernel's event timestamp -> settings applied (from `status`);
  * outside view: mount(8) returned -> the bench sees the thread's affinity changed;
- runs a fork storm (>= 2000 fork+exec of /bin/true) and reports the daemon's CPU time
  per fork+exec (utime+stime of the daemon process, from /proc/PID/stat).

    python -m bench kthread [--threads 210] [--forks 2000] [--sources perf,proc-connector,none]
    python -m bench kthread --quick      # 9 threads, 100 forks: that it runs, not figures

Targets from the issue: 100 % pinned, p99 <= 2 ms, <= 40 µs of daemon CPU per fork+exec.
Benchmarks print figures; they do not judge (exit 0 unless the bench itself cannot run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import arguments, not_root
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


def main(argv: list[str]) -> int:
    parser = arguments("kthread", __doc__, quick="a few threads and forks")
    parser.add_argument("--threads", type=int, default=210)
    parser.add_argument("--forks", type=int, default=2000)
    parser.add_argument("--sources", default="perf,proc-connector,none")
    args = parser.parse_args(argv)
    if args.quick:
        args.threads, args.forks = 9, 100
    if not_root("kthread", "loop devices, mounts, a tuning daemon"):
        return 2
    results: dict[str, dict[str, Any]] = {}
    with PrivateBus(POLICY) as bus, tempfile.TemporaryDirectory(prefix="latencyd-kbench-") as tmp:
        for source in args.sources.split(","):
            results[source] = run_source(
                bus.address, Path(tmp) / source, source, args.threads, args.forks
            )
    if args.json:
        print(json.dumps({"benchmark": "kthread", "results": results}))
    else:
        report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
