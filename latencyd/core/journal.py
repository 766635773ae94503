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

import contextlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencyd.errors import FileRefused, JournalError, UnsafePath, describe_oserror
from latencyd.kernel.system import read_regular_at, replace_at, write_all
from latencyd.kernel.trust import open_private_dir

JOURNAL_FILE = "journal.jsonl"  # in the state directory (--state-dir)
BASE_FILE = "base.json"  # the base profile the next start resumes (in the keep directory)
# A journal file larger than this is not read: ~300 bytes an entry, so beyond a million
# owned settings (50,000 tasks own about 100,000).
MAX_FILE_BYTES = 256 * 1024 * 1024
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


def _parse(text: str) -> Any:
    """json.loads, with nesting too deep for the parser said as malformed JSON."""
    try:
        return json.loads(text)
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


class Journal:
    """The journal in `state_dir`, a directory only this user can change (trust.py):
    every file in it is opened relative to the directory, without following symlinks."""

    def __init__(self, state_dir: Path, keep_dir: Path | None = None) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / JOURNAL_FILE
        # Where the base profile is noted (BASE_FILE): a directory a reboot does not empty
        # (latencyd.paths.DEFAULT_KEEP_DIR), unlike the journal's, which /run is. None:
        # the state directory (tests, and a daemon whose choice need not outlast a boot).
        self.keep_dir = Path(keep_dir) if keep_dir is not None else self.state_dir
        self._keep_fd: int | None = None
        # What the journal holds (as loaded, then as written); `_fresh` when the file is a
        # snapshot we wrote followed by our appends, so a delta may be appended to it.
        self._written = JournalState()
        self._fresh = False
        self._lines = 0
        self._cleared = False  # we removed the file and wrote nothing since
        self._dir_fd: int | None = None

    def open(self) -> None:
        """Open the state directory (made, mode 0700, if missing): JournalError if it, or a
        directory above it, could be changed by another user."""
        try:
            self._dir  # noqa: B018 (opened for its check)
        except UnsafePath as exc:
            raise JournalError(f"the journal's state directory: {exc}") from exc

    def close(self) -> None:
        """Let go of the directories (reopened, and checked again, when next used)."""
        for fd in (self._dir_fd, self._keep_fd):
            if fd is not None:
                os.close(fd)
        self._dir_fd = self._keep_fd = None

    @property
    def _dir(self) -> int:
        """The state directory's descriptor (UnsafePath if it cannot be trusted)."""
        if self._dir_fd is None:
            self._dir_fd = open_private_dir(self.state_dir)
        return self._dir_fd

    @property
    def _keep(self) -> int:
        """The keep directory's descriptor (UnsafePath if it cannot be trusted)."""
        if self.keep_dir == self.state_dir:
            return self._dir
        if self._keep_fd is None:
            self._keep_fd = open_private_dir(self.keep_dir)
        return self._keep_fd

    # -- reading ------------------------------------------------------------------
    def _read(self, name: str) -> bytes | None:
        """A regular file of the state directory, whole; None if there is none."""
        try:
            path = self.state_dir / name
            return read_regular_at(self._dir, path, MAX_FILE_BYTES, False, "journal file")
        except FileNotFoundError:
            return None

    def load(self) -> JournalState | None:
        """The journal left on disk, or None when the last exit was clean."""
        try:
            data = self._read(JOURNAL_FILE)
            if data is None:
                return None
            text = data.decode()
        except (OSError, ValueError, UnsafePath, FileRefused) as exc:
            raise JournalError(f"journal {self.path} is unreadable: {_why(exc)}") from exc
        lines = text.splitlines()
        if not lines:
            raise JournalError(f"journal {self.path} is unreadable: the file is empty")
        state, version = self._parse_snapshot(lines[0])
        for number, line in enumerate(lines[1:], 2):
            try:
                delta = _parse(line)
                if not isinstance(delta, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                if number == len(lines) and not text.endswith("\n"):
                    break  # a torn last append: its change never started
                raise JournalError(f"journal {self.path}:{number} is malformed: {exc}") from exc
            self._apply_delta(state, delta, number, version)
        # What the disk holds now; the next change rewrites it whole (_fresh is False).
        self._written = JournalState(dict(state.originals), state.profile)
        self._fresh = False
        return state

    def _parse_snapshot(self, line: str) -> tuple[JournalState, int]:
        try:
            doc = _parse(line)
        except ValueError as exc:
            raise JournalError(f"journal {self.path} is unreadable: {exc}") from exc
        if not isinstance(doc, dict):
            raise JournalError(f"journal {self.path} is not a JSON object")
        version = doc.get("format")
        if version not in READABLE or isinstance(version, bool):
            raise JournalError(f"journal {self.path} has unknown format {version!r}"[:300])
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
        except (ValueError, RecursionError) as exc:
            raise JournalError(f"journal {self.path} has malformed originals: {exc}") from exc
        return JournalState(originals, _profile(doc.get("profile"), self.path, 1)), version

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
        except (TypeError, ValueError, RecursionError) as exc:
            raise JournalError(f"journal {self.path}:{number} is malformed: {exc}") from exc
        if "profile" in delta:
            state.profile = _profile(delta["profile"], self.path, number)

    # -- writing ------------------------------------------------------------------
    def record(
        self,
        updates: Mapping[JournalKey, Any],
        drops: Iterable[JournalKey],
        profile: str | None,
    ) -> None:
        """Change some originals (and the profile): one appended delta of what really
        changed, a fresh snapshot when the file has grown (or was not written by us, or a
        write failed), or no file at all once nothing is left. The cost follows the
        change, not the size. What is kept in memory changes only once the disk holds it:
        after a failed write (JournalError) both still hold what they held before."""
        written = self._written
        state = written.originals
        changed = [(key, v) for key, v in updates.items() if state.get(key, _NONE) != v]
        dropped = [key for key in set(drops) if key in state]
        added = sum(1 for key, _ in changed if key not in state)
        if len(state) + added - len(dropped) == 0:
            self.clear()
            return
        if not self._fresh or self._lines > len(state) + added + COMPACT_SLACK:
            after = JournalState(dict(state), profile)
            after.originals.update(changed)
            for key in dropped:
                del after.originals[key]
            self._write_snapshot(after)
            self._written = after
            return
        delta: dict[str, Any] = {}
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
        if delta:
            self._append(json.dumps(delta, separators=(",", ":")) + "\n")
        state.update(changed)
        for key in dropped:
            del state[key]
        written.profile = profile

    def save(self, state: JournalState) -> None:
        """Make the file hold exactly `state`."""
        held = self._written.originals
        self.record(state.originals, [k for k in held if k not in state.originals], state.profile)

    def _replace(self, name: str, data: bytes) -> None:
        """Make `name` hold `data`, never torn: a fresh temporary file (O_EXCL, no symlink
        followed), written whole and fsync'd, renamed over it, the directory fsync'd."""
        replace_at(self._dir, name, data, name.rsplit(".", 1)[0] + ".tmp", 0o600)

    def _write_snapshot(self, state: JournalState) -> None:
        data = (json.dumps(_snapshot(state), sort_keys=True, separators=(",", ":")) + "\n").encode()
        try:
            self._replace(JOURNAL_FILE, data)
        except (OSError, UnsafePath) as exc:
            self._fresh = False
            raise JournalError(f"cannot write journal {self.path}: {_why(exc)}") from exc
        self._fresh = True
        self._lines = 1
        self._cleared = False

    def _append(self, line: str) -> None:
        """One delta, whole and fsync'd. A failed append is cut off again where it began
        (so no torn line is ever followed by another), and the next change writes a
        whole snapshot instead of appending to a file it cannot vouch for."""
        try:
            fd = os.open(JOURNAL_FILE, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=self._dir)  # fmt: skip
        except (OSError, UnsafePath) as exc:
            self._fresh = False
            raise JournalError(f"cannot append to journal {self.path}: {_why(exc)}") from exc
        try:
            size = os.fstat(fd).st_size
            try:
                write_all(fd, line.encode())
                os.fsync(fd)
            except OSError as exc:
                self._fresh = False
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                raise JournalError(f"cannot append to journal {self.path}: {_why(exc)}") from exc
        finally:
            os.close(fd)
        self._lines += 1

    def clear(self) -> None:
        """Remove the journal (once: removing it again would cost a directory fsync)."""
        if self._cleared:
            return
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(JOURNAL_FILE, dir_fd=self._dir)
            os.fsync(self._dir)
        except (OSError, UnsafePath) as exc:
            raise JournalError(f"cannot remove journal {self.path}: {_why(exc)}") from exc
        self._written = JournalState()
        self._fresh = False
        self._lines = 0
        self._cleared = True

    def set_aside(self) -> Path:
        """Move an unreadable journal out of the way (kept for a human to read) so the
        daemon can start; returns where it went."""
        aside = f"{JOURNAL_FILE}.unreadable-{int(time.time())}"
        try:
            os.replace(JOURNAL_FILE, aside, src_dir_fd=self._dir, dst_dir_fd=self._dir)
            os.fsync(self._dir)
        except (OSError, UnsafePath) as exc:
            raise JournalError(
                f"cannot move unreadable journal {self.path} aside: {_why(exc)}"
            ) from exc
        self._written = JournalState()
        self._fresh = False
        self._lines = 0
        return self.state_dir / aside

    # -- the base profile, so the next start resumes it -----------------------------
    def save_base(self, ref: str | None) -> None:
        """Note the base profile (None: switched off) for every later start, a reboot's
        included, as `tuned-adm profile` is kept: the next start resumes it instead of the
        configured default. Written like a snapshot; a failure only loses the resume, so it
        is logged by the caller, not fatal."""
        path = self.keep_dir / BASE_FILE
        try:
            replace_at(self._keep, BASE_FILE, (json.dumps({"base": ref}) + "\n").encode(),
                       "base.tmp", 0o600)  # fmt: skip
        except (OSError, UnsafePath) as exc:
            raise JournalError(f"cannot write {path}: {_why(exc)}") from exc

    def load_base(self) -> tuple[bool, str | None]:
        """(found, ref) of the base profile a previous run left noted."""
        try:
            data = read_regular_at(self._keep, self.keep_dir / BASE_FILE, MAX_FILE_BYTES, False,
                                   "journal file")  # fmt: skip
            parsed = _parse(data.decode())
        except (OSError, ValueError, UnsafePath, FileRefused):
            return False, None
        ref = parsed.get("base") if isinstance(parsed, dict) else None
        return isinstance(parsed, dict) and "base" in parsed, ref if isinstance(ref, str) else None


def _why(exc: Exception) -> str:
    """Why a journal file could not be used (they are all opened with O_NOFOLLOW)."""
    return describe_oserror(exc, nofollow=True) if isinstance(exc, OSError) else str(exc)


def _profile(value: Any, path: Path, line: int) -> str | None:
    """The journal's profile name, which must be a name or null."""
    if value is None or isinstance(value, str):
        return value
    raise JournalError(f"journal {path}:{line} names no profile: {value!r}"[:300])
