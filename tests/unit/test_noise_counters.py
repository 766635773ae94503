"""The noise watch's fallback, /proc counters: what fired on a watched CPU named as the
tracefs watch names it, the tasks' time less the application's, and the daemon's watch
choosing it (saying why) when tracefs cannot be had; `measure`'s counters, which name
and time alike. Fake /proc files; the kernel test (tests/kernel/test_noise_watch.py)
reads the real ones."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from latencyd.cpuset import CpuSet
from latencyd.kernel import procstat
from latencyd.kernel.noise import TickCount, WatchPlan
from latencyd.kernel.system import System
from latencyd.service.noisewatch import CounterWatch, NoiseWatch, ShieldWatch
from latencyd.tools.measure.counters import counters as measure_counters
from plugins.monitor import MonitorPlugin
from tests.unit.fakesys import make_fake_root, put, stat_line

TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def proc(root: Path, virtio: int, loc: int, timer: int, busy_ticks: int) -> None:
    """/proc/interrupts, softirqs and stat of a 2-CPU machine; CPU 1's counts given, CPU
    0's moving too (they must not show)."""
    put(
        root,
        "proc/interrupts",
        "           CPU0       CPU1\n"
        f" 24:   {virtio * 7}   {virtio}  PCI-MSIX-0000:00:03.0   1-edge   virtio0-input.0\n"
        f"LOC:       {loc * 3}       {loc}   Local timer interrupts\n"
        f"CAL:       {loc}       0   Function call interrupts\n",
    )
    put(root, "proc/softirqs", f"     CPU0   CPU1\n  TIMER:  {timer * 2}  {timer}\nNET_RX:  5  0\n")
    put(root, "proc/stat", f"cpu  9 0 9 9\ncpu0 {busy_ticks * 5} 0 0 9\ncpu1 {busy_ticks} 0 0 9\n")


def test_counters_name_what_fired_on_the_watched_cpu_only(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, cpus="0-1")
    proc(root, virtio=10, loc=100, timer=40, busy_ticks=50)
    watch = CounterWatch(System(root), CpuSet({1}), "tracefs: not mounted")
    watch.start()
    proc(root, virtio=13, loc=350, timer=45, busy_ticks=52)
    interval = watch.poll()
    tallies = interval.cpus[1]
    assert {s: t.count for s, t in tallies.items() if s != CounterWatch.TASKS} == {
        "irq 24 virtio0-input.0": 3,
        "local timer": 250,
        "softirq TIMER": 5,
    }
    assert tallies[CounterWatch.TASKS].total_ns == 2 * TICK_NS
    assert list(interval.cpus) == [1]
    assert watch.mechanism.startswith("/proc counters (tracefs: not mounted)")
    # Nothing moved: nothing shown.
    assert watch.poll().cpus[1] == {}


def test_counters_leave_the_applications_own_time_out(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, cpus="0-1")
    proc(root, virtio=0, loc=0, timer=0, busy_ticks=100)
    stat = "4242 (app) R 1 " + " ".join(["0"] * 34) + " 1 0"  # field 39: last ran on CPU 1
    put(root, "proc/4242/task/4242/stat", stat)
    put(root, "proc/4242/task/4242/schedstat", "0 0 0")
    watch = CounterWatch(System(root), CpuSet({1}), "test")
    watch.start(lambda: frozenset({4242}))
    proc(root, virtio=0, loc=0, timer=0, busy_ticks=110)
    put(root, "proc/4242/task/4242/schedstat", f"{8 * TICK_NS} 0 0")
    assert watch.poll().cpus[1][CounterWatch.TASKS].total_ns == 2 * TICK_NS


# A shared line, an action named with a blank (alone, and last on a shared line), and an
# IRQ without an action: each named one way wherever noise is reported.
NAMED_IRQS = """\
            CPU0       CPU1
  11:          0   {n:>8}   IO-APIC  11-fasteoi   uhci_hcd:usb1, virtio2
 122:          0   {n:>8}   IR-PCI-MSI 458752-edge   aerdrv, PCIe PME
 123:          0   {n:>8}   IR-PCI-MSI 460800-edge   PCIe PME, pciehp
  44:          0   {n:>8}   PCI-MSI-0000:00:1f.2    0-edge
"""
IRQ_NAMES = {
    "irq 11 virtio2",
    "irq 122 PCIe PME",
    "irq 123 pciehp",
    "irq 44 PCI-MSI-0000:00:1f.2",
}


def test_an_irq_is_named_alike_by_the_watches_and_measure(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, cpus="0-1")
    proc(root, virtio=0, loc=0, timer=0, busy_ticks=0)
    put(root, "proc/interrupts", NAMED_IRQS.format(n=1))
    counters = CounterWatch(System(root), CpuSet({1}), "test")
    counters.start()
    put(root, "proc/interrupts", NAMED_IRQS.format(n=2))
    assert set(counters.poll().cpus[1]) == IRQ_NAMES
    traced = NoiseWatch(System(root), CpuSet({1}))._irq_names()
    assert {f"irq {n} {name}" for n, name in traced.items()} == IRQ_NAMES
    measured = measure_counters(CpuSet({1}), System(root)).irqs
    assert {f"irq {row_and_name}" for row_and_name in measured} == IRQ_NAMES


def thread(root: Path, pid: int, tid: int, comm: str, cpu: int, ran_ns: int) -> None:
    """proc/PID/task/TID: its stat (last ran on `cpu`) and schedstat (`ran_ns` run)."""
    head, _, rest = stat_line(tid, comm, 1, 0, 1000).rpartition(")")
    after_comm = rest.split()
    after_comm[36] = str(cpu)  # field 39, processor
    put(root, f"proc/{pid}/task/{tid}/stat", f"{head}) {' '.join(after_comm)}")
    put(root, f"proc/{pid}/task/{tid}/schedstat", f"{ran_ns} 0 1")


