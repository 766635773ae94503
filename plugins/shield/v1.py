"""v1 exclusive cpusets: latencyd's housekeeping and shield cpusets, which the kernel
keeps (a task is born where its parent is), with the root's load balancing off; every
user task the shield moves goes to housekeeping, the application into the shield's,
each held application into a cpuset of its own inside it (app_cgroup)."""

from __future__ import annotations

from latencyd.core.plugin import Settings, Target
from latencyd.cpuset import CpuSet
from latencyd.kernel.cgroups import (
    V1_ROOT_FILES,
    CgroupFacts,
    app_cgroup,
    v1_app_group,
    v1_groups,
)

from .cpusets import Cpusets, shield_was
from .mechanism import Owned
from .rules import ShieldRules
from .targets import Cgroup, RootFile


class V1Cpusets(Cpusets):
    name = "cpuset-v1"

    def cgroups(self, rules: ShieldRules, owned: Owned, refused: dict[str, str]) -> Settings:
        hierarchy = self.hierarchy(rules)
        mems = self.system.read(f"{hierarchy}/cpuset.effective_mems")
        was = shield_was(hierarchy, owned)
        groups = v1_groups(rules.cpus, self.system.online_cpus(), mems, was)
        settings: Settings = {RootFile(hierarchy, f): v for f, v in V1_ROOT_FILES.items()}
        settings.update({Cgroup(hierarchy, name): files for name, files in groups.items()})
        return settings

    def first_made(self, facts: CgroupFacts) -> tuple[Target, ...]:
        """The root's files (cgroups writes them first)."""
        v1 = facts.v1_cpuset
        return tuple(RootFile(v1, f) for f in V1_ROOT_FILES) if v1 else ()

    def own_cgroup(self, pid: int) -> str | None:
        """A held application's own cpuset inside the shield's."""
        return f"/{app_cgroup(pid)}" if pid in self.judge.placed_pids else None

    def own_made(self, rules: ShieldRules, pid: int, cpus: CpuSet) -> Settings:
        """Its cpuset, made before it moves in: its hold's CPUs, the shield's memory nodes."""
        hierarchy = self.hierarchy(rules)
        mems = self.system.read(f"{hierarchy}/cpuset.effective_mems")  # the shield's
        return {Cgroup(hierarchy, app_cgroup(pid)): v1_app_group(cpus, mems)}
