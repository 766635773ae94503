"""measure --attribute's logic: grouping a profile's settings, the scenario plan (each
switch changes one group), the profiles it holds, and the verdict rule."""

from __future__ import annotations

import itertools
import json
import math
import tomllib
from pathlib import Path
from typing import Any

import pytest

from latencyd.core.engine import section_schemas
from latencyd.core.plugin import load_plugins
from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import Schema
from latencyd.cpuset import CpuSet
from latencyd.kernel.system import Machine, System
from latencyd.paths import shipped_profiles_dir
from latencyd.tools import attribute as A
from latencyd.tools.measure.plan import refit_seconds
from tests.unit.fakesys import make_fake_root

MACHINE = Machine(CpuSet.from_list("0-3"), 8 << 30)


@pytest.fixture
def schemas(tmp_path: Path) -> dict[str, Schema]:
    return section_schemas(load_plugins(System(make_fake_root(tmp_path))))


def load(schemas: dict[str, Schema], name: str, extra: Path | None = None) -> Any:
    dirs = ([extra] if extra else []) + [shipped_profiles_dir()]
    return ProfileLibrary(dirs, schemas, MACHINE).load(name)


def attribution(schemas: dict[str, Schema], name: str, control: bool = False) -> A.Attribution:
    p = load(schemas, name)
    groups = A.groups_of(p.written, schemas)
    hog = {"shield": {"rule": [{"match": "^hog$", "cpus": "3"}]}}
    if control:
        groups.append(A.Group(A.CONTROL, ()))
    return A.Attribution(p.name, p.written, A.settings_of(p.written, schemas), groups,
                         hog if control else None)  # fmt: skip


def test_cpu_partitioning_splits_sections_whose_parts_act_alone(schemas: dict[str, Schema]) -> None:
    p = load(schemas, "cpu-partitioning")
    groups = {g.name: [s.id for s in g.settings] for g in A.groups_of(p.written, schemas)}
    assert groups == {
        "cstate.idle": ["cstate.idle"],
        "writeback": ["writeback.dirty_bytes", "writeback.dirty_background_bytes",
                      "writeback.dirty_expire_centisecs", "writeback.dirty_writeback_centisecs"],
        "sysctl": ["sysctl.vm.swappiness", "sysctl.vm.stat_interval",
                   "sysctl.kernel.timer_migration", "sysctl.net.ipv4.tcp_fastopen"],
        "sysctl.busy_poll": ["sysctl.net.core.busy_read", "sysctl.net.core.busy_poll"],
        "net.coalesce": ["net.nic.coalesce"],
        "net.steering": ["net.nic.rps_cpus", "net.nic.napi_defer_hard_irqs",
                         "net.nic.gro_flush_timeout", "net.nic.xps_cpus"],
        "irq.isolate": ["irq.isolate"],
        "kthread.workqueues": ["kthread.writeback_cpumask", "kthread.unbound_cpumask"],
        "kthread.rules": ["kthread.rule"],
        "shield.tasks": ["shield.cpus", "shield.allow"],
    }  # fmt: skip


def test_user_groups_come_first_and_bad_ones_say_what_is_wrong(schemas: dict[str, Schema]) -> None:
    p = load(schemas, "cpu-partitioning")
    specs = ["shield=irq,shield.cpus", "vm=sysctl.vm.swappiness"]
    groups = A.groups_of(p.written, schemas, specs)
    assert [s.id for s in groups[0].settings] == ["irq.isolate", "shield.cpus"]
    assert [s.id for s in groups[1].settings] == ["sysctl.vm.swappiness"]
    rest = {g.name: [s.id for s in g.settings] for g in groups[2:]}
    assert rest["shield.tasks"] == ["shield.allow"]
    assert "irq.isolate" not in rest and "sysctl.vm.swappiness" not in rest["sysctl"]
    for spec, message in [
        ("shield", r"expected NAME=SECTION\[\.OPTION\]"),
        ("x=irq.nope", "'irq.nope' names no setting of the profile"),
        ("untuned=irq", "is reserved"),
        ("a b=irq", "not a usable group name"),
    ]:
        with pytest.raises(A.AttributionError, match=message):
            A.groups_of(p.written, schemas, [spec])
    with pytest.raises(A.AttributionError, match="already in group a"):
        A.groups_of(p.written, schemas, ["a=irq", "b=irq.isolate"])


