"""`latencyctl measure --attribute`: what each group of a profile's settings buys here.

A profile P is split into groups of settings that act independently (the plugins declare
them in their schemas; `--group` defines more). Each group G is measured two ways against
a neighbour that differs from it by G alone:

- leave-one-out: P against "P without G" (what G adds to the rest of P);
- add-one-in: "untuned plus G" against untuned (what G does on its own).

Each scenario is a profile written from P's own settings (variables substituted) and held
through the daemon; between measured scenarios the daemon is walked there one group at a
time, so every switch it makes changes one group's settings only. The scenarios alternate
in rounds (measure's rounds), so drift of the machine hits all of them alike.

Effects are ratios "with G / without G" of each tool's percentile: below 1, G lowers the
latency. THE VERDICT RULE (RULE below, printed with every table): an effect counts only
when it is larger than the spread between rounds of the same scenario, pooled over all of
the run's scenarios (the standard deviation of log(percentile) within a scenario: 24
scenarios of 3 rounds give it 48 degrees of freedom, where the two compared scenarios alone
give 4 and one outlying round silences or invents an effect) -- or larger than the two
compared scenarios' own spread, moderated by the run's (spread.py: under load, scenarios
without the shield are bimodal and steady ones could never clear the pooled bar) -- by a
margin that keeps a group's false alarms at 5 % over all its votes (Bonferroni), beyond
MIN_EFFECT, and with every round's own ratio on the same side of 1. p50, p99 and p99.9 of
every tool vote, in both directions (max is shown; a single sample does not vote). The
tails and the profile come first, and a verdict needs two corroborating votes
(CORROBORATION): a group `hurts` when two p99/p99.9 votes count as higher leaving it out
(or only higher votes count), `helps` when two votes count as lower and it does not hurt,
and has `no measurable effect` otherwise.

Pure functions over profiles and results: the measuring is measure.run's.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from statistics import NormalDist
from typing import Any

from latencyd.core.schema import Schema
from latencyd.core.tomlwrite import toml_line, toml_section
from latencyd.errors import LatencydError
from latencyd.text import printable
from latencyd.tools import spread

RULE = (
    "ratio = latency with the group / without it (below 1: the group lowers latency). An "
    "effect counts only when the mean of its rounds' log ratios is beyond z standard errors "
    "of the round-to-round spread (pooled over every scenario of the run, or the two "
    "compared scenarios' own spread moderated by the run's, as scenarios under load spread "
    "unlike each other; z for 5 % false alarms over all of a group's votes, Student t's for "
    "the moderated spread), beyond 5 %, and every round's own ratio lies on the "
    "same side of 1; p50, p99 and p99.9 of every tool count, leave-one-out and add-one-in "
    "alike (max is shown, not counted); a verdict needs two such votes. hurts: two p99 or "
    "p99.9 votes higher leaving the group out (the tails and the profile come first), or "
    "only higher votes; helps: two votes lower, and not two tail votes higher leaving it "
    "out (a tail higher with the group alone is shown, not harm: the rest of the profile "
    "makes up for it); no measurable effect: otherwise."
)
VOTING = ("p50", "p99", "p99.9")
TAILS = ("p99", "p99.9")
SHOWN = (*VOTING, "max")
MIN_EFFECT = 0.05  # effects within 5 % never count, however steady the rounds
FALSE_ALARMS = 0.05  # per group, over all its votes
CORROBORATION = 2  # votes a verdict needs (see verdict)
COSTLY_BUSY_PCT = 0.5  # idle busy share a group adds that recommend calls a cost
DIRECTIONS = ("leave_one_out", "add_one_in")
CONTROL = "control"
UNTUNED = "untuned"
ENGINE_KEYS = ("on_drift",)  # every section's own: kept in every scenario, not a setting
# What a scenario visit costs besides the tools' own seconds, as measured on the 2-CPU
# guests: measure's settle time, a tool's start and end, a switch (when not measured).
SETTLE_S, TOOL_OVERHEAD_S, SWITCH_S = 0.5, 1.0, 0.3


class AttributionError(LatencydError):
    """Bad --group, or a profile with nothing to attribute."""


@dataclass(frozen=True, order=True)
class Setting:
    """One setting of a profile: `section.option`, or `section.table.key` for a key
    inside every entry of an array of tables that a plugin splits by key ([[net.nic]])."""

    section: str
    option: str
    key: str | None = None

    @property
    def id(self) -> str:
        return f"{self.section}.{self.option}" + (f".{self.key}" if self.key else "")


@dataclass(frozen=True)
class Group:
    name: str
    settings: tuple[Setting, ...]


# -- grouping --------------------------------------------------------------------------------


def split_tables(schema: Schema) -> set[str]:
    """Tables the schema's groups split by key (a pattern TABLE.KEY)."""
    return {p.split(".", 1)[0] for _, pats in schema.groups for p in pats if "." in p} & {
        t.name for t in schema.tables
    }


