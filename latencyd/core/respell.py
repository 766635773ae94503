"""Old spellings of moved options (schema.Moved), read as the new ones.

A profile written for an older version (shipped, a user's, the TuneD importer's) keeps
loading after an option moved to another section: each file is respelled before it is
merged, so includes and overrides work as if every file said it the new way, and the
line numbers go with the keys, so errors, `explain` and `status` point at the line that
was written. Every respelling is logged with that line and the new spelling; a file
that says the same thing both ways is refused, as there is no telling which it means.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from latencyd.core.schema import Moved, Schema
from latencyd.core.tomlpos import KeyPath, nearest_line
from latencyd.errors import Location, ProfileError

log = logging.getLogger(__name__)

Lines = dict[KeyPath, int]


def respell(
    path: Path, data: dict[str, Any], lines: Lines, schemas: Mapping[str, Schema]
) -> tuple[dict[str, Any], Lines] | None:
    """The file's data and key lines with old spellings moved to their new places, or
    None when it has none (the file is used as it is)."""
    moves = [
        (section, move)
        for section, schema in schemas.items()
        for move in schema.moved
        if isinstance(data.get(move.section), dict)
    ]
    if not moves:
        return None
    data, lines = dict(data), dict(lines)
    for section, move in moves:
        if move.option in data[move.section]:
            _move(path, data, lines, section, move)
        _carry_drops(data, lines, section, move)
    for old in {move.section for _, move in moves}:
        if old in data and not data[old]:  # it held only what moved: no empty section
            del data[old]
    return data, lines


def _move(path: Path, data: dict[str, Any], lines: Lines, section: str, move: Moved) -> None:
    old_key, new_key = (move.section, move.option), (section, move.to)
    at = Location(path, nearest_line(lines, old_key))
    old = data[move.section] = dict(data[move.section])
    value = old.pop(move.option)
    if move.only_with is None:
        moving, indices = value, None
        spelled = f"[{move.section}] {move.option} is now [{section}] {move.to}"
    else:
        parts, staying = _split(value, move.only_with)
        kept = [i for i, _ in staying]
        if staying:
            old[move.option] = [entry for _, entry in staying]
        if not parts:
            _renumber(lines, old_key, kept)
            return
        moving, indices = [entry for _, entry in parts], [i for i, _ in parts]
        at = Location(path, nearest_line(lines, (*old_key, indices[0])))  # the first moved
        key, wanted = move.only_with
        spelled = (
            f"[[{move.section}.{move.option}]] with {key} = {_toml(wanted)} is now "
            f"[[{section}.{move.to}]] (without {key})"
        )
    new = data.get(section)
    if isinstance(new, dict) and move.to in new:
        other = nearest_line(lines, new_key)
        raise ProfileError(
            at, f"{spelled}, which this file also has (line {other}): keep that one only"
        )
    if new is not None and not isinstance(new, dict):
        return  # [shield] = 1: the merge says what is wrong with it, where
    log.warning("%s: %s", at, spelled)
    _relocate(lines, old_key, new_key, indices)
    if move.only_with is not None:  # after _relocate: it reads the entries' old numbers
        _renumber(lines, old_key, kept)
    data[section] = {**(new or {}), move.to: moving}
    if at.line is not None:
        lines.setdefault((section,), at.line)
        lines.setdefault(new_key, at.line)


def _split(
    value: Any, only_with: tuple[str, Any]
) -> tuple[list[tuple[int, Any]], list[tuple[int, Any]]]:
    """(index, entry) of an array of tables that move (without the key) and that stay
    (without it where it is false). Anything else stays as written: the old section's
    schema then says what is wrong with it, where it is."""
    key, wanted = only_with
    entries = [value] if isinstance(value, dict) else value if isinstance(value, list) else None
    if entries is None:
        return [], [(0, value)]
    moving, staying = [], []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict) and entry.get(key) == wanted:
            moving.append((i, {k: v for k, v in entry.items() if k != key}))
        elif isinstance(entry, dict) and entry.get(key) is False:
            staying.append((i, {k: v for k, v in entry.items() if k != key}))
        else:
            staying.append((i, entry))
    return moving, staying


def _relocate(lines: Lines, old: KeyPath, new: KeyPath, indices: list[int] | None) -> None:
    """Copies the lines of `old`'s keys to `new` (its entries `indices`, renumbered from
    0, when given), so a position asked of the new spelling is the one written."""
    n = len(old)
    for key, line in list(lines.items()):
        if key[:n] != old:
            continue
        rest = key[n:]
        if indices is None:
            lines[(*new, *rest)] = line
        elif rest and rest[0] in indices:
            lines[(*new, indices.index(int(rest[0])), *rest[1:])] = line
    if (*new, 0) in lines:  # an array of tables is where its first entry is
        lines.setdefault(new, lines[(*new, 0)])


def _renumber(lines: Lines, old: KeyPath, kept: list[int]) -> None:
    """The entries of `old` that stay, renumbered from 0 as the section now holds them."""
    n = len(old)
    entries = {k: v for k, v in lines.items() if k[:n] == old and len(k) > n}
    for key in entries:
        del lines[key]
    for key, line in entries.items():
        if key[n] in kept:
            lines[(*old, kept.index(int(key[n])), *key[n + 1 :])] = line


def _carry_drops(data: dict[str, Any], lines: Lines, section: str, move: Moved) -> None:
    """Inheritance keys of the old section that take away what moved (`drop` naming it,
    `enabled = false`, `replace = true`) take it away from the new section too."""
    old, new = data.get(move.section), data.get(section)
    if not isinstance(old, dict) or (new is not None and not isinstance(new, dict)):
        return
    drop = old.get("drop")
    named = isinstance(drop, list) and move.option in drop
    if not (named or old.get("enabled") is False or old.get("replace") is True):
        return
    given = (new or {}).get("drop", [])
    if not isinstance(given, list):
        return  # the merge says what is wrong with it, where
    # Moved whole, only the new section has it; moved in part (some rules), both do.
    if isinstance(drop, list) and named and move.only_with is None:
        data[move.section] = {**old, "drop": [d for d in drop if d != move.option]}
    data[section] = {**(new or {}), "drop": [*given, move.to]}
    for key in ("drop", "enabled", "replace"):
        if (move.section, key) in lines:
            lines.setdefault((section, "drop"), lines[(move.section, key)])
            lines.setdefault((section,), lines[(move.section, key)])
            break


def _toml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value)
