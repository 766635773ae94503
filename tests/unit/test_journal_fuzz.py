"""Adopting whatever journal a previous run left: after `kill -9` the next start adopts it,
so a journal that cannot be used must never crash the daemon (a crash-loop under
systemd's Restart=, with nothing able to restore the machine). Every journal, of every
target kind and value kind, truncated, hand-edited or from another version, either
adopts and applies cleanly or is refused with a LatencydError; `off` then restores what
it can and never raises."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path
from typing import Any

import pytest

from latencyd.core.engine import ADOPTED, Engine
from latencyd.core.journal import Journal
from latencyd.core.profile import Profile
from latencyd.errors import LatencydError
from latencyd.kernel.system import System
from tests.fuzzjournal import applied_journal, machine, plugins_on
from tests.unit.fakesys import put, tree_bytes

JUNK: list[Any] = [
    None, 0, -1, 2**70, 1.5, True, "", "garbage", "0-1", "<adopted>", [], [1, "x"],
    ["fifo"], {"a": 1}, {"": []}, [[[[]]]],
]  # fmt: skip


def restart(system: System, profile: Profile, journal: Journal) -> Engine:
    """What the next start does: adopt, apply the profile (or fail cleanly), and later off."""
    engine = Engine(plugins_on(system), Journal(journal.state_dir))
    engine.adopt()
    with contextlib.suppress(LatencydError):
        engine.apply(profile)
    assert not any(v is ADOPTED for v in engine.owned("irq").values())
    return engine


def test_a_restart_under_isolation_adopts_and_tunes_an_irq_born_since(tmp_path: Path) -> None:
    """The crash of issue 15: a new IRQ's original is decided from the adopted default
    affinity, whose applied value the engine did not know ('<adopted>' reached irq.same)."""
    system, profile, journal, _ = applied_journal(tmp_path)
    root = system.root
    assert (root / "proc/irq/default_smp_affinity").read_text().strip() == "1"  # CPU 0
    interrupts = (root / "proc/interrupts").read_text()
    (root / "proc/interrupts").write_text(interrupts + "\n 50:  0  0  0  0  PCI-MSIX  virtio9-tx")
    put(root, "proc/irq/50/smp_affinity_list", "0")  # born with the profile's default
    engine = Engine(plugins_on(system), Journal(journal.state_dir))
    engine.adopt()
    report = engine.apply(profile)
    assert report.not_applicable == {}
    assert engine.verify() == []
    assert engine.off() == []
    assert not journal.path.exists()
    # Without the profile it would have had the machine's own default: all four CPUs.
    assert (root / "proc/irq/50/smp_affinity_list").read_text().strip() == "0-3"
    assert (root / "proc/irq/default_smp_affinity").read_text().strip() == "f"


def test_an_intact_journal_restores_the_machine_exactly(tmp_path: Path) -> None:
    before_dir = tmp_path / "before"
    before = tree_bytes(machine(before_dir).root, "sys")
    system, profile, journal, _ = applied_journal(tmp_path)
    engine = restart(system, profile, journal)
    assert engine.off() == []
    assert tree_bytes(system.root, "sys") == before
    assert not journal.path.exists()


def mutate(text: str, rng: random.Random) -> str:
    """One damage of the kinds a journal meets: torn, edited by hand, another version."""
    lines = text.splitlines(keepends=True)
    op = rng.randrange(7)
    try:
        doc = json.loads(lines[0])
    except (IndexError, ValueError):
        op = 0  # already torn: tear it further
    if op == 0:  # torn anywhere (not only at an append's end)
        return text[: rng.randrange(len(text) + 1)]
    # A snapshot's originals: per plugin, records [value, field names, rows of values].
    records = [
        r
        for plugin in sorted(doc["originals"])
        if isinstance(doc["originals"][plugin], list)
        for r in doc["originals"][plugin]
        if isinstance(r, list) and len(r) == 3 and isinstance(r[2], list) and r[2]
    ]
    if not records and op in (2, 3, 4):
        op = 5  # an earlier damage left no record to damage further
    if op == 1:  # another format version (3 reads a table per plugin: these are lists)
        doc["format"] = rng.choice([2, 3, 5, "4", None, True])
    elif op in (2, 3):  # a value of the wrong kind
        rng.choice(records)[0] = rng.choice(JUNK)
    elif op == 4:  # a target of the wrong shape (field types, unknown kinds, row lengths)
        record = rng.choice(records)
        row = rng.choice(record[2])
        if rng.randrange(4) and isinstance(row, list) and row:
            row[rng.randrange(len(row))] = rng.choice(JUNK)
        else:
            record[rng.randrange(3)] = rng.choice(JUNK)
    elif op == 5:  # a plugin's records that are not a list, or an unknown plugin
        doc["originals"][rng.choice(["irq", "kthread", "nosuch"])] = rng.choice(JUNK)
    else:  # junk appended deltas
        extra = rng.choice(
            ['{"set":[["irq","x"]]}', '{"drop":[1]}', "[]", '{"profile":7}',
             '{"set":[["irq","0",["irq"],[[1,2]]]]}', '{"drop":[["irq",null,[5]]]}']
        )  # fmt: skip
        return text + extra + "\n"
    return json.dumps(doc, separators=(",", ":")) + "\n" + "".join(lines[1:])


@pytest.mark.parametrize("seed", range(40))
def test_any_damaged_journal_starts_cleanly(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    system, profile, journal, text = applied_journal(tmp_path)
    for _ in range(rng.randrange(1, 4)):
        text = mutate(text, rng)
    journal.path.write_text(text)
    engine = restart(system, profile, journal)  # raises nothing but LatencydError
    problems = engine.off()
    assert isinstance(problems, list)
    assert not journal.path.exists()  # restored, or set aside for a human to read
