"""Text any local user chooses (task names, HoldProfile reasons) cannot forge a journal
entry or drive an admin's terminal (issue 37, defect 5; TuneD's CVE-2024-52337): the
daemon's logs and latencyctl's output escape it (latencyd.text.printable), and
`--json` keeps it as it is. Through the daemon's own logging set-up and the CLI's own
output path; the D-Bus call and the noise watch's tracefs reading are the fakes."""

from __future__ import annotations

import codecs
import contextlib
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from latencyd.plugins.monitor import MonitorPlugin

from latencyd.cpuset import CpuSet
from latencyd.kernel.noise import Tally, WatchPlan
from latencyd.kernel.system import System
from latencyd.service.daemon import Daemon
from latencyd.service.logs import setup_logging
from latencyd.service.noisewatch import NoiseInterval, ShieldWatch
from latencyd.text import printable
from latencyd.tools import cli
from tests.unit.fakesys import FakeSched, add_task, make_fake_root
from tests.unit.test_scale import shielding_daemon

# A comm is 15 bytes of its task's choosing (prctl PR_SET_NAME, or the file it execs).
FORGER = "x\n<0>pwned"  # journald: a second entry, at emergency level
TITLE = "\x1b]0;evil\x07"  # a terminal: sets its window title
CLEAR = "\x1b[2J"  # a terminal: clears the screen
REASON = "benchmark\n<0>forged hold"  # HoldProfile's reason, any caller's text


def test_printable_escapes_what_is_not_printable_and_keeps_the_rest() -> None:
    assert printable(FORGER) == "x\\n<0>pwned"
    assert printable(TITLE) == "\\x1b]0;evil\\x07"
    assert printable(CLEAR) == "\\x1b[2J"
    assert printable("\r\t\x00\x7f\x85\x9b") == "\\r\\t\\x00\\x7f\\x85\\x9b"  # C0, DEL, C1
    assert printable("\u2028\u202e\udc80") == "\\u2028\\u202e\\udc80"  # LS, RLO, surrogate
    kept = "task 77 stress-ng 12.5 µs (é, 中, 😀)"
    assert printable(kept) == kept


@pytest.mark.parametrize("text", [FORGER, TITLE, CLEAR, "a\\nb", "a\\x1bb", "\\", "\\\n", ""])
def test_printable_reads_back_unambiguously(text: str) -> None:
    """A backslash is escaped too: the text a user wrote as `\\n` cannot pass for a newline."""
    shown = printable(text)
    assert shown.isprintable()
    assert codecs.decode(shown, "unicode_escape") == text


# -- the daemon's log ------------------------------------------------------------------------


class DaemonLog(logging.Handler):
    """Counts the records logged, beside the daemon's own handler; `lines` reads what
    that one wrote."""

    def __init__(self, stream: io.StringIO) -> None:
        super().__init__()
        self.stream = stream
        self.records = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.records += 1

    def lines(self) -> list[str]:
        """What the journal was sent since the last call: a line per record, each with its
        priority, of printable text only."""
        lines = self.stream.getvalue().splitlines()
        self.stream.seek(0)
        self.stream.truncate()
        assert len(lines) == self.records, lines
        self.records = 0
        for line in lines:
            assert line.isprintable(), line
            assert line[:3] in ("<7>", "<6>", "<4>", "<3>", "<2>"), line
        return lines


