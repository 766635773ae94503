"""What latencyctl draws on a terminal besides its answers: a progress bar on stderr, and
blocks of lines without the blank ones they end with."""

from __future__ import annotations

import sys
import time

from latencyd.text import printable


class ProgressBar:
    """A one-line bar on stderr, on a terminal only, with the time left at the pace so far."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, what: str, share: float) -> None:
        if not sys.stderr.isatty():
            return
        width = 30
        filled = int(share * width)
        elapsed = time.monotonic() - self.started
        left = f"{elapsed * (1 - share) / share / 60:4.1f} min left" if share > 0.01 else ""
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {share:4.0%} {left:>14} "
            f"{printable(what)[:50]:<50}"  # the daemon's `what` quotes a caller's profile name
        )
        if share >= 1:
            sys.stderr.write("\n")
        sys.stderr.flush()


def trimmed(lines: list[str]) -> list[str]:
    """`lines` without the blank ones at the end (a block ends with one, the last too)."""
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    return lines[:end]
