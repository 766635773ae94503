"""Where each key of a TOML document is: the line numbers tomllib does not give us.

A small scanner, tolerant by design: it runs only on files tomllib has already
accepted, so it only has to find key positions, not validate anything.
"""

from __future__ import annotations

KeyPath = tuple[str | int, ...]


def _split_key(text: str) -> list[str]:
    """Split a dotted TOML key (``a."b.c".d``) into its parts, unquoted."""
    parts: list[str] = []
    buf = ""
    quote = ""
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
            else:
                buf += ch
        elif ch in "\"'":
            quote = ch
        elif ch == ".":
            parts.append(buf.strip())
            buf = ""
        else:
            buf += ch
    parts.append(buf.strip())
    return parts


class _Scanner:
    """Tracks strings and brackets across lines so continuation lines are skipped."""

    def __init__(self) -> None:
        self.depth = 0
        self.max_depth = 0
        self.multiline = ""  # the open triple-quote delimiter, if any

    def feed(self, text: str) -> None:
        i = 0
        while i < len(text):
            if self.multiline:
                end = _closing_quotes(text, i, self.multiline)
                if end < 0:
                    return
                i = end
                self.multiline = ""
                continue
            ch = text[i]
            if ch == "#":
                return
            if text.startswith('"""', i) or text.startswith("'''", i):
                self.multiline = text[i : i + 3]
                i += 3
                continue
            if ch in "\"'":
                j = i + 1
                while j < len(text) and text[j] != ch:
                    j += 2 if ch == '"' and text[j] == "\\" else 1
                i = j + 1
                continue
            if ch in "[{":
                self.depth += 1
                self.max_depth = max(self.max_depth, self.depth)
            elif ch in "]}":
                self.depth -= 1
            i += 1

    @property
    def busy(self) -> bool:
        return bool(self.multiline) or self.depth > 0


def _closing_quotes(text: str, start: int, delim: str) -> int:
    """Index just past the triple quote closing a multi-line string, or -1 if not on this line.

    Escapes count in basic strings (an escaped quote does not start a delimiter), and
    a run of up to five quotes ends the string with its last three (the string's
    content may end with one or two quotes).
    """
    i = start
    while i < len(text):
        if delim == '"""' and text[i] == "\\":
            i += 2
            continue
        if text.startswith(delim, i):
            end = i + 3
            while end < len(text) and end < i + 5 and text[end] == delim[0]:
                end += 1
            return end
        i += 1
    return -1


def _find_unquoted(line: str, target: str) -> int:
    """Index of `target` in line outside quoted key parts, or -1."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif line.startswith(target, i):
            return i
    return -1


def _header_end(line: str, close: str) -> int:
    """Index of the `close` bracket(s) ending a table header (end of line if missing)."""
    end = _find_unquoted(line, close)
    return end if end >= 0 else len(line)


def key_lines(text: str) -> dict[KeyPath, int]:
    """Map every table header and key path to its 1-based line number.

    Arrays of tables get an index: ``[[irq.rule]]`` twice gives ("irq", "rule", 0)
    and ("irq", "rule", 1); ("irq", "rule") maps to the first one.
    """
    lines: dict[KeyPath, int] = {}
    counts: dict[KeyPath, int] = {}
    table: KeyPath = ()
    scan = _Scanner()
    for lineno, raw in enumerate(text.splitlines(), 1):
        if scan.busy:
            scan.feed(raw)
            continue
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[["):
            name = tuple(_split_key(line[2 : _header_end(line, "]]")]))
            index = counts.get(name, 0)
            counts[name] = index + 1
            table = (*name, index)
            for n in range(1, len(name) + 1):  # [[irq.rule]] also defines [irq]
                lines.setdefault(name[:n], lineno)
            lines[table] = lineno
        elif line.startswith("["):
            table = tuple(_split_key(line[1 : _header_end(line, "]")]))
            for n in range(1, len(table) + 1):
                lines.setdefault(table[:n], lineno)
        else:
            eq = _find_unquoted(line, "=")  # the "=" ending the key part
            if eq < 0:
                continue
            keys = tuple(_split_key(line[:eq]))
            for n in range(1, len(keys) + 1):
                lines.setdefault((*table, *keys[:n]), lineno)
            scan.feed(line[eq + 1 :])
    return lines


def max_nesting(text: str, limit: int) -> int | None:
    """The first line where arrays and inline tables nest deeper than `limit`, or None.

    Run before tomllib, whose parser recurses once per level: a file nested thousands
    deep would raise RecursionError there instead of a clear error.
    """
    scan = _Scanner()
    for lineno, raw in enumerate(text.splitlines(), 1):
        if scan.busy:  # inside a value that spans lines
            scan.feed(raw)
        else:
            line = raw.strip()
            eq = _find_unquoted(line, "=")
            if line.startswith(("[", "#")) or eq < 0:  # a table header, a comment, a blank line
                continue
            scan.feed(line[eq + 1 :])
        if scan.max_depth > limit:
            return lineno
    return None


def nearest_line(lines: dict[KeyPath, int], path: KeyPath) -> int | None:
    """Line of `path`, or of its closest enclosing key or table."""
    for n in range(len(path), 0, -1):
        if path[:n] in lines:
            return lines[path[:n]]
    return None
