"""sysfs plugin on the real /sys: a bracketed-choice file (transparent hugepages) set through
the engine, read back, verified and restored byte for byte."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from latencyd.plugins.sysfs import SysfsFile, SysfsPlugin, bracketed

from latencyd.core.engine import Engine, plugin_options, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.profile import Profile
from latencyd.core.schema import validate
from latencyd.kernel.system import System

pytestmark = pytest.mark.usefixtures("kernel_guard")
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.fixture
def original() -> Iterator[bytes]:
    """THP's `enabled` as found; put back even if the test fails half-way."""
    if not THP.exists():
        pytest.skip(f"{THP} is absent: this kernel has no transparent hugepages")
    before = THP.read_bytes()
    yield before
    if THP.read_bytes() != before:
        choices = bracketed(before.decode())
        assert choices is not None
        THP.write_text(choices[1])


def test_a_bracketed_choice_is_set_verified_and_restored(original: bytes, tmp_path: Path) -> None:
    choices = bracketed(original.decode())
    assert choices is not None, f"{THP} is not a bracketed-choice file: {original!r}"
    words, chosen = choices
    # Another choice, the least disruptive first ("never" only stops new huge pages).
    other = next(w for w in ("never", "madvise", *words) if w in words and w != chosen)

    system = System("/")
    plugin = SysfsPlugin(system)
    schema = section_schemas({"sysfs": plugin})["sysfs"]
    section = validate(schema, {str(THP): other}, system.machine())
    assert plugin_options(section) == {str(THP): other}
    profile = Profile("thp", tmp_path / "thp.toml", "", {"sysfs": section}, {})
    engine = Engine({"sysfs": plugin}, Journal(tmp_path / "state"))

    report = engine.apply(profile)
    assert report.applied == 1 and report.not_applicable == {}
    target = SysfsFile(str(THP))
    assert plugin.read(target) == other
    assert f"[{other}]" in THP.read_text().split()
    assert engine.verify() == []

    assert engine.off() == []
    assert THP.read_bytes() == original
    assert plugin.read(target) == chosen
    assert not (tmp_path / "state" / "journal.jsonl").exists()
