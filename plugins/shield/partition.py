"""A cgroup v2 isolated partition: latencyd's shield cgroup takes its CPUs from every
cgroup outside it (and from the scheduler's load balancing); the application is moved
in, each held one kept on its hold's CPUs by an affinity (no cgroup of its own: a
partition's child would have to be one too)."""

from __future__ import annotations

from latencyd.core.plugin import Settings, Target
from latencyd.kernel.cgroups import CgroupFacts, v2_groups

from .cpusets import Cpusets
from .mechanism import Owned
from .rules import ShieldRules
from .targets import Cgroup, Controller


class V2Partition(Cpusets):
    name = "cpuset-v2"

    def cgroups(self, rules: ShieldRules, owned: Owned, refused: dict[str, str]) -> Settings:
        hierarchy = self.hierarchy(rules)
        settings: Settings = {Controller(hierarchy, "cpuset"): True}
        settings.update(
            {Cgroup(hierarchy, name): files for name, files in v2_groups(rules.cpus).items()}
        )
        if rules.allow:
            refused["allow"] = (
                "an isolated partition takes its CPUs from every cgroup outside it: no "
                "task outside may stay on them (name the application in apps instead)"
            )
        return settings

    def first_made(self, facts: CgroupFacts) -> tuple[Target, ...]:
        """The v2 root's cpuset controller for its children (cgroups enables it first)."""
        return (Controller(facts.unified, "cpuset"),) if facts.unified else ()