def settings_of(
    written: Mapping[str, Mapping[str, Any]], schemas: Mapping[str, Schema]
) -> list[Setting]:
    """Every setting of a profile, in the order its sections and options were written.
    A split table's keys that no group names (match, exclude: which NICs) are selectors,
    kept in every entry, not settings."""
    out: list[Setting] = []
    for section, options in written.items():
        schema = schemas[section]
        if schema.watches_only:
            continue
        split = split_tables(schema)
        for option, value in options.items():
            if option in ENGINE_KEYS:
                continue
            if option not in split:
                out.append(Setting(section, option))
                continue
            entries = value if isinstance(value, list) else [value]
            keys = dict.fromkeys(
                k for e in entries for k in e if _group_named(schema, f"{option}.{k}") is not None
            )
            out += [Setting(section, option, k) for k in keys]
    return out


def _group_named(schema: Schema, local: str) -> str | None:
    """The schema's group whose patterns name `local` (OPTION or TABLE.KEY), if any."""
    for name, patterns in schema.groups:
        if any(fnmatch.fnmatchcase(local, p) for p in patterns):
            return name
    return None


def _declared_group(schema: Schema, setting: Setting) -> str:
    name = _group_named(schema, setting.option + (f".{setting.key}" if setting.key else ""))
    return setting.section if name is None else f"{setting.section}.{name}"


def parse_group_spec(spec: str) -> tuple[str, list[str]]:
    """`NAME=SECTION[.OPTION],...` -> (NAME, items)."""
    name, sep, items = spec.partition("=")
    name = name.strip()
    parts = [i.strip() for i in items.split(",") if i.strip()]
    if not sep or not parts:
        raise AttributionError(f"--group {spec!r}: expected NAME=SECTION[.OPTION],...")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+@-]*", name):
        raise AttributionError(f"--group {spec!r}: {name!r} is not a usable group name")
    if name in (CONTROL, UNTUNED):
        raise AttributionError(f"--group {spec!r}: {name!r} is reserved")
    return name, parts


def groups_of(
    written: Mapping[str, Mapping[str, Any]],
    schemas: Mapping[str, Schema],
    specs: Sequence[str] = (),
) -> list[Group]:
    """The profile's settings in groups: the user's (`--group`) first, then what the
    plugins declare, then one group per section for the rest; empty groups are none."""
    settings = settings_of(written, schemas)
    if not settings:
        raise AttributionError("the profile sets nothing: there is nothing to attribute")
    chosen: dict[Setting, str] = {}
    order: list[str] = []
    for spec in specs:
        name, items = parse_group_spec(spec)
        if name in order:
            raise AttributionError(f"--group {name} is given twice")
        order.append(name)
        for item in items:
            hits = [s for s in settings if s.id == item or s.id.startswith(item + ".")]
            if not hits:
                known = ", ".join(s.id for s in settings)
                raise AttributionError(
                    f"--group {name}: {item!r} names no setting of the profile (its settings: "
                    f"{known})"
                )
            for s in hits:
                if chosen.get(s, name) != name:
                    raise AttributionError(
                        f"--group {name}: {s.id} is already in group {chosen[s]}"
                    )
                chosen[s] = name
    for s in settings:
        if s not in chosen:
            name = _declared_group(schemas[s.section], s)
            chosen[s] = name
            if name not in order:
                order.append(name)
    return [
        Group(name, tuple(s for s in settings if chosen[s] == name))
        for name in order
        if any(chosen[s] == name for s in settings)
    ]


