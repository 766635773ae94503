"""Costs that must follow the work, not the size of what is owned (issue 19): a step for
one new thread, beside 5,000 owned settings, visits a handful of entries. Counted, not
timed: the engine's tables are dicts that count every entry anything iterates over."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from latencyd.engine import Engine
from latencyd.journal import Journal
from latencyd.plugin import Expansion, Options, Plugin, Target, Value
from latencyd.system import System

OWNED = 5000


class CountingDict(dict[Any, Any]):
    """A dict that counts the entries iterated over (by keys, values, items or iter)."""

    visits = 0

    def _count(self, it: Iterator[Any]) -> Iterator[Any]:
        for x in it:
            CountingDict.visits += 1
            yield x

    def __iter__(self) -> Iterator[Any]:
        return self._count(super().__iter__())

    def keys(self) -> Any:
        return set(self._count(super().__iter__()))

    def values(self) -> Any:
        return list(self._count(iter(super().values())))

    def items(self) -> Any:
        return list(self._count(iter(super().items())))


@dataclass(frozen=True)
class Cell(Target):
    kind: ClassVar[str] = "cell"
    n: int


class MemoryPlugin(Plugin[Cell]):
    """Settings in a dict: the engine's own costs, with nothing else to pay for."""

    name = "mem"
    summary = "in-memory test double"
    targets = (Cell,)

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.cells: dict[int, Value] = {}
        self.reads = 0

    def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion:
        return Expansion()

    def read(self, target: Cell) -> Value:
        self.reads += 1
        return self.cells.get(target.n, 0)

    def write(self, target: Cell, value: Value) -> None:
        self.cells[target.n] = value

    def describe(self, target: Cell, value: Value) -> str:
        return f"cell {target.n} = {value}"


def engine_owning(tmp_path: Path, n: int) -> tuple[Engine, MemoryPlugin]:
    plugin = MemoryPlugin(System(tmp_path))
    engine = Engine({"mem": plugin}, Journal(tmp_path / "state"))
    engine.applied = CountingDict()
    engine.not_applicable = CountingDict()
    engine.switch({("mem", Cell(i)): 1 for i in range(n)}, "p")
    assert len(engine.applied) == n
    assert engine.take_changes() is None  # the first consumer looks at everything once
    CountingDict.visits = 0
    plugin.reads = 0
    return engine, plugin


def test_a_step_for_one_new_target_visits_what_it_changes(tmp_path: Path) -> None:
    engine, plugin = engine_owning(tmp_path, OWNED)
    report = engine.extend("mem", {Cell(OWNED + 1): 1})
    assert report.applied == 1
    assert CountingDict.visits < 20, CountingDict.visits
    assert plugin.reads == 2  # its original, and the read-back
    assert engine.take_changes() == {("mem", Cell(OWNED + 1))}


def test_is_it_mine_is_one_lookup(tmp_path: Path) -> None:
    engine, plugin = engine_owning(tmp_path, OWNED)
    owned = engine.owned("mem")
    assert Cell(7) in owned and owned[Cell(7)] == 1 and Cell(OWNED + 5) not in owned
    assert CountingDict.visits == 0 and plugin.reads == 0


def test_updating_one_device_gives_back_only_what_it_names(tmp_path: Path) -> None:
    engine, _ = engine_owning(tmp_path, OWNED)
    engine.update("mem", {("mem", Cell(3)): 2}, [("mem", Cell(4))], [("mem", Cell(3))])
    assert CountingDict.visits < 20, CountingDict.visits
    assert engine.take_changes() == {("mem", Cell(4))}
    assert ("mem", Cell(4)) not in engine.applied and engine.applied[("mem", Cell(3))] == 2
