"""Costs that must follow the work, not the size of what is owned (issue 19): a step for
one new thread, beside 5,000 owned settings, visits a handful of entries, and holding a
profile reads back a bounded slice per poll. Counted, not timed: the engine's tables are
dicts that count every entry anything iterates over, and the plugin counts its reads."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
from latencyd.plugins.shield import ShieldPlugin

from latencyd.core.engine import Engine
from latencyd.core.journal import Journal
from latencyd.core.plugin import Expansion, Options, Plugin, Target, Value
from latencyd.core.profile import ProfileLibrary
from latencyd.cpuset import CpuSet
from latencyd.kernel.system import Machine, System
from latencyd.service.daemon import Daemon
from latencyd.service.main import DriftWatch
from tests.unit.fakesys import FakeSched, add_task, make_fake_root

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


class MemoryPlugin(Plugin[Cell, None, Options]):
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


class StubLoop:
    """The main loop's calls, recorded; nothing runs by itself."""

    def __init__(self) -> None:
        self.timeouts: list[tuple[int, Any]] = []

    def fd_add(self, fd: int, callback: Any, *args: Any) -> int:
        return 1

    def timeout_add(self, ms: int, callback: Any) -> int:
        self.timeouts.append((ms, callback))
        return len(self.timeouts)

    def source_remove(self, source: int) -> None:
        pass


def test_read_back_is_bounded_per_poll_and_covers_everything_in_turn(tmp_path: Path) -> None:
    """Quiet while holding: beside 1,000 owned thread affinities a poll reads 256, and
    four polls read each exactly once; drift is put back when its turn comes."""

    engine, plugin = engine_owning(tmp_path, 1000)
    engine.take_changes()
    engine._changes = None  # a watcher that starts now sees everything once
    daemon = Daemon(
        plugin.system,
        {"mem": plugin},
        ProfileLibrary([], {}, Machine(CpuSet({0}), 1 << 30)),
        engine,
    )
    loop = StubLoop()
    watch = DriftWatch(daemon, loop, 1.0)  # type: ignore[arg-type]
    watch.sync()
    assert len(watch.unwatched) == 1000 and loop.timeouts[0][0] == 1000
    plugin.cells[999] = 7  # drift on one thread
    reads_per_poll = []
    for _ in range(4):
        before = plugin.reads
        watch._poll()
        reads_per_poll.append(plugin.reads - before)
    assert reads_per_poll == [256, 256, 256, 232]
    assert plugin.cells[999] == 1  # put back within the round
    assert daemon.readback == {
        "settings_without_a_file": 1000,
        "read_per_poll": 256,
        "poll_interval_s": 1.0,
        "each_checked_every_s": 4.0,
    }


def jvm_of_200_threads(tmp_path: Path) -> tuple[System, FakeSched]:
    """A fake machine of 4 CPUs with one process (pid 1000, "jvm") of 200 threads."""
    root = make_fake_root(tmp_path)
    sched = FakeSched({0, 1, 2, 3})
    threads = tuple(range(1001, 1200))
    add_task(root, 1000, "jvm", threads=threads)
    for tid in (1000, *threads):
        sched.add(tid)
    return System(root, sched=sched), sched


def shielding_daemon(tmp_path: Path, system: System) -> Daemon:
    """A daemon with the shield plugin alone and profile "p": the shield of CPU 1."""
    plugin = ShieldPlugin(system)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "p.toml").write_text('[shield]\ncpus = "1"\n')
    library = ProfileLibrary([profiles], {"shield": plugin.schema}, system.machine())
    engine = Engine({"shield": plugin}, Journal(tmp_path / "state"))
    return Daemon(system, {"shield": plugin}, library, engine)