def test_every_switch_of_a_run_changes_one_group(schemas: dict[str, Schema]) -> None:
    at = attribution(schemas, "cpu-partitioning", control=True)
    sets = {s.name: s.groups for s in at.scenarios}
    names = [s.name for s in at.scenarios]
    assert len(names) == len(set(names)) == 2 * (len(at.groups) - 1) + 4
    orders = [at.round_order(r) for r in range(4)]
    assert orders[0] == at.round_order(0)  # seeded: a run is repeatable
    for r, order in enumerate(orders):
        assert sorted(order) == sorted(names)
        ends = ("cpu-partitioning", "untuned") if r % 2 == 0 else ("untuned", "cpu-partitioning")
        assert (order[0], order[-1]) == ends
        kinds = [next(s.kind for s in at.scenarios if s.name == n) for n in order[1:-1]]
        assert kinds == sorted(kinds, reverse=r % 2 == 0)  # leave-one-out, then add-one-in
        for a, b in itertools.pairwise(order):
            steps = [sets[a], *(at.groups_named(n) for n in at.route(a, b))]
            assert at.route(a, b)[-1] == b
            for x, y in itertools.pairwise(steps):
                assert len(x ^ y) == 1, (a, b, x, y)
        for name in {n for a, b in itertools.pairwise(order) for n in at.route(a, b)}:
            assert at.name_of(at.groups_named(name)) == name
    # No scenario follows the same one in every round.
    follows = [dict(itertools.pairwise(o if r % 2 == 0 else o[::-1])) for r, o in enumerate(orders)]
    assert any(len({f.get(n) for f in follows}) > 1 for n in names[1:-1])
    # Each group's two comparisons differ by that group alone.
    for name, directions in at.comparisons.items():
        for with_, without in directions.values():
            assert sets[with_] ^ sets[without] == {name}


def test_scenario_profiles_hold_exactly_their_groups_settings(schemas: dict[str, Schema],
                                                             tmp_path: Path) -> None:  # fmt: skip
    at = attribution(schemas, "cpu-partitioning", control=True)
    files = {s.name: at.text(s.groups) for s in at.scenarios}
    for name, text in files.items():
        (tmp_path / f"{name}.toml").write_text(text)
    full = load(schemas, "cpu-partitioning")
    # P written back out is P: the same validated sections, but for [monitor], which sets
    # nothing and whose tracing must not run while measuring (Schema.watches_only).
    tuning = {k: v for k, v in full.sections.items() if not schemas[k].watches_only}
    assert "monitor" in full.sections and "monitor" not in tuning
    assert load(schemas, "cpu-partitioning", tmp_path).sections == tuning
    without = load(schemas, "cpu-partitioning-without-net.steering", tmp_path).sections
    assert without["net"]["nic"][0].keys() >= {"coalesce", "match", "exclude"}
    assert not {"rps_cpus", "xps_cpus"} & without["net"]["nic"][0].keys()
    assert {k: v for k, v in without.items() if k != "net"} == {
        k: v for k, v in tuning.items() if k != "net"
    }
    alone = load(schemas, "untuned+shield.tasks", tmp_path).sections
    assert set(alone) == {"shield"} and set(alone["shield"]) - {"on_drift", "mechanism"} == {
        "cpus",
        "allow",
    }
    # The control rule goes first, so it wins over P's own rules.
    ctl = tomllib.loads(files["cpu-partitioning+control"])
    assert ctl["shield"]["rule"][0]["match"] == "^hog$"
    assert set(tomllib.loads(files["untuned"])) == {"main"}


