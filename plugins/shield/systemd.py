"""systemd's AllowedCPUs=: where systemd owns the v2 tree, latencyd sets AllowedCPUs=
through systemd on init.scope, system.slice and user.slice (housekeeping) and on a
latencyd.slice of its own for the application, and makes that slice an isolated
partition; the application is moved into a scope of its own in the slice (app_scope),
whose AllowedCPUs= are its hold's CPUs when it holds one."""

from __future__ import annotations

from latencyd.core.plugin import Settings, Table, Target
from latencyd.cpuset import CpuSet
from latencyd.kernel.cgroups import (
    APP_SLICE,
    ISOLATED_FILE,
    PARTITION_FILE,
    SYSTEMD_CONFINED,
    CgroupFacts,
    app_scope,
    partition_says,
    systemd_placement,
)

from .cpusets import START_INSIDE, Cpusets, Placement, UserTask
from .mechanism import Owned, chosen_table
from .rules import ShieldRules
from .targets import SlicePartition, TaskUnit, UnitCpus, top_cgroup


class SystemdCpus(Cpusets):
    name = "cpuset-systemd"
    shield_cgroup = APP_SLICE

    def cgroups(self, rules: ShieldRules, owned: Owned, refused: dict[str, str]) -> Settings:
        hierarchy = self.hierarchy(rules)
        # The application's slice first (first_made).
        settings: Settings = {UnitCpus(APP_SLICE): rules.cpus.to_list()}
        housekeeping = (self.system.online_cpus() - rules.cpus).to_list()
        settings.update({UnitCpus(unit): housekeeping for unit in SYSTEMD_CONFINED})
        # Once every other unit is off the shielded CPUs, the slice can have them alone.
        settings[SlicePartition(hierarchy)] = "isolated"
        if rules.allow:
            refused["allow"] = (
                f"AllowedCPUs= of {', '.join(SYSTEMD_CONFINED)} keeps every task in them "
                "off the shielded CPUs: none may stay (name the application in apps)"
            )
        return settings

    def first_made(self, facts: CgroupFacts) -> tuple[Target, ...]:
        """The application's slice (cgroups sets its AllowedCPUs= first)."""
        return (UnitCpus(APP_SLICE),)

    def task_placement(self, rules: ShieldRules, found: UserTask, owned: Owned) -> Placement:
        """Where a user task goes: its unit (moved through systemd), into a scope of its
        own in latencyd.slice."""
        task, cgroup = found.task, found.cgroup
        unit_target = TaskUnit(self.hierarchy(rules), task.pid, task.start_time)
        confined = top_cgroup(cgroup) in SYSTEMD_CONFINED
        cpus = self._users_cpus(task, owned) if confined else CpuSet()
        placed = self.judge.placed(rules, task, found.rule)
        # By name or under a hold; asked only where it decides (a walk up the parents).
        confined_there = bool(cpus) and cpus.issubset(rules.cpus)
        allowed = confined_there and self.judge.left_alone(rules, task) is not None
        into, why = systemd_placement(cgroup, cpus, rules.cpus, placed, allowed)
        where = f"/{APP_SLICE}/{app_scope(task.pid)}" if into else None
        return Placement(unit_target, where, why)

    def own_cgroup(self, pid: int) -> str | None:
        """A held application's own scope in latencyd.slice."""
        return f"/{APP_SLICE}/{app_scope(pid)}" if pid in self.judge.placed_pids else None

    def own_set(self, pid: int, cpus: CpuSet) -> Settings:
        """Its scope's AllowedCPUs=, set once the move has made the scope."""
        return {UnitCpus(app_scope(pid)): cpus.to_list()}

    def tables(self, rules: ShieldRules) -> tuple[Table, ...]:
        chosen = chosen_table(rules, START_INSIDE)
        return (chosen, self.partition(rules), self.inside(rules), self.others(rules))

    def partition(self, rules: ShieldRules) -> Table:
        """What the isolated partition adds here, read back from the kernel, or why none."""
        hierarchy = rules.choice.hierarchy or ""
        state = SlicePartition(hierarchy).read(self.system)
        isolated_at = f"{hierarchy}/{ISOLATED_FILE}"
        isolated = self.system.read(isolated_at) if self.system.exists(isolated_at) else None
        rows = (
            (f"/{APP_SLICE} {PARTITION_FILE}", state if state is not None else "(no slice)"),
            (f"/ {ISOLATED_FILE}", isolated if isolated is not None else "(not in this kernel)"),
            ("adds here", partition_says(state, isolated, rules.cpus)),
        )
        return Table("Isolated partition (read back from the kernel)", ("", "here"), rows)
