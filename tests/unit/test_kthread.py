"""The kthread plugin against fake /proc/PID/stat files and a fake scheduler."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.kthread import (
    MOVE_REFUSED,
    THREAD_CHUNK,
    KthreadPlugin,
    KthreadRules,
    TaskAffinity,
    ThreadAffinity,
    ThreadPolicy,
    Workqueue,
    rules_from,
)
from latencyd.plugins.monitor import MonitorPlugin

from latencyd.core import engine as engine_module
from latencyd.core.engine import Engine, Refused, SettingId, section_schemas
from latencyd.core.errors import ApplyFailed, KernelRefused, NotApplicable
from latencyd.core.journal import Journal
from latencyd.core.noise import LastInterval, Tally, top_view
from latencyd.core.plugin import (
    CPU_ACTIONS,
    Expansion,
    Monitor,
    Plugin,
    Target,
    TaskEvent,
    Value,
    decode_target,
    encode_target,
    run_to_end,
    target_kinds,
)
from latencyd.core.profile import Profile, ProfileLibrary
from latencyd.core.schema import Machine, SchemaError, validate
from latencyd.core.system import PF_KTHREAD, System, Task
from latencyd.service.daemon import Daemon, Delays
from latencyd.tools.cli import format_status
from tests.unit.fakesys import (
    EPERM_REASON,
    FakeSched,
    RefusingSystem,
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
PER_CPU = "a per-CPU kernel thread (PF_NO_SETAFFINITY): the kernel does not let anyone move it"
NO_WRITEBACK_WQ = (
    "this kernel has no /sys/devices/virtual/workqueue/writeback/cpumask (before "
    "Linux 3.10, writeback runs in flush-* threads: match them with a rule)"
)


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

    def options(self, machine: Machine, section: dict[str, Any]) -> dict[str, Any]:
        return validate(self.plugin.schema, section, machine)

    def expand(
        self,
        machine: Machine,
        section: dict[str, Any],
        owned: Mapping[Target, Value] | None = None,
    ) -> Expansion:
        return self.plugin.expand(self.options(machine, section), owned or {})

    def settings(self, machine: Machine, section: dict[str, Any]) -> dict[Target, Value]:
        return self.expand(machine, section).settings

    def wanted(self, machine: Machine, section: dict[str, Any]) -> dict[SettingId, Value]:
        return {("kthread", t): v for t, v in self.settings(machine, section).items()}

    def profile(self, machine: Machine, section: dict[str, Any]) -> Profile:
        return Profile(
            "p", self.root / "p.toml", "", {"kthread": self.options(machine, section)}, {}
        )

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
ISOLATE = {"isolate_tasks": "1", "allow": ["sshd"]}


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


def test_a_usermode_helper_is_a_user_task_though_kthreadd_made_it(tmp_path: Path) -> None:
    """Issue 37: the kernel starts usermode helpers (modprobe, hotplug scripts) as children
    of kthreadd; they are user processes, not kernel threads: only PF_KTHREAD says so."""
    root = make_fake_root(tmp_path)
    add_task(root, 90, "modprobe", ppid=2, flags=0x00400100)
    add_kthread(root, 91, "kworker/1:0")
    system = System(root)
    helper, kthread = system.task(90), system.task(91)
    assert helper is not None and not helper.is_kthread
    assert kthread is not None and kthread.is_kthread


def test_fake_stat_line_has_the_kernels_52_fields() -> None:
    fields = stat_line(5, "x", 2, PF_KTHREAD, 99).split()
    assert len(fields) == 52
    # proc(5): field 2 comm, 4 ppid, 9 flags, 22 starttime (1-based)
    assert (fields[1], fields[3], fields[8], fields[21]) == ("(x)", "2", str(PF_KTHREAD), "99")


# -- targets -------------------------------------------------------------------------------------


def test_targets_round_trip_through_the_journal_form(m: Machinery) -> None:
    """The journal keeps targets as JSON: each kind must decode back to the same target."""
    targets = [Workqueue("writeback"), ThreadAffinity(10, 10), ThreadPolicy(10, 10)]
    targets.append(TaskAffinity(400, 1000, 401))
    kinds = target_kinds(m.plugin)
    for target in targets:
        assert decode_target(kinds, encode_target(target)) == target
    assert encode_target(TaskAffinity(400, 1000, 401)) == {
        "kind": "task_affinity",
        "pid": 400,
        "start": 1000,
        "tid": 401,
    }
    # The same thread's CPUs and policy are two settings, never one.
    assert ThreadAffinity(10, 10) != ThreadPolicy(10, 10)


def test_refusal_means_not_applicable_for_threads_but_not_workqueues() -> None:
    """A thread the kernel will not move is reported; a refused workqueue fails the profile."""
    assert ThreadAffinity.refusal_means == TaskAffinity.refusal_means == MOVE_REFUSED
    assert ThreadPolicy.refusal_means == "the kernel will not change this thread's policy"
    assert Workqueue.refusal_means is None


# -- rules -------------------------------------------------------------------------------------


def test_rules_match_kernel_threads_first_rule_wins(m: Machinery, machine: Machine) -> None:
    assert m.settings(machine, RULES) == {
        ThreadAffinity(10, 10): "0-1",
        ThreadPolicy(10, 10): ["fifo", 2],
        ThreadAffinity(11, 10): "0,2",
        ThreadPolicy(11, 10): ["batch", 0],
        ThreadAffinity(12, 10): "0",  # wanted; read will say it cannot be moved
        ThreadAffinity(13, 10): "0",
        ThreadAffinity(14, 10): "3",  # the first rule, not the second
        ThreadAffinity(15, 10): "0",
    }


def test_rules_never_match_kthreadd_or_user_tasks(m: Machinery, machine: Machine) -> None:
    section = {"rule": [{"match": "^(kthreadd|sshd|myapp|systemd)$", "cpus": "0"}]}
    assert m.settings(machine, section) == {}


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
    settings = m.settings(machine, {"rule": [{"match": "^kswapd", "cpus": "0", **rule}]})
    assert settings[ThreadPolicy(14, 10)] == sched
    m.plugin.write(ThreadPolicy(14, 10), sched)
    assert m.plugin.read(ThreadPolicy(14, 10)) == sched


def test_a_policy_only_rule_leaves_per_cpu_threads_where_they_are(
    m: Machinery, machine: Machine
) -> None:
    """ksoftirqd/N at SCHED_FIFO, as TuneD's realtime profile sets it: no CPUs asked, so no
    affinity a per-CPU thread cannot take (nor a "not applicable" line for each)."""
    settings = m.settings(machine, {"rule": [{"match": "^ksoftirqd/", "policy": "fifo",
                                              "priority": 2}]})  # fmt: skip
    assert settings == {ThreadPolicy(12, 10): ["fifo", 2]}


def test_write_and_read_go_through_the_scheduler(m: Machinery) -> None:
    assert m.plugin.read(ThreadAffinity(13, 10)) == "0-3"
    assert m.plugin.read(ThreadPolicy(10, 10)) == ["fifo", 1]
    m.plugin.write(ThreadAffinity(13, 10), "0,2")
    m.plugin.write(ThreadPolicy(10, 10), ["rr", 3])
    assert m.sched.affinity[13] == {0, 2}
    assert m.sched.policy[10] == (os.SCHED_RR, 3)
    assert m.plugin.read(ThreadPolicy(10, 10)) == ["rr", 3]
    m.sched.policy[10] = (os.SCHED_FIFO | 0x40000000, 3)  # SCHED_RESET_ON_FORK is or-ed in
    assert m.plugin.read(ThreadPolicy(10, 10)) == ["fifo", 3]
    assert m.plugin.same(ThreadAffinity(13, 10), "0,2", "0,2")
    assert m.plugin.same(ThreadAffinity(13, 10), "2,0", "0,2")
    assert not m.plugin.same(ThreadAffinity(13, 10), "0", "0,2")
    assert not m.plugin.same(ThreadPolicy(10, 10), ["rr", 3], ["rr", 4])
    assert m.plugin.exists(ThreadAffinity(13, 10)) and m.plugin.exists(Workqueue("writeback"))


def test_describe(m: Machinery) -> None:
    assert m.plugin.describe(ThreadAffinity(13, 10), "0") == "jbd2/vda1-8 (pid 13) CPUs = 0"
    assert (
        m.plugin.describe(ThreadPolicy(10, 10), ["fifo", 2])
        == "rcu_preempt (pid 10) policy = fifo priority 2"
    )
    assert m.plugin.describe(ThreadAffinity(99, 10), "0") == "pid 99 CPUs = 0"
    assert m.plugin.describe(Workqueue("unbound"), "0") == "workqueue unbound cpumask = 0"
    assert (
        m.plugin.describe(TaskAffinity(400, 1000, 401), "0")
        == "user task myapp (pid 400, thread 401) CPUs = 0"
    )


# -- what the kernel will not do ---------------------------------------------------------------


def test_per_cpu_kthread_is_not_applicable_without_asking_the_kernel(m: Machinery) -> None:
    with pytest.raises(NotApplicable) as info:
        m.plugin.read(ThreadAffinity(12, 10))
    assert str(info.value) == PER_CPU
    with pytest.raises(NotApplicable, match=r"PF_NO_SETAFFINITY"):
        m.plugin.write(ThreadAffinity(12, 10), "0")
    assert ("getaffinity", 12) not in m.sched.calls
    assert ("setaffinity", 12) not in m.sched.calls
    # Its policy is not pinned to the CPU: that one may still be read (and changed).
    assert m.plugin.read(ThreadPolicy(12, 10)) == ["other", 0]


def test_write_refusal_is_kernel_refused_for_the_engine(m: Machinery) -> None:
    """The plugin reports the errno as it is; turning it into "not applicable" is the engine's."""
    m.sched.refuse[13] = errno.EPERM
    with pytest.raises(KernelRefused) as info:
        m.plugin.write(ThreadAffinity(13, 10), "0")
    assert info.value.reason == "Operation not permitted (EPERM)"


