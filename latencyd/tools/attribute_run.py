"""`measure --attribute` and `recommend --measure` run through the daemon: a profile's
settings in groups (the control group where asked for), the groups the daemon says cannot
act here named with its reason, the rest measured in scenarios written for the run, and
judged (latencyd.tools.attribute). latencyctl passes what reaches the daemon (hold,
release, status) and prints what comes back."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from latencyd.core.profile import ProfileLibrary
from latencyd.cpuset import CpuSet
from latencyd.kernel.system import System
from latencyd.tools import attribute
from latencyd.tools.measure import MeasureError
from latencyd.tools.measure.load import CONTROL_HOG
from latencyd.tools.measure.plan import Plan
from latencyd.tools.measure.runner import run as measure
from latencyd.tools.measure.scratch import scratch_dir
from latencyd.tools.recommend import machine_kind, read_facts
from latencyd.tools.terminal import ProgressBar


def attribution_plan(
    profiles: ProfileLibrary, profile_name: str, app: CpuSet, specs: list[str], control: bool
) -> attribute.Attribution:
    """P's settings in groups (--group first), the control group where asked for. A
    profile that cannot be loaded or grouped raises LatencydError."""
    schemas = profiles.schemas
    profile = profiles.load(profile_name)
    groups = attribute.groups_of(profile.written, schemas, specs)
    hog = None
    if control:  # the hog measure starts on housekeeping, moved onto the measured CPUs
        rule = {"match": f"^{CONTROL_HOG}$", "cpus": app.to_list()}
        hog = {"shield": {"rule": [rule]}}
        groups.append(attribute.Group(attribute.CONTROL, ()))
    settings = attribute.settings_of(profile.written, schemas)
    return attribute.Attribution(profile.name, profile.written, settings, groups, hog)


def run(
    system: System,
    at: attribute.Attribution,
    plan: Plan,
    seconds: float | None,
    budget_s: float,
    hold: Callable[[str], int],
    release: Callable[[int], None],
    status: Callable[[], dict[str, Any]],
    say: Callable[[str], None] | None,
) -> tuple[list[attribute.GroupResult], dict[str, Any], str]:
    """Each group of `at` left out of P and added to untuned, through the daemon: (the
    groups judged, the measure result, the machine they hold on). Groups the daemon says
    cannot act here are named with its reason, not measured. With `seconds` None the
    rounds are as long as fits `budget_s` (less the probing); `say` is told what the run
    will take. MeasureError when no group can act here, or the measuring fails."""
    begun = time.monotonic()
    machine = machine_kind(read_facts(system), os.uname().release)
    with tempfile.TemporaryDirectory(
        prefix=f"latencyd-attribute-{os.getpid()}-", dir=scratch_dir()
    ) as name:
        tmp = Path(name)
        tmp.chmod(0o755)  # the daemon reads them; root's, not writable by others
        skipped, switches = [], []
        for group in [g for g in at.groups if g.name != attribute.CONTROL]:
            alone = tmp / "alone.toml"
            alone.write_text(at.text(frozenset({group.name})))
            started = time.monotonic()
            cookie = hold(str(alone))
            switches.append(time.monotonic() - started)
            try:
                reason = attribute.not_applicable(status(), group)
            finally:
                release(cookie)
            if reason:
                skipped.append(attribute.GroupResult(group.name, [s.id for s in group.settings],
                                                     "not applicable", reason=reason))  # fmt: skip
        gone = {r.name for r in skipped}
        at = dataclasses.replace(at, groups=[g for g in at.groups if g.name not in gone])
        if len(at.groups) == (at.control is not None):
            raise MeasureError("no group of the profile can act here: "
                               + "; ".join(f"{r.name}: {r.reason}" for r in skipped))  # fmt: skip
        names = [s.name for s in at.scenarios]
        left_s = None  # with --seconds, none: the rounds are as long as asked
        if seconds is None:  # the budget less the probing above; measure refits each round
            left_s = budget_s - (time.monotonic() - begun)
            seconds = attribute.seconds_for(left_s, plan.rounds, len(names), len(plan.tools),
                                            plan.idle_seconds, at.transit_steps(),
                                            max(switches))  # fmt: skip
        holds: dict[str, str] = {}

        def held(names: list[str]) -> list[str]:
            """Each profile written before the daemon is asked to hold it."""
            for name in names:
                if name not in holds:
                    (tmp / f"{name}.toml").write_text(at.text(at.groups_named(name)))
                    holds[name] = str(tmp / f"{name}.toml")
            return names

        plan = dataclasses.replace(
            plan,
            scenarios=held(names),
            seconds=seconds,
            holds=holds,
            route=lambda a, b: held(at.route(a, b)),
            order=at.round_order,
            control_hog=at.control is not None,
            scratch=(*plan.scratch, tmp),
            budget_s=left_s,
        )
        if say is not None:
            say(
                f"attributing {at.profile} on {machine}: {len(at.groups)} groups measured, "
                f"{len(names)} scenarios, {plan.rounds} rounds x {len(plan.tools)} tools x "
                f"{seconds:.1f} s, about {plan.estimate_s / 60:.0f} min"
            )
        result = measure(system, plan, hold, release, ProgressBar())
    return attribute.judge(result, at.groups, at.comparisons) + skipped, result, machine
