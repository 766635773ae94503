"""Keep a `latencyctl measure --attribute --save DIR` run as a recorded sample for the
verdict tests (tests/data/attribution/): trimmed to what the verdicts read (per-round and
pooled p50/p99/p99.9/max, idle busy shares, the plan), with where and how it was recorded,
and its verdicts judged by the current rule.

    .venv/bin/python -m scripts.record_attribution SAVED.json OUT.json "how it was run"

Run it again on a recorded sample (OUT.json as SAVED.json) after changing the rule: the
measurements stay, the verdicts follow the rule, and each change is printed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from latencyd.tools import attribute

KEPT_PLAN = ("scenarios", "tools", "rounds", "seconds_per_tool", "load")


def trimmed(saved: dict[str, Any], recorded: str) -> dict[str, Any]:
    measured = saved["measure"]

    def stats(summary: dict[str, float]) -> dict[str, float]:
        return {p: summary[p] for p in attribute.SHOWN}

    tools = {
        tool: {
            "stats": {s: stats(v) for s, v in data["stats"].items()},
            "per_round": {s: [stats(r) for r in rs] for s, rs in data["per_round"].items()},
        }
        for tool, data in measured["tools"].items()
    }
    return {
        "recorded": recorded,
        "profile": saved["profile"],
        "machine": saved["machine"],
        "groups": [
            {k: g[k] for k in ("name", "settings", "verdict", "reason") if k in g}
            for g in saved["groups"]
        ],
        "measure": {
            "plan": {k: measured["plan"][k] for k in KEPT_PLAN},
            "round_order": measured.get("round_order", []),
            "idle_busy_pct": measured.get("idle_busy_pct", {}),
            "tools": tools,
        },
    }


def rejudge(sample: dict[str, Any]) -> list[str]:
    """Verdicts by the current rule, written into `sample`; the changes, as lines."""
    groups = [
        attribute.Group(g["name"], ()) for g in sample["groups"] if g["verdict"] != "not applicable"
    ]
    control = any(g.name == attribute.CONTROL for g in groups)
    compare = attribute.comparisons(sample["profile"], groups, control=control)
    judged = {r.name: r.verdict for r in attribute.judge(sample["measure"], groups, compare)}
    changes = []
    for group in sample["groups"]:
        new = judged.get(group["name"], group["verdict"])
        if new != group["verdict"]:
            changes.append(f"{group['name']}: {group['verdict']} -> {new}")
            group["verdict"] = new
    return changes


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    saved = json.loads(Path(argv[0]).read_text())
    recorded = argv[2] if len(argv) == 3 else saved.get("recorded", "")
    sample = trimmed(saved, recorded) if "recorded" not in saved else saved
    if len(argv) == 3:
        sample["recorded"] = recorded
    for line in rejudge(sample):
        print(line)
    Path(argv[1]).write_text(json.dumps(sample, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
