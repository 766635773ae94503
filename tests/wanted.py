"""What a plugin's section wants, keyed the way the engine keys it (for tests)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latencyd.core.engine import SettingId
from latencyd.core.plugin import Plugin


def wanted(plugin: Plugin[Any, Any, Any], options: Mapping[str, Any]) -> dict[SettingId, Any]:
    """The section (validated, as a profile holds it) expanded to its settings as
    engine.switch takes them (nothing owned yet)."""
    expansion = plugin.expand(plugin.options_of(options), {})
    return {(plugin.name, t): v for t, v in expansion.settings.items()}
