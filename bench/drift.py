"""drift benchmark: how fast drift is put back, and what keeping watch costs while idle.

Design (see latencyd/service/main.py DriftWatch): every procfs/sysfs file holding an owned
setting is watched with inotify, so a write by anyone wakes the daemon at once and
nothing wakes it otherwise; settings that live in no file (thread affinities, NIC
settings, the PM QoS request) are read back every `poll_interval_s` (1 s) while a
profile owns any; the full verify tick (`verify_interval_s`, 10 s) is the safety net.

Figures, at the default configuration:
- a rewritten sysctl (file: inotify) -> put back: p50 / p99 over --samples;
- a moved kernel thread (no file: the poll) -> put back: p50 / p99;
- the daemon's idle CPU over --idle-seconds, for the default profile (files only) and
  for cpu-partitioning (which owns thread affinities, so the 1 s poll runs).

    python -m bench drift [--samples 50] [--idle-seconds 60] [--json] [--quick]

Goals: drift put back within 1 s; idle CPU <= 0.02 %. Benchmarks print, never judge.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import arguments, not_root
from bench.daemon import cpu_sample
from scripts.private_bus import PrivateBus
from tests.harness import POLICY, REPO, Latencyd
from tests.loopfs import LoopFs, jbd2_pids

THREADS = """
[main]
summary = "bench: a pinned jbd2 thread"
include = ["latency-performance"]

[[kthread.rule]]
match = "^jbd2/"
cpus = "0"
"""
SWAPPINESS = Path("/proc/sys/vm/swappiness")


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def put_back(change: Any, is_back: Any, samples: int) -> list[float]:
    """ms from an outside change to the daemon having put it back, per sample."""
    delays = []
    for _ in range(samples):
        change()
        start = time.monotonic()
        while not is_back():
            if time.monotonic() - start > 5:
                raise RuntimeError("drift was not put back within 5 s")
            time.sleep(0.0001)
        delays.append((time.monotonic() - start) * 1000)
        time.sleep(0.05)
    return delays


def idle_cpu(d: Latencyd, seconds: float) -> dict[str, float]:
    assert d.proc is not None
    time.sleep(1.0)  # let start-up settle
    before = cpu_sample(d.proc.pid)
    time.sleep(seconds)
    after = cpu_sample(d.proc.pid)
    wall = after["wall"] - before["wall"]
    return {
        "idle_cpu_pct": (after["exec_ns"] - before["exec_ns"]) / (wall * 1e9) * 100,
        "wakeups": after["switches"] - before["switches"],
        "seconds": wall,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"benchmark": "drift"}
    with PrivateBus(POLICY) as bus, tempfile.TemporaryDirectory(prefix="latencyd-drift-") as tmp:
        root = Path(tmp)
        profiles = root / "profiles"
        profiles.mkdir()
        (profiles / "threads.toml").write_text(THREADS)
        dirs = [profiles, REPO / "profiles"]
        # 1. default profile: files only
        (root / "default").mkdir()
        d = Latencyd(bus.address, root / "default", "latency-performance", dirs)
        d.start()
        try:
            wanted = SWAPPINESS.read_text().strip()
            delays = put_back(
                lambda: SWAPPINESS.write_text("42"),
                lambda: SWAPPINESS.read_text().strip() == wanted,
                args.samples,
            )
            out["sysctl_put_back_ms"] = {
                "p50": percentile(delays, 0.5),
                "p99": percentile(delays, 0.99),
            }
            out["default_profile"] = idle_cpu(d, args.idle_seconds)
        finally:
            d.stop()
        # 2. a profile that owns a thread affinity: the 1 s poll runs
        fs = LoopFs(root / "loops", 0)
        (root / "threads").mkdir()
        d = Latencyd(bus.address, root / "threads", "threads", dirs)
        try:
            fs.mount()
            (pid,) = jbd2_pids(fs.device)
            d.start()
            while os.sched_getaffinity(pid) != {0}:
                time.sleep(0.001)
            delays = put_back(
                lambda: os.sched_setaffinity(pid, {1}),
                lambda: os.sched_getaffinity(pid) == {0},
                max(3, args.samples // 10),
            )
            out["thread_put_back_ms"] = {
                "p50": percentile(delays, 0.5),
                "p99": percentile(delays, 0.99),
            }
            out["thread_profile"] = idle_cpu(d, args.idle_seconds)
        finally:
            d.stop()
            fs.close()
    return out


def report(r: dict[str, Any]) -> None:
    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    s, t = r["sysctl_put_back_ms"], r["thread_put_back_ms"]
    print("drift put back (outside write -> value back), goal <= 1000 ms")
    print(
        f"  sysctl (inotify):        p50 {s['p50']:8.2f} ms  p99 {s['p99']:8.2f} ms  "
        f"[{verdict(s['p99'] <= 1000)}]"
    )
    print(
        f"  thread affinity (poll):  p50 {t['p50']:8.2f} ms  p99 {t['p99']:8.2f} ms  "
        f"[{verdict(t['p99'] <= 1000)}]"
    )
    print("daemon CPU while idle (schedstat), goal <= 0.02 %")
    for key, label in (
        ("default_profile", "latency-performance (files only)"),
        ("thread_profile", "with an owned thread (1 s poll)"),
    ):
        i = r[key]
        print(
            f"  {label:34} {i['idle_cpu_pct']:.4f} %  ({i['wakeups']} wake-ups in "
            f"{i['seconds']:.0f} s)  [{verdict(i['idle_cpu_pct'] <= 0.02)}]"
        )


def main(argv: list[str]) -> int:
    parser = arguments("drift", __doc__, quick="5 samples, 2 s idle windows")
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.idle_seconds = 5, 2.0
    if not_root("drift", "it tunes the machine"):
        return 2
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
