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
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencyd.errors import JournalError

# 3: keys are targets in canonical JSON (2 had plugin-specific string keys).
FORMAT = 3
JournalKey = tuple[str, str]  # (plugin, the target as canonical JSON)
COMPACT_SLACK = 256  # appended lines allowed beyond the number of originals
_NONE = object()


@dataclass
class JournalState:
    originals: dict[JournalKey, Any] = field(default_factory=dict)
    profile: str | None = None


def _snapshot(state: JournalState) -> dict[str, Any]:
    by_plugin: dict[str, dict[str, Any]] = {}
    for (plugin, key), value in state.originals.items():
        by_plugin.setdefault(plugin, {})[key] = value
    return {"format": FORMAT, "profile": state.profile, "originals": by_plugin}


class Journal:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / "journal.jsonl"
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
        state = self._parse_snapshot(lines[0])
        for number, line in enumerate(lines[1:], 2):
            try:
                delta = json.loads(line)
                if not isinstance(delta, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                if number == len(lines) and not text.endswith("\n"):
                    break  # a torn last append: its change never started
                raise JournalError(f"journal {self.path}:{number} is malformed: {exc}") from exc
            self._apply_delta(state, delta, number)
        return state

    def _parse_snapshot(self, line: str) -> JournalState:
        try:
            doc = json.loads(line)
        except ValueError as exc:
            raise JournalError(f"journal {self.path} is unreadable: {exc}") from exc
        if not isinstance(doc, dict):
            raise JournalError(f"journal {self.path} is not a JSON object")
        if doc.get("format") != FORMAT:
            raise JournalError(f"journal {self.path} has unknown format {doc.get('format')!r}")
        by_plugin = doc.get("originals", {})
        if not isinstance(by_plugin, dict) or not all(
            isinstance(settings, dict) for settings in by_plugin.values()
        ):
            raise JournalError(f"journal {self.path} has malformed originals")
        originals = {
            (plugin, key): value
            for plugin, settings in by_plugin.items()
            for key, value in settings.items()
        }
        return JournalState(originals, doc.get("profile"))

    def _apply_delta(self, state: JournalState, delta: dict[str, Any], number: int) -> None:
        try:
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
        changed = [[p, k, v] for (p, k), v in updates.items() if state.get((p, k), _NONE) != v]
        dropped = [[p, k] for (p, k) in drops if (p, k) in state]
        for p, k, v in changed:
            state[(p, k)] = v
        for p, k in dropped:
            del state[(p, k)]
        if changed:
            delta["set"] = changed
        if dropped:
            delta["drop"] = dropped
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
