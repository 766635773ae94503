"""The shield plugin (user tasks kept off the shielded CPUs) against fake /proc/PID/stat
files and a fake scheduler."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.kthread import KthreadPlugin, ThreadAffinity
from latencyd.plugins.monitor import MonitorPlugin
from latencyd.plugins.shield import THREAD_CHUNK, ShieldPlugin, ShieldRules, TaskAffinity

from latencyd.core import engine as engine_module
from latencyd.core.capabilities import FollowsTasks, declares, files_to_watch
from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal, JournalState, key_of
from latencyd.core.movable import MOVE_REFUSED
from latencyd.core.plugin import (
    CPU_ACTIONS,
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
from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import SchemaError, validate
from latencyd.errors import NotApplicable
from latencyd.kernel.noise import LastInterval, Tally
from latencyd.kernel.system import Machine
from latencyd.service.daemon import Daemon
from latencyd.tools.cli import format_status
from latencyd.tools.top import top_view
from tests.unit.fakesys import add_task
from tests.unit.taskrig import ISOLATE, Counting, Machinery


@pytest.fixture
def m(tmp_path: Path) -> Machinery:
    return Machinery(tmp_path, ShieldPlugin)


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


def test_comm_of_a_user_task_under_the_shield(m: Machinery, machine: Machine) -> None:
    rules = m.expand(machine, {"cpus": "1", "allow": ["ssh*", "trading-?"]}).rules
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


def test_user_rules_move_every_thread_of_matching_processes(m: Machinery, machine: Machine) -> None:
    """[[shield.rule]]: a rule for user processes (TuneD's scheduler groups), winning over
    the shield; it never matches kernel threads (kswapd0 stays the kthread rules')."""
    section = {
        "cpus": "1",
        "rule": [
            {"match": "^myapp$", "cpus": "1"},
            {"match": "^kswapd", "cpus": "0"},
        ],
    }
    settings = m.settings(machine, section)
    assert settings[TaskAffinity(400, 1000, 400)] == "1"
    assert settings[TaskAffinity(400, 1000, 402)] == "1"  # kept off CPU 1 by its user: moved too
    assert all(isinstance(t, TaskAffinity) and t.pid != 14 for t in settings)
    assert TaskAffinity(300, 900, 300) in settings  # sshd is still shielded as before
    assert m.plugin.follows_user_tasks(m.typed(machine, {"rule": section["rule"]}))
    # A process that exec's into the name gets the rule at its comm event.
    rules = m.expand(machine, {"rule": section["rule"]}).rules
    add_task(m.root, 700, "myapp", start_time=9000)
    m.sched.add(700)
    assert m.plugin.on_task(rules, TaskEvent("comm", 700, 700), {}) == {
        TaskAffinity(700, 9000, 700): "1"
    }
    assert m.plugin.on_task(rules, TaskEvent("comm", 300, 300), {}) == {}


def test_the_shield_moves_user_threads_off_the_cpus(m: Machinery, machine: Machine) -> None:
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


def test_a_task_moved_by_an_event_stays_owned_across_rescans(
    m: Machinery, machine: Machine
) -> None:
    """Moved by the watcher, then a rescan: it must not be handed back to the isolated CPU."""
    section = {"cpus": "1"}
    engine = m.engine()
    engine.apply(m.profile(machine, section))
    add_task(m.root, 700, "late", start_time=9000)
    m.sched.add(700, {1, 2, 3})
    event = TaskEvent("comm", 700, 700)
    moved = m.plugin.on_task(
        engine.sections["shield"].expansion.rules, event, engine.owned("shield")
    )
    engine.extend("shield", moved)
    assert m.sched.affinity[700] == {2, 3}
    engine.apply(m.profile(machine, section), only=["shield"])  # the periodic rescan
    assert m.sched.affinity[700] == {2, 3}
    assert ("shield", TaskAffinity(700, 9000, 700)) in engine.applied
    assert engine.off() == []
    assert m.sched.affinity[700] == {1, 2, 3}


def test_a_narrowed_task_put_back_inside_the_shield_is_handed_over(
    m: Machinery, machine: Machine
) -> None:
    """Someone confines a task the shield narrowed to the isolated CPUs (`taskset -p`): it
    is theirs. No drift, not re-applied by a rescan, and `off` leaves it where they put it."""
    section = {"cpus": "1"}
    engine = m.engine()
    engine.apply(m.profile(machine, section))
    sid = ("shield", TaskAffinity(400, 1000, 401))
    assert m.sched.affinity[401] == {0, 2, 3} and sid in engine.applied
    m.sched.affinity[401] = {1}
    engine.apply(m.profile(machine, section), only=["shield"])  # a rescan first
    assert m.sched.affinity[401] == {1} and sid not in engine.applied
    assert engine.verify() == []
    m.sched.affinity[400] = {1}  # the drift check sees it first
    assert engine.verify() == []
    assert ("shield", TaskAffinity(400, 1000, 400)) not in engine.applied
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
    section = {"cpus": "1"}
    engine.apply(m.profile(machine, section))
    add_task(m.root, 700, "app", start_time=9000)
    m.sched.add(700)
    rules = engine.sections["shield"].expansion.rules
    moved = m.plugin.on_task(rules, TaskEvent("comm", 700, 700), engine.owned("shield"))
    assert moved == {TaskAffinity(700, 9000, 700): "0,2-3"}  # judged before the pin
    _pinned_by_its_user_while_journaled(m, engine, 700)
    report = engine.extend("shield", moved)
    assert m.sched.affinity[700] == {1}
    assert report.applied == 0 and ("shield", TaskAffinity(700, 9000, 700)) not in engine.applied
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
    wanted = m.wanted(machine, {"cpus": "1"})
    assert ("shield", TaskAffinity(400, 1000, 400)) in wanted
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
    moved = [t.pid for t, _, _ in report.changes["shield"]]
    assert 400 not in moved and 1 in moved  # the others were narrowed as ever
    assert ("shield", TaskAffinity(400, 1000, 400)) not in engine.applied  # it is gone
    assert engine.off() == []


def test_a_task_pinned_during_the_first_switch_is_left_there(
    m: Machinery, machine: Machine
) -> None:
    """The same race in the switch that raises the shield (its expansion read every
    thread long before the writes): judged by the rules being applied."""
    engine = m.engine()
    _pinned_by_its_user_while_journaled(m, engine, 401)
    engine.apply(m.profile(machine, {"cpus": "1"}))
    assert m.sched.affinity[401] == {1} and m.sched.affinity[400] == {0, 2, 3}
    assert ("shield", TaskAffinity(400, 1000, 401)) not in engine.applied
    assert engine.off() == []
    assert m.sched.affinity[401] == {1} and m.sched.affinity[400] == {0, 1, 2, 3}


def test_a_task_its_user_pins_right_after_the_write_is_theirs(
    m: Machinery, machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pin lands between the write and its read-back: not "the kernel kept another
    value" (a failed step), but the user's choice, left as it is."""
    engine = m.engine()
    engine.apply(m.profile(machine, {"cpus": "1"}))
    add_task(m.root, 700, "app", start_time=9000)
    m.sched.add(700)
    rules = engine.sections["shield"].expansion.rules
    moved = m.plugin.on_task(rules, TaskEvent("comm", 700, 700), engine.owned("shield"))
    set_affinity, pins = m.sched.sched_setaffinity, [700]

    def then_the_user_pins(pid: int, cpus: Any) -> None:
        set_affinity(pid, cpus)
        if pid in pins:  # once: `taskset -c 1 app` right after the shield's write
            m.sched.affinity[pins.pop()] = frozenset({1})

    monkeypatch.setattr(m.sched, "sched_setaffinity", then_the_user_pins)
    report = engine.extend("shield", moved)
    monkeypatch.undo()
    assert m.sched.affinity[700] == {1} and report.applied == 0
    assert ("shield", TaskAffinity(700, 9000, 700)) not in engine.applied
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
    engine.apply(m.profile(machine, {"cpus": "1"}))
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
    engine.apply(m.profile(machine, {"cpus": "1"}))
    for pid, pinned_meanwhile in ((700, False), (701, True)):
        add_task(m.root, pid, "app", start_time=9000 + pid)
        m.sched.add(pid)
        rules = engine.sections["shield"].expansion.rules
        moved = m.plugin.on_task(rules, TaskEvent("comm", pid, pid), engine.owned("shield"))
        if pinned_meanwhile:
            _pinned_by_its_user_while_journaled(m, engine, pid)
        engine.extend("shield", moved)
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
    (pdir / "p.toml").write_text('[shield]\ncpus = "1"\n')
    plugins = {"shield": m.plugin}
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
    assert m.plugin.chase.just_narrowed == set()
    assert daemon.engine.off() == []
    assert all(m.sched.affinity[t] == {0, 1, 2, 3} for t in (700, 701, 702, 704))


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
        '[shield]\ncpus = "1"\n[kthread]\nwriteback_cpumask = "0"\n'
        '[[kthread.rule]]\nmatch = "^kswapd"\ncpus = "3"\n[monitor]\ncpus = "1"\n'
    )
    monitor = MonitorPlugin(m.system)
    kthread = KthreadPlugin(m.system)
    plugins: dict[str, Plugin[Any, Any, Any]] = {
        "kthread": kthread,
        "shield": m.plugin,
        "monitor": monitor,
    }
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
    tasks = [t for _, t in daemon.engine.applied if "pid" in encode_target(t)]
    shown = others["plugins"]["shield"]
    assert shown["hidden"] == 4 and len(tasks) == 5  # systemd, sshd, myapp (2 threads)
    assert others["plugins"]["kthread"]["hidden"] == 1  # kswapd0
    assert [row["text"] for row in others["plugins"]["kthread"]["applied"]] == [
        "workqueue writeback cpumask = 0"
    ]
    mechanism, shield = shown["tables"]  # no cgroup hierarchy on this rig: the chase
    assert mechanism["rows"][0] == ["affinity", "in use"]
    assert shield["rows"] == [] and shield["hidden"] == 1
    assert [row[0] for row in root["plugins"]["shield"]["tables"][1]["rows"]] == [600]
    (sources,) = others["plugins"]["monitor"]["tables"]  # the time stays, not whose it was
    assert [row[:3] for row in sources["rows"]] == [
        ["1", "task (hidden)", "3"],
        ["1", "local timer", "250"],
    ]
    assert [(h["owner"], h["pid"]) for h in root["holds"]] == [(":1.42", 4321)]
    # the reason is by default the held command's whole command line: the holder's own
    assert [(h["owner"], h["pid"], h["reason"]) for h in others["holds"]] == [(None, None, None)]
    assert root["holds"][0]["reason"] == "latency bench" and "latency bench" not in shown
    # As latencyctl status and top show it.
    text = "\n".join(format_status(others))
    assert "(4 settings of tasks: shown to root and the admin group only)" in text  # shield's
    assert "(1 setting of tasks: shown to root and the admin group only)" in text  # kthread's
    assert "(1 row naming tasks: shown to root and the admin group only)" in text
    view = top_view(others)
    assert view["expected"] == ["hold 1"]
    assert [s["source"] for s in view["cpus"]["1"]] == ["task (hidden)", "local timer"]


def test_every_move_is_logged_once_per_process_and_move(
    m: Machinery, machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    """Every move of a user task is said (name, pid, threads, CPUs before and after), in
    one line per process and move however many threads it has; and so is giving back."""
    caplog.set_level(logging.INFO, logger="latencyd.plugins.shield")
    engine = m.engine()
    engine.apply(m.profile(machine, {"cpus": "1"}))
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
    engine.apply(m.profile(machine, {"cpus": "1"}))
    assert m.sched.affinity[400] == {0, 2, 3} and m.sched.affinity[620] == {2}
    engine.apply(m.profile(machine, {"cpus": "0"}))
    assert m.sched.affinity[400] == {1, 2, 3}  # from 0-3, not from 0,2-3
    assert m.sched.affinity[620] == {1, 2}  # never touched CPU 0: given back
    engine.apply(m.profile(machine, {"cpus": "0"}), only=["shield"])  # a rescan
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
    engine.apply(m.profile(machine, {"cpus": "1-3"}))
    assert m.sched.affinity[400] == {0}
    add_task(m.root, 800, "child", ppid=400, start_time=8100)
    add_task(m.root, 801, "grandchild", ppid=800, start_time=8101)  # a subshell's load
    add_task(m.root, 802, "pinned", ppid=800, start_time=8102)
    m.sched.add(800, {0})  # forked since: inherited the narrowed CPUs
    m.sched.add(801, {0})
    m.sched.add(802, {1})  # its user put it inside the shield: theirs
    engine.apply(m.profile(machine, {"cpus": "0"}))
    assert m.sched.affinity[400] == m.sched.affinity[800] == m.sched.affinity[801] == {1, 2, 3}
    assert ("shield", TaskAffinity(801, 8101, 801)) in engine.applied
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
    options = m.typed(machine, ISOLATE)
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
    daemon.refresh(["shield"])
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
    daemon.refresh(["shield"])
    assert ("setaffinity", 1400) not in sched.calls
    assert any(t.tid == 1400 for _, t in daemon.engine.applied if isinstance(t, TaskAffinity))
    assert "pid 1400" not in caplog.text
    sched.before_set.pop(1400)()  # the pin, as the task runs on
    daemon.check()
    assert daemon.engine.off() == []
    assert sched.affinity[1400] == {1}  # theirs: confined to the isolated CPU, left there
    assert sched.affinity[1000] == {0, 1, 2, 3}


# -- what moved here from [kthread] ---------------------------------------------------------


def test_targets_round_trip_through_the_journal_form(m: Machinery) -> None:
    """The kind and fields are what [kthread] journaled them as: old journals still decode."""
    target = TaskAffinity(400, 1000, 401)
    assert decode_target(target_kinds(m.plugin), encode_target(target)) == target
    assert encode_target(target) == {"kind": "task_affinity", "pid": 400, "start": 1000, "tid": 401}
    assert TaskAffinity.refusal_means == MOVE_REFUSED
    assert ShieldPlugin.took_over == {"task_affinity": "kthread"}


def test_describe(m: Machinery) -> None:
    assert (
        m.plugin.describe(TaskAffinity(400, 1000, 401), "0")
        == "user task myapp (pid 400, thread 401) CPUs = 0"
    )
    assert files_to_watch(m.plugin, TaskAffinity(400, 1000, 401)) == ()  # polled


def test_follows_user_tasks_only_when_asked(m: Machinery, machine: Machine) -> None:
    assert declares(m.plugin, FollowsTasks)
    assert m.plugin.follows.udev == {"cpu": CPU_ACTIONS}
    assert m.plugin.follows_user_tasks(m.typed(machine, ISOLATE))
    assert m.plugin.follows_user_tasks(m.typed(machine, {"rule": [{"match": "a", "cpus": "1"}]}))
    assert not m.plugin.follows_user_tasks(m.typed(machine, {"allow": ["sshd"]}))


def test_user_forks_and_kernel_threads_cost_nothing(m: Machinery, machine: Machine) -> None:
    system = Counting(m.root, m.sched)
    plugin = ShieldPlugin(system)
    rules = plugin.expand(plugin.options_of(validate(plugin.schema, ISOLATE, machine)), {}).rules
    system.looks = 0
    m.sched.calls.clear()
    for pid in range(1000, 1100):
        assert plugin.on_task(rules, TaskEvent("fork", pid, pid, ppid=400), {}) == {}
    assert plugin.on_task(rules, TaskEvent("fork", 40, 40, ppid=2), {}) == {}  # a kthread's
    assert plugin.on_task(rules, TaskEvent("exit", 400, 401), {}) == {}
    assert system.looks == 0 and m.sched.calls == []
    assert plugin.on_task(None, TaskEvent("comm", 400, 400), {}) == {}  # nothing applied yet


def test_expand_stores_nothing_on_the_plugin(m: Machinery, machine: Machine) -> None:
    """Rules travel in the Expansion, so a rejected switch cannot leave its rules behind."""
    before = {k: repr(v) for k, v in vars(m.plugin).items()}
    first = m.expand(machine, ISOLATE)
    second = m.expand(machine, {"cpus": "2"})
    assert {k: repr(v) for k, v in vars(m.plugin).items()} == before
    assert isinstance(first.rules, ShieldRules) and isinstance(second.rules, ShieldRules)
    assert first.rules.allow == ("sshd",) and second.rules.allow == ()
    assert first.settings != second.settings


def test_the_mechanism_is_chosen_in_one_place(m: Machinery, machine: Machine) -> None:
    """On a machine without a cpuset hierarchy, auto and affinity run the affinity chase;
    cpuset is not applicable, with the reason for each kind of cpuset."""
    for mechanism in ("auto", "affinity"):
        options = m.typed(machine, {**ISOLATE, "mechanism": mechanism})
        assert m.plugin.mechanism(options).mechanism == "affinity"
        assert m.plugin.expand(options, {}).settings == m.settings(machine, ISOLATE)
    assert m.options(machine, ISOLATE)["mechanism"] == "auto"
    cpuset = m.typed(machine, {**ISOLATE, "mechanism": "cpuset"})
    with pytest.raises(NotApplicable, match="no cgroup v1 hierarchy has the cpuset controller"):
        m.plugin.expand(cpuset, {})
    with pytest.raises(SchemaError, match="expected one of auto, cpuset, affinity"):
        m.options(machine, {"mechanism": "cgroup"})


def test_monitor_facts_and_the_rescan(m: Machinery, machine: Machine) -> None:
    rules = m.expand(machine, {"allow": ["sshd"]}).rules
    assert m.plugin.monitor(rules) == Monitor(
        facts={"mechanism": "affinity", "rules": 0, "rescan_every_s": 60.0}
    )
    assert m.plugin.monitor(None) == Monitor()
    assert not m.plugin.changed(rules)
    stale = ShieldRules(rules.rules, rules.cpus, rules.allow, time.monotonic() - 61)
    assert m.plugin.changed(stale)  # scanned over a minute ago: due again


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"match": "(", "cpus": "0"}, "match: bad regular expression '('"),
        ({"match": "x"}, "missing required option 'cpus'"),
        ({"match": "x", "cpus": "0", "policy": "fifo"}, "unknown option 'policy'"),
    ],
)
def test_schema_errors(m: Machinery, machine: Machine, rule: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError) as info:
        validate(m.plugin.schema, {"rule": [rule]}, machine)
    assert info.value.message.startswith(message)