def test_engine_records_per_cpu_and_refused_threads(m: Machinery, machine: Machine) -> None:
    m.sched.refuse[15] = errno.EINVAL  # e.g. a race with the thread binding itself
    m.sched.refuse[10] = errno.EPERM
    engine = m.engine()
    report = engine.switch(m.wanted(machine, RULES), "p")
    policy_refused = "the kernel will not change this thread's policy"
    assert report.not_applicable == {
        ("kthread", ThreadAffinity(12, 10)): Refused("0", PER_CPU),
        ("kthread", ThreadAffinity(15, 10)): Refused(
            "0", f"{MOVE_REFUSED}: Invalid argument (EINVAL)"
        ),
        ("kthread", ThreadAffinity(10, 10)): Refused(
            "0-1", f"{MOVE_REFUSED}: Operation not permitted (EPERM)"
        ),
        ("kthread", ThreadPolicy(10, 10)): Refused(
            ["fifo", 2], f"{policy_refused}: Operation not permitted (EPERM)"
        ),
    }
    assert engine.not_applicable == report.not_applicable
    assert engine.profile == "p"
    assert m.sched.affinity[13] == {0} and m.sched.affinity[14] == {3}
    assert ("setaffinity", 12) not in m.sched.calls
    assert ("kthread", ThreadAffinity(15, 10)) not in engine.applied
    assert engine.verify() == []


def test_thread_exiting_while_being_pinned_is_dropped(m: Machinery) -> None:
    """A thread that exits mid-write is gone, not refused: no error, nothing to restore."""

    def exit_now() -> None:
        shutil.rmtree(m.root / "proc/13")
        del m.sched.affinity[13]

    m.sched.before_set[13] = exit_now
    engine = m.engine()
    report = engine.switch(
        {("kthread", ThreadAffinity(13, 10)): "0", ("kthread", ThreadAffinity(14, 10)): "3"}, "p"
    )
    assert not m.plugin.exists(ThreadAffinity(13, 10))
    assert report.applied == 1 and report.not_applicable == {}
    assert engine.applied == {("kthread", ThreadAffinity(14, 10)): "3"}
    assert list(engine.originals) == [("kthread", ThreadAffinity(14, 10))]
    with pytest.raises(NotApplicable, match=r"^pid 13 has exited$"):
        m.plugin.write(ThreadAffinity(13, 10), "0")


def test_thread_gone_before_the_step_is_dropped(m: Machinery, machine: Machine) -> None:
    """Expanded, then exited before its original could be read: skipped, not an error."""
    wanted = m.wanted(machine, RULES)
    shutil.rmtree(m.root / "proc/13")
    del m.sched.affinity[13]
    engine = m.engine()
    report = engine.switch(wanted, "p")
    assert ("kthread", ThreadAffinity(13, 10)) not in engine.applied
    assert ("kthread", ThreadAffinity(13, 10)) not in report.not_applicable
    assert m.sched.affinity[14] == {3}


def test_recycled_pid_is_a_different_thread(m: Machinery, machine: Machine) -> None:
    engine = m.engine()
    engine.switch(m.wanted(machine, RULES), "p")
    assert m.sched.affinity[13] == {0}
    # jbd2 exits; a user process gets pid 13 (later start time) and its own affinity.
    add_task(m.root, 13, "bash", ppid=1, start_time=777777)
    m.sched.add(13, {1})
    assert not m.plugin.exists(ThreadAffinity(13, 10))
    assert m.plugin.exists(ThreadAffinity(14, 10))
    with pytest.raises(NotApplicable, match="pid 13 has exited"):
        m.plugin.read(ThreadAffinity(13, 10))
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
    assert ("kthread", ThreadAffinity(14, 10)) not in engine.applied
    assert engine.off() == []


