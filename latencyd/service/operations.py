"""Operations: the daemon's changes, one at a time, each run from the main loop a slice at
a time, so the daemon keeps answering while one narrows 20,000 tasks.

A change is a generator (Daemon.switch_steps and its kind) that yields its Progress every
slice of work (engine.SLICE_S). The first slice runs at once, in the D-Bus call that asked
for it: most changes end there and reply without a round through the loop. A longer one
goes on from the main loop, a slice per turn at D-Bus's own priority: `status` and
`active` are answered between its slices, and no stream of calls, however fast, keeps
it from its next slice. Other changes wait their turn in order; `off` cancels them all.
Events (new threads, devices, drift checks) wait for the change in progress
(Daemon.deferred).

A read that must wait for the change in progress (`verify`) is shared: while one waits,
every caller asking for the same joins it and gets its answer, so a flood of reads from
anyone costs one read, and a change asked for after them waits for that one only.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from latencyd.core.engine import Steps
from latencyd.errors import Cancelled
from latencyd.service.daemon import Daemon
from latencyd.service.mainloop import MainLoop

log = logging.getLogger(__name__)

PRIORITY_SLICES = 0  # GLib's default, D-Bus's: a turn dispatches both, neither starves


@dataclass
class Operation:
    what: str  # for status and the log: "switch to cpu-partitioning"
    start: Callable[[], Steps[Any]]
    done: Callable[[Any], None]
    failed: Callable[[Exception], None]


class Operations:
    def __init__(self, daemon: Daemon, loop: MainLoop) -> None:
        self.daemon = daemon
        self.loop = loop
        self.waiting: collections.deque[Operation] = collections.deque()
        self.current: Operation | None = None
        self.steps: Steps[Any] | None = None
        self.source: int | None = None
        # Reads waiting to run, by what they read: the callers that joined each.
        self.reads: dict[str, list[tuple[Callable[[Any], None], Callable[[Exception], None]]]]
        self.reads = {}

    def read(self, op: Operation) -> None:
        """A read that waits its turn like a change (`op.what` names what it reads): if
        the same read is already waiting, the caller joins it instead of queueing another."""
        joined = self.reads.get(op.what)
        if joined is not None:
            joined.append((op.done, op.failed))
            return
        callers = self.reads[op.what] = [(op.done, op.failed)]

        def done(result: Any) -> None:
            del self.reads[op.what]
            for reply, _ in callers:
                reply(result)

        def failed(exc: Exception) -> None:
            del self.reads[op.what]
            for _, error in callers:
                error(exc)

        self.submit(Operation(op.what, op.start, done, failed))

    def submit(self, op: Operation) -> None:
        """Run `op` now if nothing else runs (its first slice before this returns), else
        after the changes before it."""
        self.waiting.append(op)
        if self.current is None:
            self._next()

    def cancel(self, why: str) -> None:
        """End every change: the one in progress is rolled back (nothing of it stays), and
        the waiting ones never start; each caller gets a Cancelled error. The events that
        waited stay for the caller's own change (Daemon.run_deferred after it)."""
        waiting, self.waiting = list(self.waiting), collections.deque()
        if self.current is not None and self.steps is not None:
            op, steps = self.current, self.steps
            log.warning("%s: cancelled by %s, rolled back", op.what, why)
            self._finish()
            try:
                steps.throw(Cancelled(f"{op.what}: cancelled by {why}"))
            except Exception as exc:  # the rollback's own words, as a Cancelled error
                op.failed(Cancelled(str(exc)) if isinstance(exc.__cause__, Cancelled) else exc)
            else:  # it ignored the cancel: cannot happen with the engine's steps
                steps.close()
                op.failed(Cancelled(f"{op.what}: cancelled by {why}"))
        for op in waiting:
            log.warning("%s: cancelled by %s before it started", op.what, why)
            op.failed(Cancelled(f"{op.what}: cancelled by {why} before it started"))

    def _next(self) -> None:
        """Start the next waiting change and run its first slice."""
        while self.current is None and self.waiting:
            op = self.waiting.popleft()
            self.current, self.daemon.busy = op, op.what
            self.steps = op.start()
            if self._step() and self.source is None:
                self.source = self.loop.timeout_add(0, self._on_idle, PRIORITY_SLICES)
        if self.current is None:
            self.daemon.run_deferred()

    def _on_idle(self) -> bool:
        if self.current is None:
            self.source = None
            return False
        if not self._step():
            self._next()
        if self.current is None:
            self.source = None
            return False
        return True

    def _step(self) -> bool:
        """One slice of the current change; False once it has ended (replied to)."""
        op, steps = self.current, self.steps
        assert op is not None and steps is not None
        try:
            self.daemon.progress = next(steps)
            return True
        except StopIteration as end:
            self._finish()
            op.done(end.value)
        except Exception as exc:
            self._finish()
            op.failed(exc)
        return False

    def _finish(self) -> None:
        self.current = self.steps = None
        self.daemon.busy = self.daemon.progress = None