# -- scenarios -------------------------------------------------------------------------------


def scenario_sections(
    written: Mapping[str, Mapping[str, Any]], every: Sequence[Setting], keep: Iterable[Setting]
) -> dict[str, dict[str, Any]]:
    """P's sections (`every` its settings) with only the settings in `keep` (engine keys
    stay with them)."""
    kept = set(keep)
    out: dict[str, dict[str, Any]] = {}
    for section, options in written.items():
        mine = {s for s in kept if s.section == section}
        if not mine:
            continue
        values: dict[str, Any] = {}
        for option, value in options.items():
            keys = {s.key for s in mine if s.option == option}
            if option in ENGINE_KEYS or None in keys:
                values[option] = value
            elif keys:  # a split table: each entry with its selectors and the kept keys
                split = {s.key for s in every if (s.section, s.option) == (section, option)}
                entries = value if isinstance(value, list) else [value]
                trimmed = [
                    {k: v for k, v in e.items() if k in keys or k not in split}
                    for e in entries
                    if any(k in keys for k in e)
                ]
                if trimmed:
                    values[option] = trimmed
        out[section] = values
    return out


def profile_text(summary: str, sections: Mapping[str, Mapping[str, Any]]) -> str:
    lines = ["[main]", toml_line("summary", summary)]
    for section, values in sections.items():
        lines += ["", *toml_section(section, dict(values))]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Scenario:
    name: str
    groups: frozenset[str]
    kind: str  # "profile", "leave_one_out", "add_one_in" or "untuned"


def scenarios(profile: str, groups: Sequence[Group], control: bool = False) -> list[Scenario]:
    """P, P without each group (and with the control group), untuned plus each group (and
    the control group), untuned."""
    names = [g.name for g in groups if g.name != CONTROL]
    full = frozenset(names)
    out = [Scenario(profile, full, "profile")]
    if control:
        out.append(Scenario(f"{profile}+{CONTROL}", full | {CONTROL}, "leave_one_out"))
    out += [Scenario(f"{profile}-without-{n}", full - {n}, "leave_one_out") for n in names]
    out += [Scenario(f"{UNTUNED}+{n}", frozenset({n}), "add_one_in") for n in names]
    if control:
        out.append(Scenario(f"{UNTUNED}+{CONTROL}", frozenset({CONTROL}), "add_one_in"))
    out.append(Scenario(UNTUNED, frozenset(), UNTUNED))
    return out


def route(a: frozenset[str], b: frozenset[str], order: Sequence[str]) -> list[frozenset[str]]:
    """From group set `a` to `b` one group at a time: what b adds first, then what it
    drops (in `order`); the steps after `a`, ending with `b`."""
    steps, here = [], set(a)
    for name in order:
        if name in b and name not in here:
            here.add(name)
            steps.append(frozenset(here))
    for name in order:
        if name in here and name not in b:
            here.discard(name)
            steps.append(frozenset(here))
    return steps


