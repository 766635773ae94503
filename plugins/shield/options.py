"""What a [shield] section may say: its options class, from which its schema is derived
(latencyd.core.schema.option), and as which its hooks and mechanisms read the section."""

from __future__ import annotations

from dataclasses import dataclass

from latencyd.core.schema import Choice, Cpus, ListOf, Regex, Str, option, table
from latencyd.cpuset import CpuSet

MECHANISM_ASKED = ("auto", "cpuset", "affinity")  # what `mechanism =` may say (choose)


@dataclass(frozen=True)
class ShieldRule:
    """One [[shield.rule]] entry."""

    match: str = option(Regex(), "Regex on the process's name (searched)", required=True)
    cpus: CpuSet = option(
        Cpus(),
        "CPUs every thread of the matched processes may run on (CPUs "
        "only: start the process with chrt for a real-time policy)",
        required=True,
    )


@dataclass(frozen=True)
class ShieldOptions:
    cpus: CpuSet | None = option(
        Cpus(),
        "Move every movable user task off these CPUs (and keep new ones off)",
        shields=True,
    )
    allow: list[str] | None = option(
        ListOf(Str()), "Name patterns (globs) of user tasks that may stay on the shielded CPUs"
    )
    apps: list[str] | None = option(
        ListOf(Str()),
        "The application's executables (globs): a path (/opt/md/bin/*), or a file "
        "name that only root's files match (not a process name, which any user "
        "chooses): placed on the shielded CPUs as it starts (exec)",
    )
    mechanism: str = option(
        Choice(MECHANISM_ASKED),
        "How the shield is kept: cpuset has the kernel keep it (a cgroup v2 "
        "isolated partition; under systemd, AllowedCPUs= set through systemd on "
        "init.scope, system.slice, user.slice and a latencyd.slice for the "
        "application; else v1 exclusive cpusets; inside one the kernel "
        "refuses taskset to CPUs outside it: start the application with latencyctl "
        "run, hold -- CMD or apps); affinity narrows each task's CPUs as it comes; "
        "auto takes cpuset where the machine has one (status says which runs)",
        default="auto",
    )
    rule: tuple[ShieldRule, ...] = table(
        ShieldRule,
        "User-process rules, by name, as TuneD's scheduler groups can; the first "
        "rule whose regex matches wins, and a rule wins over the shield",
        selectors=("match",),
    )