def test_a_journal_of_the_kthread_days_is_adopted_and_restored(
    m: Machinery, machine: Machine
) -> None:
    """A daemon killed (kill -9) while [kthread] still moved user tasks left journal
    entries ("kthread", task_affinity); the upgraded daemon's adopt gives them to the
    shield (ShieldPlugin.took_over), so `off` still gives the tasks their CPUs back."""
    target, pinned = TaskAffinity(400, 1000, 401), ThreadAffinity(13, 10)
    m.sched.affinity[401] = frozenset({0, 2, 3})  # what the old daemon left applied
    m.sched.affinity[13] = frozenset({0})
    journal = Journal(m.state_dir)
    old = {("kthread", key_of(encode_target(t))): "0-3" for t in (target, pinned)}
    journal.save(JournalState(old, "cpu-partitioning"))
    kthread = KthreadPlugin(m.system)
    engine = Engine({"kthread": kthread, "shield": m.plugin}, journal)
    assert engine.adopt() is not None
    assert set(engine.originals) == {("shield", target), ("kthread", pinned)}
    saved = journal.load()
    assert saved is not None and {name for name, _ in saved.originals} == {"kthread", "shield"}
    assert engine.off() == []
    assert m.sched.affinity[401] == m.sched.affinity[13] == {0, 1, 2, 3}