def comparisons(
    profile: str, groups: Sequence[Group], control: bool
) -> dict[str, dict[str, tuple[str, str]]]:
    """Per group and direction: (scenario with the group, scenario without it)."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for g in groups:
        if g.name == CONTROL:
            continue
        out[g.name] = {
            "leave_one_out": (profile, f"{profile}-without-{g.name}"),
            "add_one_in": (f"{UNTUNED}+{g.name}", UNTUNED),
        }
    if control:
        out[CONTROL] = {
            "leave_one_out": (f"{profile}+{CONTROL}", profile),
            "add_one_in": (f"{UNTUNED}+{CONTROL}", UNTUNED),
        }
    return out


@dataclass
class Attribution:
    """The plan of one attribution: P's settings in groups, the scenarios measured, and
    a profile for every set of groups the daemon is walked through."""

    profile: str
    written: dict[str, dict[str, Any]]
    settings: list[Setting]
    groups: list[Group]  # P's groups, then the control group where asked for
    control: dict[str, dict[str, Any]] | None = None  # the control group's own settings

    @property
    def order(self) -> list[str]:
        return [g.name for g in self.groups]

    @cached_property  # looked up on every step of every walk between scenarios
    def scenarios(self) -> list[Scenario]:
        return scenarios(self.profile, [g for g in self.groups if g.name != CONTROL],
                         self.control is not None)  # fmt: skip

    @property
    def comparisons(self) -> dict[str, dict[str, tuple[str, str]]]:
        return comparisons(self.profile, self.groups, self.control is not None)

    def name_of(self, groups: frozenset[str]) -> str:
        for scenario in self.scenarios:
            if scenario.groups == groups:
                return scenario.name
        return "via-" + "-".join(str(i) for i, n in enumerate(self.order) if n in groups)

    def groups_named(self, name: str) -> frozenset[str]:
        """The inverse of name_of."""
        for scenario in self.scenarios:
            if scenario.name == name:
                return scenario.groups
        return frozenset(self.order[int(i)] for i in name.removeprefix("via-").split("-") if i)

    def round_order(self, r: int) -> list[str]:
        """Round r's scenarios: P first and untuned last (the other way round in odd
        rounds), between them the leave-one-out and then the add-one-in scenarios, each
        half shuffled anew every round (seeded by r: a run is repeatable). Measured here:
        in a fixed order, P always followed P plus the control hog and cyclictest p50 read
        30 µs for P against 16-26 µs for profiles differing from it in nothing that acted;
        a scenario must not always follow the same one."""
        rng = random.Random(r)
        halves = []
        for kind in ("leave_one_out", "add_one_in"):
            half = [s.name for s in self.scenarios if s.kind == kind]
            rng.shuffle(half)
            halves += half
        order = [self.profile, *halves, UNTUNED]
        return order if r % 2 == 0 else order[::-1]

    def sections(self, groups: frozenset[str]) -> dict[str, dict[str, Any]]:
        keep = [s for g in self.groups if g.name in groups for s in g.settings]
        out = scenario_sections(self.written, self.settings, keep)
        if CONTROL in groups and self.control:
            for section, values in self.control.items():
                mine = out.setdefault(section, {})
                for option, value in values.items():
                    before = mine.get(option)
                    # A control rule goes first: the first matching rule wins.
                    mine[option] = value + before if isinstance(before, list) else value
        return out

    def text(self, groups: frozenset[str]) -> str:
        name = self.name_of(groups)
        return profile_text(f"{self.profile} attribution: {name}", self.sections(groups))

    def route(self, a: str, b: str) -> list[str]:
        """Names of the profiles held on the way from scenario a to b (b last)."""
        steps = route(self.groups_named(a), self.groups_named(b), self.order)
        return [self.name_of(step) for step in steps]

    def transit_steps(self) -> int:
        """Switches in a round that only pass through (nothing measured)."""
        order = self.round_order(0)
        return sum(len(self.route(a, b)) - 1 for a, b in itertools.pairwise(order))


def seconds_for(
    budget_s: float,
    rounds: int,
    scenarios: int,
    tools: int,
    idle_s: float,
    transit: int,
    switch_s: float = SWITCH_S,
) -> float:
    """Seconds per tool and round that fit `budget_s`: what each scenario visit costs
    besides the tools (a switch, settling, starting them) and each switch passed through
    are taken off first (`switch_s` as measured on this machine: with 50,000 tasks a
    switch takes seconds); never below 1 s (a group is never dropped: a budget too small
    for them all is exceeded)."""
    visit = switch_s + SETTLE_S + idle_s + tools * TOOL_OVERHEAD_S
    per_round = budget_s / max(rounds, 1) - scenarios * visit - transit * switch_s
    return max(1.0, per_round / (scenarios * tools))


# -- effects and verdicts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    ratio: float  # pooled percentile, with the group over without it
    spread: float  # round-to-round spread of the percentile, pooled (a factor: e^sd)
    bar: float  # the factor the ratio must exceed (either way) to count
    counts: str | None  # "lower" / "higher" latency when the effect counts, else None


def noise(per_round: Mapping[str, Sequence[Mapping[str, float]]], pct: str) -> float:
    """The standard deviation of log(pct) between rounds of the same scenario, pooled over
    every scenario with two rounds or more (nan with none)."""
    squares, freedom = 0.0, 0
    for rounds in per_round.values():
        logs = [math.log(r[pct]) for r in rounds if _usable(r[pct])]
        if len(logs) >= 2:
            mean = sum(logs) / len(logs)
            squares += sum((x - mean) ** 2 for x in logs)
            freedom += len(logs) - 1
    return math.sqrt(squares / freedom) if freedom else math.nan


def margin(votes: int, alarms: float = FALSE_ALARMS) -> float:
    """z for a two-sided test at `alarms` shared by `votes` tests (Bonferroni)."""
    return NormalDist().inv_cdf(1 - alarms / (2 * max(1, votes)))


def effect(
    with_: float,
    without: float,
    rounds_with: Sequence[float],
    rounds_without: Sequence[float],
    sd: float,
    z: float,
    votes: bool = True,
    own: tuple[float, float] | None = None,
) -> Effect:
    """One comparison: `sd` is the run's pooled noise of this percentile, `z` its margin;
    `own` the comparison's own (moderated) noise and margin, where the run's scenarios
    spread unlike each other. The effect must clear either bar."""
    ratio = with_ / without if _usable(with_) and _usable(without) else math.nan
    # Rounds alternate the scenarios, so round k of each saw the same machine.
    logs = [math.log(w / wo) for w, wo in zip(rounds_with, rounds_without, strict=False)
            if _usable(w) and _usable(wo)]  # fmt: skip
    bars = [
        max(math.exp(margin_ * noise_ * math.sqrt(2 / len(logs))), 1 + MIN_EFFECT)
        for noise_, margin_ in [(sd, z), *([own] if own else [])]
        if logs and math.isfinite(noise_) and math.isfinite(margin_)
    ]
    bar = min(bars, default=math.nan)
    counts = None
    if votes and logs and math.isfinite(bar):
        mean = sum(logs) / len(logs)
        if mean > math.log(bar) and all(x > 0 for x in logs):
            counts = "higher"
        elif mean < -math.log(bar) and all(x < 0 for x in logs):
            counts = "lower"
    return Effect(ratio, math.exp(sd) if math.isfinite(sd) else math.nan, bar, counts)


def _usable(value: float) -> bool:
    return math.isfinite(value) and value > 0


def verdict(effects: Iterable[tuple[str, str, Effect]]) -> str:
    """From (direction, percentile, effect): the tails first, as latency work protects
    them, and the profile first: a tail worse with the group in the profile (leave-one-
    out) is harm; a tail worse with the group alone, where something else counts as
    lower, is the rest of the profile making up for it (task isolation empties a CPU, and
    without the profile's idle-wait setting an empty CPU wakes late), not harm. Each way
    needs CORROBORATION votes: latency tails are heavy and often bimodal (p99.9 of one
    scenario 65 µs in one round, 2.5 ms in the next), beyond the normal model behind the
    margin, and a lone vote decided four of eleven groups differently in two runs of the
    same attribution."""
    counted = [(d, pct, e.counts) for d, pct, e in effects if e.counts]
    harm = [1 for d, pct, c in counted if c == "higher" and pct in TAILS and d == DIRECTIONS[0]]
    higher = [1 for _, _, c in counted if c == "higher"]
    lower = [1 for _, _, c in counted if c == "lower"]
    if len(harm) >= CORROBORATION or (len(higher) >= CORROBORATION and not lower):
        return "hurts"
    if len(lower) >= CORROBORATION:
        return "helps"
    return "no measurable effect"


def not_applicable(status: Mapping[str, Any], group: Group) -> str | None:
    """Why a group cannot act here, from the daemon's status while it holds "untuned plus
    the group": none of its sections applied anything, and they say why not."""
    sections = {s.section for s in group.settings}
    plugins = status.get("plugins", {})
    reasons = []
    for section in sorted(sections):
        info = plugins.get(section, {})
        if info.get("applied") or not info.get("not_applicable"):
            return None
        reasons += [f"{r['text']}: {r['reason']}" for r in info["not_applicable"]]
    return "; ".join(dict.fromkeys(reasons)) if reasons else None


@dataclass
class GroupResult:
    name: str
    settings: list[str]
    verdict: str
    effects: dict[str, dict[str, dict[str, Effect]]] = field(default_factory=dict)
    idle_busy_pct: float | None = None  # added busy % of the measured CPUs, on its own
    reason: str | None = None  # why it is not applicable here

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "settings": self.settings,
            "verdict": self.verdict,
            "effects": {
                tool: {
                    pct: {d: _effect_json(e) for d, e in by_dir.items()}
                    for pct, by_dir in by_pct.items()
                }
                for tool, by_pct in self.effects.items()
            },
            "idle_busy_pct": self.idle_busy_pct,
            **({"reason": self.reason} if self.reason else {}),
        }


