"""The fake machine of `bench scale --fake`: a server's worth of CPUs, IRQs, NICs and tasks
in the unit rig's style (a /proc + /sys tree in a temp dir, FakeSched, FakeEthtool), at a
multiple of a base size, and the engine's operations timed on it.

Base size (x1): 4 CPUs, 64 IRQs, 1 NIC, 782 tasks; x64 is 256 CPUs, 4,096 IRQs, 64 NICs
and 50,048 tasks. Timed per size: load the profile, expand it, plan it (nothing
written), apply it, plan the switch to a second profile (other isolated CPUs), switch
to it, verify, off; and one event each: a kernel thread
forked, an IRQ appearing (its device added), a NIC appearing (the median of EVENTS each).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import DeviceEvent, TaskEvent, in_one_go, load_plugins
from latencyd.core.profile import ProfileLibrary
from latencyd.kernel.system import System
from latencyd.service.daemon import Daemon
from tests.unit.fakesys import (
    FakeEthtool,
    FakeNic,
    FakeSched,
    KernelLikeSystem,
    add_cpuidle,
    add_kthread,
    add_nic,
    add_task,
    make_fake_root,
    put,
)

EVENTS = 5  # of each kind, per size
BASE = {"cpus": 4, "irqs": 64, "nics": 1, "tasks": 782}
PROFILE = """
[main]
summary = "a server's cpu-partitioning"

[variables]
isolated = "{isolated}"

[irq]
isolate = "${{isolated}}"

[shield]
cpus = "${{isolated}}"

[kthread]
writeback_cpumask = "0"

[[kthread.rule]]
match = "^kswapd"
cpus = "0"

[[cstate.cpus]]
cpus = "${{isolated}}"
resume_latency_us = 0

[[net.nic]]
coalesce = {{ rx-usecs = 0 }}
rps_cpus = "none"