@contextlib.contextmanager
def daemons_logging() -> Iterator[io.StringIO]:
    """The logging main() sets up (for the journal or a terminal, as the environment
    says), its handler writing to a buffer of the test's instead of stderr."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    setup_logging()
    (handler,) = root.handlers
    assert isinstance(handler, logging.StreamHandler)
    stream = io.StringIO()
    handler.setStream(stream)
    try:
        yield stream
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


@pytest.fixture
def daemon_log(monkeypatch: pytest.MonkeyPatch) -> Iterator[DaemonLog]:
    """The daemon's logging under systemd: its stderr is the journal's stream."""
    monkeypatch.setenv("JOURNAL_STREAM", "8:4242")
    with daemons_logging() as stream:
        counted = DaemonLog(stream)
        logging.getLogger().addHandler(counted)
        yield counted


def shield_among_hostile_names(tmp_path: Path) -> Daemon:
    """The kthread shield of CPU 1 (profile "p"), on a fake machine where three user
    tasks, named to attack the log and the terminal, run on every CPU."""
    root = make_fake_root(tmp_path)
    sched = FakeSched({0, 1, 2, 3})
    for pid, comm in ((4242, FORGER), (4243, TITLE), (4244, CLEAR)):
        add_task(root, pid, comm, start_time=9000 + pid)
        sched.add(pid)
    return shielding_daemon(tmp_path, System(root, sched=sched))


def test_the_shields_moves_and_a_hold_log_one_entry_each_whatever_the_names(
    tmp_path: Path, daemon_log: DaemonLog
) -> None:
    daemon = shield_among_hostile_names(tmp_path)
    daemon.hold("p", REASON, ":1.42")
    lines = daemon_log.lines()
    assert "<6>user task x\\n<0>pwned (pid 4242, thread 4242): CPUs 0-3 -> 0,2-3" in lines
    assert "<6>user task \\x1b]0;evil\\x07 (pid 4243, thread 4243): CPUs 0-3 -> 0,2-3" in lines
    assert "<6>user task \\x1b[2J (pid 4244, thread 4244): CPUs 0-3 -> 0,2-3" in lines
    assert "<6>hold 1 on p by :1.42 (benchmark\\n<0>forged hold)" in lines


def test_the_noise_watchs_breach_line_is_one_entry_whatever_the_culprit_is_named(
    tmp_path: Path, daemon_log: DaemonLog
) -> None:
    """The culprit named by its comm in the line that says a CPU broke its budget: the
    daemon's watch polls for real, its reading of tracefs is the fake."""
    system = System(make_fake_root(tmp_path, cpus="0-1"))
    daemon: Any = SimpleNamespace(plugins={"monitor": MonitorPlugin(system)}, after_step=[],
                                  system=system, holds={})  # fmt: skip
    loop: Any = SimpleNamespace()  # polled by hand
    shield = ShieldWatch(daemon, loop, lambda breach, seconds: None)
    shield.plan = WatchPlan(CpuSet({1}), 1000, 50, None)
    culprit = {f"task 4242 {FORGER}": Tally(1, 300_000, 300_000)}
    shield.watch = SimpleNamespace(  # type: ignore[assignment]
        mechanism="tracefs instance", poll=lambda: NoiseInterval(0.0, 1.0, {1: culprit})
    )
    assert shield._poll() is True
    assert daemon_log.lines() == [
        "<4>noise: CPU 1 took 300 µs of noise in one interval (longest 300 µs; budget 50 µs): "
        "task 4242 x\\n<0>pwned 300 µs (1x)"
    ]


def test_a_message_on_a_terminal_is_one_line_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not under systemd (`make run`, a shell): the same escaping, after the time and level;
    a traceback keeps its lines, each escaped."""
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    log = logging.getLogger("latencyd.test")
    with daemons_logging() as stream:
        log.info("hold %d on %s by %s (%s)", 1, "p", ":1.42", f"{TITLE}{CLEAR}")
        try:
            raise ValueError(TITLE)
        except ValueError:
            log.exception("task %s", FORGER)
    lines = stream.getvalue().splitlines()
    assert all(line.isprintable() for line in lines), lines
    assert lines[0].endswith(" INFO    hold 1 on p by :1.42 (\\x1b]0;evil\\x07\\x1b[2J)")
    assert lines[1].endswith(" ERROR   task x\\n<0>pwned")
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: \\x1b]0;evil\\x07"


# -- latencyctl ------------------------------------------------------------------------------


def answering(monkeypatch: pytest.MonkeyPatch, **answers: Any) -> None:
    """The daemon's D-Bus answers, by method, as latencyctl receives them (JSON text)."""
    monkeypatch.setattr(cli, "_call", lambda method, *args, **kw: json.dumps(answers[method]))


def test_status_shows_task_names_and_hold_reasons_escaped_and_json_as_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    daemon = shield_among_hostile_names(tmp_path)
    daemon.hold("p", REASON, ":1.42")
    status = daemon.status()
    answering(monkeypatch, Status=status)
    assert cli.main(["status"]) == cli.OK
    lines = capsys.readouterr().out.splitlines()
    assert all(line.isprintable() for line in lines), lines
    assert "hold 1: p by :1.42 (benchmark\\n<0>forged hold), CPUs 1" in lines
    assert (
        "  user task x\\n<0>pwned (pid 4242, thread 4242) CPUs = 0,2-3   (original: 0-3)" in lines
    )
    assert (
        "  user task \\x1b]0;evil\\x07 (pid 4243, thread 4243) CPUs = 0,2-3   (original: 0-3)"
        in lines
    )
    assert "  user task \\x1b[2J (pid 4244, thread 4244) CPUs = 0,2-3   (original: 0-3)" in lines
    # --json: the data itself; JSON escapes the control characters its own way.
    assert cli.main(["--json", "status"]) == cli.OK
    data = json.loads(capsys.readouterr().out)
    assert data == json.loads(json.dumps(status))
    assert data["holds"][0]["reason"] == REASON