# -- expand is pure ------------------------------------------------------------------------------


def test_expand_stores_nothing_on_the_plugin(m: Machinery, machine: Machine) -> None:
    """Rules travel in the Expansion, so a rejected switch cannot leave its rules behind."""
    before = {k: repr(v) for k, v in vars(m.plugin).items()}
    first = m.expand(machine, RULES)
    second = m.expand(machine, {**ISOLATE, "writeback_cpumask": "0"})
    assert {k: repr(v) for k, v in vars(m.plugin).items()} == before
    assert first.settings != second.settings
    assert m.expand(machine, RULES).settings == first.settings
    assert isinstance(first.rules, KthreadRules) and isinstance(second.rules, KthreadRules)
    assert first.rules.rules == rules_from(m.options(machine, RULES))
    assert second.rules.rules == () and second.rules.allow == ("sshd",)
    # The first section's rules still decide for a new thread after the second expansion.
    add_kthread(m.root, 40, "kswapd1", start_time=9000)
    assert m.plugin.on_task(first.rules, TaskEvent("fork", 40, 40, ppid=2), {}) == {
        ThreadAffinity(40, 9000): "3"
    }
    assert m.plugin.on_task(second.rules, TaskEvent("fork", 40, 40, ppid=2), {}) == {}


def test_moved_user_task_stays_owned_only_through_owned(m: Machinery, machine: Machine) -> None:
    """A rescan sees a moved task off the isolated CPUs; only `owned` says it is ours."""
    add_task(m.root, 700, "late", start_time=9000)
    m.sched.add(700, {0, 1, 2, 3})
    target = TaskAffinity(700, 9000, 700)
    assert m.settings(machine, ISOLATE)[target] == "0,2-3"
    m.plugin.write(target, "0,2-3")
    assert m.sched.affinity[700] == {0, 2, 3}
    assert target not in m.settings(machine, ISOLATE)
    rescan = m.expand(machine, ISOLATE, owned={target: "0,2-3"}).settings
    assert rescan[target] == "0,2-3"
    # Owning something else does not make the task wanted.
    other = m.expand(machine, ISOLATE, owned={TaskAffinity(700, 9000, 701): "0"}).settings
    assert target not in other


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
    options = validate(plugin.schema, {**RULES, "isolate_tasks": "1"}, machine)
    rules = plugin.expand(options, {}).rules
    system.looks = 0
    m.sched.calls.clear()
    for pid in range(1000, 1100):
        assert plugin.on_task(rules, TaskEvent("fork", pid, pid, ppid=400), {}) == {}
    assert plugin.on_task(rules, TaskEvent("fork", 400, 1200, ppid=400), {}) == {}  # a thread
    assert plugin.on_task(rules, TaskEvent("exit", 400, 401), {}) == {}
    assert system.looks == 0 and m.sched.calls == []


def test_no_rules_no_settings(m: Machinery) -> None:
    """Events before any section was applied (no rules yet) pin nothing."""
    add_kthread(m.root, 20, "kswapd1", start_time=5000)
    assert m.plugin.on_task(None, TaskEvent("fork", 20, 20, ppid=2), {}) == {}


def test_kthreadd_fork_gets_its_settings(m: Machinery, machine: Machine) -> None:
    rules = m.expand(machine, RULES).rules
    add_kthread(m.root, 20, "jbd2/vdb1-8", start_time=5000)
    m.sched.add(20)
    assert m.plugin.on_task(rules, TaskEvent("fork", 20, 20, ppid=2, time_ns=1), {}) == {
        ThreadAffinity(20, 5000): "0"
    }
    add_kthread(m.root, 21, "kworker/3:0", start_time=5001)  # no rule for it
    assert m.plugin.on_task(rules, TaskEvent("fork", 21, 21, ppid=2), {}) == {}
    assert m.plugin.on_task(rules, TaskEvent("fork", 22, 22, ppid=2), {}) == {}  # gone already


def test_comm_after_a_kthreadd_fork_gets_the_settings(m: Machinery, machine: Machine) -> None:
    # Older kernels: the child shows as "kthreadd" at fork and is named just after.
    rules = m.expand(machine, RULES).rules
    add_kthread(m.root, 30, "kthreadd", start_time=6000)
    assert m.plugin.on_task(rules, TaskEvent("fork", 30, 30, ppid=2), {}) == {}
    add_kthread(m.root, 30, "flush-254:16", start_time=6000)
    assert m.plugin.on_task(rules, TaskEvent("comm", 30, 30), {}) == {ThreadAffinity(30, 6000): "0"}
    # Only once per fork: a later rename is not a new kernel thread.
    assert m.plugin.on_task(rules, TaskEvent("comm", 30, 30), {}) == {}


def test_comm_of_a_user_task_with_isolate_tasks(m: Machinery, machine: Machine) -> None:
    rules = m.expand(machine, {"isolate_tasks": "1", "allow": ["ssh*", "trading-?"]}).rules
    add_task(m.root, 500, "worker", start_time=7000, threads=(501,))
    m.sched.add(500)
    m.sched.add(501, {1})  # only on the isolated CPU: put there on purpose, stays
    add_task(m.root, 500, "worker", start_time=7000, threads=(501, 502))
    m.sched.add(502, {1, 3})  # also elsewhere: narrowed to the elsewhere

    def on_comm(pid: int, tid: int) -> dict[Target, Value]:
        return m.plugin.on_task(rules, TaskEvent("comm", pid, tid), {})

    assert on_comm(500, 500) == {TaskAffinity(500, 7000, 500): "0,2-3"}
    assert on_comm(500, 501) == {}
    assert on_comm(500, 502) == {TaskAffinity(500, 7000, 502): "3"}
    add_task(m.root, 500, "trading-1", start_time=7000)  # exec'd into an allowed name
    assert on_comm(500, 500) == {}
    add_task(m.root, 500, "trading-10", start_time=7000)  # the glob does not match this
    assert on_comm(500, 500) == {TaskAffinity(500, 7000, 500): "0,2-3"}
    assert on_comm(402, 402) == {}  # not on CPU 1: nothing to do
    assert on_comm(10, 10) == {}  # kernel threads are not tasks
    assert on_comm(999, 999) == {}  # exited


def test_comm_without_isolate_tasks_is_ignored(m: Machinery, machine: Machine) -> None:
    rules = m.expand(machine, RULES).rules
    assert m.plugin.on_task(rules, TaskEvent("comm", 400, 400), {}) == {}


def test_follows_threads_and_cpus_and_user_tasks_only_when_asked(
    m: Machinery, machine: Machine
) -> None:
    assert m.plugin.follows.threads
    assert m.plugin.follows.udev == {"cpu": CPU_ACTIONS}
    assert m.plugin.follows_user_tasks(m.options(machine, ISOLATE))
    assert not m.plugin.follows_user_tasks(m.options(machine, RULES))


