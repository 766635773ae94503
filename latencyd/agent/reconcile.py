"""What the agent wants for its node, from what the cluster says: the profile its rules
choose by the node's labels, and the cluster's profile set that profile is read from.
Pure: the cluster's objects in, a `Wanted` out; what to do about it is `plan`'s."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from latencyd.agent.render import ProfileSet, RenderError, profile_set
from latencyd.agent.selection import RuleError, choose, rules_of


@dataclass(frozen=True)
class Wanted:
    profile: str | None  # None: no rule matches (or the rules cannot be read)
    why: str  # which rule chose it, or why none did
    profiles: ProfileSet | None  # the cluster's profiles, as files (None: not readable)
    error: str | None = None  # the cluster's rules or profiles cannot be used, and why

    @property
    def digest(self) -> str | None:
        return self.profiles.digest if self.profiles else None


def wanted(
    labels: Mapping[str, str],
    profiles: Iterable[Mapping[str, object]],
    recommends: Iterable[Mapping[str, object]],
) -> Wanted:
    try:
        rules = rules_of(recommends)
        rendered = profile_set(profiles)
    except (RuleError, RenderError) as exc:
        return Wanted(None, "the cluster's rules or profiles cannot be read", None, str(exc))
    choice = choose(labels, rules)
    return Wanted(choice.profile, choice.rule, rendered)


class Step(Enum):
    NOTHING = "nothing"  # the node holds what is wanted (or nothing is wanted)
    SWITCH = "switch"  # install the profile set if it changed, then switch the daemon
    REFUSE = "refuse"  # the cluster's rules or profiles are unusable: keep what is held


@dataclass(frozen=True)
class Held:
    """What the node holds, as the agent last left it and the daemon says."""

    profile: str  # the daemon's active profile ("" before anything)
    digest: str | None  # of the profile set installed (None: none installed)


def plan(want: Wanted, held: Held) -> Step:
    """One step toward `want`. A relist, a bookmark or a restarted agent that finds the
    same profile and the same set plans nothing: the daemon is not asked to switch."""
    if want.error is not None:
        return Step.REFUSE
    if want.profile is None:
        return Step.NOTHING  # no rule for this node: left as it is, not reverted
    if want.profile == held.profile and want.digest == held.digest:
        return Step.NOTHING
    return Step.SWITCH