def test_top_shows_sources_and_expected_holders_escaped_and_json_as_they_are(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    status = {
        "holds": [{"pid": 4242, "reason": REASON}],
        "plugins": {
            "monitor": {
                "facts": {"mechanism": "tracefs instance", "interval_ms": 1000, "budget_us": 50},
                "tables": [{"rows": [
                    ["1", f"task 4242 {FORGER}", "1", "300.0", "300.0"],
                    ["1", f"task 4243 {TITLE}", "2", "20.0", "10.0"],
                    ["1", f"task 4244 {CLEAR}", "3", "30.0", "10.0"],
                ]}],
            },
        },
    }  # fmt: skip
    answering(monkeypatch, Status=status)
    assert cli.main(["top", "--once"]) == cli.OK
    lines = capsys.readouterr().out.splitlines()
    assert all(line.isprintable() for line in lines), lines
    assert "expected there: pid 4242 (benchmark\\n<0>forged hold)" in lines
    for source in ("task 4242 x\\n<0>pwned", "task 4243 \\x1b]0;evil\\x07", "task 4244 \\x1b[2J"):
        assert any(line.startswith(f"  {source} ") for line in lines), (source, lines)
    assert cli.main(["--json", "top", "--once"]) == cli.OK
    view = json.loads(capsys.readouterr().out)
    assert [s["source"] for s in view["cpus"]["1"]] == [
        f"task 4242 {FORGER}",
        f"task 4243 {TITLE}",
        f"task 4244 {CLEAR}",
    ]
    assert view["expected"] == [f"pid 4242 ({REASON})"]


def test_an_error_the_daemon_sends_is_one_line_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Errors quote what the caller or a task named: `switch` to a profile named so."""

    def refuse(method: str, *args: Any, **kw: Any) -> Any:
        raise cli.CliError(cli.USAGE, f"no profile named {args[0]}")

    monkeypatch.setattr(cli, "_call", refuse)
    assert cli.main(["switch", f"p{FORGER}{CLEAR}"]) == cli.USAGE
    assert capsys.readouterr().err == "latencyctl: no profile named px\\n<0>pwned\\x1b[2J\n"


def test_a_plan_shows_task_names_escaped_moves_nothing_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`latencyctl plan`: the shield would narrow the three hostile tasks, said escaped
    (the JSON as it is); the plan itself narrows none; exit 1 since something would
    change. Hidden from who may not see tasks: counted, never named."""
    from latencyd.core.plugin import in_one_go

    daemon = shield_among_hostile_names(tmp_path)
    sched = daemon.system.sched
    before = dict(sched.affinity)
    switch_plan = in_one_go(daemon.plan_steps)("p")
    assert dict(sched.affinity) == before
    assert not [call for call, _ in sched.calls if call.startswith("sched_set")]
    assert not (tmp_path / "state" / "journal.jsonl").exists()
    answering(monkeypatch, Plan=switch_plan.as_json(daemon.plugins))
    assert cli.main(["plan", "p"]) == cli.WOULD_CHANGE
    lines = capsys.readouterr().out.splitlines()
    assert all(line.isprintable() for line in lines), lines
    assert "plan: nothing applied -> p (nothing was changed)" in lines
    assert "would change: 3 [shield] task_affinity" in lines  # which tasks would move
    assert (
        "  change          user task x\\n<0>pwned (pid 4242, thread 4242) CPUs = 0,2-3   (now: 0-3)"
        in lines
    )
    assert cli.main(["--json", "plan", "p"]) == cli.WOULD_CHANGE
    data = json.loads(capsys.readouterr().out)
    assert any(FORGER in row["setting"] for row in data["settings"])
    hidden = switch_plan.as_json(daemon.plugins, show_tasks=False)
    assert hidden["hidden"] == {"shield": 3} and FORGER not in json.dumps(hidden)
