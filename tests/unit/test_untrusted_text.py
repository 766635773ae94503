"""Text any local user chooses (task names, HoldProfile reasons) cannot forge a journal
entry or drive an admin's terminal (issue 37, defect 5; TuneD's CVE-2024-52337): the
daemon's logs and latencyctl's output escape it (latencyd.core.text.printable), and
`--json` keeps it as it is. Through the daemon's own logging set-up and the CLI's own
output path; the D-Bus call and the noise watch's tracefs reading are the fakes."""

from __future__ import annotations

import codecs

import pytest

from latencyd.core.text import printable

# A comm is 15 bytes of its task's choosing (prctl PR_SET_NAME, or the file it execs).
FORGER = "x\n<0>pwned"  # journald: a second entry, at emergency level
TITLE = "\x1b]0;evil\x07"  # a terminal: sets its window title
CLEAR = "\x1b[2J"  # a terminal: clears the screen


def test_printable_escapes_what_is_not_printable_and_keeps_the_rest() -> None:
    assert printable(FORGER) == "x\\n<0>pwned"
    assert printable(TITLE) == "\\x1b]0;evil\\x07"
    assert printable(CLEAR) == "\\x1b[2J"
    assert printable("\r\t\x00\x7f\x85\x9b") == "\\r\\t\\x00\\x7f\\x85\\x9b"  # C0, DEL, C1
    assert printable("\u2028\u202e\udc80") == "\\u2028\\u202e\\udc80"  # LS, RLO, surrogate
    kept = "task 77 stress-ng 12.5 µs (é, 中, 😀)"
    assert printable(kept) == kept


@pytest.mark.parametrize("text", [FORGER, TITLE, CLEAR, "a\\nb", "a\\x1bb", "\\", "\\\n", ""])
def test_printable_reads_back_unambiguously(text: str) -> None:
    """A backslash is escaped too: the text a user wrote as `\\n` cannot pass for a newline."""
    shown = printable(text)
    assert shown.isprintable()
    assert codecs.decode(shown, "unicode_escape") == text