def test_a_holder_is_placed_on_the_shielded_cpus_only_when_it_asks_itself(
    m: Machinery, tmp_path: Path
) -> None:
    """HoldAndPlace: the holder puts itself on the shielded CPUs in the hold's own apply
    (`latencyctl run`): its command is then born there. A hold that does not ask
    (measure's) leaves its holder where it was, exempt as before."""
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "p.toml").write_text('[shield]\ncpus = "1"\nmechanism = "affinity"\n')
    plugins: dict[str, Plugin[Any, Any, Any]] = {"shield": m.plugin}
    machine = m.system.machine()
    library = ProfileLibrary([pdir], section_schemas(plugins), machine)
    daemon = Daemon(m.system, plugins, library, Engine(plugins, Journal(m.state_dir)))
    cookie, _ = run_to_end(daemon.hold_steps("p", "measure", ":1.42", pid=300))  # sshd holds
    assert m.sched.affinity[300] == {0, 1, 2, 3}  # exempt, not placed
    run_to_end(daemon.release_steps(cookie))
    run_to_end(daemon.hold_steps("p", "app", ":1.42", pid=300, placed=True))
    assert m.sched.affinity[300] == {1}
    assert m.sched.affinity[1] == {0, 2, 3}  # the rest is shielded as before
    assert daemon.engine.off() == []
    assert m.sched.affinity[300] == {0, 1, 2, 3}


