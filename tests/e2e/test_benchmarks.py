"""Every benchmark runs, once, in its quick mode: figures are not judged here (they live
in bench/), but a benchmark that no longer runs from a fresh set-up fails the suite."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.__main__ import BENCHMARKS
from tests.harness import REPO


def test_every_benchmark_runs_in_quick_mode(kernel_guard: None) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(BENCHMARKS), r.stdout[-3000:]
    assert "Traceback" not in r.stderr
