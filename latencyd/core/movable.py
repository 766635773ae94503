"""Plugins that move tasks (kthread's kernel threads, shield's user tasks): which task a
pid is within a step, and whether the kernel lets a task move at all.

Both plugins key a task's settings by pid and start time, so a recycled pid is never
mistaken for the task that was moved; reading that identity once per step, not once per
thread, is what keeps a process of 20,000 threads cheap.
"""

from __future__ import annotations

import time
from typing import Protocol, TypeVar

from latencyd.core.errors import NotApplicable
from latencyd.core.plugin import Plugin, Target
from latencyd.core.system import System, Task

MOVE_REFUSED = "the kernel will not move this thread"

T = TypeVar("T", bound=Target)


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


class TaskMover(Plugin[T, S]):
    """A plugin whose targets name tasks: it keeps who each pid is for the step."""

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.identities: dict[int, Task | None] | None = None  # pid -> task, within a step

    def changed(self, rules: S | None) -> bool:
        """A periodic rescan: the safety net behind task events (the rules a section
        expanded to say when, as scanned_at; a section refused whole is tried again)."""
        scanned = rules.scanned_at if rules is not None else 0.0
        return time.monotonic() - scanned >= self.rescan_interval_s

    def begin_step(self) -> None:
        self.identities = {}

    def end_step(self) -> None:
        self.identities = None

    def _task(self, target: NamesATask, fresh: bool = False) -> Task:
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