def test_the_noise_is_the_spread_between_rounds_pooled_over_scenarios() -> None:
    per_round = {
        "a": [{"p99": 10.0}, {"p99": 10.0 * math.e}],  # log values 0 and 1 apart
        "b": [{"p99": 5.0}, {"p99": 5.0}, {"p99": 5.0}],  # steady: adds freedom, no spread
        "c": [{"p99": 7.0}],  # one round: no spread to learn from
        "d": [{"p99": math.nan}, {"p99": 3.0}],
    }
    # squares: a 0.5, b 0; degrees of freedom: a 1 + b 2 = 3
    assert A.noise(per_round, "p99") == pytest.approx(math.sqrt(0.5 / 3))
    assert math.isnan(A.noise({"c": per_round["c"]}, "p99"))
    # Bonferroni: one vote at 5 % is 1.96; twelve votes share the 5 %.
    assert A.margin(1) == pytest.approx(1.96, abs=0.01)
    assert A.margin(12) == pytest.approx(2.87, abs=0.01)


def test_the_verdict_counts_only_effects_beyond_the_runs_noise() -> None:
    z = A.margin(12)
    # A halving, where rounds of a scenario differ by ~3 %: counts as lower latency.
    e = A.effect(5.0, 10.0, [5.0, 5.1, 4.9], [10.0, 10.2, 9.9], sd=0.03, z=z)
    assert e.counts == "lower" and e.bar == pytest.approx(1.07, abs=0.01)
    # 30 % higher in every round, but rounds of the same scenario spread ~40 %: no count.
    e = A.effect(13.0, 10.0, [13.0] * 3, [10.0] * 3, sd=0.35, z=z)
    assert e.counts is None and e.spread == pytest.approx(math.exp(0.35)) and e.bar > 1.3
    # ... and the same 30 % on a quiet machine counts.
    assert A.effect(13.0, 10.0, [13.0] * 3, [10.0] * 3, sd=0.03, z=z).counts == "higher"
    # Within MIN_EFFECT, however steady: does not count.
    assert A.effect(10.4, 10.0, [10.4] * 3, [10.0] * 3, sd=0.0, z=z).counts is None
    # max never votes; a missing value or no measured noise is no effect.
    assert A.effect(1.0, 10.0, [1.0] * 3, [10.0] * 3, sd=0.01, z=z, votes=False).counts is None
    assert math.isnan(A.effect(5.0, math.nan, [5.0], [math.nan], sd=0.01, z=z).ratio)
    assert A.effect(1.0, 10.0, [1.0], [10.0], sd=math.nan, z=z).counts is None
    # Every round must agree: a mean effect that one round contradicts does not count.
    e = A.effect(3.0, 10.0, [1.0, 1.0, 10.4], [10.0, 10.1, 10.2], sd=0.01, z=z)
    assert e.counts is None
    lower, higher, none = (A.Effect(0.5, 1.1, 1.2, "lower"), A.Effect(2, 1.1, 1.2, "higher"),
                           A.Effect(1, 1, 1.2, None))  # fmt: skip
    loo, aoi = "leave_one_out", "add_one_in"
    assert A.verdict([(loo, "p50", lower), (aoi, "p99", lower), (aoi, "p99", none)]) == "helps"
    assert A.verdict([(aoi, "p99", higher), (loo, "p50", higher)]) == "hurts"
    # The tails come first: a faster median does not excuse worse tails in the profile ...
    tails_up = [(loo, "p99", higher), (loo, "p99.9", higher)]
    assert A.verdict([(aoi, "p50", lower), (loo, "p50", lower), *tails_up]) == "hurts"
    # ... but better tails are worth a slower median,
    assert A.verdict([(loo, "p50", higher), (loo, "p99", lower), (aoi, "p99", lower)]) == "helps"
    # and tails worse only with the group alone are the rest of the profile's to make up.
    alone_up = [(aoi, "p99", higher), (aoi, "p99.9", higher)]
    assert A.verdict([(loo, "p99", lower), (loo, "p50", lower), *alone_up]) == "helps"
    # A lone vote, either way, decides nothing: heavy tails fool the normal margin.
    assert A.verdict([(loo, "p99.9", higher)]) == "no measurable effect"
    assert A.verdict([(loo, "p50", lower)]) == "no measurable effect"
    assert A.verdict([(loo, "p50", none), (aoi, "p99", none)]) == "no measurable effect"