def _effect_json(e: Effect) -> dict[str, Any]:
    return {
        "ratio": None if math.isnan(e.ratio) else round(e.ratio, 4),
        "spread": None if math.isnan(e.spread) else round(e.spread, 4),
        "bar": None if math.isnan(e.bar) else round(e.bar, 4),
        "counts": e.counts,
    }


def own_noise(
    prior: spread.Prior | None,
    spreads: Mapping[str, spread.Spread] | None,
    with_: str,
    without: str,
    votes: int,
) -> tuple[float, float] | None:
    """A comparison's own noise (its two scenarios' spreads, moderated by the run's) and
    its margin: Student t at its degrees of freedom, Bonferroni over the group's votes."""
    if prior is None or spreads is None or with_ not in spreads or without not in spreads:
        return None
    sd, dof = spread.moderated(prior, spreads[with_], spreads[without])
    return sd, spread.t_quantile(1 - FALSE_ALARMS / (2 * votes), dof)


def judge(
    result: Mapping[str, Any],
    groups: Sequence[Group],
    compare: Mapping[str, Mapping[str, tuple[str, str]]],
    moderate: bool = True,
) -> list[GroupResult]:
    """Verdicts from a measure.run result (its per-round summaries and pooled stats);
    `moderate=False` judges by the run's pooled noise alone (the rule before 2026-11-27,
    kept to show what the moderated bar changed)."""
    out = []
    busy = result.get("idle_busy_pct", {})
    by_name = {g.name: g for g in groups}
    sd = {
        (tool, pct): noise(data["per_round"], pct)
        for tool, data in result["tools"].items()
        for pct in SHOWN
    }
    votes = len(result["tools"]) * len(VOTING) * len(DIRECTIONS)
    z = margin(votes)
    spreads = {
        (tool, pct): {
            s: spread.Spread.of([r[pct] for r in rs]) for s, rs in data["per_round"].items()
        }
        for tool, data in result["tools"].items()
        for pct in VOTING
    }
    priors = {
        key: spread.fit_prior(list(by_s.values())) if moderate else None
        for key, by_s in spreads.items()
    }
    for name, directions in compare.items():
        effects: dict[str, dict[str, dict[str, Effect]]] = {}
        for tool, data in result["tools"].items():
            stats, rounds = data["stats"], data["per_round"]
            per_pct: dict[str, dict[str, Effect]] = {}
            for pct in SHOWN:
                per_dir = {}
                for direction, (w, wo) in directions.items():
                    if w not in stats or wo not in stats:
                        continue
                    per_dir[direction] = effect(
                        stats[w][pct],
                        stats[wo][pct],
                        [r[pct] for r in rounds[w]],
                        [r[pct] for r in rounds[wo]],
                        sd[tool, pct],
                        z,
                        votes=pct in VOTING,
                        own=own_noise(
                            priors.get((tool, pct)), spreads.get((tool, pct)), w, wo, votes
                        ),
                    )
                per_pct[pct] = per_dir
            effects[tool] = per_pct
        w, wo = directions["add_one_in"]
        cost = round(busy[w] - busy[wo], 2) if w in busy and wo in busy else None
        group = by_name.get(name)
        out.append(
            GroupResult(
                name,
                [s.id for s in group.settings] if group else [],
                verdict(
                    (direction, pct, e)
                    for by_pct in effects.values()
                    for pct, by_dir in by_pct.items()
                    for direction, e in by_dir.items()
                ),
                effects,
                cost,
            )
        )
    return out


