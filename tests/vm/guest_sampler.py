"""Run inside the VM (Debian's python3, standard library only): samples, until a stop file
appears and once more after it, an application's CPU affinity (each of its threads) and
cgroup, and a set of kernel settings (files, kernel threads' affinities), and writes what
it saw as JSON: the sample count, and for each setting every value seen with how many
samples showed it.
Once the first sample is taken it makes OUT.started, so its caller starts what is to be
sampled through only then.

    python3 guest_sampler.py OUT STOPFILE PID  <settings.json

settings.json: {"files": [path, ...], "kthreads": [pid, ...]}. The VM tier's package test
runs it through an upgrade: a setting seen with two values flipped. A file gone reads as
its error (a flip); a kernel thread that exited is no setting and is no longer sampled."""

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


def affinity(pid: int) -> str | None:
    """The CPUs a task may run on; None once it has exited."""
    try:
        return ",".join(map(str, sorted(os.sched_getaffinity(pid))))
    except ProcessLookupError:
        return None
    except OSError as e:
        return f"<{e.strerror}>"


def main() -> None:
    out, stop, app = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    wanted = json.load(sys.stdin)
    files: list[str] = wanted["files"]
    kthreads: list[int] = wanted["kthreads"]
    seen: dict[str, Counter[str]] = defaultdict(Counter)
    samples = 0
    while True:
        stopping = stop.exists()  # one sample more once it is there: the state at the end
        try:
            threads = os.listdir(f"/proc/{app}/task")
        except FileNotFoundError:
            threads = []
            seen["app"]["<exited>"] += 1
        for tid in threads:
            if (cpus := affinity(int(tid))) is not None:  # a thread that ended: none
                seen["app"][cpus] += 1
        seen["app cgroup"][read(f"/proc/{app}/cgroup")] += 1
        for path in files:
            seen[path][read(path)] += 1
        for pid in kthreads:
            if (cpus := affinity(pid)) is not None:
                seen[f"kthread {pid}"][cpus] += 1
        samples += 1
        if samples == 1:
            Path(f"{out}.started").touch()
        if stopping:
            break
    partial = Path(f"{out}.partial")  # OUT appears whole: its caller waits for it
    partial.write_text(json.dumps({"samples": samples, "seen": seen}))
    partial.rename(out)


if __name__ == "__main__":
    main()
