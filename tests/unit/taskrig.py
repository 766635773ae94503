"""A fake machine for the plugins that move tasks (kthread, shield): kthreadd, some
kernel threads, user tasks and their scheduler state."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from latencyd.core.engine import Engine, SettingId
from latencyd.core.journal import Journal
from latencyd.core.plugin import Expansion, Plugin, Target, Value
from latencyd.core.profile import Profile
from latencyd.core.schema import validate
from latencyd.kernel.system import PF_KTHREAD, Machine, System, Task
from tests.unit.fakesys import FakeSched, add_kthread, add_task, make_fake_root, put

WRITEBACK = "sys/devices/virtual/workqueue/writeback/cpumask"
UNBOUND = "sys/devices/virtual/workqueue/cpumask"
KTHREADS = {
    10: "rcu_preempt",
    11: "kworker/u8:1-events_unbound",
    13: "jbd2/vda1-8",
    14: "kswapd0",
    15: "flush-254:0",
}
# Kernel-thread rules ([kthread]) and a shield ([shield]) for this machine.
RULES = {
    "rule": [
        {"match": "^kswapd", "cpus": "3"},
        {"match": "^(jbd2/|kswapd|flush-)", "cpus": "0"},
        {"match": "^rcu_", "cpus": "0-1", "policy": "fifo", "priority": 2},
        {"match": "^kworker/u", "cpus": "0,2", "policy": "batch"},
        {"match": "^ksoftirqd/", "cpus": "0"},
    ]
}
ISOLATE = {"cpus": "1", "allow": ["sshd"]}


class Machinery:
    """A fake machine: kthreadd, some kernel threads, user tasks, their scheduler state."""

    def __init__(self, tmp_path: Path, plugin: type[Plugin[Any, Any, Any]]) -> None:
        self.root = make_fake_root(tmp_path, cpus="0-3")
        self.sched = FakeSched({0, 1, 2, 3})
        self.state_dir = tmp_path / "state"
        root = self.root
        add_task(root, 1, "systemd", ppid=0, start_time=5)
        add_task(root, 2, "kthreadd", ppid=0, flags=PF_KTHREAD | 0x8040, start_time=5)
        for pid, comm in KTHREADS.items():
            add_kthread(root, pid, comm)
        add_kthread(root, 12, "ksoftirqd/1", per_cpu=True)  # PF_NO_SETAFFINITY
        add_task(root, 300, "sshd", start_time=900, exe="/usr/sbin/sshd")
        add_task(root, 400, "myapp", start_time=1000, threads=(401, 402), exe="/usr/bin/myapp")
        for pid in (1, 2, *KTHREADS, 12, 300, 400, 401):
            self.sched.add(pid)
        self.sched.add(402, {0})  # already kept off CPU 1
        self.sched.add(10, policy=os.SCHED_FIFO, prio=1)  # rcu is RT by default
        put(root, WRITEBACK, "f")
        put(root, UNBOUND, "f")
        self.system = System(root, sched=self.sched)
        self.plugin = plugin(self.system)
        self.name = self.plugin.name

    def options(self, machine: Machine, section: dict[str, Any]) -> dict[str, Any]:
        return validate(self.plugin.schema, section, machine)

    def typed(self, machine: Machine, section: dict[str, Any]) -> Any:
        """The section as the plugin's hooks get it (Plugin.options_of)."""
        return self.plugin.options_of(self.options(machine, section))

    def expand(
        self,
        machine: Machine,
        section: dict[str, Any],
        owned: Mapping[Target, Value] | None = None,
    ) -> Expansion:
        return self.plugin.expand(self.typed(machine, section), owned or {})

    def settings(self, machine: Machine, section: dict[str, Any]) -> dict[Target, Value]:
        return self.expand(machine, section).settings

    def wanted(self, machine: Machine, section: dict[str, Any]) -> dict[SettingId, Value]:
        return {(self.name, t): v for t, v in self.settings(machine, section).items()}

    def profile(self, machine: Machine, section: dict[str, Any]) -> Profile:
        return Profile(
            "p", self.root / "p.toml", "", {self.name: self.options(machine, section)}, {}
        )

    def engine(self) -> Engine:
        return Engine({self.name: self.plugin}, Journal(self.state_dir))


class Counting(System):
    """Counts every look at the machine, to prove the cheap paths read nothing."""

    def __init__(self, root: Path, sched: Any) -> None:
        super().__init__(root, sched)
        self.looks = 0

    def task(self, pid: int) -> Task | None:
        self.looks += 1
        return super().task(pid)

    def read(self, rel: str) -> str:
        self.looks += 1
        return super().read(rel)

    def listdir(self, rel: str) -> list[str]:
        self.looks += 1
        return super().listdir(rel)

    def exists(self, rel: str) -> bool:
        self.looks += 1
        return super().exists(rel)
