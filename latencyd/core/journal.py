"""Journal: the original value of every setting latencyd changed, durable before the change.

One file of JSON lines: a snapshot (the first line), then deltas appended as
settings are first changed or given back. Every write is fsync'd before the
engine touches the kernel, so after SIGKILL or a crash the next start knows
every original. A snapshot is written to a temp file and renamed into place
(never torn); an append torn by a crash can only be the last line, and it
announced a change that had not started yet, so it is ignored. Appending keeps
the cost per new thread or IRQ constant instead of rewriting every original;
the file is compacted back into one snapshot as it grows.
TuneD keeps originals only in RAM.

Settings with the same original are one record: 20,000 threads narrowed by a shield,
all of them allowed on every CPU before, are one value and one table of their targets'
fields (one row each), not 20,000 entries each spelling its target out.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencyd.core.errors import JournalError

JOURNAL_FILE = "journal.jsonl"  # in the state directory (--state-dir)
# 4: settings with the same original are one record (_group); 3 had one entry per setting
# (still read: a journal a crash left before an upgrade); 2 had plugin-specific keys.
FORMAT = 4
READABLE = (3, 4)
JournalKey = tuple[str, str]  # (plugin, the target as canonical JSON)
COMPACT_SLACK = 256  # appended lines allowed beyond the number of originals
_NONE = object()


_quote = json.encoder.encode_basestring_ascii  # what json.dumps quotes strings with


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


Columns = tuple[tuple[str, ...] | None, tuple[Any, ...]]
_COLUMNS: dict[str, Columns] = {}  # of the keys made by key_of, so record() parses none
_COLUMNS_KEPT = 1 << 16  # as many as engine._key keeps: a 50,000-task server's settings
_NAMES: dict[tuple[str, ...], tuple[str, ...]] = {}  # each kind's field names, sorted once


def key_of(fields: Mapping[str, Any]) -> str:
    """The journal's key for a target (its fields, `kind` too): canonical JSON."""
    order = tuple(fields)
    names = _NAMES.get(order)
    if names is None:
        names = _NAMES[order] = tuple(sorted(order))
    row = tuple(fields[n] for n in names)
    key = _flat_canonical(names, row) or _canonical(fields)
    if len(_COLUMNS) >= _COLUMNS_KEPT:
        _COLUMNS.clear()
    _COLUMNS[key] = (names, row)
    return key


def _flat_canonical(names: tuple[str, ...], row: tuple[Any, ...]) -> str | None:
    """_canonical of a dict of str and int values, without the json module's general
    path (a third of a 20,000-thread switch); None for anything else."""
    parts = []
    for name, value in zip(names, row, strict=True):
        if type(value) is int:
            parts.append(f"{_quote(name)}:{value}")
        elif type(value) is str:
            parts.append(f"{_quote(name)}:{_quote(value)}")
        else:
            return None
    return "{" + ",".join(parts) + "}"


def _columns(key: str) -> Columns:
    """A key as (field names, the row of their values) when it is a target in canonical
    JSON with plain fields; else (None, (key,)): kept whole."""
    known = _COLUMNS.get(key)
    if known is not None:
        return known
    try:
        obj = json.loads(key)
    except ValueError:
        return None, (key,)
    if (
        not isinstance(obj, dict)
        or _canonical(obj) != key
        or not all(v is None or isinstance(v, str | int) for v in obj.values())
    ):
        return None, (key,)
    return tuple(obj), tuple(obj.values())


def _group(items: Iterable[tuple[JournalKey, Any]]) -> dict[str, list[list[Any]]]:
    """Per plugin, the records of format 4: [value, field names or null, rows], one per
    value and kind of key (a row is a key's field values, or the key whole)."""
    # Values compared as JSON, but a string (the common case) as itself: no encoding.
    groups: dict[tuple[str, bool, str, tuple[str, ...] | None], list[Any]] = {}
    for (plugin, key), value in items:
        fields, row = _columns(key)
        text = isinstance(value, str)
        same = (plugin, text, value if text else _canonical(value), fields)
        rows = groups.setdefault(same, [value, []])[1]
        rows.append(key if fields is None else list(row))
    out: dict[str, list[list[Any]]] = {}
    for (plugin, _, _, fields), (value, rows) in groups.items():
        out.setdefault(plugin, []).append([value, None if fields is None else list(fields), rows])
    return out


