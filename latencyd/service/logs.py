"""Logging that suits journald under systemd and a terminal otherwise.

Every record is one line of printable text (`latencyd.text.printable`): its
arguments carry what local users choose (task names, hold reasons, profile paths), and
journald would read a newline in them as the start of another entry, with its own `<N>`
priority; a terminal would obey their escape sequences. The whole message is escaped,
not only the arguments, so a message built before logging (an exception's text, a
`%r`) is covered too; no message is meant to span lines (journald would split it).
"""

from __future__ import annotations

import logging
import os
import sys
from types import TracebackType

from latencyd.text import printable

# sd-daemon(3) priority prefixes: journald stores the level, and stamps the time itself.
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prio = _PRIORITY.get(record.levelno, 6)
        return f"<{prio}>{printable(record.getMessage())}"


class _TerminalFormatter(logging.Formatter):
    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record))

    def formatException(self, ei: _ExcInfo) -> str:
        # A traceback spans lines on purpose: each is escaped on its own.
        return "\n".join(map(printable, super().formatException(ei).splitlines()))


def under_systemd() -> bool:
    return "JOURNAL_STREAM" in os.environ or "INVOCATION_ID" in os.environ


def setup_logging(verbose: bool = False, level: int | str | None = None) -> None:
    """Every record escaped, for the daemon and the node agent alike (the agent's carry
    what a cluster's objects say)."""
    handler = logging.StreamHandler(sys.stderr)
    if under_systemd():
        handler.setFormatter(_JournalFormatter())
    else:
        handler.setFormatter(
            _TerminalFormatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if level is not None else logging.DEBUG if verbose else logging.INFO)
