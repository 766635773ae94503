"""Logging that suits journald under systemd and a terminal otherwise."""

from __future__ import annotations

import logging
import os
import sys

# sd-daemon(3) priority prefixes: journald stores the level, and stamps the time itself.
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prio = _PRIORITY.get(record.levelno, 6)
        return f"<{prio}>{record.getMessage()}"


def under_systemd() -> bool:
    return "JOURNAL_STREAM" in os.environ or "INVOCATION_ID" in os.environ


def setup_logging(verbose: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if under_systemd():
        handler.setFormatter(_JournalFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%H:%M:%S")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