def fmt_effect(e: Effect | None) -> str:
    if e is None or math.isnan(e.ratio):
        return "-"
    mark = {"lower": "-", "higher": "+", None: " "}[e.counts]
    return f"{e.ratio:.2f}{mark}"


def render(results: Sequence[GroupResult], tools: Sequence[str], machine: str) -> list[str]:
    """A table per tool: each group's ratios (with / without it) leaving it out of the
    profile and adding it to untuned, '-' or '+' where the effect counts (lower or higher
    latency); then the verdicts."""
    width = max([len("group"), *(len(r.name) for r in results)])
    lines = [f"attribution on {machine}"]
    measured = [r for r in results if not r.reason]
    for tool in tools:
        lines += ["", f"{tool}: latency with the group / without it",
                  "  " + " " * width + "  leave-one-out (profile vs profile without)"
                  + " " * 4 + "add-one-in (untuned + group vs untuned)",
                  "  " + "group".ljust(width) + "  "
                  + ("".join(p.rjust(9) for p in SHOWN) + " " * 10) * 2]  # fmt: skip
        for r in measured:
            cells = [
                fmt_effect(r.effects.get(tool, {}).get(p, {}).get(d)).rjust(9)
                for d in DIRECTIONS
                for p in SHOWN
            ]
            lines.append("  " + r.name.ljust(width) + "  " + "".join(cells[:4]) + " " * 10
                         + "".join(cells[4:]))  # fmt: skip
    lines += ["", "  " + "group".ljust(width) + "  " + "verdict".ljust(22) + "idle busy  settings"]
    for r in results:
        if r.reason:
            lines.append("  " + r.name.ljust(width) + f"  not applicable here: {r.reason}")
            continue
        busy = "-" if r.idle_busy_pct is None else f"{r.idle_busy_pct:+.1f} %"
        lines.append(
            "  " + r.name.ljust(width) + "  " + r.verdict.ljust(22) + busy.rjust(9) + "  "
            + ", ".join(r.settings)
        )  # fmt: skip
    lines += ["", "'-' / '+': the effect counts, as lower / higher latency. " + RULE]
    return lines


