"""A fake machine tuned by every plugin, and the journal it leaves when killed: what the
journal fuzz of the suite (tests/unit/test_journal_fuzz.py) and of bench/fuzz.py mutate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import Plugin, discover
from latencyd.core.profile import Profile
from latencyd.core.schema import validate
from latencyd.kernel.system import System
from tests.unit.fakesys import add_task, make_fake_machine

# Every plugin's example, and isolation (the sections whose new targets consult what the
# profile owns: a new IRQ's original is the machine's default affinity, not the profile's).
EXTRA: dict[str, dict[str, Any]] = {
    "irq": {"isolate": "1", "default_affinity": "0"},
    "kthread": {
        "writeback_cpumask": "0",
        "rule": [{"match": "^kswapd", "cpus": "0"}],
    },
    "shield": {"cpus": "1"},
}


def machine(tmp_path: Path) -> System:
    system = make_fake_machine(tmp_path)
    add_task(system.root, 300, "app", threads=(301,))
    system.sched.add(300)  # the fake machine's scheduler
    system.sched.add(301)
    return system


def plugins_on(system: System) -> dict[str, Plugin[Any, Any, Any]]:
    return {name: cls(system) for name, cls in discover().items()}


def profile_on(system: System, plugins: dict[str, Plugin[Any, Any, Any]]) -> Profile:
    schemas = section_schemas(plugins)
    sections = {
        name: validate(schemas[name], EXTRA.get(name, plugin.example), system.machine())
        for name, plugin in plugins.items()
    }
    return Profile("fuzz", Path("fuzz.toml"), "", sections, {})


def applied_journal(tmp_path: Path) -> tuple[System, Profile, Journal, str]:
    """A fake machine under the profile, killed: the journal it leaves."""
    system = machine(tmp_path)
    plugins = plugins_on(system)
    profile = profile_on(system, plugins)
    journal = Journal(tmp_path / "state")
    Engine(plugins, journal).apply(profile)
    return system, profile, journal, journal.path.read_text()
