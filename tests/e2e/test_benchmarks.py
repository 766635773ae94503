"""Every benchmark runs, once, in its quick mode: figures are not judged here (they live
in bench/), but a benchmark that no longer runs from a fresh set-up fails the suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.__main__ import BENCHMARKS, RUNS_ONLY_WITH
from tests.harness import REPO


def test_every_benchmark_runs_in_quick_mode(kernel_guard: None, tmp_path: Path) -> None:
    """All but those that need what this run has not (RUNS_ONLY_WITH: vm_ticks, the VM
    image, here pointed at an empty cache: the VM tier boots that VM in its own time, not
    inside the host suite), which are skipped, saying why."""
    r = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "LATENCYD_VM_CACHE": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(BENCHMARKS) - len(RUNS_ONLY_WITH), r.stdout[-3000:]
    assert f"bench: vm_ticks: skipped: no VM image in {tmp_path}" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
