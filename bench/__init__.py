"""Benchmarks for latencyd: print figures (medians over repeated runs) next to their targets.

Run from the repository root as root: ``python -m bench`` (every registered benchmark) or
``python -m bench NAME [options]``. See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import os
import sys


def arguments(name: str, description: str | None, quick: str) -> argparse.ArgumentParser:
    """A benchmark's option parser: its docstring as help, and the options every benchmark
    takes (`--json`: one line of JSON; `--quick`: briefly, to show it still runs)."""
    parser = argparse.ArgumentParser(
        prog=f"python -m bench {name}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    parser.add_argument("--quick", action="store_true", help=quick)
    return parser


def not_root(name: str, why: str) -> bool:
    """Whether this process lacks root (and said so): the benchmarks tune the real machine."""
    if os.geteuid() == 0:
        return False
    print(f"bench {name}: needs root ({why})", file=sys.stderr)
    return True


# cpu-partitioning with its shield kept by the affinity chase: benchmarks run it beside the
# shipped profile (whose shield is a cpuset where the machine has one) to compare the two.
CHASE = "cpu-partitioning-affinity"
CHASE_PROFILE = """[main]
summary = "cpu-partitioning with the affinity shield (the chase)"
include = ["cpu-partitioning"]

[shield]
mechanism = "affinity"
"""
