"""Every shipped profile loads on this machine, applies, verifies and restores for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import load_plugins
from latencyd.core.profile import ProfileLibrary
from latencyd.core.system import System
from latencyd.service.config import shipped_profiles_dir

SHIPPED = sorted(p.stem for p in shipped_profiles_dir().glob("*.toml"))


@pytest.fixture
def setup(tmp_path: Path) -> tuple[ProfileLibrary, Engine]:
    system = System("/")
    plugins = load_plugins(system)
    library = ProfileLibrary(
        [shipped_profiles_dir()],
        section_schemas(plugins),
        system.machine(),
    )
    return library, Engine(plugins, Journal(tmp_path / "state"))


def test_all_shipped_profiles_are_valid(setup: tuple[ProfileLibrary, Engine]) -> None:
    library, _ = setup
    infos = library.all()
    assert {i.name for i in infos} == set(SHIPPED)
    assert [(i.name, i.error) for i in infos if i.error] == []
    assert all(i.summary for i in infos)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_applies_verifies_and_restores(
    setup: tuple[ProfileLibrary, Engine], name: str, kernel_guard: None
) -> None:
    library, engine = setup
    profile = library.load(name)
    report = engine.apply(profile)
    try:
        # Every profile tunes something, but "untuned", the baseline that tunes nothing.
        assert (report.applied + report.unchanged > 0) == (name != "untuned")
        assert engine.verify() == []
    finally:
        assert engine.off() == []
