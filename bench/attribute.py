"""attribute benchmark: how long `latencyctl measure --attribute` takes for the shipped
`cpu-partitioning` under load with its control group (target: about 15 minutes on 2 CPUs,
its default budget), and what it finds; with `--runs 2`, whether two runs agree (target:
the same verdict for at least 90 % of the groups, and the control group `hurts` in each);
and what the control hog costs the measured CPUs once the daemon moved it there, the
control group's added busy share at idle (target: over 30 %; the hog is busy 80 µs of
every 100, and another task on the machine can take some of that from it).

    python -m bench attribute [--profile cpu-partitioning] [--runs 1] [--budget 15m]
                              [--json] [--quick]

The load is measure's `--load`: stress-ng started as from a shell, unpinned, so the
shield's task isolation has something to move off the measured CPU. Run it on a quiet
machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import arguments, not_root
from latencyd.tools.attribute import CONTROL
from latencyd.tools.cli import parse_duration
from scripts.private_bus import PrivateBus
from tests.harness import BIN, POLICY, REPO, Latencyd

BUDGET_SLACK = 1.1  # a run may take its --budget and 10 % more
AGREEMENT_TARGET = 0.9
CONTROL_BUSY_TARGET_PCT = 30.0


def attribute(d: Latencyd, profile: str, budget: str, quick: bool) -> tuple[dict[str, Any], float]:
    cmd = [str(BIN / "latencyctl"), "measure", "--attribute", "--profile", profile, "--control",
           "--load", "--json"]  # fmt: skip
    cmd += ["--seconds", "1", "--rounds", "2", "--idle-seconds", "0.5"] if quick else []
    cmd += [] if quick else ["--budget", budget]
    started = time.monotonic()
    out = subprocess.run(cmd, env=d.env, capture_output=True, text=True, timeout=7200)
    if out.returncode != 0:
        raise RuntimeError(f"latencyctl measure --attribute failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout), time.monotonic() - started


def control_busy(result: dict[str, Any], profile: str) -> float | None:
    """The control group's added busy share of the measured CPUs at idle, in %: added to
    the profile (P+control against P). Not the group's own idle_busy_pct, which adds it
    to the untuned machine: there the load already fills the measured CPUs, so it reads
    0 whatever the hog does; the profile's shield keeps the load off them."""
    busy = result["measure"].get("idle_busy_pct", {})
    with_it, without = busy.get(f"{profile}+{CONTROL}"), busy.get(profile)
    return None if with_it is None or without is None else round(with_it - without, 2)


def main(argv: list[str]) -> int:
    parser = arguments("attribute", __doc__, quick="latency-performance, 2 rounds of 1 s")
    parser.add_argument("--profile", default="cpu-partitioning")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--budget", default="15m")
    args = parser.parse_args(argv)
    if args.quick:
        args.profile, args.runs = "latency-performance", 1
    if not_root("attribute", "network namespaces, profiles, SCHED_FIFO"):
        return 2
    budget_s = parse_duration(args.budget, "--budget")
    runs = []
    with PrivateBus(POLICY) as bus, tempfile.TemporaryDirectory(prefix="latencyd-attr-") as tmp:
        d = Latencyd(bus.address, Path(tmp), None, [REPO / "profiles"], extra=["--no-profile"])
        try:
            d.start()
            for i in range(args.runs):
                print(
                    f"bench attribute: run {i + 1}/{args.runs} of {args.profile}", file=sys.stderr
                )
                runs.append(attribute(d, args.profile, args.budget, args.quick))
        finally:
            d.stop()
    verdicts = [{g["name"]: g["verdict"] for g in r["groups"]} for r, _ in runs]
    same = (
        sum(verdicts[0][n] == verdicts[1].get(n) for n in verdicts[0]) / len(verdicts[0])
        if len(verdicts) > 1
        else None
    )
    summary = {
        "profile": args.profile,
        "machine": runs[0][0]["machine"],
        "seconds": [round(s, 1) for _, s in runs],
        "budget_s": budget_s,
        # the tools' seconds per round: the first from the estimate, the rest refitted
        "seconds_per_round": [r["measure"]["plan"]["seconds_per_round"] for r, _ in runs],
        "verdicts": verdicts,
        "same_verdict_share": same,
        "control_hurts": [v.get("control") == "hurts" for v in verdicts],
        # the control hog's added busy % of the measured CPUs at idle (its duty cycle there)
        "control_busy_pct": [control_busy(r, args.profile) for r, _ in runs],
    }
    if args.json:
        print(json.dumps(summary))
        return 0
    print(f"attribution of {args.profile} under load, with --control, on {summary['machine']}")
    for i, ((result, seconds), v) in enumerate(zip(runs, verdicts, strict=True)):
        mark = "PASS" if seconds <= budget_s * BUDGET_SLACK else "MISS"
        per_round = ", ".join(f"{s:.1f}" for s in result["measure"]["plan"]["seconds_per_round"])
        print(f"  run {i + 1}: {seconds / 60:.1f} min  (target <= "
              f"{budget_s * BUDGET_SLACK / 60:.1f} min with --budget {args.budget}; "
              f"seconds per tool in each round: {per_round})  [{mark}]")  # fmt: skip
        for name, verdict in v.items():
            print(f"    {name:<22} {verdict}")
    hurts = sum(summary["control_hurts"])
    print(f"  control group hurts in {hurts} of {len(runs)} runs  "
          f"[{'PASS' if hurts == len(runs) else 'MISS'}]")  # fmt: skip
    for i, busy in enumerate(summary["control_busy_pct"]):
        mark = "PASS" if busy is not None and busy > CONTROL_BUSY_TARGET_PCT else "MISS"
        print(f"  run {i + 1}: the control hog adds {busy} % busy to the measured CPUs at "
              f"idle  (target > {CONTROL_BUSY_TARGET_PCT:.0f} %)  [{mark}]")  # fmt: skip
    if same is not None:
        mark = "PASS" if same >= AGREEMENT_TARGET else "MISS"
        print(f"  runs 1 and 2 give the same verdict for {same:.0%} of the groups  "
              f"(target >= {AGREEMENT_TARGET:.0%})  [{mark}]")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