def test_a_pid_reused_after_its_holder_exited_is_not_placed(m: Machinery, tmp_path: Path) -> None:
    """Holders are known by pid and start time: a process that got the holder's pid after
    the holder exited is neither placed on the shielded CPUs nor exempt (issue 50)."""
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "p.toml").write_text('[shield]\ncpus = "1"\nmechanism = "affinity"\n')
    plugins: dict[str, Plugin[Any, Any, Any]] = {"shield": m.plugin}
    library = ProfileLibrary([pdir], section_schemas(plugins), m.system.machine())
    daemon = Daemon(m.system, plugins, library, Engine(plugins, Journal(m.state_dir)))
    run_to_end(daemon.hold_steps("p", "app", ":1.42", pid=300, placed=True))  # sshd, at 900
    assert m.sched.affinity[300] == {1}
    add_task(m.root, 300, "intruder", start_time=950)  # sshd exited; its pid taken again
    m.sched.add(300, {0, 1, 2, 3})
    run_to_end(daemon.hold_steps("p", "another", ":1.43"))  # the next apply
    assert m.sched.affinity[300] == {0, 2, 3}  # narrowed like any other task
    assert daemon.engine.off() == []


def test_a_placed_hold_that_needs_no_cpus_is_kept_off_another_holds_shield(
    m: Machinery, tmp_path: Path
) -> None:
    """Issue 52: `hold network-latency -- CMD` (no CPUs of its own) beside an application's
    hold on CPU 1: its command is an application like any other, kept off CPU 1, not
    exempt from the shield (the first application keeps its CPU)."""
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "p.toml").write_text('[shield]\ncpus = "1"\nmechanism = "affinity"\n')
    (pdir / "q.toml").write_text('[shield]\nmechanism = "affinity"\n')
    plugins: dict[str, Plugin[Any, Any, Any]] = {"shield": m.plugin}
    library = ProfileLibrary([pdir], section_schemas(plugins), m.system.machine())
    daemon = Daemon(m.system, plugins, library, Engine(plugins, Journal(m.state_dir)))
    run_to_end(daemon.hold_steps("p", "app", ":1.1", pid=300, placed=True))
    run_to_end(daemon.hold_steps("q", "other", ":1.2", pid=400, placed=True))
    assert daemon.in_force() == "p+q"
    assert m.sched.affinity[300] == {1}
    assert m.sched.affinity[400] == {0, 2, 3}
    assert [h["cpus"] for h in daemon.status()["holds"]] == ["1", ""]
    assert daemon.engine.off() == []


