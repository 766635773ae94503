"""Which profile a node gets: the cluster's rules, read from LatencyRecommend objects, and
the first whose selector matches the node's labels (as NTO's `recommend`). Pure: labels
and rules in, a choice out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class RuleError(ValueError):
    """A rule the agent cannot use, with where it is ("LatencyRecommend ns/name: rules[2]")."""


@dataclass(frozen=True)
class Requirement:
    """One of a selector's matchExpressions (Kubernetes label-selector semantics)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        # NotIn: as Kubernetes, a node without the label is not in the set
        return labels.get(self.key) not in self.values


@dataclass(frozen=True)
class Selector:
    """Every matchLabels pair and every requirement must hold; an empty selector matches
    every node (a fleet-wide default rule)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels) and all(
            r.matches(labels) for r in self.requirements
        )


@dataclass(frozen=True)
class Rule:
    profile: str
    selector: Selector
    source: str  # "LatencyRecommend ns/name: rules[i]", for the report


@dataclass(frozen=True)
class Choice:
    profile: str | None  # None: no rule matched (the node is left as it is)
    rule: str  # which rule chose it, or why none did


def parse_selector(data: object, where: str) -> Selector:
    """A metav1.LabelSelector as the API server returns it (already shaped by the CRD's
    schema; checked again here because the agent must not act on what it misreads)."""
    if data is None:
        return Selector()
    if not isinstance(data, Mapping):
        raise RuleError(f"{where}: nodeSelector must be a mapping")
    labels = data.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise RuleError(f"{where}: matchLabels must map label names to strings")
    requirements = []
    for i, expr in enumerate(data.get("matchExpressions") or ()):
        at = f"{where}: matchExpressions[{i}]"
        if not isinstance(expr, Mapping):
            raise RuleError(f"{at}: must be a mapping")
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if not isinstance(key, str) or not key:
            raise RuleError(f"{at}: key must be a label name")
        if op not in OPERATORS:
            raise RuleError(f"{at}: operator must be one of {', '.join(OPERATORS)}, not {op!r}")
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise RuleError(f"{at}: values must be a list of strings")
        if op in ("In", "NotIn") and not values:
            raise RuleError(f"{at}: {op} needs at least one value")
        if op in ("Exists", "DoesNotExist") and values:
            raise RuleError(f"{at}: {op} takes no values")
        requirements.append(Requirement(key, op, tuple(values)))
    return Selector(tuple(sorted(labels.items())), tuple(requirements))


def rules_of(recommends: Iterable[Mapping[str, object]]) -> list[Rule]:
    """Every rule of the LatencyRecommend objects, in the order they are tried: by
    spec.priority (lower first, as NTO), then by name, then as listed."""

    def order(obj: Mapping[str, object]) -> tuple[int, str]:
        spec = obj.get("spec")
        priority = spec.get("priority", 0) if isinstance(spec, Mapping) else 0
        return (priority if isinstance(priority, int) else 0, _name(obj))

    rules = []
    for obj in sorted(recommends, key=order):
        spec = obj.get("spec")
        listed = spec.get("rules", []) if isinstance(spec, Mapping) else []
        for i, item in enumerate(listed if isinstance(listed, list) else []):
            where = f"LatencyRecommend {_name(obj)}: rules[{i}]"
            if not isinstance(item, Mapping) or not isinstance(item.get("profile"), str):
                raise RuleError(f"{where}: profile must name a LatencyProfile")
            selector = parse_selector(item.get("nodeSelector"), where)
            rules.append(Rule(str(item["profile"]), selector, where))
    return rules


def choose(labels: Mapping[str, str], rules: Sequence[Rule]) -> Choice:
    for rule in rules:
        if rule.selector.matches(labels):
            return Choice(rule.profile, rule.source)
    return Choice(None, "no rule matches the node's labels")


def _name(obj: Mapping[str, object]) -> str:
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return "?"
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"