COLOURS = {"lower": "tab:green", "higher": "tab:red", None: "tab:gray"}


def plot(results: Sequence[GroupResult], tools: Sequence[str], machine: str, path: str) -> None:
    """One bar per group: its p99 ratio (log scale) per tool and direction, the margin it
    must clear as the error bar, green / red where it counts as lower / higher."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(tools), 2, figsize=(14, 3.5 * len(tools)), squeeze=False)
    names = [r.name for r in results]
    for row, tool in enumerate(tools):
        for col, direction in enumerate(DIRECTIONS):
            ax = axes[row][col]
            effects = [r.effects.get(tool, {}).get("p99", {}).get(direction) for r in results]
            ratios = [e.ratio if e and math.isfinite(e.ratio) else 1.0 for e in effects]
            spread = [e.bar if e and math.isfinite(e.bar) else 1.0 for e in effects]
            # The margin is a factor: ratio / bar .. ratio * bar on the log axis.
            yerr = [[r - r / f for r, f in zip(ratios, spread, strict=True)],
                    [r * f - r for r, f in zip(ratios, spread, strict=True)]]  # fmt: skip
            colours = [COLOURS[e.counts if e else None] for e in effects]
            ax.bar(names, [r - 1 for r in ratios], bottom=1, color=colours)
            ax.errorbar(names, ratios, yerr=yerr, fmt="none", ecolor="black", capsize=3)
            ax.axhline(1, color="black", linewidth=0.8)
            ax.set_yscale("log")
            ax.set_title(f"{tool} p99, {direction.replace('_', '-')}")
            ax.set_ylabel("with / without")
            ax.tick_params(axis="x", labelrotation=60, labelsize=8)
    fig.suptitle(f"what each group buys, {machine}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- a profile from the evidence (recommend --measure) ------------------------------------------


def quote(result: GroupResult) -> str:
    """The effects that counted, as "sockperf p50 0.12x, p99 0.31x (leave-one-out)"."""
    parts = []
    for direction in DIRECTIONS:
        counted = [
            f"{tool} {pct} {e.ratio:.2f}x"
            for tool, by_pct in result.effects.items()
            for pct, by_dir in by_pct.items()
            if (e := by_dir.get(direction)) is not None and e.counts
        ]
        if counted:
            parts.append(f"{', '.join(counted)} ({direction.replace('_', '-')})")
    return "; ".join(parts) or "no effect counted"


def keep(results: Sequence[GroupResult]) -> tuple[list[GroupResult], list[tuple[GroupResult, str]]]:
    """The groups a profile built on evidence keeps (those that help), and those it drops
    with why (hurts, mixed, no measurable effect and what it costs, not applicable)."""
    kept, dropped = [], []
    for r in results:
        if r.name == CONTROL:
            continue
        if r.verdict == "helps":
            kept.append(r)
            continue
        if r.verdict == "no measurable effect":
            cost = r.idle_busy_pct
            why = (
                f"no measurable effect, and it keeps the measured CPUs {cost:+.1f} % busier "
                "with no traffic"
                if cost is not None and cost >= COSTLY_BUSY_PCT
                else "no measurable effect (what it costs is not worth reviewing for nothing)"
            )
        elif r.verdict == "not applicable":
            why = f"not applicable here: {r.reason}"
        else:
            why = f"{r.verdict}: {quote(r)}"
        dropped.append((r, why))
    return kept, dropped


def render_kept(results: Sequence[GroupResult], tools: Sequence[str], machine: str) -> list[str]:
    """`recommend --measure`'s verdict: the tables (render), then each group kept or
    dropped and why, and that the proposal is not confirmed where nothing is kept."""
    kept, dropped = keep(results)
    lines = [
        *render(results, tools, machine),
        "",
        *(f"kept {r.name}: {quote(r)}" for r in kept),
        *(f"dropped {r.name}: {why}" for r, why in dropped),
    ]
    if not kept:
        lines.append("NOT confirmed: no group of the proposal measurably helped here; "
                     "keep the default profile")  # fmt: skip
    return lines


def evidence_profile(at: Attribution, results: Sequence[GroupResult], machine: str) -> str:
    """`at`'s profile cut down to the groups that help, each section headed by a comment
    quoting what its groups measured, and what was dropped and why."""
    kept, dropped = keep(results)
    names = frozenset(r.name for r in kept)
    sections = at.sections(names)
    by_section: dict[str, list[GroupResult]] = {}
    groups = {g.name: g for g in at.groups}
    for r in kept:
        for section in dict.fromkeys(s.section for s in groups[r.name].settings):
            by_section.setdefault(section, []).append(r)
    # A comment is one line: a reason with a newline (what the kernel or a user said)
    # must not write settings into the profile.
    lines = [
        f"# Built by `latencyctl recommend --measure` from attribution on {printable(machine)}:",
        "# only the groups of settings that measurably helped here are kept.",
        *(printable(f"# dropped {r.name} ({', '.join(r.settings)}): {why}") for r, why in dropped),
        "[main]",
        toml_line("summary", f"{at.profile}, cut to what helped on {machine}"),
    ]
    for section, values in sections.items():
        lines.append("")
        lines += [printable(f"# {r.name} helps: {quote(r)}") for r in by_section.get(section, [])]
        lines += toml_section(section, dict(values))
    return "\n".join(lines) + "\n"