def test_user_rules_move_every_thread_of_matching_processes(m: Machinery, machine: Machine) -> None:
    """`user = true`: a rule for user processes (TuneD's scheduler groups), winning over
    isolate_tasks; kernel-thread rules still match kernel threads only."""
    section = {
        "isolate_tasks": "1",
        "rule": [
            {"match": "^myapp$", "cpus": "1", "user": True},
            {"match": "^kswapd", "cpus": "0"},
        ],
    }
    settings = m.settings(machine, section)
    assert settings[TaskAffinity(400, 1000, 400)] == "1"
    assert settings[TaskAffinity(400, 1000, 402)] == "1"  # kept off CPU 1 by its user: moved too
    assert settings[ThreadAffinity(14, 10)] == "0"
    assert TaskAffinity(300, 900, 300) in settings  # sshd is still shielded as before
    assert m.plugin.follows_user_tasks(m.options(machine, {"rule": section["rule"]}))
    # A process that exec's into the name gets the rule at its comm event.
    rules = m.expand(machine, {"rule": section["rule"]}).rules
    add_task(m.root, 700, "myapp", start_time=9000)
    m.sched.add(700)
    assert m.plugin.on_task(rules, TaskEvent("comm", 700, 700), {}) == {
        TaskAffinity(700, 9000, 700): "1"
    }
    assert m.plugin.on_task(rules, TaskEvent("comm", 300, 300), {}) == {}


# -- isolate_tasks ----------------------------------------------------------------------------


def test_isolate_tasks_moves_user_threads_off_the_cpus(m: Machinery, machine: Machine) -> None:
    add_task(m.root, 600, "pinned", start_time=8000)
    m.sched.add(600, {1})  # confined to the isolated CPU: put there on purpose, stays
    add_task(m.root, 620, "half", start_time=8002)
    m.sched.add(620, {1, 2})
    add_task(m.root, 610, "exiting", start_time=8001)  # its thread is gone from the scheduler
    settings = m.settings(machine, ISOLATE)
    assert settings == {
        TaskAffinity(1, 5, 1): "0,2-3",
        TaskAffinity(400, 1000, 400): "0,2-3",
        TaskAffinity(400, 1000, 401): "0,2-3",
        TaskAffinity(620, 8002, 620): "2",
    }
    target = TaskAffinity(400, 1000, 401)
    m.plugin.write(target, "0,2-3")
    assert m.sched.affinity[401] == {0, 2, 3}
    assert m.sched.affinity[400] == {0, 1, 2, 3}  # one thread, not the whole process
    assert m.plugin.read(target) == "0,2-3"
    assert m.plugin.exists(target) and not m.plugin.exists(TaskAffinity(400, 1000, 403))
    # A task this profile moved stays owned: still wanted, at the value it was given.
    assert m.expand(machine, ISOLATE, owned={target: "0,2-3"}).settings[target] == "0,2-3"


# -- workqueues --------------------------------------------------------------------------------


def test_workqueue_cpumasks_are_hex_masks(m: Machinery, machine: Machine) -> None:
    settings = m.settings(machine, {"writeback_cpumask": "0", "unbound_cpumask": "all - 1"})
    assert settings == {Workqueue("writeback"): "0", Workqueue("unbound"): "0,2-3"}
    assert m.plugin.read(Workqueue("writeback")) == "0-3"
    m.plugin.write(Workqueue("writeback"), "0")
    m.plugin.write(Workqueue("unbound"), "0,2-3")
    assert (m.root / WRITEBACK).read_text() == "1"
    assert (m.root / UNBOUND).read_text() == "d"
    assert m.plugin.read(Workqueue("unbound")) == "0,2-3"
    assert m.plugin.exists(Workqueue("unbound"))


def test_watch_files_name_workqueue_files_and_no_thread_files(m: Machinery) -> None:
    """Workqueue masks are files (inotify); thread affinities are not and must be polled."""
    assert m.plugin.watch_files(Workqueue("writeback")) == (WRITEBACK,)
    assert m.plugin.watch_files(Workqueue("unbound")) == (UNBOUND,)
    for target in (ThreadAffinity(13, 10), ThreadPolicy(10, 10), TaskAffinity(400, 1000, 401)):
        assert m.plugin.watch_files(target) == ()


def test_missing_workqueue_file_is_not_applicable(m: Machinery) -> None:
    (m.root / WRITEBACK).unlink()
    with pytest.raises(NotApplicable) as info:
        m.plugin.write(Workqueue("writeback"), "0")
    assert str(info.value) == NO_WRITEBACK_WQ
    with pytest.raises(NotApplicable, match=r"before Linux 3\.10"):
        m.plugin.read(Workqueue("writeback"))
    assert m.plugin.exists(Workqueue("writeback"))  # unsupported here, not vanished


def test_engine_reports_a_missing_workqueue_file_as_not_applicable(
    m: Machinery, machine: Machine
) -> None:
    """The reason must reach status: the file never existed, nothing vanished."""
    (m.root / WRITEBACK).unlink()
    engine = m.engine()
    report = engine.switch(
        m.wanted(machine, {"writeback_cpumask": "0", "unbound_cpumask": "0"}), "p"
    )
    assert (m.root / UNBOUND).read_text() == "1"
    assert report.not_applicable == {
        ("kthread", Workqueue("writeback")): Refused("0", NO_WRITEBACK_WQ)
    }


def test_refused_workqueue_write_fails_the_step(m: Machinery) -> None:
    """A workqueue mask has no refusal_means: the kernel saying no rolls the step back."""
    files_before = tree_values(m.root, "sys")
    system = RefusingSystem(m.root, m.sched)
    system.refuse[WRITEBACK] = EPERM_REASON
    engine = Engine({"kthread": KthreadPlugin(system)}, Journal(m.state_dir))
    wanted = {("kthread", Workqueue("unbound")): "0", ("kthread", Workqueue("writeback")): "0"}
    with pytest.raises(ApplyFailed, match=r"\[kthread\] workqueue writeback cpumask = 0"):
        engine.switch(wanted, "p")
    assert (UNBOUND, "1") in system.writes  # applied, then rolled back
    assert tree_values(m.root, "sys") == files_before
    assert engine.applied == {} and engine.not_applicable == {}


# -- through the engine ----------------------------------------------------------------------


def test_engine_round_trip_restores_everything(m: Machinery, machine: Machine) -> None:
    sched_before = m.sched.state()
    files_before = tree_values(m.root, "sys")
    section = {**RULES, "writeback_cpumask": "0", "unbound_cpumask": "0,2-3", **ISOLATE}
    engine = m.engine()
    report = engine.switch(m.wanted(machine, section), "p")
    assert list(report.not_applicable) == [("kthread", ThreadAffinity(12, 10))]
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
    expansion = m.expand(machine, RULES)
    engine.switch({("kthread", t): v for t, v in expansion.settings.items()}, "p")
    add_kthread(m.root, 40, "kswapd1", start_time=9000)
    m.sched.add(40)
    settings = m.plugin.on_task(expansion.rules, TaskEvent("fork", 40, 40, ppid=2), {})
    report = engine.extend("kthread", settings)
    assert report.applied == 1 and m.sched.affinity[40] == {3}
    assert engine.off() == []
    assert m.sched.affinity[40] == {0, 1, 2, 3}