[sysctl]
"vm.swappiness" = 10
"""


def _nic(i: int) -> FakeNic:
    return FakeNic(values={"coalesce": {"rx-usecs": 8}})


class FakeServer:
    """The tree, its scheduler and NICs; `grow_*` add what an event announces."""

    def __init__(self, tmp: Path, k: int) -> None:
        self.k = k
        self.cpus = BASE["cpus"] * k
        self.root = make_fake_root(tmp, cpus=f"0-{self.cpus - 1}")
        add_cpuidle(self.root, range(self.cpus))
        self.sched = FakeSched(set(range(self.cpus)))
        self.irqs = [100 + i for i in range(BASE["irqs"] * k)]
        self._write_interrupts()
        everything = "0-" + str(self.cpus - 1)
        for n in self.irqs:
            put(self.root, f"proc/irq/{n}/smp_affinity_list", everything)
        put(self.root, "proc/irq/default_smp_affinity", f"{(1 << self.cpus) - 1:x}")
        add_task(self.root, 1, "systemd", ppid=0, start_time=5)
        add_task(self.root, 2, "kthreadd", ppid=0, flags=0x00208040, start_time=5)
        self.sched.add(1)
        self.sched.add(2)
        for cpu in range(self.cpus):
            add_kthread(self.root, 10 + cpu, f"ksoftirqd/{cpu}", per_cpu=True)
        add_kthread(self.root, 9, "kswapd0")
        self.sched.add(9)
        self.next_pid = 100_000
        for i in range(BASE["tasks"] * k):
            add_task(self.root, 20_000 + i, f"app{i % 97}", start_time=1000)
            self.sched.add(20_000 + i)
        put(self.root, "sys/devices/virtual/workqueue/writeback/cpumask", "f")
        self.nics: dict[str, FakeNic] = {}
        for i in range(BASE["nics"] * k):
            self.add_nic(i)
        self.system = KernelLikeSystem(self.root, sched=self.sched, ethtool=FakeEthtool(self.nics))

    def _write_interrupts(self) -> None:
        head = "      " + "".join(f"CPU{c:<7}" for c in range(self.cpus))
        zeros = " ".join("0" for _ in range(self.cpus))
        lines = [f"{n:>4}: {zeros}   PCI-MSIX  {n}-edge  virtio{n}-q" for n in self.irqs]
        put(self.root, "proc/interrupts", "\n".join([head, *lines]))

    def add_nic(self, i: int) -> str:
        name = f"eth{i}"
        add_nic(self.root, name, 2 + i, mac=f"52:54:00:00:{i // 256:02x}:{i % 256:02x}",
                assign=0, bus=f"0000:01:{i // 8:02x}.{i % 8}", driver="virtio_net")  # fmt: skip
        self.nics[name] = _nic(i)
        return name

    def grow_irq(self) -> None:
        n = max(self.irqs) + 1
        self.irqs.append(n)
        self._write_interrupts()
        put(self.root, f"proc/irq/{n}/smp_affinity_list", f"0-{self.cpus - 1}")

    def grow_kthread(self) -> int:
        self.next_pid += 1
        add_kthread(self.root, self.next_pid, "kswapd1")
        self.sched.add(self.next_pid)
        return self.next_pid


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(tmp: Path, k: int) -> dict[str, float]:
    """Seconds per operation on the fake server at `k` times the base size."""
    server = FakeServer(tmp, k)
    # The rig's own objects (its scheduler's tables) are the kernel's memory, not the
    # daemon's: out of the garbage collector's sight, as the kernel's would be.
    gc.collect()
    gc.freeze()
    try:
        return _measure(server, tmp)
    finally:
        gc.unfreeze()


def _measure(server: FakeServer, tmp: Path) -> dict[str, float]:
    system: System = server.system
    profiles = tmp / "profiles"
    profiles.mkdir()
    half, quarter = server.cpus // 2, server.cpus * 3 // 4
    (profiles / "a.toml").write_text(PROFILE.format(isolated=f"{half}-{server.cpus - 1}"))
    (profiles / "b.toml").write_text(PROFILE.format(isolated=f"{quarter}-{server.cpus - 1}"))
    plugins = load_plugins(system)
    library = ProfileLibrary([profiles], section_schemas(plugins), system.machine())
    engine = Engine(plugins, Journal(tmp / "state"))
    daemon = Daemon(system, plugins, library, engine)
    out: dict[str, float] = {}
    out["load"] = timed(lambda: library.load("a"))
    a = library.load("a")
    out["expand"] = timed(lambda: engine.expand(a))
    out["plan"] = timed(lambda: in_one_go(daemon.plan_steps)("a"))
    out["apply"] = timed(lambda: daemon.switch("a"))
    out["plan of the switch"] = timed(lambda: in_one_go(daemon.plan_steps)("b"))
    out["switch"] = timed(lambda: daemon.switch("b"))
    out["verify"] = timed(engine.verify)
    # Each event EVENTS times, the median printed: the first after a big step also pays
    # to free that step's report, which is the step's cost, not the event's.
    forks = []
    for _ in range(EVENTS):
        pid = server.grow_kthread()
        forks.append(timed(partial(daemon.on_task_events, [TaskEvent("fork", pid, pid, ppid=2)])))
    out["event: kthread fork"] = statistics.median(forks)
    irqs = []
    for _ in range(EVENTS):
        server.grow_irq()
        pci = DeviceEvent("pci", "add", "0000:02:00.0")
        irqs.append(timed(partial(daemon.on_device_events, [pci])))
    out["event: IRQ appears"] = statistics.median(irqs)
    nics = []
    for _ in range(EVENTS):
        name = server.add_nic(len(server.nics))
        net = DeviceEvent("net", "add", name, devpath=f"/devices/virtual/net/{name}")
        nics.append(timed(partial(daemon.on_device_events, [net])))
    out["event: NIC appears"] = statistics.median(nics)
    out["off"] = timed(daemon.off)
    out["owned"] = float(len(engine.applied))
    return out