def _ungroup(records: Any) -> Iterable[tuple[str, Any]]:
    """(key, value) of each setting in a plugin's records (ValueError if malformed)."""
    if not isinstance(records, list):
        raise ValueError("not a list of records")
    for record in records:
        if not isinstance(record, list) or len(record) != 3 or not isinstance(record[2], list):
            raise ValueError(f"not a record: {record!r}"[:200])
        value, fields, rows = record
        for row in rows:
            if fields is None:
                if not isinstance(row, str):
                    raise ValueError(f"not a key: {row!r}"[:200])
                yield row, value
            elif (
                isinstance(fields, list)
                and all(isinstance(f, str) for f in fields)
                and isinstance(row, list)
                and len(row) == len(fields)
            ):
                yield _canonical(dict(zip(fields, row, strict=True))), value
            else:
                raise ValueError(f"a row that does not fit its fields: {row!r}"[:200])


@dataclass
class JournalState:
    originals: dict[JournalKey, Any] = field(default_factory=dict)
    profile: str | None = None


def _snapshot(state: JournalState) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "profile": state.profile,
        "originals": _group(state.originals.items()),
    }


def _entries_v3(settings: Any) -> Iterable[tuple[str, Any]]:
    """A plugin's originals in format 3: {key: value}."""
    if not isinstance(settings, dict):
        raise ValueError("not a table of settings")
    return settings.items()


