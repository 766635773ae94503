"""The kthread plugin against fake /proc/PID/stat files and a fake scheduler."""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.kthread import (
    KthreadPlugin,
    KthreadRules,
    ThreadAffinity,
    ThreadPolicy,
    Workqueue,
    rules_from,
)

from latencyd.core.capabilities import FollowsTasks, declares, files_to_watch
from latencyd.core.engine import Engine, Refused, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.movable import MOVE_REFUSED
from latencyd.core.plugin import (
    CPU_ACTIONS,
    Monitor,
    TaskEvent,
    decode_target,
    encode_target,
    target_kinds,
)
from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import SchemaError, validate
from latencyd.errors import ApplyFailed, KernelRefused, NotApplicable
from latencyd.kernel.system import PF_KTHREAD, Machine, System, Task
from latencyd.service.daemon import Daemon, Delays
from tests.unit.fakesys import (
    EPERM_REASON,
    RefusingSystem,
    add_kthread,
    add_task,
    make_fake_root,
    put,
    stat_line,
    tree_values,
)
from tests.unit.taskrig import RULES, UNBOUND, WRITEBACK, Counting, Machinery

PER_CPU = "a per-CPU kernel thread (PF_NO_SETAFFINITY): the kernel does not let anyone move it"
NO_WRITEBACK_WQ = (
    "this kernel has no /sys/devices/virtual/workqueue/writeback/cpumask (before "
    "Linux 3.10, writeback runs in flush-* threads: match them with a rule)"
)


@pytest.fixture
def m(tmp_path: Path) -> Machinery:
    return Machinery(tmp_path, KthreadPlugin)


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
    kinds = target_kinds(m.plugin)
    for target in targets:
        assert decode_target(kinds, encode_target(target)) == target
    # The same thread's CPUs and policy are two settings, never one.
    assert ThreadAffinity(10, 10) != ThreadPolicy(10, 10)


def test_refusal_means_not_applicable_for_threads_but_not_workqueues() -> None:
    """A thread the kernel will not move is reported; a refused workqueue fails the profile."""
    assert ThreadAffinity.refusal_means == MOVE_REFUSED
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
    second = m.expand(machine, {"writeback_cpumask": "0"})
    assert {k: repr(v) for k, v in vars(m.plugin).items()} == before
    assert first.settings != second.settings
    assert m.expand(machine, RULES).settings == first.settings
    assert isinstance(first.rules, KthreadRules) and isinstance(second.rules, KthreadRules)
    assert first.rules.rules == rules_from(m.typed(machine, RULES))
    assert second.rules.rules == ()
    # The first section's rules still decide for a new thread after the second expansion.
    add_kthread(m.root, 40, "kswapd1", start_time=9000)
    assert m.plugin.on_task(first.rules, TaskEvent("fork", 40, 40, ppid=2), {}) == {
        ThreadAffinity(40, 9000): "3"
    }
    assert m.plugin.on_task(second.rules, TaskEvent("fork", 40, 40, ppid=2), {}) == {}


# -- task events --------------------------------------------------------------------------------


def test_user_forks_cost_nothing(m: Machinery, machine: Machine) -> None:
    system = Counting(m.root, m.sched)
    plugin = KthreadPlugin(system)
    options = validate(plugin.schema, RULES, machine)
    rules = plugin.expand(plugin.options_of(options), {}).rules
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


def test_comm_of_a_user_task_is_the_shields(m: Machinery, machine: Machine) -> None:
    rules = m.expand(machine, RULES).rules
    assert m.plugin.on_task(rules, TaskEvent("comm", 400, 400), {}) == {}


def test_follows_threads_and_cpus_and_never_user_tasks(m: Machinery, machine: Machine) -> None:
    assert declares(m.plugin, FollowsTasks)
    assert m.plugin.follows.udev == {"cpu": CPU_ACTIONS}
    assert not m.plugin.follows_user_tasks(m.typed(machine, RULES))  # the shield's


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
    assert files_to_watch(m.plugin, Workqueue("writeback")) == (WRITEBACK,)
    assert files_to_watch(m.plugin, Workqueue("unbound")) == (UNBOUND,)
    for target in (ThreadAffinity(13, 10), ThreadPolicy(10, 10)):
        assert files_to_watch(m.plugin, target) == ()


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
    section = {**RULES, "writeback_cpumask": "0", "unbound_cpumask": "0,2-3"}
    engine = m.engine()
    report = engine.switch(m.wanted(machine, section), "p")
    assert list(report.not_applicable) == [("kthread", ThreadAffinity(12, 10))]
    assert m.sched.affinity[14] == {3} and m.sched.affinity[400] == {0, 1, 2, 3}  # the shield's
    assert m.sched.policy[10] == (os.SCHED_FIFO, 2)
    assert m.sched.policy[11] == (os.SCHED_BATCH, 0)
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


# -- monitoring -----------------------------------------------------------------------------------


def test_rescan_interval(m: Machinery, machine: Machine) -> None:
    rules = m.expand(machine, RULES).rules
    m.plugin.rescan_interval_s = 60.0
    assert not m.plugin.changed(rules)
    m.plugin.rescan_interval_s = 0.0  # no task events: rescan on every tick
    assert m.plugin.changed(rules)
    m.plugin.rescan_interval_s = 60.0
    stale = KthreadRules(rules.rules, time.monotonic() - 61)
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


# -- schema -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"match": "(", "cpus": "0"}, "match: bad regular expression '('"),
        ({"match": "x", "cpus": "0", "policy": "deadline"}, "policy: expected one of other, fifo"),
        ({"match": "x", "cpus": "0", "priority": 100}, "priority: 100 is above the maximum 99"),
        ({"match": "x"}, "a rule needs cpus or a policy"),
        ({"match": "x", "cpus": "0", "user": True}, "unknown option 'user'"),  # [[shield.rule]]
    ],
)
def test_schema_errors(m: Machinery, machine: Machine, rule: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError) as info:
        validate(m.plugin.schema, {"rule": [rule]}, machine)
    assert info.value.message.startswith(message)