def test_a_task_moved_by_an_event_stays_owned_across_rescans(
    m: Machinery, machine: Machine
) -> None:
    """Moved by the watcher, then a rescan: it must not be handed back to the isolated CPU."""
    section = {"isolate_tasks": "1"}
    engine = m.engine()
    engine.apply(m.profile(machine, section))
    add_task(m.root, 700, "late", start_time=9000)
    m.sched.add(700, {1, 2, 3})
    event = TaskEvent("comm", 700, 700)
    moved = m.plugin.on_task(
        engine.sections["kthread"].expansion.rules, event, engine.owned("kthread")
    )
    engine.extend("kthread", moved)
    assert m.sched.affinity[700] == {2, 3}
    engine.apply(m.profile(machine, section), only=["kthread"])  # the periodic rescan
    assert m.sched.affinity[700] == {2, 3}
    assert ("kthread", TaskAffinity(700, 9000, 700)) in engine.applied
    assert engine.off() == []
    assert m.sched.affinity[700] == {1, 2, 3}


def test_a_narrowed_task_put_back_inside_the_shield_is_handed_over(
    m: Machinery, machine: Machine
) -> None:
    """Someone confines a task the shield narrowed to the isolated CPUs (`taskset -p`): it
    is theirs. No drift, not re-applied by a rescan, and `off` leaves it where they put it."""
    section = {"isolate_tasks": "1"}
    engine = m.engine()
    engine.apply(m.profile(machine, section))
    sid = ("kthread", TaskAffinity(400, 1000, 401))
    assert m.sched.affinity[401] == {0, 2, 3} and sid in engine.applied
    m.sched.affinity[401] = {1}
    engine.apply(m.profile(machine, section), only=["kthread"])  # a rescan first
    assert m.sched.affinity[401] == {1} and sid not in engine.applied
    assert engine.verify() == []
    m.sched.affinity[400] = {1}  # the drift check sees it first
    assert engine.verify() == []
    assert ("kthread", TaskAffinity(400, 1000, 400)) not in engine.applied
    journal = engine.journal.load()
    assert journal is not None and not [k for k in journal.originals if '"tid":40' in k[1]]
    assert engine.off() == []
    assert m.sched.affinity[400] == m.sched.affinity[401] == {1}
    # Drift outside the shield is still drift.
    engine.apply(m.profile(machine, section))
    m.sched.affinity[1] = {1, 2}
    assert [d.target for d in engine.verify()] == [TaskAffinity(1, 5, 1)]
    assert engine.off() == []


def _pinned_by_its_user_while_journaled(m: Machinery, engine: Engine, pid: int) -> None:
    """`taskset -c 1` lands on `pid` while the engine journals the originals: after its
    CPUs were read for the decision and for the original, before the write."""
    record = engine.journal.record

    def user_pins_then_record(*args: Any, **kwargs: Any) -> None:
        m.sched.affinity[pid] = frozenset({1})
        record(*args, **kwargs)

    engine.journal.record = user_pins_then_record  # type: ignore[method-assign]


def test_a_task_its_user_pins_to_the_shield_during_the_step_is_left_there(
    m: Machinery, machine: Machine
) -> None:
    """An application started as `taskset -c 1 app` from a shell on every CPU: the exec
    event of the shell's child is judged on all CPUs, and its user pins it inside the
    shield before the write. The write must not move it out (the shield moved measure's
    sockperf server to CPU 0 this way under I/O load): one read right before it says so."""
    engine = m.engine()
    section = {"isolate_tasks": "1"}
    engine.apply(m.profile(machine, section))
    add_task(m.root, 700, "app", start_time=9000)
    m.sched.add(700)
    rules = engine.sections["kthread"].expansion.rules
    moved = m.plugin.on_task(rules, TaskEvent("comm", 700, 700), engine.owned("kthread"))
    assert moved == {TaskAffinity(700, 9000, 700): "0,2-3"}  # judged before the pin
    _pinned_by_its_user_while_journaled(m, engine, 700)
    report = engine.extend("kthread", moved)
    assert m.sched.affinity[700] == {1}
    assert report.applied == 0 and ("kthread", TaskAffinity(700, 9000, 700)) not in engine.applied
    journal = engine.journal.load()
    assert journal is not None and not [k for k in journal.originals if '"pid":700' in k[1]]
    assert engine.verify() == []
    assert engine.off() == []
    assert m.sched.affinity[700] == {1}


