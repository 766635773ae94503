"""The kthread plugin against fake /proc/PID/stat files and a fake scheduler."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import latencyd.plugins.kthread as kthread_module
import pytest
from latencyd.plugins.kthread import KthreadPlugin

from latencyd.engine import Engine
from latencyd.errors import NotApplicable
from latencyd.journal import Journal
from latencyd.schema import Machine, SchemaError, validate
from latencyd.system import PF_KTHREAD, System, Task
from latencyd.taskevents import TaskEvent
from tests.unit.fakesys import (
    FakeSched,
    add_kthread,
    add_task,
    make_fake_root,
    put,
    stat_line,
    tree_values,
)

WRITEBACK = "sys/devices/virtual/workqueue/writeback/cpumask"
UNBOUND = "sys/devices/virtual/workqueue/cpumask"
KTHREADS = {
    10: "rcu_preempt",
    11: "kworker/u8:1-events_unbound",
    13: "jbd2/vda1-8",
    14: "kswapd0",
    15: "flush-254:0",
}


class Machinery:
    """A fake machine: kthreadd, some kernel threads, user tasks, their scheduler state."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = make_fake_root(tmp_path, cpus="0-3")
        self.sched = FakeSched({0, 1, 2, 3})
        self.state_dir = tmp_path / "state"
        root = self.root
        add_task(root, 1, "systemd", ppid=0, start_time=5)
        add_task(root, 2, "kthreadd", ppid=0, flags=PF_KTHREAD | 0x8040, start_time=5)
        for pid, comm in KTHREADS.items():
            add_kthread(root, pid, comm)
        add_kthread(root, 12, "ksoftirqd/1", per_cpu=True)  # PF_NO_SETAFFINITY
        add_task(root, 300, "sshd", start_time=900)
        add_task(root, 400, "myapp", start_time=1000, threads=(401, 402))
        for pid in (1, 2, *KTHREADS, 12, 300, 400, 401):
            self.sched.add(pid)
        self.sched.add(402, {0})  # already kept off CPU 1
        self.sched.add(10, policy=os.SCHED_FIFO, prio=1)  # rcu is RT by default
        put(root, WRITEBACK, "f")
        put(root, UNBOUND, "f")
        self.system = System(root, sched=self.sched)
        self.plugin = KthreadPlugin(self.system)

    def expand(self, machine: Machine, section: dict[str, Any]) -> dict[str, Any]:
        return self.plugin.expand(validate(self.plugin.schema, section, machine))

    def wanted(self, machine: Machine, section: dict[str, Any]) -> dict[Any, Any]:
        return {("kthread", k): v for k, v in self.expand(machine, section).items()}

    def engine(self) -> Engine:
        return Engine({"kthread": self.plugin}, Journal(self.state_dir))


@pytest.fixture
def m(tmp_path: Path) -> Machinery:
    return Machinery(tmp_path)


RULES = {
    "rule": [
        {"match": "^kswapd", "cpus": "3"},
        {"match": "^(jbd2/|kswapd|flush-)", "cpus": "0"},
        {"match": "^rcu_", "cpus": "0-1", "policy": "fifo", "priority": 2},
        {"match": "^kworker/u", "cpus": "0,2", "policy": "batch"},
        {"match": "^ksoftirqd/", "cpus": "0"},
    ]
}


# -- /proc/PID/stat ---------------------------------------------------------------------------


