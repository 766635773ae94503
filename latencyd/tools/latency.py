"""Latency distributions, their percentiles and ratios: the arithmetic of `latencyctl measure`.

Pure functions over what the standard tools reported (sockperf's per-packet latencies,
cyclictest's and oslat's histograms): nothing here measures anything itself.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
RESOLUTION_US = 0.1  # sockperf latencies are kept to a tenth of a µs


@dataclass
class Histogram:
    """Counts of latencies in µs (values rounded to RESOLUTION_US); `overflow` counts
    samples above `ceiling` (a tool's histogram range), whose exact values are unknown."""

    counts: Counter[float] = field(default_factory=Counter)
    overflow: int = 0
    ceiling: float = math.inf

    @classmethod
    def of(cls, values: Iterable[float]) -> Histogram:
        return cls(Counter(round(v / RESOLUTION_US) * RESOLUTION_US for v in values))

    def add(self, other: Histogram) -> None:
        self.counts.update(other.counts)
        self.overflow += other.overflow
        self.ceiling = min(self.ceiling, other.ceiling)

    @property
    def samples(self) -> int:
        return sum(self.counts.values()) + self.overflow

    def percentile(self, q: float) -> float:
        """Nearest-rank percentile; inf when it falls among the overflows."""
        total = self.samples
        if not total:
            return math.nan
        rank = max(1, math.ceil(q / 100 * total))
        seen = 0
        for value in sorted(self.counts):
            seen += self.counts[value]
            if seen >= rank:
                return value
        return math.inf

    def summary(self) -> dict[str, float]:
        n = sum(self.counts.values())
        mean = sum(v * c for v, c in self.counts.items()) / n if n else math.nan
        var = sum(c * (v - mean) ** 2 for v, c in self.counts.items()) / n if n else math.nan
        out = {
            "samples": float(self.samples),
            "min": min(self.counts) if self.counts else math.nan,
            **{f"p{q:g}": self.percentile(q) for q in PERCENTILES},
            "max": math.inf if self.overflow else (max(self.counts) if self.counts else math.nan),
            "mean": mean,
            "stdev": math.sqrt(var) if n else math.nan,
        }
        if self.overflow:
            out["overflow_above_us"] = self.ceiling
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "counts": {f"{v:g}": c for v, c in sorted(self.counts.items())},
            "overflow": self.overflow,
            "ceiling": None if math.isinf(self.ceiling) else self.ceiling,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Histogram:
        ceiling = data.get("ceiling")
        return cls(
            Counter({float(v): int(c) for v, c in data.get("counts", {}).items()}),
            int(data.get("overflow", 0)),
            math.inf if ceiling is None else float(ceiling),
        )


def ratio(value: float, base: float) -> float:
    if base == 0 or math.isnan(base) or math.isnan(value):
        return math.nan
    return value / base


@dataclass(frozen=True)
class Ratio:
    """A scenario's percentile over the baseline's: pooled, and its round-to-round spread."""

    pooled: float
    low: float
    high: float


def ratios(
    rounds: Sequence[tuple[Histogram, Histogram]], pooled: tuple[Histogram, Histogram]
) -> dict[str, Ratio]:
    """Per percentile: pooled ratio of (scenario, baseline), and min..max of the per-round
    ratios (rounds alternate scenarios, so each round's pair saw the same machine)."""
    out = {}
    for q in (*PERCENTILES,):
        key = f"p{q:g}"
        per_round = [
            ratio(s.percentile(q), b.percentile(q)) for s, b in rounds if s.samples and b.samples
        ]
        finite = [r for r in per_round if math.isfinite(r)]
        out[key] = Ratio(
            ratio(pooled[0].percentile(q), pooled[1].percentile(q)),
            min(finite) if finite else math.nan,
            max(finite) if finite else math.nan,
        )
    return out


def fmt(value: float) -> str:
    if math.isnan(value):
        return "-"
    if math.isinf(value):
        return "overflow"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def render_table(
    tool: str, unit: str, stats: Mapping[str, Mapping[str, float]], baseline: str
) -> list[str]:
    """One tool's scenarios as rows: percentiles, and ratios to the baseline."""
    columns = ["min", "p50", "p90", "p99", "p99.9", "max", "stdev", "samples"]
    width = max([len("scenario"), *(len(n) for n in stats)])
    lines = [
        f"{tool} ({unit})",
        "  " + "scenario".ljust(width) + "".join(c.rjust(10) for c in columns),
    ]
    for name, s in stats.items():
        cells = [
            fmt(s.get(c, math.nan)) if c != "samples" else f"{s['samples']:.0f}" for c in columns
        ]
        lines.append("  " + name.ljust(width) + "".join(c.rjust(10) for c in cells))
    return lines


def render_ratios(tool: str, table: Mapping[str, Mapping[str, Ratio]], baseline: str) -> list[str]:
    if not table:
        return []
    lines = [f"{tool}: ratio to {baseline} (pooled, and the spread over rounds)"]
    for name, per in table.items():
        cells = "  ".join(
            f"{key} {fmt_ratio(r.pooled)} [{fmt_ratio(r.low)}-{fmt_ratio(r.high)}]"
            for key, r in per.items()
        )
        lines.append(f"  {name}: {cells}")
    return lines


def fmt_ratio(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}x"


def plot(result: Mapping[str, Any], path: str) -> None:
    """Per tool: latency histograms and CDFs on a log scale, one line per scenario."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display needed
    import matplotlib.pyplot as plt

    tools = result["tools"]
    fig, axes = plt.subplots(len(tools), 2, figsize=(12, 4 * len(tools)), squeeze=False)
    for row, (tool, data) in enumerate(tools.items()):
        hist_ax, cdf_ax = axes[row]
        for scenario, raw in data["histograms"].items():
            h = Histogram.from_json(raw)
            values = sorted(h.counts)
            if not values:
                continue
            counts = [h.counts[v] for v in values]
            total = h.samples
            hist_ax.step(values, counts, where="mid", label=scenario)
            cumulative, seen = [], 0
            for c in counts:
                seen += c
                cumulative.append(seen / total)
            # The tail on a log axis: 1 - CDF, so p99 and p99.9 are visible.
            cdf_ax.step(values, [max(1 - c, 1 / total) for c in cumulative], where="post",
                        label=scenario)  # fmt: skip
        for ax in (hist_ax, cdf_ax):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(f"latency, {data['unit']}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        hist_ax.set_title(f"{tool}: histogram")
        hist_ax.set_ylabel("samples")
        cdf_ax.set_title(f"{tool}: share of samples above (1 - CDF)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
