"""Journal: the original value of every setting latencyd changed, durable before the change.

Kept as one small JSON file, replaced atomically (write temp, fsync, rename,
fsync the directory), so after SIGKILL or a crash the next start finds either
the old or the new journal, never a torn one. TuneD keeps originals only in RAM.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencyd.errors import JournalError

FORMAT = 1
SettingId = tuple[str, str]  # (plugin, key)


@dataclass
class JournalState:
    originals: dict[SettingId, Any] = field(default_factory=dict)
    profile: str | None = None


class Journal:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / "journal.json"

    def load(self) -> JournalState | None:
        """The journal left on disk, or None when the last exit was clean."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
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

    def save(self, state: JournalState) -> None:
        by_plugin: dict[str, dict[str, Any]] = {}
        for (plugin, key), value in state.originals.items():
            by_plugin.setdefault(plugin, {})[key] = value
        doc = {"format": FORMAT, "profile": state.profile, "originals": by_plugin}
        data = json.dumps(doc, indent=1, sort_keys=True).encode()
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

    def clear(self) -> None:
        try:
            self.path.unlink(missing_ok=True)
            self._sync_dir()
        except OSError as exc:
            raise JournalError(f"cannot remove journal {self.path}: {exc}") from exc

    def _sync_dir(self) -> None:
        if not self.state_dir.exists():
            return
        dfd = os.open(self.state_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
