"""Putting a scenario in force: a latencyd profile held through the daemon, "untuned",
"current" (nothing switched), or "tuned:NAME" (TuneD, while latencyd holds "untuned")."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from latencyd.tools.measure.processes import Processes
from latencyd.tools.measure.tuned import TunedDaemon


class Switcher:
    """Puts a scenario in force: latencyd holds (through the `hold`/`release` calls given),
    and TuneD for "tuned:NAME" scenarios. Holds stack and the newest wins, so the next
    scenario is held before the previous one is let go: nothing flips in between."""

    def __init__(
        self,
        hold: Callable[[str], int],
        release: Callable[[int], None],
        procs: Processes,
        tuned_etc: Path = Path("/etc/tuned"),
    ) -> None:
        self.hold = hold
        self.release = release
        self.cookie: int | None = None
        self.tuned = TunedDaemon(procs, tuned_etc, hold="untuned")

    def enter(self, scenario: str, hold: str | None = None, settle: float = 0.5) -> None:
        """Put `scenario` in force, holding `hold` (default: the scenario's name)."""
        self.tuned.stop()
        previous = self.cookie
        if scenario == "current":
            self.cookie = None
        else:
            self.cookie = self.hold(
                "untuned" if scenario.startswith("tuned:") else hold or scenario
            )
        if previous is not None:
            self.release(previous)
        if scenario.startswith("tuned:"):
            self.tuned.start(scenario.split(":", 1)[1])
        time.sleep(settle)  # let the machine settle (idle states, caches)

    def leave(self) -> None:
        self.tuned.stop()
        if self.cookie is not None:
            cookie, self.cookie = self.cookie, None
            self.release(cookie)