def test_a_pid_reused_while_a_step_gives_the_main_loop_a_turn_is_not_written(
    m: Machinery, machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 37: a step a slice at a time lets the main loop run between slices; a task it
    read may exit meanwhile and its pid go to another process. The write must be judged
    by what was read since the turn, not by what the step read before it."""
    monkeypatch.setattr(engine_module, "SLICE_S", 0.0)  # a turn before every setting
    engine = m.engine()
    wanted = m.wanted(machine, {"isolate_tasks": "1"})
    assert ("kthread", TaskAffinity(400, 1000, 400)) in wanted
    steps = engine.switch_steps(wanted, "p")
    reused = False
    try:
        progress = next(steps)
        while True:
            if not reused and progress.done > len(wanted):  # originals read: now writing
                add_task(m.root, 400, "victim", start_time=5555)  # 400 exited; pid reused
                reused = True
            progress = steps.send(None)
    except StopIteration as done:
        report = done.value
    assert reused
    assert m.sched.affinity[400] == {0, 1, 2, 3}  # the new process was not narrowed
    moved = [t.pid for t, _, _ in report.changes["kthread"]]
    assert 400 not in moved and 1 in moved  # the others were narrowed as ever
    assert ("kthread", TaskAffinity(400, 1000, 400)) not in engine.applied  # it is gone
    assert engine.off() == []


def test_a_task_pinned_during_the_first_switch_is_left_there(
    m: Machinery, machine: Machine
) -> None:
    """The same race in the switch that raises the shield (its expansion read every
    thread long before the writes): judged by the rules being applied."""
    engine = m.engine()
    _pinned_by_its_user_while_journaled(m, engine, 401)
    engine.apply(m.profile(machine, {"isolate_tasks": "1"}))
    assert m.sched.affinity[401] == {1} and m.sched.affinity[400] == {0, 2, 3}
    assert ("kthread", TaskAffinity(400, 1000, 401)) not in engine.applied
    assert engine.off() == []
    assert m.sched.affinity[401] == {1} and m.sched.affinity[400] == {0, 1, 2, 3}


def test_a_task_its_user_pins_right_after_the_write_is_theirs(
    m: Machinery, machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pin lands between the write and its read-back: not "the kernel kept another
    value" (a failed step), but the user's choice, left as it is."""
    engine = m.engine()
    engine.apply(m.profile(machine, {"isolate_tasks": "1"}))
    add_task(m.root, 700, "app", start_time=9000)
    m.sched.add(700)
    rules = engine.sections["kthread"].expansion.rules
    moved = m.plugin.on_task(rules, TaskEvent("comm", 700, 700), engine.owned("kthread"))
    set_affinity, pins = m.sched.sched_setaffinity, [700]

    def then_the_user_pins(pid: int, cpus: Any) -> None:
        set_affinity(pid, cpus)
        if pid in pins:  # once: `taskset -c 1 app` right after the shield's write
            m.sched.affinity[pins.pop()] = frozenset({1})

    monkeypatch.setattr(m.sched, "sched_setaffinity", then_the_user_pins)
    report = engine.extend("kthread", moved)
    monkeypatch.undo()
    assert m.sched.affinity[700] == {1} and report.applied == 0
    assert ("kthread", TaskAffinity(700, 9000, 700)) not in engine.applied
    assert engine.verify() == []
    assert engine.off() == []
    assert m.sched.affinity[700] == {1}


def test_off_leaves_a_task_its_user_confined_to_the_shield_since_the_last_check(
    m: Machinery, machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    """A narrowed task its user then pins inside the shield (`taskset -p -c 1 PID`) is
    theirs; off (or a switch giving it back) comes before the check that would have let
    it go: it restores only what still holds the narrowed CPUs, and says why not the rest.
    A task moved elsewhere, not inside the shield, is drift: its original comes back."""
    engine = m.engine()
    engine.apply(m.profile(machine, {"isolate_tasks": "1"}))
    assert m.sched.affinity[401] == m.sched.affinity[300] == {0, 2, 3}
    m.sched.affinity[401] = frozenset({1})  # its user's pin, after the write
    m.sched.affinity[300] = frozenset({2})  # moved, not inside the shield
    caplog.set_level(logging.INFO)
    assert engine.off() == []
    assert m.sched.affinity[401] == {1}
    assert m.sched.affinity[300] == m.sched.affinity[400] == {0, 1, 2, 3}
    assert "thread 401) CPUs = 1: left as it is, put on isolated CPUs 1 on purpose" in caplog.text


def test_bench_latency_counts_the_moves_and_catches_the_daemon_logs(
    m: Machinery, machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    """`bench latency` says whether the shield moved the taskset-pinned application by
    reading these log lines back: reworded, it would count 0 and pass silently."""
    from bench.latency import application_moves

    caplog.set_level(logging.INFO)
    engine = m.engine()
    engine.apply(m.profile(machine, {"isolate_tasks": "1"}))
    for pid, pinned_meanwhile in ((700, False), (701, True)):
        add_task(m.root, pid, "app", start_time=9000 + pid)
        m.sched.add(pid)
        rules = engine.sections["kthread"].expansion.rules
        moved = m.plugin.on_task(rules, TaskEvent("comm", pid, pid), engine.owned("kthread"))
        if pinned_meanwhile:
            _pinned_by_its_user_while_journaled(m, engine, pid)
        engine.extend("kthread", moved)
    log = "\n".join(record.getMessage() for record in caplog.records)
    found = application_moves(log, "app")
    assert (found["moved"], found["caught"]) == (1, 1), log
    assert found["lines"] == ["user task app (pid 700, thread 700): CPUs 0-3 -> 0,2-3"]
    assert application_moves(log, "sockperf") == {"moved": 0, "caught": 0, "lines": []}
    assert engine.off() == []


def test_what_a_task_started_before_it_was_narrowed_is_narrowed_after_it(
    m: Machinery, machine: Machine, tmp_path: Path
) -> None:
    """stress-ng forks its workers before the shield handles its exec: they inherit every
    CPU and no event tells of them. Once the exec's setting is written, the daemon asks
    again ("applied"), generation by generation: a second thread, a child and a
    grandchild are narrowed; a child its user pinned inside the shield stays."""
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "p.toml").write_text('[kthread]\nisolate_tasks = "1"\n')
    plugins = {"kthread": m.plugin}
    daemon = Daemon(
        m.system, plugins, ProfileLibrary([pdir], section_schemas(plugins), machine), m.engine()
    )
    daemon.switch("p")
    add_task(m.root, 700, "stress-ng", start_time=9000, threads=(704,))
    for pid, comm in ((701, "worker"), (702, "grandchild"), (703, "pinned")):
        add_task(m.root, pid, comm, ppid=700 if pid != 702 else 701, start_time=9000 + pid)
    (m.root / "proc/700/task/704/children").write_text("701 703 ")  # forked by its 2nd thread
    (m.root / "proc/701/task/701/children").write_text("702 ")
    for tid in (700, 701, 702, 704):
        m.sched.add(tid)
    m.sched.add(703, {1})
    daemon.on_task_events([TaskEvent("comm", 700, 700)])
    assert {t: set(m.sched.affinity[t]) for t in (700, 704, 701, 702, 703)} == {
        700: {0, 2, 3},
        704: {0, 2, 3},
        701: {0, 2, 3},
        702: {0, 2, 3},
        703: {1},
    }
    assert m.plugin.just_narrowed == set()
    assert daemon.engine.off() == []
    assert all(m.sched.affinity[t] == {0, 1, 2, 3} for t in (700, 701, 702, 704))


# -- monitoring -----------------------------------------------------------------------------------


def test_rescan_interval(m: Machinery, machine: Machine) -> None:
    rules = m.expand(machine, RULES).rules
    m.plugin.rescan_interval_s = 60.0
    assert not m.plugin.changed(rules)
    m.plugin.rescan_interval_s = 0.0  # no task events: rescan on every tick
    assert m.plugin.changed(rules)
    m.plugin.rescan_interval_s = 60.0
    stale = KthreadRules(rules.rules, rules.isolate_tasks, rules.allow, time.monotonic() - 61)
    assert m.plugin.changed(stale)  # scanned over a minute ago: due again


def test_monitor_facts(m: Machinery, machine: Machine) -> None:
    assert m.plugin.monitor(m.expand(machine, RULES).rules) == Monitor(
        facts={"rules": 5, "rescan_every_s": 60.0}
    )
    assert m.plugin.monitor(None) == Monitor()


def test_delay_summary() -> None:
    delays = Delays()
    for delay_us in (30, 10, 20, 400):
        delays.add(delay_us * 1000)
    assert delays.summary() == {"count": 4, "p50": 30.0, "p99": 400.0, "max": 400.0}
    for _ in range(1200):
        delays.add(1000)
    assert len(delays.ns) == 1000  # bounded: the newest thousand


def test_pin_delays_are_measured_by_the_daemon(
    m: Machinery, machine: Machine, tmp_path: Path
) -> None:
    """Event timestamp -> pinned, per plugin, in status; events without a timestamp do not count."""
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "p.toml").write_text('[[kthread.rule]]\nmatch = "^kswapd"\ncpus = "3"\n')
    plugins = {"kthread": m.plugin}
    library = ProfileLibrary([pdir], section_schemas(plugins), machine)
    daemon = Daemon(m.system, plugins, library, m.engine())
    daemon.switch("p")
    add_kthread(m.root, 40, "kswapd1", start_time=9000)
    add_kthread(m.root, 41, "kswapd2", start_time=9001)
    m.sched.add(40)
    m.sched.add(41)
    started = time.clock_gettime_ns(time.CLOCK_MONOTONIC) - 250_000
    daemon.on_task_events([TaskEvent("fork", 40, 40, ppid=2, time_ns=started)])
    daemon.on_task_events([TaskEvent("fork", 41, 41, ppid=2)])
    assert m.sched.affinity[40] == {3} and m.sched.affinity[41] == {3}
    facts = daemon.status()["plugins"]["kthread"]["facts"]
    assert facts["rules"] == 1
    delay = facts["event_to_applied_us"]
    assert delay["count"] == 1
    assert delay["p50"] == delay["max"] >= 250.0


def test_status_shows_tasks_to_root_and_the_admin_group_only(
    m: Machinery, machine: Machine, tmp_path: Path
) -> None:
    """Status to anyone else is what hidepid would let them see: no pid, name or CPUs of
    another user's task (settings of the shield, its table, the noise watch's sources,
    a holder), only how many there are; everything else as root sees it."""
    add_task(m.root, 600, "pinned", start_time=8000)
    m.sched.add(600, {1})  # confined to the isolated CPU: a row of the shield's table
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "p.toml").write_text(
        '[kthread]\nisolate_tasks = "1"\nwriteback_cpumask = "0"\n'
        '[[kthread.rule]]\nmatch = "^kswapd"\ncpus = "3"\n[monitor]\ncpus = "1"\n'
    )
    monitor = MonitorPlugin(m.system)
    plugins: dict[str, Plugin[Any]] = {"kthread": m.plugin, "monitor": monitor}
    library = ProfileLibrary([pdir], section_schemas(plugins), machine)
    daemon = Daemon(m.system, plugins, library, Engine(plugins, Journal(m.state_dir)))
    run_to_end(daemon.hold_steps("p", "latency bench", ":1.42", pid=4321))
    noise = {
        "task 400 myapp": Tally(3, 2_000_000, 1_000_000),
        "local timer": Tally(250, 1_000_000, 8_000),
    }
    monitor.last = LastInterval("tracefs", 1.0, {1: noise})

    root, others = daemon.status(), daemon.status(sees_tasks=False)
    seen, shown = json.dumps(root), json.dumps(others)
    for identity in ("myapp", "kswapd0", "pinned", "sshd", "(pid ", ":1.42"):
        assert identity in seen and identity not in shown
    kthread = others["plugins"]["kthread"]
    tasks = [t for p, t in daemon.engine.applied if p == "kthread" and "pid" in encode_target(t)]
    assert kthread["hidden"] == len(tasks) == 5  # systemd, sshd, myapp (2 threads), kswapd0
    assert [row["text"] for row in kthread["applied"]] == ["workqueue writeback cpumask = 0"]
    (shield,) = kthread["tables"]
    assert shield["rows"] == [] and shield["hidden"] == 1
    assert [row[0] for row in root["plugins"]["kthread"]["tables"][0]["rows"]] == [600]
    (sources,) = others["plugins"]["monitor"]["tables"]  # the time stays, not whose it was
    assert [row[:3] for row in sources["rows"]] == [
        ["1", "task (hidden)", "3"],
        ["1", "local timer", "250"],
    ]
    assert [(h["owner"], h["pid"]) for h in root["holds"]] == [(":1.42", 4321)]
    assert [(h["owner"], h["pid"], h["reason"]) for h in others["holds"]] == [
        (None, None, "latency bench")
    ]
    # As latencyctl status and top show it.
    text = "\n".join(format_status(others))
    assert f"({len(tasks):,} settings of tasks: shown to root and the admin group only)" in text
    assert "(1 row naming tasks: shown to root and the admin group only)" in text
    view = top_view(others)
    assert view["expected"] == ["hold 1 (latency bench)"]
    assert [s["source"] for s in view["cpus"]["1"]] == ["task (hidden)", "local timer"]


