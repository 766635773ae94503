"""Operations: changes one at a time, a slice per main-loop turn, events kept for after,
`off` cancelling what runs and what waits. On the real GLib loop, with a stand-in daemon
(only its busy/progress/deferred bookkeeping is used)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, cast

import pytest

from latencyd.core.engine import Progress
from latencyd.errors import Cancelled
from latencyd.service.daemon import Daemon
from latencyd.service.mainloop import MainLoop
from latencyd.service.operations import Operation, Operations


class StandIn:
    def __init__(self) -> None:
        self.busy: str | None = None
        self.progress: Progress | None = None
        self.deferred: list[str] = []
        self.ran: list[str] = []

    def run_deferred(self) -> None:
        self.ran += self.deferred
        self.deferred = []


def change(log: list[str], name: str, slices: int) -> Generator[Progress, None, str]:
    for i in range(slices):
        log.append(f"{name} {i}")
        yield Progress(i + 1, slices)
    log.append(f"{name} end")
    return name


@pytest.fixture
def rig() -> tuple[StandIn, MainLoop, Operations]:
    daemon, loop = StandIn(), MainLoop()
    return daemon, loop, Operations(cast(Daemon, daemon), loop)


def turn(loop: MainLoop, times: int = 1) -> None:
    for _ in range(times):
        loop.dispatch_pending()


def test_changes_run_in_order_a_slice_per_turn_and_reply_when_done(
    rig: tuple[StandIn, MainLoop, Operations],
) -> None:
    daemon, loop, ops = rig
    log: list[str] = []
    replies: list[Any] = []
    ops.submit(Operation("a", lambda: change(log, "a", 3), replies.append, replies.append))
    ops.submit(Operation("b", lambda: change(log, "b", 1), replies.append, replies.append))
    assert log == ["a 0"] and daemon.busy == "a"  # the first slice ran in the call
    assert daemon.progress == Progress(1, 3)
    daemon.deferred.append("thread 42")  # an event arriving meanwhile waits
    for _ in range(50):
        turn(loop)
        if ops.current is None:
            break
    assert log == ["a 0", "a 1", "a 2", "a end", "b 0", "b end"]
    assert replies == ["a", "b"]
    assert daemon.busy is None and daemon.progress is None
    assert daemon.ran == ["thread 42"]  # once nothing runs


def test_a_short_change_replies_before_submit_returns(
    rig: tuple[StandIn, MainLoop, Operations],
) -> None:
    _, _, ops = rig
    replies: list[Any] = []
    ops.submit(Operation("a", lambda: change([], "a", 0), replies.append, replies.append))
    assert replies == ["a"] and ops.current is None and ops.source is None


def test_cancel_rolls_back_the_running_change_and_fails_the_waiting_ones(
    rig: tuple[StandIn, MainLoop, Operations],
) -> None:
    daemon, loop, ops = rig
    rolled_back: list[str] = []

    def rolls_back() -> Generator[Progress, None, str]:
        try:
            yield Progress(1, 10)
            yield Progress(2, 10)
        except Cancelled:
            rolled_back.append("a")
            raise
        return "a"

    failed: list[Exception] = []
    ops.submit(Operation("switch to x", rolls_back, failed.append, failed.append))
    ops.submit(Operation("hold on y", lambda: change([], "b", 2), failed.append, failed.append))
    ops.cancel("off")
    assert rolled_back == ["a"]
    assert [str(e) for e in failed] == [
        "switch to x: cancelled by off",
        "hold on y: cancelled by off before it started",
    ]
    assert ops.current is None and not ops.waiting and daemon.busy is None
    turn(loop, 3)  # the idle source ends itself
    assert ops.source is None


def test_a_flood_of_reads_costs_one_read_and_a_change_asked_after_waits_for_one(
    rig: tuple[StandIn, MainLoop, Operations],
) -> None:
    """Issue 37: 400 callers asking to verify while a change runs share one verify; root's
    change asked for after them starts right after it, not after 400 of them."""
    _, loop, ops = rig
    log: list[str] = []
    replies: list[Any] = []
    reads = []

    def verify() -> Generator[Progress, None, str]:
        reads.append(1)
        log.append("verify")
        return "no drift"
        yield  # a generator function: one slice

    ops.submit(Operation("a", lambda: change(log, "a", 3), replies.append, replies.append))
    for _ in range(400):
        ops.read(Operation("verify", verify, replies.append, replies.append))
    ops.submit(Operation("hold", lambda: change(log, "hold", 1), replies.append, replies.append))
    for _ in range(50):
        turn(loop)
        if ops.current is None:
            break
    assert reads == [1]
    assert log == ["a 0", "a 1", "a 2", "a end", "verify", "hold 0", "hold end"]
    assert replies == ["a", *["no drift"] * 400, "hold"]
    ops.read(Operation("verify", verify, replies.append, replies.append))
    assert reads == [1, 1]  # once answered, the next caller gets a read of its own


def test_a_stream_of_calls_does_not_keep_a_change_from_its_slices(
    rig: tuple[StandIn, MainLoop, Operations],
) -> None:
    """A source of D-Bus's priority that is ready again at once, 200 times (a client
    calling as fast as the bus allows): the change gets its slices meanwhile, not after."""
    _, loop, ops = rig
    log: list[str] = []

    def a_call() -> bool:
        log.append("call")
        return log.count("call") < 200

    loop.timeout_add(0, a_call)
    ops.submit(Operation("a", lambda: change(log, "a", 5), print, print))
    turn(loop)
    assert log.count("call") == 200
    last_call = len(log) - 1 - log[::-1].index("call")
    assert log.index("a end") < last_call