def _result(values: dict[str, list[float]]) -> dict[str, Any]:
    """A measure result whose every percentile is `values[scenario][round]`."""
    pooled = {s: sorted(v)[len(v) // 2] for s, v in values.items()}
    return {
        "tools": {
            "sockperf": {
                "stats": {s: {p: pooled[s] for p in A.SHOWN} for s in values},
                "per_round": {s: [{p: x for p in A.SHOWN} for x in v] for s, v in values.items()},
            }
        },
        "idle_busy_pct": {s: 1.0 for s in values} | {"untuned+g": 31.0},
    }


def test_judge_reads_both_directions() -> None:
    groups = [A.Group("g", (A.Setting("cstate", "idle"),)), A.Group("h", ())]
    compare = A.comparisons("p", groups, control=False)
    result = _result({
        "p": [5, 5.2, 5.1], "p-without-g": [40, 41, 39], "untuned+g": [5, 5.1, 5.2],
        "untuned": [40, 40, 41], "p-without-h": [5, 5.3, 5.1], "untuned+h": [40, 42, 41],
    })  # fmt: skip
    g, h = A.judge(result, groups, compare)
    assert (g.verdict, g.settings, g.idle_busy_pct) == ("helps", ["cstate.idle"], 30.0)
    assert g.effects["sockperf"]["p99"]["leave_one_out"].ratio == pytest.approx(5.1 / 40)
    assert h.verdict == "no measurable effect"
    assert set(g.as_json()) == {"name", "settings", "verdict", "effects", "idle_busy_pct"}


def test_a_group_the_daemon_cannot_apply_is_not_applicable() -> None:
    group = A.Group("cstate.idle", (A.Setting("cstate", "idle"),))
    na = {"text": "idle = responsive", "reason": "no cpuidle driver: idle CPUs halt"}
    status = {"plugins": {"cstate": {"applied": [], "not_applicable": [na]}}}
    assert A.not_applicable(status, group) == "idle = responsive: no cpuidle driver: idle CPUs halt"
    status["plugins"]["cstate"]["applied"] = [{"text": "PM QoS"}]
    assert A.not_applicable(status, group) is None


def test_seconds_fit_the_budget_and_never_drop_below_one() -> None:
    s = A.seconds_for(900, 3, 24, 2, 1.0, 29)
    visit = A.SWITCH_S + A.SETTLE_S + 1.0 + 2 * A.TOOL_OVERHEAD_S
    assert 3 * (24 * visit + 29 * A.SWITCH_S + s * 24 * 2) == pytest.approx(900)
    # A server's slow switches (seconds, beside 50,000 tasks) shorten the rounds.
    assert A.seconds_for(900, 3, 24, 2, 1.0, 29, switch_s=2.0) < s - 1
    assert A.seconds_for(10, 3, 24, 2, 1.0, 29) == 1.0


def test_later_rounds_are_refitted_to_what_the_first_cost() -> None:
    """The estimate missed (a round cost 50 s besides its 200 s of tools, 300 s in all): the
    three rounds left share what is left of the budget, their own 100 s besides each."""
    s = refit_seconds(900, 300, 1, 4, 200, 20)
    assert 3 * (100 + 20 * s) == pytest.approx(900 - 300)
    assert s < 200 / 20  # shorter than the first round's 10 s
    # A cheaper machine than estimated gets longer rounds; no budget left, 1 s each.
    assert refit_seconds(900, 210, 1, 4, 200, 20) > 10
    assert refit_seconds(900, 890, 3, 4, 600, 20) == 1.0


RECORDED = sorted((Path(__file__).parent.parent / "data" / "attribution").glob("*.json"))


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_verdicts_on_samples_recorded_on_real_machines(path: Path) -> None:
    """Runs of `latencyctl measure --attribute --save` (trimmed to what verdicts read; where
    and how each was recorded is in its "recorded" field), on both kinds of guest: the rule
    gives the verdicts recorded with the sample; the control group hurts on every kind, at
    idle and under load (an instrument that cannot see a known harm proves nothing); on a
    haltpoll guest at idle the idle-wait group helps (halt-polling is what moves a haltpoll
    guest's wake-ups); on a guest without a cpuidle driver it is not applicable or buys
    nothing (idle CPUs halt there whatever it says); under load task isolation helps."""
    data = json.loads(path.read_text())
    groups = [A.Group(g["name"], ()) for g in data["groups"] if g["verdict"] != "not applicable"]
    compare = A.comparisons(
        data["profile"], groups, control=any(g.name == A.CONTROL for g in groups)
    )
    judged = {r.name: r.verdict for r in A.judge(data["measure"], groups, compare)}
    recorded = {g["name"]: g["verdict"] for g in data["groups"]}
    kind = data["machine"].split(" (")[0]
    assert kind in ("haltpoll guest", "guest without a cpuidle driver"), kind
    if kind == "guest without a cpuidle driver":
        assert recorded.get("cstate.idle") in (None, "not applicable", "no measurable effect")
    assert judged == {name: v for name, v in recorded.items() if name in judged}
    assert judged[A.CONTROL] == "hurts"
    if kind == "haltpoll guest" and not data["measure"]["plan"]["load"]:
        assert judged["cstate.idle"] == "helps"
    if data["profile"] == "cpu-partitioning" and data["measure"]["plan"]["load"]:
        # Under CPU hogs: task isolation takes them off the measured CPU.
        assert judged["kthread.tasks"] == "helps"


def test_both_kinds_of_guest_have_recorded_samples() -> None:
    kinds = [json.loads(p.read_text())["machine"].split(" (")[0] for p in RECORDED]
    assert kinds.count("haltpoll guest") >= 2
    assert kinds.count("guest without a cpuidle driver") >= 2


def _bimodal_run(effect: float) -> dict[str, Any]:
    """Twenty scenarios of which half are bimodal (a round 10x slower now and then, as a
    scenario without the shield under load), the rest steady; "p" is `effect` times
    slower than "p-without-g" in every round, both steady."""
    rng = __import__("random").Random(3)
    values: dict[str, list[float]] = {}
    for i in range(20):
        slow = [10.0 if (i + r) % 3 == 0 else 1.0 for r in range(3)] if i % 2 else [1.0] * 3
        values[f"s{i}"] = [40.0 * x * math.exp(rng.gauss(0, 0.05)) for x in slow]
    values["p-without-g"] = [30.0, 29.0, 31.0]
    values["p"] = [v * effect for v in values["p-without-g"]]
    values["untuned+g"] = values["untuned"] = [40.0, 41.0, 39.0]
    return _result(values)


def test_a_steady_effect_counts_beside_bimodal_scenarios() -> None:
    """The finding of the guest without a cpuidle driver under load: the control group
    made cpu-partitioning's sockperf p99 3x slower in every round (30 -> 82-114 µs), but
    the scenarios without the shield were bimodal, their pooled spread e^0.79 set a bar of
    6.3x, and the known harm went unseen. The comparison's own moderated spread sees it;
    the pooled rule alone does not; no effect at all still counts as none."""
    groups = [A.Group("g", ())]
    compare = A.comparisons("p", groups, control=False)
    run = _bimodal_run(3.0)
    pooled = A.judge(run, groups, compare, moderate=False)[0]
    assert pooled.effects["sockperf"]["p99"]["leave_one_out"].counts is None
    assert pooled.verdict == "no measurable effect"
    current = A.judge(run, groups, compare)[0]
    assert current.effects["sockperf"]["p99"]["leave_one_out"].counts == "higher"
    assert current.verdict == "hurts"
    assert A.judge(_bimodal_run(1.0), groups, compare)[0].verdict == "no measurable effect"


def test_a_reason_with_a_newline_writes_no_setting_into_the_evidence_profile(
    schemas: dict[str, Schema],
) -> None:
    """Issue 37: what a dropped group's reason says (the kernel's words, a name a user
    chose) stays in its comment line, whatever characters it holds."""
    at = attribution(schemas, "latency-performance")
    results = [
        A.GroupResult(g.name, [s.id for s in g.settings], "not applicable",
                      reason='x\n[sysctl]\n"kernel.core_pattern" = "|/tmp/evil"')
        for g in at.groups
    ]  # fmt: skip
    text = A.evidence_profile(at, results, "guest\nx = 1")
    parsed = tomllib.loads(text)
    assert set(parsed) == {"main"}  # nothing kept, nothing injected
    assert all(line.startswith("#") or not line or line.startswith(("[", "summary"))
               for line in text.splitlines())  # fmt: skip
