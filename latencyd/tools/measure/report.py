"""A run's result as lines for the terminal: per tool its percentiles and ratios to the
baseline (beside an older run's, with --compare), the idle cost, what interfered on the
measured CPUs, and the tick on the shielded ones."""

from __future__ import annotations

from typing import Any

from latencyd.tools.latency import Ratio, fmt, fmt_ratio, ratio, render_ratios, render_table
from latencyd.tools.terminal import trimmed
from latencyd.tools.ticks import format_ticks


def format_measure(result: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    out = []
    baseline = result["baseline"]
    for tool, data in result["tools"].items():
        out += render_table(tool, data["unit"], data["stats"], baseline)
        table = {s: {k: Ratio(**v) for k, v in per.items()} for s, per in data["ratios"].items()}
        out += render_ratios(tool, table, baseline)
        if old is not None and tool in old.get("tools", {}):
            out += _compare(tool, data["stats"], old["tools"][tool]["stats"])
        out.append("")
    if result.get("idle_busy_pct"):
        busy = ", ".join(f"{s} {v:.2f} %" for s, v in result["idle_busy_pct"].items())
        out += [f"measured CPUs awake with no traffic (running or polling): {busy}", ""]
    for scenario, blame in result["attribution"].items():
        top = ", ".join(f"{k} {v}" for k, v in list(blame["interrupts"].items())[:4]) or "none"
        soft = ", ".join(f"{k} {v}" for k, v in list(blame["softirqs"].items())[:4]) or "none"
        tasks = ", ".join(f"{t['comm']} {t['ran_ms']:.1f} ms" for t in blame["tasks_that_ran"][:4])
        out.append(f"on CPUs {result['plan']['app_cpus']} during {scenario}:")
        out.append(f"  interrupts: {top}")
        out.append(f"  softirqs: {soft}")
        out.append(f"  schedule() calls: {blame['schedule_calls']}; other tasks: {tasks or 'none'}")
    if result.get("tick"):
        out += ["", *format_ticks(result["tick"])]
    if result.get("saved"):
        out += ["", f"saved: {result['saved']}"]
    if result.get("plot"):
        out.append(f"plot: {result['plot']}")
    return trimmed(out)


def _compare(tool: str, new: dict[str, Any], old: dict[str, Any]) -> list[str]:
    lines = [f"{tool}: this run beside the old one (new / old)"]
    for scenario in [s for s in new if s in old]:
        cells = "  ".join(
            f"{q} {fmt(old[scenario][q])}->{fmt(new[scenario][q])} "
            f"({fmt_ratio(ratio(new[scenario][q], old[scenario][q]))})"
            for q in ("p50", "p99", "p99.9")
        )
        lines.append(f"  {scenario}: {cells}")
    return lines
