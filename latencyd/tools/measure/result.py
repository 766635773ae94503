"""What a run's rounds come to: each tool's histograms pooled per scenario, their
percentiles, and the ratios to the baseline (the first scenario), per round and pooled,
as the JSON that `--save` keeps and the report reads."""

from __future__ import annotations

import time
from typing import Any

from latencyd.tools.latency import Histogram, ratios
from latencyd.tools.measure.plan import Plan
from latencyd.tools.measure.tools import UNITS


def result(
    plan: Plan,
    per_round: dict[str, dict[str, list[Histogram]]],
    blame: dict[str, dict[str, Any]],
    order: list[list[str]],
    started: float,
) -> dict[str, Any]:
    baseline = plan.scenarios[0]
    tools: dict[str, Any] = {}
    for tool, by_scenario in per_round.items():
        pooled: dict[str, Histogram] = {}
        for scenario, hists in by_scenario.items():
            total = Histogram()
            for h in hists:
                total.add(h)
            pooled[scenario] = total
        tables = {}
        for scenario in plan.scenarios[1:]:
            pairs = list(zip(by_scenario.get(scenario, []), by_scenario.get(baseline, []),
                             strict=False))  # fmt: skip
            if scenario in pooled and baseline in pooled:
                per = ratios(pairs, (pooled[scenario], pooled[baseline]))
                tables[scenario] = {k: vars(v) for k, v in per.items()}
        tools[tool] = {
            "unit": UNITS[tool],
            "stats": {s: pooled[s].summary() for s in plan.scenarios if s in pooled},
            "per_round": {s: [h.summary() for h in hs] for s, hs in by_scenario.items()},
            "ratios": tables,
            "histograms": {s: h.as_json() for s, h in pooled.items()},
        }
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "plan": {
            "scenarios": plan.scenarios,
            "app_cpus": plan.app_cpus.to_list(),
            "housekeeping_cpus": plan.housekeeping.to_list(),
            "seconds_per_tool": plan.seconds,
            "rounds": plan.rounds,
            "tools": plan.tools,
            "load": " ".join(plan.load) if plan.load else None,
            "idle_seconds": plan.idle_seconds,
        },
        "baseline": baseline,
        "round_order": order,
        "tools": tools,
        "attribution": blame,
    }
