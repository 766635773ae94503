"""tomlwrite: values as TOML text, for the files latencyd writes and the examples it prints.

One writer for `latencyctl import-tuned` (the profiles it writes) and the man pages (the
examples and defaults they show): keys quoted only where they must be, strings escaped
as TOML requires, integers checked against TOML's 64-bit range.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

INT64 = 1 << 63  # TOML integers are signed 64-bit: -INT64 <= n < INT64


def toml_line(key: str, value: Any) -> str:
    """`key = value` as a line of TOML."""
    return f"{toml_key(key)} = {toml_value(value)}"


def toml_table(array: str, key: str, entry: Mapping[str, Any]) -> list[str]:
    """One entry of the array of tables `array.key` (``[[irq.rule]]``) as TOML lines."""
    return [f"[[{array}.{toml_key(key)}]]", *(toml_line(k, v) for k, v in entry.items())]


def toml_key(key: str) -> str:
    """A key, bare where TOML allows it, else quoted."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_string(key)


def toml_string(text: str) -> str:
    """A basic string, every character TOML does not take as it is escaped."""
    out = ['"']
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(value: Any) -> str:
    """A value as TOML: strings, integers, floats, booleans, arrays, inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if not -INT64 <= value < INT64:
            raise ValueError(f"{value} does not fit a TOML integer")
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(toml_line(str(k), v) for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def toml_section(name: str, values: dict[str, Any]) -> list[str]:
    """A profile section as TOML: arrays of tables as [[name.key]] blocks."""
    lines = []
    tables = {}
    for key, value in values.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables[key] = value
        else:
            lines.append(toml_line(key, value))
    if lines:
        lines.insert(0, f"[{name}]")
    for key, entries in tables.items():
        for entry in entries:
            lines += [""] if lines else []
            lines += toml_table(name, key, entry)
    return lines
