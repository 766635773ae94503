"""verdicts benchmark: what the attribution verdict rule decides, without measuring.

1. Every recorded sample (tests/data/attribution/) judged by the run's pooled noise alone
   (the rule before 2026-11-27) and by the current rule (the pooled bar, or the compared
   scenarios' own moderated one: latencyd/tools/spread.py): a table of each group's
   verdicts, the groups whose verdict moved marked.
2. False verdicts under the null: runs with no effect anywhere, shaped like the recorded
   cpu-partitioning run under load (22 scenarios, 2 tools, 3 rounds), their rounds drawn
   from a log-normal spread (sd 0.15) alike in every scenario, or, in half of the
   scenarios, bimodal as unshielded scenarios under load are (a round 10x slower with
   probability 0.3). Target: the current rule's share of groups with a verdict (helps or
   hurts) no more than 1 percentage point above the pooled rule's.

    python -m bench verdicts [--runs 100] [--json] [--quick]

Pure arithmetic: needs no root and touches nothing.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path
from typing import Any

from bench import arguments
from latencyd.tools import attribute as A

SAMPLES = Path(__file__).resolve().parents[1] / "tests" / "data" / "attribution"
SHAPE = "no-cpuidle-driver-cpu-partitioning-load-2026-11-27.json"
LEVELS = {"p50": 15.0, "p99": 40.0, "p99.9": 100.0, "max": 500.0}  # µs, any will do
TARGET_EXTRA_PCT = 1.0


def verdicts(sample: dict[str, Any], moderate: bool) -> dict[str, str]:
    groups = [A.Group(g["name"], ()) for g in sample["groups"] if g["verdict"] != "not applicable"]
    control = any(g.name == A.CONTROL for g in groups)
    compare = A.comparisons(sample["profile"], groups, control=control)
    return {r.name: r.verdict for r in A.judge(sample["measure"], groups, compare, moderate)}


def null_run(shape: dict[str, Any], rng: random.Random, bimodal: bool) -> dict[str, Any]:
    """A measure result shaped like `shape`, with no effect anywhere."""
    tools = {}
    for tool in shape["measure"]["tools"]:
        per_round, stats = {}, {}
        for scenario in shape["measure"]["plan"]["scenarios"]:
            noisy = bimodal and rng.random() < 0.5
            rounds = []
            for _ in range(shape["measure"]["plan"]["rounds"]):
                slow = 10.0 if noisy and rng.random() < 0.3 else 1.0
                rounds.append(
                    {p: lvl * slow * math.exp(rng.gauss(0, 0.15)) for p, lvl in LEVELS.items()}
                )
            per_round[scenario] = rounds
            stats[scenario] = {p: sorted(r[p] for r in rounds)[len(rounds) // 2] for p in LEVELS}
        tools[tool] = {"per_round": per_round, "stats": stats}
    return {**shape, "measure": {**shape["measure"], "tools": tools}}


def false_verdicts(shape: dict[str, Any], runs: int, bimodal: bool) -> dict[str, float]:
    rng = random.Random(1)
    counts = {"pooled": 0, "current": 0}
    total = 0
    for _ in range(runs):
        run = null_run(shape, rng, bimodal)
        for rule, moderate in (("pooled", False), ("current", True)):
            judged = verdicts(run, moderate)
            counts[rule] += sum(v != "no measurable effect" for v in judged.values())
        total += len(judged)
    return {rule: 100.0 * n / total for rule, n in counts.items()}


def main(argv: list[str]) -> int:
    parser = arguments("verdicts", __doc__, "10 null runs per spread")
    parser.add_argument("--runs", type=int, default=100, help="null runs per spread")
    args = parser.parse_args(argv)
    runs = 10 if args.quick else args.runs
    out: dict[str, Any] = {"samples": {}, "null": {}}
    for path in sorted(SAMPLES.glob("*.json")):
        sample = json.loads(path.read_text())
        before, after = verdicts(sample, False), verdicts(sample, True)
        out["samples"][path.stem] = {g: [before[g], after[g]] for g in before}
    shape = json.loads((SAMPLES / SHAPE).read_text())
    for bimodal in (False, True):
        out["null"]["bimodal" if bimodal else "alike"] = false_verdicts(shape, runs, bimodal)
    if args.json:
        print(json.dumps(out))
        return 0
    print("verdicts on the recorded samples: pooled noise alone -> the current rule")
    for name, groups in out["samples"].items():
        print(f"  {name}")
        for group, (before, after) in groups.items():
            moved = "   <- moved" if before != after else ""
            print(f"    {group:20} {before:22} {after:22}{moved}")
    print(f"groups given a verdict with no effect anywhere ({runs} runs of {SHAPE}'s shape):")
    for spread, rates in out["null"].items():
        extra = rates["current"] - rates["pooled"]
        mark = "PASS" if extra <= TARGET_EXTRA_PCT else "MISS"
        print(
            f"  scenarios spread {spread:8} pooled {rates['pooled']:5.2f} %  current "
            f"{rates['current']:5.2f} %  (+{extra:.2f} points; target <= +{TARGET_EXTRA_PCT:g}: "
            f"{mark})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
