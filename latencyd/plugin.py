"""What a plugin is, and how plugins are found.

A plugin turns its profile section into *settings* (key -> wanted value) and
knows how to read and write one setting. Everything else — diffing, the
journal, rollback, verification, status — is the engine's, so every plugin
gets it for free. Values are JSON-serialisable so the journal can hold them.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from latencyd.schema import Schema
from latencyd.system import System
from latencyd.taskevents import TaskEvent

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "latencyd.plugins"

Value = Any  # JSON-serialisable


class Plugin:
    """Base of every plugin: override `expand`, `capture` and `apply`; the rest has defaults."""

    name: ClassVar[str]
    summary: ClassVar[str]
    # An instance may replace its schema when checks need the machine (sysctl keys).
    schema: Schema = Schema()
    # Events that make the engine re-expand this plugin's section (see watchers).
    events: ClassVar[frozenset[str]] = frozenset()
    # How often `changed()` should force a full rescan; the daemon lowers it to every
    # tick when no task-event source is available.
    rescan_interval_s: float = 0.0

    def __init__(self, system: System) -> None:
        self.system = system

    def expand(self, options: Mapping[str, Any]) -> dict[str, Value]:
        """Settings this section wants, by key. Reads the machine, changes nothing."""
        raise NotImplementedError

    def capture(self, key: str) -> Value:
        """The current value of one setting (used to save originals and to verify)."""
        raise NotImplementedError

    def apply(self, key: str, value: Value) -> None:
        """Write one setting. Raise KernelRefused (or NotApplicable) when the kernel says no."""
        raise NotImplementedError

    def restore(self, key: str, original: Value) -> None:
        """Put one captured original back; by default the same as applying it."""
        self.apply(key, original)

    def same(self, key: str, wanted: Value, actual: Value) -> bool:
        """Whether the kernel's value matches what was wanted (override to normalise)."""
        return bool(wanted == actual)

    def optional(self, key: str) -> bool:
        """A setting whose refusal means "not applicable here" rather than a failed profile."""
        return False

    def exists(self, key: str) -> bool:
        """Whether the setting's target still exists (an IRQ, a thread); gone ones are dropped."""
        return True

    def describe(self, key: str, value: Value) -> str:
        return f"{key} = {value}"

    def on_task(self, event: TaskEvent) -> dict[str, Value]:
        """Settings a new or renamed task needs (plugins listening to "thread" events)."""
        return {}

    def follows_user_tasks(self, options: Mapping[str, Any]) -> bool:
        """Whether this section needs exec events of user tasks (not just new kthreads)."""
        return False

    def record_delay(self, event: TaskEvent) -> None:
        """Note how long after the kernel's event the settings were in place."""

    def on_profile_applied(self) -> None:
        """A profile was just applied: reset monitoring baselines (counters "since apply")."""

    def changed(self) -> bool:
        """Cheap check on the monitor tick: has the set of targets changed (new IRQs)?"""
        return False

    def status(self) -> dict[str, Any]:
        """Plugin-specific monitoring data for `latencyctl status`."""
        return {}

    def close(self) -> None:
        """Release held resources (fds); called when the daemon stops."""


def entry_point_specs(group: str, path: list[str] | None = None) -> dict[str, str]:
    """name -> "module:attr" for an entry-point group, read from installed metadata.

    Reads each distribution's entry_points.txt directly: importing importlib.metadata
    (email, zipfile, csv, ...) cost 17 ms and 2.9 MiB of the daemon's start-up here.
    The first distribution on the path to define a name wins, as with importlib.
    """
    found: dict[str, str] = {}
    for entry in sys.path if path is None else path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                text = Path(entry or ".", name, "entry_points.txt").read_text()
            except OSError:
                continue
            section = ""
            for raw in text.splitlines():
                line = raw.strip()
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1].strip()
                elif section == group and "=" in line and not line.startswith(("#", ";")):
                    key, _, value = line.partition("=")
                    found.setdefault(key.strip(), value.strip())
    return found


def discover() -> dict[str, type[Plugin]]:
    """All plugins registered under the `latencyd.plugins` entry-point group (built-ins too)."""
    found: dict[str, type[Plugin]] = {}
    for name, spec in entry_point_specs(ENTRY_POINT_GROUP).items():
        module, _, attr = spec.partition(":")
        try:
            cls = getattr(importlib.import_module(module.strip()), attr.strip())
        except Exception as exc:  # a broken third-party plugin must not stop the daemon
            log.error("plugin %s (%s) failed to load: %s", name, spec, exc)
            continue
        if not (isinstance(cls, type) and issubclass(cls, Plugin)):
            log.error("plugin %s (%s) is not a latencyd Plugin class", name, spec)
            continue
        found[name] = cls
    return found


def load_plugins(system: System) -> dict[str, Plugin]:
    """One instance of every registered plugin, bound to `system`."""
    plugins: dict[str, Plugin] = {}
    for name, cls in discover().items():
        try:
            plugins[name] = cls(system)
        except Exception as exc:  # one plugin that cannot start must not stop the rest
            log.error("plugin %s failed to start: %s", name, exc)
    return plugins