# -- schema -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"match": "(", "cpus": "0"}, "match: bad regular expression '('"),
        ({"match": "x", "cpus": "0", "policy": "deadline"}, "policy: expected one of other, fifo"),
        ({"match": "x", "cpus": "0", "priority": 100}, "priority: 100 is above the maximum 99"),
        ({"match": "x"}, "a rule needs cpus (or, for kernel threads, a policy)"),
        ({"match": "x", "user": True, "policy": "fifo"}, "a rule needs cpus"),
    ],
)
def test_schema_errors(m: Machinery, machine: Machine, rule: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError) as info:
        validate(m.plugin.schema, {"rule": [rule]}, machine)
    assert info.value.message.startswith(message)


def test_every_move_is_logged_once_per_process_and_move(
    m: Machinery, machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    """Every move of a user task is said (name, pid, threads, CPUs before and after), in
    one line per process and move however many threads it has; and so is giving back."""
    caplog.set_level(logging.INFO, logger="latencyd.plugins.kthread")
    engine = m.engine()
    engine.apply(m.profile(machine, {"isolate_tasks": "1"}))
    moves = [r.getMessage() for r in caplog.records if r.getMessage().startswith("user task")]
    assert "user task myapp (pid 400, 2 threads): CPUs 0-3 -> 0,2-3" in moves
    assert "user task systemd (pid 1, thread 1): CPUs 0-3 -> 0,2-3" in moves
    assert len(moves) == len({line.split(":")[0] for line in moves})  # one per process
    caplog.clear()
    assert engine.off() == []
    back = [r.getMessage() for r in caplog.records if r.getMessage().startswith("user task")]
    assert "user task myapp (pid 400, 2 threads): CPUs 0,2-3 -> 0-3" in back


def test_a_switch_to_other_isolated_cpus_starts_from_what_the_task_was_given(
    m: Machinery, machine: Machine
) -> None:
    """Found by bench latency's mis-tuned profile: a floating load narrowed off CPU 1 was
    then "confined to the isolated CPUs" of a profile isolating CPU 0 and stayed there. A
    task we moved is judged by its original affinity, not by what we made of it."""
    add_task(m.root, 620, "half", start_time=8002)
    m.sched.add(620, {1, 2})
    engine = m.engine()
    engine.apply(m.profile(machine, {"isolate_tasks": "1"}))
    assert m.sched.affinity[400] == {0, 2, 3} and m.sched.affinity[620] == {2}
    engine.apply(m.profile(machine, {"isolate_tasks": "0"}))
    assert m.sched.affinity[400] == {1, 2, 3}  # from 0-3, not from 0,2-3
    assert m.sched.affinity[620] == {1, 2}  # never touched CPU 0: given back
    engine.apply(m.profile(machine, {"isolate_tasks": "0"}), only=["kthread"])  # a rescan
    assert m.sched.affinity[400] == {1, 2, 3} and m.sched.affinity[620] == {1, 2}
    assert engine.off() == []
    assert m.sched.affinity[400] == {0, 1, 2, 3} and m.sched.affinity[620] == {1, 2}


def test_a_switch_to_other_isolated_cpus_moves_what_narrowed_tasks_started(
    m: Machinery, machine: Machine
) -> None:
    """A task born of a narrowed one, and what it starts, carry the narrowed CPUs (here
    CPU 0, what the first shield left). At a switch to a shield of CPU 0 they are judged
    as their narrowed ancestor is, by its original: moved off CPU 0 with it, not taken for
    tasks their user put inside the new shield (found with the daemon's noise watch:
    stress-ng started from a narrowed shell's subshell ran on the isolated CPU)."""
    engine = m.engine()
    engine.apply(m.profile(machine, {"isolate_tasks": "1-3"}))
    assert m.sched.affinity[400] == {0}
    add_task(m.root, 800, "child", ppid=400, start_time=8100)
    add_task(m.root, 801, "grandchild", ppid=800, start_time=8101)  # a subshell's load
    add_task(m.root, 802, "pinned", ppid=800, start_time=8102)
    m.sched.add(800, {0})  # forked since: inherited the narrowed CPUs
    m.sched.add(801, {0})
    m.sched.add(802, {1})  # its user put it inside the shield: theirs
    engine.apply(m.profile(machine, {"isolate_tasks": "0"}))
    assert m.sched.affinity[400] == m.sched.affinity[800] == m.sched.affinity[801] == {1, 2, 3}
    assert ("kthread", TaskAffinity(801, 8101, 801)) in engine.applied
    assert m.sched.affinity[802] == {1}
    assert engine.verify() == []
    assert engine.off() == []
    assert m.sched.affinity[400] == m.sched.affinity[800] == m.sched.affinity[801] == {0, 1, 2, 3}
    assert m.sched.affinity[802] == {1}


def test_expanding_a_task_of_many_threads_yields_between_chunks(
    m: Machinery, machine: Machine
) -> None:
    """Issue 19: a JVM's 20,000 threads are read a chunk at a time, so the daemon answers
    D-Bus between chunks (Plugin.expand_steps); the result is expand's."""
    threads = tuple(range(5001, 5001 + 2 * THREAD_CHUNK + 5))
    add_task(m.root, 5000, "jvm", start_time=8000, threads=threads)
    for tid in (5000, *threads):
        m.sched.add(tid)
    options = m.options(machine, ISOLATE)
    steps = m.plugin.expand_steps(options, {})
    pieces = 0
    with pytest.raises(StopIteration) as end:
        while True:
            next(steps)
            pieces += 1
    expansion = end.value.value
    users = [t.comm for t in m.system.tasks() if not t.is_kthread]
    assert users == ["systemd", "sshd", "myapp", "jvm"]
    # one per task, and one per chunk of a shielded user task's threads: the jvm's 3, one
    # each for systemd and myapp (sshd is allowed: its threads are not read at all)
    assert pieces == len(m.system.tasks()) + 3 + 2
    narrowed = {t.tid for t in expansion.settings if isinstance(t, TaskAffinity)}
    assert set(threads) | {5000} <= narrowed
    assert expansion.settings == m.plugin.expand(options, {}).settings


def test_tasks_born_narrowed_are_owned_and_given_their_parents_cpus(tmp_path: Path) -> None:
    """A thread and a child process forked by a narrowed process after the switch carry
    the narrowed CPUs (user forks are not heard of). The next expansion (a rescan, an exec,
    a switch) owns them, so off gives them the parent's original; a task someone pinned
    elsewhere is not taken for one."""
    from tests.unit.test_scale import jvm_of_200_threads, shielding_daemon

    system, sched = jvm_of_200_threads(tmp_path)
    daemon = shielding_daemon(tmp_path, system)
    daemon.switch("p")
    assert sched.affinity[1000] == {0, 2, 3}
    # Born since: a thread of the narrowed process, a child process, and an unrelated
    # task its user pinned to CPU 0 (not what the shield gave the parent).
    add_task(system.root, 1000, "jvm", threads=(*range(1001, 1200), 1300))
    add_task(system.root, 1400, "jvm-child", ppid=1000, start_time=5000)
    add_task(system.root, 1500, "pinned", ppid=1000, start_time=5001)
    sched.add(1300, {0, 2, 3})
    sched.add(1400, {0, 2, 3})
    sched.add(1500, {0})
    daemon.refresh(["kthread"])
    owned = {t for _, t in daemon.engine.applied if isinstance(t, TaskAffinity)}
    assert {t.tid for t in owned} >= {1300, 1400} and 1500 not in {t.tid for t in owned}
    assert daemon.engine.off() == []
    assert sched.affinity[1300] == sched.affinity[1400] == {0, 1, 2, 3}
    assert sched.affinity[1500] == {0} and sched.affinity[1000] == {0, 1, 2, 3}


def test_a_task_born_narrowed_is_owned_without_a_write_that_would_undo_its_users_pin(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rescan finds a child of a narrowed process mid-way through `taskset -c 1 app`:
    it still carries the narrowed CPUs, and its own pin lands just before the daemon's
    write would (the fake's before_set). Nothing is written to a task that already holds
    what is wanted, so the pin stays; it is owned all the same (off gives it the parent's
    original), and no move is logged for a task that was never moved."""
    from tests.unit.test_scale import jvm_of_200_threads, shielding_daemon

    system, sched = jvm_of_200_threads(tmp_path)
    daemon = shielding_daemon(tmp_path, system)
    daemon.switch("p")
    add_task(system.root, 1400, "taskset", ppid=1000, start_time=5000)
    sched.add(1400, {0, 2, 3})
    sched.before_set[1400] = lambda: sched.affinity.update({1400: frozenset({1})})
    sched.calls.clear()
    caplog.set_level(logging.INFO)
    daemon.refresh(["kthread"])
    assert ("setaffinity", 1400) not in sched.calls
    assert any(t.tid == 1400 for _, t in daemon.engine.applied if isinstance(t, TaskAffinity))
    assert "pid 1400" not in caplog.text
    sched.before_set.pop(1400)()  # the pin, as the task runs on
    daemon.check()
    assert daemon.engine.off() == []
    assert sched.affinity[1400] == {1}  # theirs: confined to the isolated CPU, left there
    assert sched.affinity[1000] == {0, 1, 2, 3}
