"""The node agent's choice of a profile: label selectors as Kubernetes reads them, rules
tried in order (priority, then name, then as listed), the first match winning."""

from __future__ import annotations

from typing import Any

import pytest

from latencyd.agent.selection import RuleError, choose, parse_selector, rules_of


def recommend(
    name: str, rules: list[dict[str, Any]], priority: int | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"rules": rules}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"namespace": "latencyd", "name": name}, "spec": spec}


def test_the_first_matching_rule_wins_and_an_empty_selector_matches_every_node() -> None:
    rules = rules_of([
        recommend("default", [
            {"profile": "vdu", "nodeSelector": {"matchLabels": {"role": "vdu"}}},
            {"profile": "trading", "nodeSelector": {"matchExpressions": [
                {"key": "desk", "operator": "In", "values": ["fx", "rates"]}]}},
            {"profile": "latency-performance", "nodeSelector": {}},
        ]),
    ])  # fmt: skip
    assert choose({"role": "vdu", "desk": "fx"}, rules).profile == "vdu"
    assert choose({"desk": "rates"}, rules).profile == "trading"
    chosen = choose({"desk": "equities"}, rules)
    assert (chosen.profile, chosen.rule) == (
        "latency-performance",
        "LatencyRecommend latencyd/default: rules[2]",
    )


def test_without_a_matching_rule_the_node_is_left_as_it_is() -> None:
    rules = rules_of(
        [recommend("r", [{"profile": "vdu", "nodeSelector": {"matchLabels": {"a": "b"}}}])]
    )
    chosen = choose({"a": "c"}, rules)
    assert chosen.profile is None and "no rule matches" in chosen.rule


@pytest.mark.parametrize(
    ("operator", "values", "labels", "matches"),
    [
        ("In", ["x"], {"k": "x"}, True),
        ("In", ["x"], {}, False),
        ("NotIn", ["x"], {"k": "y"}, True),
        ("NotIn", ["x"], {}, True),  # as Kubernetes: a missing label is not in the set
        ("NotIn", ["x"], {"k": "x"}, False),
        ("Exists", [], {"k": ""}, True),
        ("Exists", [], {}, False),
        ("DoesNotExist", [], {}, True),
        ("DoesNotExist", [], {"k": "v"}, False),
    ],
)
def test_match_expressions_read_as_kubernetes_reads_them(
    operator: str, values: list[str], labels: dict[str, str], matches: bool
) -> None:
    expr = {"key": "k", "operator": operator, "values": values}
    assert parse_selector({"matchExpressions": [expr]}, "here").matches(labels) is matches


def test_rules_are_tried_by_priority_then_name() -> None:
    every = {"nodeSelector": {}}
    rules = rules_of([
        recommend("b", [{"profile": "from-b", **every}]),
        recommend("a", [{"profile": "from-a", **every}]),
        recommend("z", [{"profile": "from-z", **every}], priority=-1),
    ])  # fmt: skip
    assert [r.profile for r in rules] == ["from-z", "from-a", "from-b"]


@pytest.mark.parametrize(
    ("selector", "error"),
    [
        ({"matchExpressions": [{"key": "k", "operator": "Near"}]}, "operator must be one of"),
        ({"matchExpressions": [{"key": "k", "operator": "In"}]}, "In needs at least one value"),
        ({"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]}, "takes no"),
        ({"matchLabels": {"k": 1}}, "matchLabels must map"),
    ],
)
def test_a_rule_the_agent_cannot_read_is_an_error_saying_where(
    selector: dict[str, Any], error: str
) -> None:
    with pytest.raises(RuleError, match=error) as caught:
        rules_of([recommend("r", [{"profile": "p"}, {"profile": "q", "nodeSelector": selector}])])
    assert str(caught.value).startswith("LatencyRecommend latencyd/r: rules[1]")


def test_the_same_profile_and_set_plan_nothing_and_a_relabel_plans_one_switch() -> None:
    from latencyd.agent.reconcile import Held, Step, plan, wanted

    profiles = [{"metadata": {"namespace": "latencyd", "name": "vdu"}, "spec": {"profile": ""}}]
    recs = [recommend("r", [
        {"profile": "vdu", "nodeSelector": {"matchLabels": {"role": "vdu"}}},
        {"profile": "latency-performance", "nodeSelector": {}},
    ])]  # fmt: skip
    vdu = wanted({"role": "vdu"}, profiles, recs)
    assert plan(vdu, Held("vdu", vdu.digest)) is Step.NOTHING
    assert plan(vdu, Held("vdu", None)) is Step.SWITCH  # installed by someone else
    relabelled = wanted({}, profiles, recs)
    assert relabelled.profile == "latency-performance"
    assert plan(relabelled, Held("vdu", vdu.digest)) is Step.SWITCH
    broken = wanted({}, profiles, [recommend("r", [{"nodeSelector": {}}])])
    assert plan(broken, Held("vdu", vdu.digest)) is Step.REFUSE
    assert broken.error and "profile must name" in broken.error