def test_measure_times_every_thread_even_beside_one_that_exits(tmp_path: Path) -> None:
    """A thread gone between its listing and its reading is left out, not its siblings: a
    sibling missing from the reading before a round would count all it ever ran."""
    root = make_fake_root(tmp_path, cpus="0-3")
    proc(root, virtio=0, loc=0, timer=0, busy_ticks=0)
    thread(root, 4242, 4242, "app", cpu=1, ran_ns=5_000)
    (root / "proc/4242/task/4243").mkdir()  # exited: its files gone
    thread(root, 4242, 4244, "app (worker)", cpu=3, ran_ns=7_000)
    c = measure_counters(CpuSet({1}), System(root))
    assert c.tasks == {(4242, "app"): 5_000, (4244, "app (worker)"): 7_000}
    assert c.last_cpu == {(4242, "app"): 1, (4244, "app (worker)"): 3}


def test_measure_counts_schedule_calls_on_the_measured_cpus_only(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, cpus="0-2")
    proc(root, virtio=0, loc=0, timer=0, busy_ticks=0)
    assert measure_counters(CpuSet({1}), System(root)).schedule_calls == 0  # no SCHEDSTATS
    put(
        root,
        "proc/schedstat",
        "version 15\ntimestamp 4295\n"
        "cpu0 0 0 100 40 60 50 900 300 70\ndomain0 MC 3 0 0 0\n"
        "cpu1 0 0 7 3 4 2 800 200 9\ncpu2 0 0 11 5 6 3 700 100 8\n",
    )
    assert measure_counters(CpuSet({1, 2}), System(root)).schedule_calls == 18


def test_proc_stat_is_read_by_column_and_busy_is_user_nice_system() -> None:
    text = (
        "cpu  30 2 13 900 5 1 1 0 0 0\n"
        "cpu0 10 1 4 500 3 1 0 0 0 0\ncpu1 20 1 9 400 2 0 1 0 0 0\n"
        "intr 1234 0 5\nctxt 99\n"
    )
    assert procstat.stat_ticks(text) == {
        0: (10, 1, 4, 500, 3, 1, 0, 0, 0, 0),
        1: (20, 1, 9, 400, 2, 0, 1, 0, 0, 0),
    }
    assert procstat.stat_busy_ticks(text) == {0: 15, 1: 30}


class Loop:
    def __init__(self) -> None:
        self.sources: list[Any] = []

    def timeout_add(self, ms: int, fn: Any) -> int:
        self.sources.append(fn)
        return len(self.sources)

    def source_remove(self, source: int) -> None:
        self.sources[source - 1] = None


def test_the_daemons_watch_falls_back_to_counters_and_says_why(tmp_path: Path) -> None:
    """No tracefs under this root (and none can be mounted there): the watch runs on /proc
    counters, and `status` (the monitor plugin's facts) says so and why."""
    root = make_fake_root(tmp_path, cpus="0-1")
    proc(root, virtio=0, loc=0, timer=0, busy_ticks=0)
    system = System(root)
    monitor = MonitorPlugin(system)
    plan = WatchPlan(CpuSet({1}), 1000, 500, None)
    section = SimpleNamespace(expansion=SimpleNamespace(rules=plan))
    daemon: Any = SimpleNamespace(
        engine=SimpleNamespace(sections={"monitor": section}),
        plugins={"monitor": monitor},
        after_step=[],
        system=system,
        holds={},
    )
    loop = Loop()
    breaches: list[Any] = []
    shield = ShieldWatch(daemon, loop, lambda breach, s: breaches.append(breach))  # type: ignore[arg-type]
    shield.sync()
    assert isinstance(shield.watch, CounterWatch)
    facts = monitor.monitor(plan).facts
    assert facts["mechanism"].startswith("/proc counters (tracefs: mounting tracefs")
    proc(root, virtio=0, loc=250, timer=0, busy_ticks=1)
    assert loop.sources[0]() is True
    assert breaches and breaches[0].cpu == 1  # a tick's worth of tasks: over 500 µs
    assert monitor.last.cpus is not None and monitor.last.cpus[1]["local timer"].count == 250
    shield.close()
    assert loop.sources == [None]


def test_the_daemons_watch_adds_up_the_tick_and_status_shows_it(tmp_path: Path) -> None:
    """Status keeps only the last interval; the tick since the watch began is what a run
    needs. The /proc counters' fallback counts it without its time, and says so."""
    root = make_fake_root(tmp_path, cpus="0-1")
    proc(root, virtio=0, loc=0, timer=0, busy_ticks=0)
    monitor = MonitorPlugin(System(root))
    plan = WatchPlan(CpuSet({1}), 1000)
    daemon: Any = SimpleNamespace(
        engine=SimpleNamespace(sections={"monitor": SimpleNamespace(
            expansion=SimpleNamespace(rules=plan))}),
        plugins={"monitor": monitor}, after_step=[], system=monitor.system, holds={},
    )  # fmt: skip
    loop = Loop()
    shield = ShieldWatch(daemon, loop, lambda breach, s: None)
    shield.sync()
    first = TickCount.from_json(monitor.monitor(plan).facts["ticks"])
    assert (first.seconds, first.cpus, first.timed) == (0.0, {}, False)
    proc(root, virtio=0, loc=250, timer=0, busy_ticks=0)
    loop.sources[0]()
    proc(root, virtio=0, loc=500, timer=0, busy_ticks=0)
    loop.sources[0]()
    total = TickCount.from_json(monitor.monitor(plan).facts["ticks"])
    assert total.since == first.since and total.cpus[1].count == 500 and total.seconds > 0
    shield.close()