def test_no_process_wide_stat_is_read_per_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel sums CPU times over every thread for proc/PID/stat, so reading it once
    per thread of a 20,000-thread process is quadratic (the issue's 58.6 s switch); the
    main thread's own proc/PID/task/PID/stat says the same for one thread's cost."""
    from latencyd.kernel import system as system_module

    system, sched = jvm_of_200_threads(tmp_path)
    plugin = ShieldPlugin(system)
    engine = Engine({"shield": plugin}, Journal(tmp_path / "state"))
    read = system_module._read_text
    process_wide: list[str] = []

    def counting(path: str | Path) -> str:
        if re.search(r"proc/\d+/stat$", str(path)):
            process_wide.append(str(path))
        return read(path)

    monkeypatch.setattr(system_module, "_read_text", counting)
    options = plugin.options_of({"cpus": CpuSet({1})})
    report = engine.switch(
        {("shield", t): v for t, v in plugin.expand(options, {}).settings.items()}, "p"
    )
    assert report.applied == 200 and sched.affinity[1100] == {0, 2, 3}
    assert engine.verify() == [] and engine.off() == []
    assert process_wide == []


def test_status_shows_a_process_s_moved_threads_as_one_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Status beside a 200-thread process: one row for the process (its thread count),
    not a row and a /proc read per thread (0.5 s and 3.9 MB of JSON at 20,000 threads)."""
    from latencyd.kernel import system as system_module

    system, sched = jvm_of_200_threads(tmp_path)
    sched.affinity[1199] = {0, 1}  # one thread its user pinned: its own row
    daemon = shielding_daemon(tmp_path, system)
    daemon.switch("p")
    read = system_module._read_text
    reads: list[str] = []

    def counting(path: str | Path) -> str:
        reads.append(str(path))
        return read(path)

    monkeypatch.setattr(system_module, "_read_text", counting)
    rows = daemon.status()["plugins"]["shield"]["applied"]
    assert [(r["text"], r.get("targets"), r["original"]) for r in rows] == [
        ("user task jvm (pid 1000, 199 threads) CPUs = 0,2-3", 199, "0-3"),
        ("user task jvm (pid 1000, thread 1199) CPUs = 0", None, "0-1"),
    ]
    assert len(reads) < 10, reads


def test_an_irq_event_lists_the_irqs_once_not_a_file_check_per_irq(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device event beside 2,000 IRQs finds the new one without a stat per IRQ (4,096
    on a server, for every event)."""
    from latencyd.plugins.irq import IrqAffinity, IrqPlugin

    from latencyd.core.plugin import DeviceEvent
    from tests.unit.fakesys import put

    root = make_fake_root(tmp_path)
    numbers = list(range(100, 2100))

    def interrupts() -> None:
        head = "           CPU0       CPU1       CPU2       CPU3"
        counts = "".join(f" {0:>10}" for _ in range(4))  # the kernel's " %10u" per CPU
        rows = [f"{n:>4}:{counts}  PCI-MSI {n}-edge  q{n}" for n in numbers]
        put(root, "proc/interrupts", "\n".join([head, *rows]))
        for n in numbers:
            put(root, f"proc/irq/{n}/smp_affinity_list", "0-3")

    interrupts()
    system = System(root)
    plugin = IrqPlugin(system)
    rules = plugin.expand(plugin.options_of({"isolate": CpuSet({3})}), {}).rules
    numbers.append(2100)
    interrupts()
    checks: list[str] = []
    exists = System.exists

    def counting(self: System, rel: str) -> bool:
        checks.append(rel)
        return exists(self, rel)

    monkeypatch.setattr(System, "exists", counting)
    result = plugin.on_device(rules, DeviceEvent("pci", "add", "0000:02:00.0"), {})
    assert result is not None
    settings, _ = result
    assert settings == {IrqAffinity(2100): "0-2"}
    assert len(checks) < 10, len(checks)


def test_a_thread_s_cpus_are_read_once_before_it_is_moved(tmp_path: Path) -> None:
    """The expansion reads each thread's CPUs to decide; the engine takes that as the
    original (Expansion.current) instead of reading all 20,000 again before journaling
    them. Then one read right before the move (its user may have pinned it inside the
    shield since: `_apply_one`) and one read-back after it. Off gives them back without
    a stat each."""
    system, sched = jvm_of_200_threads(tmp_path)
    daemon = shielding_daemon(tmp_path, system)
    engine = daemon.engine
    sched.calls.clear()
    report = engine.apply(daemon.library.load("p"))
    assert report.applied == 200 and engine.originals[("shield", next(iter(engine.applied))[1])]
    reads = [pid for call, pid in sched.calls if call == "getaffinity" and pid == 1100]
    assert len(reads) == 3, sched.calls
    checks: list[str] = []
    exists = system.exists
    system.exists = lambda rel: checks.append(rel) or exists(rel)  # type: ignore
    assert engine.off() == [] and sched.affinity[1100] == {0, 1, 2, 3}
    assert checks == []  # whether a thread is gone is asked only if its restore fails
