"""Plugins that move tasks (kthread's kernel threads, shield's user tasks): which task a
pid is within a step, and whether the kernel lets a task move at all.

Both plugins key a task's settings by pid and start time, so a recycled pid is never
mistaken for the task that was moved; reading that identity once per step, not once per
thread, is what keeps a process of 20,000 threads cheap. A task's setting (TaskTarget) is
therefore read and written through what the plugin keeps for the step (Tasks), not
through the System alone as other kinds are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, TypeVar

from latencyd.core.capabilities import RemembersInStep
from latencyd.core.plugin import Plugin, Target, V, Value
from latencyd.errors import NotApplicable
from latencyd.kernel.system import System, Task

MOVE_REFUSED = "the kernel will not move this thread"

T = TypeVar("T", bound=Target)
Opt = TypeVar("Opt")  # the plugin's options (Plugin.options_of)


class Rescanned(Protocol):
    """The rules of a plugin that moves tasks: when its section was last expanded."""

    @property
    def scanned_at(self) -> float: ...  # monotonic time: the next rescan is due from here


S = TypeVar("S", bound=Rescanned)


class NamesATask(Protocol):
    """A target naming a task by pid and start time (ThreadAffinity, TaskAffinity...)."""

    @property
    def pid(self) -> int: ...

    @property
    def start(self) -> int: ...


def require_movable(task: Task) -> None:
    if task.is_kthread and not task.pinnable:
        # The setting names the thread; the reason is the same for every such thread.
        raise NotApplicable(
            "a per-CPU kernel thread (PF_NO_SETAFFINITY): the kernel does not let anyone move it"
        )


class Tasks:
    """The System, and which task each pid is within a step (between the plugin's
    begin_step and end_step)."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.identities: dict[int, Task | None] | None = None  # pid -> task, within a step

    def task(self, target: NamesATask, fresh: bool = False) -> Task:
        """The target's task, if it is still the one the target names. Within a step a
        process is read once, not once per thread of its 20,000 (a pid cannot be freed
        and reused while a step runs without giving the main loop a turn, and the
        engine begins a new step after each turn; across steps the start time tells)."""
        cache = self.identities
        if cache is None or fresh:
            task = self.system.task(target.pid)
        elif target.pid in cache:
            task = cache[target.pid]
        else:
            task = cache[target.pid] = self.system.task(target.pid)
        if task is None or task.start_time != target.start:
            raise NotApplicable(f"pid {target.pid} has exited")
        return task


@dataclass(frozen=True)
class TaskTarget(Target[V]):
    """A setting of one task, named by pid and start time (NamesATask): its kind reads,
    writes, looks for and describes it given Tasks (which task its pid is within the
    step), which a TaskMover keeps and hands it, instead of the System alone."""

    def read_task(self, tasks: Tasks) -> V:
        raise NotImplementedError

    def write_task(self, tasks: Tasks, value: V) -> None:
        raise NotImplementedError

    def task_exists(self, tasks: Tasks) -> bool:
        """Whether the task is still the one named; NotApplicable (it exited) is False."""
        raise NotImplementedError

    def describe_task(self, tasks: Tasks, value: V) -> str:
        raise NotImplementedError


class TaskMover(Plugin[T, S, Opt], RemembersInStep):
    """A plugin whose targets name tasks: it keeps who each pid is for the step
    (RemembersInStep), and hands that to its TaskTarget kinds; its other kinds reach their
    settings as any do."""

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.tasks = Tasks(system)

    @property
    def identities(self) -> dict[int, Task | None] | None:
        """pid -> task, within a step (None between steps)."""
        return self.tasks.identities

    def changed(self, rules: S | None) -> bool:
        """A periodic rescan: the safety net behind task events (the rules a section
        expanded to say when, as scanned_at; a section refused whole is tried again)."""
        scanned = rules.scanned_at if rules is not None else 0.0
        return time.monotonic() - scanned >= self.rescan_interval_s

    def begin_step(self) -> None:
        self.tasks.identities = {}

    def end_step(self) -> None:
        self.tasks.identities = None

    def _task(self, target: NamesATask, fresh: bool = False) -> Task:
        """The target's task, if it is still the one it names (Tasks.task)."""
        return self.tasks.task(target, fresh)

    # -- one target: a task's through Tasks, any other kind's through the System ---------
    def read(self, target: T) -> Value:
        if isinstance(target, TaskTarget):
            value: Value = target.read_task(self.tasks)  # its kind's, a JSON value
            return value
        return super().read(target)

    def write(self, target: T, value: Value) -> None:
        if isinstance(target, TaskTarget):
            target.write_task(self.tasks, value)
        else:
            super().write(target, value)

    def exists(self, target: T) -> bool:
        if isinstance(target, TaskTarget):
            try:
                return target.task_exists(self.tasks)
            except NotApplicable:
                return False
        return super().exists(target)

    def describe(self, target: T, value: Value) -> str:
        if isinstance(target, TaskTarget):
            return target.describe_task(self.tasks, value)
        return super().describe(target, value)
