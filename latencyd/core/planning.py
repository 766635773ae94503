"""A switch's plan: what applying a profile would do to each setting, computed by the
engine (Engine.plan_steps) from what it owns and what the kernel holds now, with nothing
written, journaled or held. `latencyctl plan P` and `switch --dry-run P` show it.

Its settings are the step's own diff (latencyd.core.engine.plan): a setting the step
would write ("change": now -> would be), one already as wanted ("unchanged"), or one this
machine cannot take ("not applicable", with the reason), each with the step it belongs
to: "apply" (the profile wants it), "restore" (owned, no longer wanted: its original
back) or "keep" (owned, as wanted). Beside each setting, its other owners
(latencyd.kernel.owners): what else sets it, and when, so a plan says what would undo it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, cast

from latencyd.core.capabilities import ReportsGrouped, declares
from latencyd.core.plugin import Plugin, Target, Value, encode_target, names_a_task
from latencyd.kernel.owners import Owner, OwnerIndex

CHANGE, UNCHANGED, NOT_APPLICABLE = "change", "unchanged", "not applicable"
ACTIONS = (CHANGE, NOT_APPLICABLE, UNCHANGED)  # in the order the table shows them


@dataclass(frozen=True)
class PlannedSetting:
    plugin: str
    target: Target
    action: str  # CHANGE, UNCHANGED or NOT_APPLICABLE
    step: str  # "apply", "restore" or "keep"
    now: Value  # what the kernel holds now (None where it cannot be read: not applicable)
    would_be: Value  # what the step would leave: the profile's value, or the original
    reason: str = ""  # not applicable: why


@dataclass
class SwitchPlan:
    """What a switch to `profile` from what is applied now (`current`) would do."""

    profile: str
    current: str | None
    settings: list[PlannedSetting] = field(default_factory=list)
    # Parts of sections this machine cannot take (Expansion.refused), by plugin: what, why.
    refused: dict[str, dict[str, str]] = field(default_factory=dict)
    # What only a boot brings, by plugin (ActsAtBoot.needs_boot): the kernel arguments.
    needs_boot: dict[str, list[str]] = field(default_factory=dict)
    # Sections whose plugin starts afresh (StartsAfresh): all they own given back
    # first, then applied again as planned.
    afresh: list[str] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return sum(1 for s in self.settings if s.action == CHANGE)

    def as_json(
        self,
        plugins: dict[str, Plugin[Any, Any, Any]],
        show_tasks: bool = True,
        owners: OwnerIndex | None = None,
    ) -> dict[str, Any]:
        """The plan for the D-Bus API; the settings of tasks (names_a_task) only with
        `show_tasks` (root and the admin group), else counted per plugin ("hidden"). With
        `owners`, each row's other owners are indices into the plan's "owners" table (one
        irqbalance named once, not once for each of 4,096 IRQs), as in status."""
        rows: list[dict[str, Any]] = []
        table: dict[Owner, int] = {}
        hidden: dict[str, int] = {}
        counts = dict.fromkeys(ACTIONS, 0)
        for s in self.settings:
            counts[s.action] += 1
            if not show_tasks and names_a_task(s.target):
                hidden[s.plugin] = hidden.get(s.plugin, 0) + 1
                continue
            plugin = plugins[s.plugin]
            rows.append(
                {
                    "plugin": s.plugin,
                    "target": encode_target(s.target),
                    "action": s.action,
                    "step": s.step,
                    "now": s.now,
                    "would_be": s.would_be,
                    "setting": _described(plugin, s.target, s.would_be),
                    "reason": s.reason,
                    "group": _group_key(plugin, s.target),
                    "owners": [
                        table.setdefault(o, len(table))
                        for o in (owners.of(s.target.claims()) if owners else ())
                    ],
                }
            )
        return {
            "profile": self.profile,
            "from": self.current or "",
            "would_change": counts[CHANGE],
            "unchanged": counts[UNCHANGED],
            "not_applicable": counts[NOT_APPLICABLE],
            "settings": rows,
            "sections_not_applicable": [
                {"plugin": p, "what": what, "reason": why}
                for p, refused in self.refused.items()
                for what, why in refused.items()
            ],
            "needs_boot": [
                {"plugin": p, "arguments": args} for p, args in self.needs_boot.items() if args
            ],
            "made_anew": self.afresh,
            "hidden": hidden,
            "owners": [o.as_json() for o in table],
        }


def _described(plugin: Plugin[Any, Any, Any], target: Target, value: Value) -> str:
    try:
        return plugin.describe(target, value)
    except Exception:  # a task that exited meanwhile, a value the plugin cannot word
        return f"{encode_target(target)} = {value!r}"


def _group_key(plugin: Plugin[Any, Any, Any], target: Target) -> str | None:
    """The plugin's status group of the target (the threads of one process), as text: the
    table shows the settings of one group alike in action and values as one row."""
    if not declares(plugin, ReportsGrouped):  # asked for each setting planned
        return None
    key: Hashable | None = cast(ReportsGrouped[Target], plugin).group(target)
    return None if key is None else repr(key)