def test_a_rename_deep_down_under_a_hold_walks_the_parents_once(
    m: Machinery, machine: Machine
) -> None:
    """Issue 50: with a hold in force each rename of a task asked whether it descends from
    the holder, a walk of /proc up 60 generations per rename (675 µs). Judged once, the
    verdict stands while the holders are the same: a rename loop costs one look each."""
    system = Counting(m.root, m.sched)
    plugin = ShieldPlugin(system)
    rules = plugin.expand(plugin.options_of(validate(plugin.schema, ISOLATE, machine)), {}).rules
    plugin.holders(frozenset({300}), {})  # sshd holds a profile
    ppid = 1
    for n in range(60):
        add_task(m.root, 2000 + n, "deep", ppid=ppid, start_time=20000 + n)
        m.sched.add(2000 + n)
        ppid = 2000 + n

    def rename(pid: int) -> dict[Target, Value]:
        return plugin.on_task(rules, TaskEvent("comm", pid, pid), {})

    narrowed = {TaskAffinity(2059, 20059, 2059): "0,2-3"}
    system.looks = 0
    assert rename(2059) == narrowed  # not under the hold: kept off CPU 1
    assert system.looks >= 60  # judged by walking up to init
    for _ in range(100):
        system.looks = 0
        assert rename(2059) == narrowed
        assert system.looks == 1  # the task itself, nothing above it
    # A new task below a judged one: its parent is looked at, no further.
    add_task(m.root, 2100, "deeper", ppid=2059, start_time=21000)
    m.sched.add(2100)
    system.looks = 0
    assert rename(2100) == {TaskAffinity(2100, 21000, 2100): "0,2-3"}
    assert system.looks == 2
    # Under the hold: left alone, and judged afresh when the holders change.
    add_task(m.root, 3000, "held-child", ppid=300, start_time=30000)
    m.sched.add(3000)
    assert rename(3000) == {}
    plugin.holders(frozenset({2030}), {})  # a process half-way up the chain holds now
    assert rename(2059) == {}
    assert rename(2010) == {TaskAffinity(2010, 20010, 2010): "0,2-3"}  # above it: not held
    # A pid reused by another task is not taken for the one judged.
    add_task(m.root, 2059, "deep", ppid=1, start_time=29999)
    assert rename(2059) == {TaskAffinity(2059, 29999, 2059): "0,2-3"}
