"""The interface every way of keeping the shield keeps (Mechanism): settings for the
section (expand_steps), for one task as it execs (place), for what the tasks placed
started before the write (started_meanwhile), where a held application runs alone
(own_cgroup), what it makes first (first_made) and whether the cgroups owned are given
back before it expands (starts_afresh), and what status shows of it (tables). Each is a
module of this package: the affinity chase (chase.py), v1 exclusive cpusets (v1.py), a v2
isolated partition (partition.py), systemd's AllowedCPUs= (systemd.py), the three
cpuset ones sharing cpusets.py.

Not a mechanism's to say: which one runs here, and why not each other. That is
latencyd.kernel.cgroups.choose's, from the machine's cgroup facts, below the plugins
because `latencyctl recommend` (latencyd.tools, which imports no plugin) says the same
without the shield; the plugin looks the chosen one up by the name choose gives it.
Nor giving a setting back: that goes by the setting's kind, not by the mechanism chosen
now (a journal may hold another one's): the plugin's original."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Iterator, Mapping
from typing import ClassVar

from latencyd.core.movable import Tasks
from latencyd.core.plugin import Expansion, Settings, Table, Target, Value
from latencyd.kernel.cgroups import CgroupFacts, Chosen
from latencyd.kernel.system import System, Task

from .options import ShieldOptions
from .rules import Judge, ShieldRules

Owned = Mapping[Target, Value]  # what the plugin owns, each with the value it set


def thread_ids(system: System, pid: int) -> Iterator[int]:
    """The process's threads, as the kernel lists them (lazily: 20,000 take a while)."""
    return (int(t) for t in system.entries(f"proc/{pid}/task") if t.isdigit())


def chosen_table(rules: ShieldRules, hint: str = "") -> Table:
    """Which mechanism keeps the shield here, and why not each other one; `hint`: what
    the mechanism in use asks of whoever starts the application."""
    used = rules.choice.mechanism
    where = f" on /{rules.choice.hierarchy}" if rules.choice.hierarchy else ""
    rows = [(used, f"in use{where}")]
    rows += [(m, why) for m, why in rules.choice.why_not.items()]
    return Table(f"Shield mechanism{hint}", ("mechanism", "here"), tuple(rows))


class Mechanism(ABC):
    """One way the shield is kept. It reaches the machine through `tasks` (the System,
    and which task each pid is within the step, the plugin's) and asks `judge` who each
    task is (the application, allowed, under a hold, ruled by name)."""

    name: ClassVar[str]  # as latencyd.kernel.cgroups.choose names it
    follows_every_exec: ClassVar[bool] = False  # whether each user exec needs judging

    def __init__(self, tasks: Tasks, judge: Judge) -> None:
        self.tasks = tasks
        self.system = tasks.system
        self.judge = judge

    @abstractmethod
    def expand_steps(
        self, rules: ShieldRules, owned: Owned
    ) -> Generator[None, None, Expansion[ShieldRules]]:
        """The section's settings (yielding now and then: 50,000 tasks take a while)."""

    @abstractmethod
    def place(self, rules: ShieldRules, task: Task, tids: list[int], owned: Owned) -> Settings:
        """Settings for a user task that just exec'd (its threads `tids`)."""

    def starts_afresh(self, chosen: Chosen, options: ShieldOptions, owned: Owned) -> bool:
        """Whether the cgroups some cpuset mechanism made (owned) must be given back before
        this one, `chosen` for the section's `options`, expands it."""
        return False

    def first_made(self, facts: CgroupFacts) -> tuple[Target, ...]:
        """The settings this mechanism's expansion makes first, on a machine with these
        cgroup `facts`: journaled with the rest of its step before anything is written,
        one of them is owned whenever anything it made is (starts_afresh looks them up).
        (): it makes no cgroup."""
        return ()

    def started_meanwhile(self, rules: ShieldRules, owned: Owned) -> Settings:
        """What the tasks placed started before the settings were written (FollowsTasks)."""
        return {}

    def own_cgroup(self, pid: int) -> str | None:
        """The cgroup a held application runs in on its hold's CPUs alone; None: it has
        none of its own here (it is kept by an affinity, or on the whole shield)."""
        return None

    @abstractmethod
    def tables(self, rules: ShieldRules) -> tuple[Table, ...]:
        """What status shows of the shield kept this way."""

    def end_step(self) -> None:
        """The step is done: forget what was kept for it."""
        return None