def test_stat_parsing_with_spaces_and_parentheses_in_the_name(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    add_task(root, 77, "a) (b c)", ppid=76, flags=0x400140, start_time=123456)
    add_kthread(root, 78, "kworker/0:1H-kblockd", per_cpu=True, start_time=42)
    system = System(root)
    assert system.task(77) == Task(77, "a) (b c)", 76, 0x400140, 123456)
    kw = system.task(78)
    assert kw is not None and kw.comm == "kworker/0:1H-kblockd" and kw.ident == "78@42"
    assert kw.is_kthread and not kw.pinnable
    assert system.task(79) is None
    put(root, "proc/80/stat", "80 (trunc")  # torn read of an exiting task
    assert system.task(80) is None
    assert [t.pid for t in system.tasks()] == [77, 78]


def test_fake_stat_line_has_the_kernels_52_fields() -> None:
    fields = stat_line(5, "x", 2, PF_KTHREAD, 99).split()
    assert len(fields) == 52
    # proc(5): field 2 comm, 4 ppid, 9 flags, 22 starttime (1-based)
    assert (fields[1], fields[3], fields[8], fields[21]) == ("(x)", "2", str(PF_KTHREAD), "99")


# -- rules -------------------------------------------------------------------------------------


def test_rules_match_kernel_threads_first_rule_wins(m: Machinery, machine: Machine) -> None:
    assert m.expand(machine, RULES) == {
        "thread/10@10/affinity": "0-1",
        "thread/10@10/sched": ["fifo", 2],
        "thread/11@10/affinity": "0,2",
        "thread/11@10/sched": ["batch", 0],
        "thread/12@10/affinity": "0",  # wanted; capture will say it cannot be moved
        "thread/13@10/affinity": "0",
        "thread/14@10/affinity": "3",  # the first rule, not the second
        "thread/15@10/affinity": "0",
    }


def test_rules_never_match_kthreadd_or_user_tasks(m: Machinery, machine: Machine) -> None:
    section = {"rule": [{"match": "^(kthreadd|sshd|myapp|systemd)$", "cpus": "0"}]}
    assert m.expand(machine, section) == {}


@pytest.mark.parametrize(
    ("rule", "sched"),
    [
        ({"policy": "fifo"}, ["fifo", 1]),  # real-time needs a priority of at least 1
        ({"policy": "rr", "priority": 50}, ["rr", 50]),
        ({"policy": "other", "priority": 5}, ["other", 0]),  # not real-time: always 0
        ({"policy": "idle"}, ["idle", 0]),
    ],
)
def test_policy_and_priority(
    m: Machinery, machine: Machine, rule: dict[str, Any], sched: list[Any]
) -> None:
    settings = m.expand(machine, {"rule": [{"match": "^kswapd", "cpus": "0", **rule}]})
    assert settings["thread/14@10/sched"] == sched
    m.plugin.apply("thread/14@10/sched", sched)
    assert m.plugin.capture("thread/14@10/sched") == sched


def test_apply_and_capture_go_through_the_scheduler(m: Machinery) -> None:
    assert m.plugin.capture("thread/13@10/affinity") == "0-3"
    assert m.plugin.capture("thread/10@10/sched") == ["fifo", 1]
    m.plugin.apply("thread/13@10/affinity", "0,2")
    m.plugin.apply("thread/10@10/sched", ["rr", 3])
    assert m.sched.affinity[13] == {0, 2}
    assert m.sched.policy[10] == (os.SCHED_RR, 3)
    assert m.plugin.capture("thread/10@10/sched") == ["rr", 3]
    m.sched.policy[10] = (os.SCHED_FIFO | 0x40000000, 3)  # SCHED_RESET_ON_FORK is or-ed in
    assert m.plugin.capture("thread/10@10/sched") == ["fifo", 3]
    assert m.plugin.same("thread/13@10/affinity", "0,2", "0,2")
    assert m.plugin.same("thread/13@10/affinity", "2,0", "0,2")
    assert not m.plugin.same("thread/10@10/sched", ["rr", 3], ["rr", 4])
    assert m.plugin.optional("thread/13@10/affinity")
    assert not m.plugin.optional("workqueue/writeback")


def test_describe(m: Machinery) -> None:
    assert m.plugin.describe("thread/13@10/affinity", "0") == "jbd2/vda1-8 (pid 13) CPUs = 0"
    assert (
        m.plugin.describe("thread/10@10/sched", ["fifo", 2])
        == "rcu_preempt (pid 10) policy = fifo priority 2"
    )
    assert m.plugin.describe("thread/99@10/affinity", "0") == "pid 99 (pid 99) CPUs = 0"
    assert m.plugin.describe("workqueue/unbound", "0") == "workqueue/unbound cpumask = 0"


# -- what the kernel will not do ---------------------------------------------------------------


def test_per_cpu_kthread_is_not_applicable_at_capture(m: Machinery) -> None:
    with pytest.raises(NotApplicable) as info:
        m.plugin.capture("thread/12@10/affinity")
    assert str(info.value) == (
        "ksoftirqd/1 (pid 12) is a per-CPU kernel thread (PF_NO_SETAFFINITY): "
        "the kernel does not let anyone move it"
    )
    assert ("getaffinity", 12) not in m.sched.calls


def test_engine_records_per_cpu_and_refused_threads(m: Machinery, machine: Machine) -> None:
    m.sched.refuse[15] = errno.EINVAL  # e.g. a race with the thread binding itself
    m.sched.refuse[10] = errno.EPERM
    engine = m.engine()
    report = engine.switch(m.wanted(machine, RULES), "p")
    assert report.not_applicable == {
        ("kthread", "thread/12@10/affinity"): (
            "ksoftirqd/1 (pid 12) is a per-CPU kernel thread (PF_NO_SETAFFINITY): "
            "the kernel does not let anyone move it"
        ),
        ("kthread", "thread/15@10/affinity"): "flush-254:0 (pid 15): Invalid argument (EINVAL)",
        (
            "kthread",
            "thread/10@10/affinity",
        ): "rcu_preempt (pid 10): Operation not permitted (EPERM)",
        ("kthread", "thread/10@10/sched"): "rcu_preempt (pid 10): Operation not permitted (EPERM)",
    }
    assert engine.profile == "p"
    assert m.sched.affinity[13] == {0} and m.sched.affinity[14] == {3}
    assert ("setaffinity", 12) not in m.sched.calls
    assert engine.verify() == []


def test_thread_exiting_while_being_pinned(m: Machinery) -> None:
    def exit_now() -> None:
        shutil.rmtree(m.root / "proc/13")
        del m.sched.affinity[13]

    m.sched.before_set[13] = exit_now
    with pytest.raises(NotApplicable, match=r"^pid 13 exited before it could be pinned$"):
        m.plugin.apply("thread/13@10/affinity", "0")
    assert not m.plugin.exists("thread/13@10/affinity")


def test_recycled_pid_is_a_different_thread(m: Machinery, machine: Machine) -> None:
    engine = m.engine()
    engine.switch(m.wanted(machine, RULES), "p")
    assert m.sched.affinity[13] == {0}
    # jbd2 exits; a user process gets pid 13 (later start time) and its own affinity.
    add_task(m.root, 13, "bash", ppid=1, start_time=777777)
    m.sched.add(13, {1})
    assert not m.plugin.exists("thread/13@10/affinity")
    assert m.plugin.exists("thread/14@10/affinity")
    with pytest.raises(NotApplicable, match="pid 13 has exited"):
        m.plugin.capture("thread/13@10/affinity")
    m.sched.calls.clear()
    assert engine.off() == []
    assert m.sched.affinity[13] == {1}  # the new task was left alone
    assert ("setaffinity", 13) not in m.sched.calls
    assert m.sched.affinity[14] == {0, 1, 2, 3}  # the others were restored


def test_thread_gone_entirely_is_skipped_on_restore(m: Machinery, machine: Machine) -> None:
    engine = m.engine()
    engine.switch(m.wanted(machine, RULES), "p")
    shutil.rmtree(m.root / "proc/14")
    del m.sched.affinity[14]
    assert engine.verify() == []  # dropped, not drift
    assert engine.off() == []


# -- task events --------------------------------------------------------------------------------


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


def test_user_forks_cost_nothing(m: Machinery, machine: Machine) -> None:
    system = Counting(m.root, m.sched)
    plugin = KthreadPlugin(system)
    plugin.expand(validate(plugin.schema, {**RULES, "isolate_tasks": "1"}, machine))
    system.looks = 0
    m.sched.calls.clear()
    for pid in range(1000, 1100):
        assert plugin.on_task(TaskEvent("fork", pid, pid, ppid=400)) == {}
    assert plugin.on_task(TaskEvent("fork", 400, 1200, ppid=400)) == {}  # a new thread
    assert plugin.on_task(TaskEvent("exit", 400, 401)) == {}
    assert system.looks == 0 and m.sched.calls == []


def test_kthreadd_fork_gets_its_settings(m: Machinery, machine: Machine) -> None:
    m.expand(machine, RULES)
    add_kthread(m.root, 20, "jbd2/vdb1-8", start_time=5000)
    m.sched.add(20)
    assert m.plugin.on_task(TaskEvent("fork", 20, 20, ppid=2, time_ns=1)) == {
        "thread/20@5000/affinity": "0"
    }
    add_kthread(m.root, 21, "kworker/3:0", start_time=5001)  # no rule for it
    assert m.plugin.on_task(TaskEvent("fork", 21, 21, ppid=2)) == {}
    assert m.plugin.on_task(TaskEvent("fork", 22, 22, ppid=2)) == {}  # gone already


def test_comm_after_a_kthreadd_fork_gets_the_settings(m: Machinery, machine: Machine) -> None:
    # Older kernels: the child shows as "kthreadd" at fork and is named just after.
    m.expand(machine, RULES)
    add_kthread(m.root, 30, "kthreadd", start_time=6000)
    assert m.plugin.on_task(TaskEvent("fork", 30, 30, ppid=2)) == {}
    add_kthread(m.root, 30, "flush-254:16", start_time=6000)
    assert m.plugin.on_task(TaskEvent("comm", 30, 30)) == {"thread/30@6000/affinity": "0"}
    # Only once per fork: a later rename is not a new kernel thread.
    assert m.plugin.on_task(TaskEvent("comm", 30, 30)) == {}


def test_comm_of_a_user_task_with_isolate_tasks(m: Machinery, machine: Machine) -> None:
    m.expand(machine, {"isolate_tasks": "1", "allow": ["ssh*", "trading-?"]})
    add_task(m.root, 500, "worker", start_time=7000, threads=(501,))
    m.sched.add(500)
    m.sched.add(501, {1})  # only on the isolated CPU: goes to the housekeeping CPUs
    assert m.plugin.on_task(TaskEvent("comm", 500, 500)) == {"task/500@7000/500/affinity": "0,2-3"}
    assert m.plugin.on_task(TaskEvent("comm", 500, 501)) == {"task/500@7000/501/affinity": "0,2-3"}
    add_task(m.root, 500, "trading-1", start_time=7000)  # exec'd into an allowed name
    assert m.plugin.on_task(TaskEvent("comm", 500, 500)) == {}
    add_task(m.root, 500, "trading-10", start_time=7000)  # the glob does not match this
    assert m.plugin.on_task(TaskEvent("comm", 500, 500)) != {}
    assert m.plugin.on_task(TaskEvent("comm", 402, 402)) == {}  # not on CPU 1: nothing to do
    assert m.plugin.on_task(TaskEvent("comm", 10, 10)) == {}  # kernel threads are not tasks
    assert m.plugin.on_task(TaskEvent("comm", 999, 999)) == {}  # exited


def test_comm_without_isolate_tasks_is_ignored(m: Machinery, machine: Machine) -> None:
    m.expand(machine, RULES)
    assert m.plugin.on_task(TaskEvent("comm", 400, 400)) == {}


# -- isolate_tasks ----------------------------------------------------------------------------


def test_isolate_tasks_moves_user_threads_off_the_cpus(m: Machinery, machine: Machine) -> None:
    add_task(m.root, 600, "pinned", start_time=8000)
    m.sched.add(600, {1})
    add_task(m.root, 610, "exiting", start_time=8001)  # its thread is gone from the scheduler
    settings = m.expand(machine, {"isolate_tasks": "1", "allow": ["sshd"]})
    assert settings == {
        "task/1@5/1/affinity": "0,2-3",
        "task/400@1000/400/affinity": "0,2-3",
        "task/400@1000/401/affinity": "0,2-3",
        "task/600@8000/600/affinity": "0,2-3",  # nothing left: all housekeeping CPUs
    }
    m.plugin.apply("task/400@1000/401/affinity", "0,2-3")
    assert m.sched.affinity[401] == {0, 2, 3}
    assert m.plugin.capture("task/400@1000/401/affinity") == "0,2-3"
    assert m.plugin.describe("task/400@1000/401/affinity", "0") == "task 401 (pid 401) CPUs = 0"
    # A task this profile moved stays owned: its key is still wanted, at its current value.
    assert (
        m.expand(machine, {"isolate_tasks": "1", "allow": ["sshd"]})["task/400@1000/401/affinity"]
        == "0,2-3"
    )


# -- workqueues --------------------------------------------------------------------------------


def test_workqueue_cpumasks_are_hex_masks(m: Machinery, machine: Machine) -> None:
    settings = m.expand(machine, {"writeback_cpumask": "0", "unbound_cpumask": "all - 1"})
    assert settings == {"workqueue/writeback": "0", "workqueue/unbound": "0,2-3"}
    assert m.plugin.capture("workqueue/writeback") == "0-3"
    m.plugin.apply("workqueue/writeback", "0")
    m.plugin.apply("workqueue/unbound", "0,2-3")
    assert (m.root / WRITEBACK).read_text() == "1"
    assert (m.root / UNBOUND).read_text() == "d"
    assert m.plugin.capture("workqueue/unbound") == "0,2-3"
    assert m.plugin.exists("workqueue/unbound")


def test_missing_workqueue_file_is_not_applicable(m: Machinery, machine: Machine) -> None:
    (m.root / WRITEBACK).unlink()
    message = (
        "this kernel has no /sys/devices/virtual/workqueue/writeback/cpumask (before "
        "Linux 3.10, writeback runs in flush-* threads: match them with a rule)"
    )
    with pytest.raises(NotApplicable) as info:
        m.plugin.apply("workqueue/writeback", "0")
    assert str(info.value) == message
    assert not m.plugin.exists("workqueue/writeback")
    report = m.engine().switch(
        m.wanted(machine, {"writeback_cpumask": "0", "unbound_cpumask": "0"}), "p"
    )
    assert report.not_applicable == {("kthread", "workqueue/writeback"): message}
    assert (m.root / UNBOUND).read_text() == "1"


# -- through the engine ----------------------------------------------------------------------


def test_engine_round_trip_restores_everything(m: Machinery, machine: Machine) -> None:
    sched_before = m.sched.state()
    files_before = tree_values(m.root, "sys")
    section = {
        **RULES,
        "writeback_cpumask": "0",
        "unbound_cpumask": "0,2-3",
        "isolate_tasks": "1",
        "allow": ["sshd"],
    }
    engine = m.engine()
    report = engine.switch(m.wanted(machine, section), "p")
    assert list(report.not_applicable) == [("kthread", "thread/12@10/affinity")]
    assert m.sched.affinity[14] == {3} and m.sched.affinity[400] == {0, 2, 3}
    assert m.sched.policy[10] == (os.SCHED_FIFO, 2)
    assert m.sched.policy[11] == (os.SCHED_BATCH, 0)
    assert m.sched.affinity[300] == {0, 1, 2, 3}  # allowed
    assert (m.root / WRITEBACK).read_text() == "1"
    assert engine.verify() == []
    assert engine.off() == []
    assert m.sched.state() == sched_before
    assert tree_values(m.root, "sys") == files_before


def test_engine_adds_a_new_thread_from_an_event(m: Machinery, machine: Machine) -> None:
    engine = m.engine()
    engine.switch(m.wanted(machine, RULES), "p")
    add_kthread(m.root, 40, "kswapd1", start_time=9000)
    m.sched.add(40)
    settings = m.plugin.on_task(TaskEvent("fork", 40, 40, ppid=2))
    report = engine.extend({("kthread", k): v for k, v in settings.items()})
    assert report.applied == 1 and m.sched.affinity[40] == {3}
    assert engine.off() == []
    assert m.sched.affinity[40] == {0, 1, 2, 3}


# -- monitoring -----------------------------------------------------------------------------------


def test_rescan_interval(m: Machinery, machine: Machine) -> None:
    m.expand(machine, RULES)
    m.plugin.rescan_interval_s = 60.0
    assert not m.plugin.changed()
    m.plugin.rescan_interval_s = 0.0  # no task events: rescan on every tick
    assert m.plugin.changed()


def test_pin_delays_in_status(m: Machinery, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SimpleNamespace(CLOCK_MONOTONIC=1, clock_gettime_ns=lambda _: 1_000_000)
    monkeypatch.setattr(kthread_module, "time", clock)
    assert m.plugin.status() == {}
    for delay_us in (30, 10, 20, 400):
        m.plugin.record_delay(TaskEvent("fork", 1, 1, 2, time_ns=1_000_000 - delay_us * 1000))
    m.plugin.record_delay(TaskEvent("fork", 1, 1, 2, time_ns=0))  # no timestamp: not counted
    assert m.plugin.status() == {
        "pin_delay_us": {"count": 4, "p50": 30.0, "p99": 400.0, "max": 400.0}
    }


# -- schema -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"match": "(", "cpus": "0"}, "match: bad regular expression '('"),
        ({"match": "x", "cpus": "0", "policy": "deadline"}, "policy: expected one of other, fifo"),
        ({"match": "x", "cpus": "0", "priority": 100}, "priority: 100 is above the maximum 99"),
        ({"match": "x"}, "missing required option 'cpus'"),
    ],
)
def test_schema_errors(m: Machinery, machine: Machine, rule: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError) as info:
        validate(m.plugin.schema, {"rule": [rule]}, machine)
    assert info.value.message.startswith(message)


def test_a_task_moved_by_an_event_stays_owned_across_rescans(
    m: Machinery, machine: Machine
) -> None:
    """Moved by the watcher, then a rescan: it must not be handed back to the isolated CPU."""
    section = {"isolate_tasks": "1"}
    engine = m.engine()
    engine.switch(m.wanted(machine, section), "p")
    add_task(m.root, 700, "late", start_time=9000)
    m.sched.add(700, {1})
    moved = {("kthread", k): v for k, v in m.plugin.on_task(TaskEvent("comm", 700, 700)).items()}
    engine.extend(moved)
    assert m.sched.affinity[700] == {0, 2, 3}
    engine.switch(m.wanted(machine, section), "p", scope=["kthread"])  # the periodic rescan
    assert m.sched.affinity[700] == {0, 2, 3}
    engine.off()
    assert m.sched.affinity[700] == {1}
