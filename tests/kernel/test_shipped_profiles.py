"""Every shipped profile loads on this machine, applies, verifies and restores for real."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import load_plugins
from latencyd.core.profile import ProfileLibrary
from latencyd.kernel.system import System
from latencyd.paths import shipped_profiles_dir

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


def test_realtime_runs_softirq_threads_fifo_on_their_own_cpus_and_turns_thp_off(
    setup: tuple[ProfileLibrary, Engine], kernel_guard: None
) -> None:
    """What realtime adds to cpu-partitioning, read back from the kernel: ksoftirqd/N at
    SCHED_FIFO 2 and still on CPU N only (a policy-only rule), THP never; a policy-only
    rule leaves no *not applicable* line per per-CPU thread."""
    library, engine = setup
    engine.apply(library.load("realtime"))
    try:
        comms = {int(p.name): _comm(p) for p in Path("/proc").iterdir() if p.name.isdigit()}
        softirq = {pid: comm for pid, comm in comms.items() if comm.startswith("ksoftirqd/")}
        assert softirq, "no ksoftirqd threads found"
        for pid, comm in softirq.items():
            assert os.sched_getscheduler(pid) == os.SCHED_FIFO, comm
            assert os.sched_getparam(pid).sched_priority == 2, comm
            assert os.sched_getaffinity(pid) == {int(comm.partition("/")[2])}, comm
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
        assert "[never]" in thp
        refused = engine.sections["kthread"].expansion.refused
        assert not [text for text in refused if "ksoftirqd" in text]
    finally:
        assert engine.off() == []


def _comm(proc: Path) -> str:
    try:
        return proc.joinpath("comm").read_text().strip()
    except OSError:  # gone since the listing
        return ""
