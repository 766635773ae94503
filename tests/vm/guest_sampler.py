"""Run inside the VM (Debian's python3, standard library only): samples, until a stop file
appears, an application's CPU affinity (each of its threads) and a set of kernel settings
(files, kernel threads' affinities), and writes what it saw as JSON: the sample count,
and for each setting every value seen with how many samples showed it.

    python3 guest_sampler.py OUT STOPFILE PID  <settings.json

settings.json: {"files": [path, ...], "kthreads": [pid, ...]}. The VM tier's package test
runs it through an upgrade: a setting seen with two values flipped."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as e:
        return f"<{e.strerror}>"


def affinity(pid: int) -> str:
    try:
        return ",".join(map(str, sorted(os.sched_getaffinity(pid))))
    except OSError as e:
        return f"<{e.strerror}>"


def main() -> None:
    out, stop, app = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    wanted = json.load(sys.stdin)
    files: list[str] = wanted["files"]
    kthreads: list[int] = wanted["kthreads"]
    seen: dict[str, Counter[str]] = defaultdict(Counter)
    samples = 0
    while not stop.exists():
        try:
            threads = os.listdir(f"/proc/{app}/task")
        except FileNotFoundError:
            threads = []
            seen["app"]["<exited>"] += 1
        for tid in threads:
            seen["app"][affinity(int(tid))] += 1
        for path in files:
            seen[path][read(path)] += 1
        for pid in kthreads:
            seen[f"kthread {pid}"][affinity(pid)] += 1
        samples += 1
    Path(out).write_text(json.dumps({"samples": samples, "seen": seen}))


if __name__ == "__main__":
    main()
