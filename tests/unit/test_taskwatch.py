"""TaskWatch on the real GLib loop, with a source that never runs dry (a rename flood
faster than the daemon): each wake-up takes a bounded batch, calls at D-Bus's priority
are dispatched between batches, and the rescans overflows ask for are paced."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from latencyd.core.capabilities import FollowsTasks
from latencyd.core.plugin import Follows, TaskEvent
from latencyd.core.profile import Profile
from latencyd.service.daemon import Daemon
from latencyd.service.main import TaskWatch
from latencyd.service.mainloop import PRIORITY_DEFAULT, MainLoop
from latencyd.service.taskevents import READ_BUDGET


class Flood:
    """A task source whose fd is always readable, holding `total` renames of one process
    and an overflow every `lost_every` records."""

    name = "flood"

    def __init__(self, total: int, lost_every: int = 0) -> None:
        self.left = total
        self.lost_every = lost_every
        self.taken = 0
        self.reads: list[int] = []
        self.r, self.w = os.pipe()
        os.write(self.w, b"x")  # never read: readable for good

    def filenos(self) -> list[int]:
        return [self.r]

    def read(self, budget: int = READ_BUDGET) -> list[TaskEvent]:
        n = min(budget, self.left)
        self.left -= n
        self.reads.append(n)
        out = []
        for _ in range(n):
            self.taken += 1
            lost = self.lost_every and self.taken % self.lost_every == 0
            out.append(TaskEvent("lost", 0, 0, lost=True) if lost else TaskEvent("comm", 7, 7))
        return out

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


@dataclass
class Follower(FollowsTasks[Any, Any]):
    """A plugin following tasks (it declares FollowsTasks: the watch asks no other)."""

    name: str = "shield"
    follows: Follows = field(default_factory=Follows)
    renames: bool = True
    rescan_interval_s: float = 60.0

    def on_task(self, rules: Any, event: TaskEvent, owned: Any) -> dict[Any, Any]:
        return {}

    def follows_user_tasks(self, options: Any) -> bool:
        return True

    def follows_renames(self, options: Any) -> bool:
        return self.renames

    def options_of(self, section: Any) -> Any:  # Plugin's: a section as the hooks get it
        return section


@dataclass
class FakeDaemon:
    plugins: dict[str, Follower]
    before_apply: list[Any] = field(default_factory=list)
    task_source: str = "none"
    handed: list[list[TaskEvent]] = field(default_factory=list)

    def on_task_events(self, events: list[TaskEvent]) -> None:
        self.handed.append(events)


@dataclass
class FakeProfile:
    sections: dict[str, dict[str, Any]]


@pytest.fixture
def loop() -> Iterator[MainLoop]:
    yield MainLoop()


def watch(loop: MainLoop, source: Flood, renames: bool = True) -> tuple[TaskWatch, FakeDaemon]:
    daemon = FakeDaemon({"shield": Follower(renames=renames)})
    opened: list[tuple[str, bool, bool]] = []

    def opener(preference: str, user_execs: bool, follow_renames: bool) -> Flood:
        opened.append((preference, user_execs, follow_renames))
        return source

    w = TaskWatch(cast(Daemon, daemon), loop, "auto", opener)
    w.sync(cast(Profile, FakeProfile({"shield": {}})))
    assert opened == [("auto", True, renames)]
    return w, daemon


def test_calls_are_dispatched_between_batches_of_a_flood(loop: MainLoop) -> None:
    total = READ_BUDGET * 1000
    source = Flood(total)
    w, daemon = watch(loop, source)
    answered: list[int] = []

    def call() -> bool:  # a D-Bus call, at D-Bus's priority
        answered.append(source.taken)
        return len(answered) < 3

    loop.timeout_add(0, call, PRIORITY_DEFAULT)
    while len(answered) < 3:
        loop.dispatch_once()
    # Answered while the flood still had almost all of its events to give.
    assert answered[-1] < total // 10
    assert max(source.reads) <= READ_BUDGET
    # One rename of one process per batch reaches the daemon (coalesced).
    assert all(batch == [TaskEvent("comm", 7, 7)] for batch in daemon.handed)
    w.sync(None)


def test_overflows_rescan_at_most_once_per_gap(loop: MainLoop) -> None:
    source = Flood(READ_BUDGET * 400, lost_every=READ_BUDGET // 2)  # two overflows a batch
    w, daemon = watch(loop, source)
    started = time.monotonic()
    while source.left and time.monotonic() - started < 2.5:
        loop.dispatch_once()
    rescans = sum(1 for batch in daemon.handed if any(e.lost for e in batch))
    # 800 overflows: the first rescan at once, then one per RESCAN_MIN_GAP_S at most.
    elapsed = time.monotonic() - started
    assert 1 <= rescans <= 1 + int(elapsed / w.pace.min_gap_s) + 1
    assert all(not e.lost for batch in daemon.handed for e in batch if len(batch) > 1)
    w.sync(None)
    assert w.rescan_timer is None


def test_renames_are_asked_of_the_source_only_if_a_section_follows_them(loop: MainLoop) -> None:
    w, _ = watch(loop, Flood(0), renames=False)
    assert not w.renames
    w.sync(None)