class Journal:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / JOURNAL_FILE
        # What the journal holds (as loaded, then as written); `_fresh` when the file is a
        # snapshot we wrote followed by our appends, so a delta may be appended to it.
        self._written = JournalState()
        self._fresh = False
        self._lines = 0
        self._cleared = False  # we removed the file and wrote nothing since

    # -- reading ------------------------------------------------------------------
    def load(self) -> JournalState | None:
        """The journal left on disk, or None when the last exit was clean."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise JournalError(f"journal {self.path} is unreadable: {exc}") from exc
        lines = text.splitlines()
        if not lines:
            raise JournalError(f"journal {self.path} is unreadable: the file is empty")
        state, version = self._parse_snapshot(lines[0])
        for number, line in enumerate(lines[1:], 2):
            try:
                delta = json.loads(line)
                if not isinstance(delta, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                if number == len(lines) and not text.endswith("\n"):
                    break  # a torn last append: its change never started
                raise JournalError(f"journal {self.path}:{number} is malformed: {exc}") from exc
            self._apply_delta(state, delta, number, version)
        return state

    def _parse_snapshot(self, line: str) -> tuple[JournalState, int]:
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise JournalError(f"journal {self.path} is unreadable: {exc}") from exc
        if not isinstance(doc, dict):
            raise JournalError(f"journal {self.path} is not a JSON object")
        version = doc.get("format")
        if version not in READABLE or isinstance(version, bool):
            raise JournalError(f"journal {self.path} has unknown format {version!r}")
        by_plugin = doc.get("originals", {})
        try:
            if not isinstance(by_plugin, dict):
                raise ValueError("not a table of plugins")
            originals = {
                (plugin, key): value
                for plugin, settings in by_plugin.items()
                for key, value in (
                    _ungroup(settings) if version == FORMAT else _entries_v3(settings)
                )
            }
        except ValueError as exc:
            raise JournalError(f"journal {self.path} has malformed originals: {exc}") from exc
        return JournalState(originals, doc.get("profile")), version

    def _apply_delta(
        self, state: JournalState, delta: dict[str, Any], number: int, version: int
    ) -> None:
        try:
            if version == FORMAT:
                for plugin, *record in delta.get("set", []):
                    for key, value in _ungroup([record]):
                        state.originals[(plugin, key)] = value
                for plugin, *record in delta.get("drop", []):
                    for key, _ in _ungroup([[None, *record]]):
                        state.originals.pop((plugin, key), None)
            else:
                for plugin, key, value in delta.get("set", []):
                    state.originals[(plugin, key)] = value
                for plugin, key in delta.get("drop", []):
                    state.originals.pop((plugin, key), None)
        except (TypeError, ValueError) as exc:
            raise JournalError(f"journal {self.path}:{number} is malformed: {exc}") from exc
        if "profile" in delta:
            state.profile = delta["profile"]

    # -- writing ------------------------------------------------------------------
    def record(
        self,
        updates: Mapping[JournalKey, Any],
        drops: Iterable[JournalKey],
        profile: str | None,
    ) -> None:
        """Change some originals (and the profile): one appended delta of what really
        changed, a fresh snapshot when the file has grown (or was not written by us), or
        no file at all once nothing is left. The cost follows the change, not the size."""
        written = self._written
        state = written.originals
        delta: dict[str, Any] = {}
        changed = [(key, v) for key, v in updates.items() if state.get(key, _NONE) != v]
        dropped = [key for key in drops if key in state]
        for key, v in changed:
            state[key] = v
        for key in dropped:
            del state[key]
        if changed:
            grouped = _group(changed).items()
            delta["set"] = [[plugin, *record] for plugin, records in grouped for record in records]
        if dropped:
            delta["drop"] = [
                [plugin, fields, rows]
                for plugin, records in _group((key, None) for key in dropped).items()
                for _, fields, rows in records
            ]
        if profile != written.profile:
            delta["profile"] = profile
        written.profile = profile
        if not state:
            self.clear()
            return
        if not self._fresh or self._lines > len(state) + COMPACT_SLACK:
            self._write_snapshot(written)
        elif delta:
            self._append(json.dumps(delta, separators=(",", ":")) + "\n")

    def save(self, state: JournalState) -> None:
        """Make the file hold exactly `state`."""
        held = self._written.originals
        self.record(state.originals, [k for k in held if k not in state.originals], state.profile)

    def _write_snapshot(self, state: JournalState) -> None:
        data = (json.dumps(_snapshot(state), sort_keys=True, separators=(",", ":")) + "\n").encode()
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self._sync_dir()
        except OSError as exc:
            raise JournalError(f"cannot write journal {self.path}: {exc}") from exc
        if state is not self._written:
            self._written = JournalState(dict(state.originals), state.profile)
        self._fresh = True
        self._lines = 1
        self._cleared = False

    def _append(self, line: str) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            raise JournalError(f"cannot append to journal {self.path}: {exc}") from exc
        self._lines += 1

    def clear(self) -> None:
        """Remove the journal (once: removing it again would cost a directory fsync)."""
        if self._cleared:
            return
        try:
            self.path.unlink(missing_ok=True)
            self._sync_dir()
        except OSError as exc:
            raise JournalError(f"cannot remove journal {self.path}: {exc}") from exc
        self._written = JournalState()
        self._fresh = False
        self._lines = 0
        self._cleared = True

    def set_aside(self) -> Path:
        """Move an unreadable journal out of the way (kept for a human to read) so the
        daemon can start; returns where it went."""
        aside = self.path.with_name(f"{self.path.name}.unreadable-{int(time.time())}")
        try:
            os.replace(self.path, aside)
            self._sync_dir()
        except OSError as exc:
            raise JournalError(f"cannot move unreadable journal {self.path} aside: {exc}") from exc
        self._written = JournalState()
        self._fresh = False
        self._lines = 0
        return aside

    # -- the base profile, so a restart resumes it ---------------------------------
    def save_base(self, ref: str | None) -> None:
        """Note the base profile (None: switched off) for the next start of this boot: a
        restart or a crash resumes it instead of the configured default. Written like a
        snapshot (temp file, fsync, rename); a failure only loses the resume, so it is
        logged by the caller, not fatal."""
        data = (json.dumps({"base": ref}) + "\n").encode()
        path = self.state_dir / "base.json"
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(path.with_suffix(".tmp"), path)
        except OSError as exc:
            raise JournalError(f"cannot write {path}: {exc}") from exc

    def load_base(self) -> tuple[bool, str | None]:
        """(found, ref) of the base profile a previous run of this boot left in force."""
        try:
            data = json.loads((self.state_dir / "base.json").read_text())
        except (OSError, ValueError):
            return False, None
        ref = data.get("base") if isinstance(data, dict) else None
        return isinstance(data, dict) and "base" in data, ref if isinstance(ref, str) else None

    def forget_base(self) -> None:
        """After a stop that restored everything: the next start begins from the default."""
        try:
            (self.state_dir / "base.json").unlink(missing_ok=True)
        except OSError as exc:
            raise JournalError(f"cannot remove {self.state_dir / 'base.json'}: {exc}") from exc

    def _sync_dir(self) -> None:
        if not self.state_dir.exists():
            return
        dfd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
