"""Text that anyone may have chosen, made safe to put in a log line or on a terminal.

Any local user names their tasks (a comm is 15 bytes of their choice: `x\\n<0>pwned`),
gives a HoldProfile reason and starts the commands `measure` sees run. Written raw, a
newline starts a new journal entry whose `<N>` prefix journald reads as its priority (a
forged emergency), and an escape sequence reaches the terminal of the admin who reads
the log or runs latencyctl (TuneD's CVE-2024-52337). The daemon's log formatters
(`latencyd.service.logs`) and latencyctl's output (`latencyd.tools.cli`) pass every line
through `printable`; JSON output carries the real text, which JSON escapes itself.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` as one line of printable characters: every character Python does not call
    printable (C0 and C1 controls, DEL, line and paragraph separators, format characters
    such as bidi overrides, lone surrogates, any Unicode space but the blank) is written
    as its escape (`\\n`, `\\x1b`, `\\x7f`, `\\u202e`), and a backslash as `\\\\`, so the
    escaped text reads back unambiguously. Printable Unicode is kept ("µs", "é")."""
    if text.isprintable() and "\\" not in text:
        return text  # the common case: returned as it is, without a pass per character
    return "".join(c if c.isprintable() and c != "\\" else _escape(c) for c in text)


def _escape(char: str) -> str:
    # Python's own escapes (those of repr): \t \n \r \\, else \xHH, \uHHHH or \UHHHHHHHH.
    return char.encode("unicode_escape").decode("ascii")
