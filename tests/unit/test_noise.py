"""The noise watch's decoding: ring-buffer pages and event formats as Linux 6.18 writes
them (format files copied from tracefs into tests/data/tracefs), and the accounting of
interruptions by source. Pages are built here the way the kernel lays them out; the
kernel test reads real ones."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from latencyd.kernel import noise as N

DATA = Path(__file__).parent.parent / "data" / "tracefs"
FORMATS = {p.stem: N.parse_format("?", p.read_text()) for p in DATA.glob("*.format")}


def event(event_name: str, **values: int | str) -> bytes:
    """An event's payload in its format's layout (__data_loc strings after the fields)."""
    fmt = FORMATS[event_name]
    size = max(f.offset + f.size for f in fmt.fields.values())
    payload = bytearray(size)
    struct.pack_into("<H", payload, 0, fmt.id)
    for key, value in values.items():
        f = fmt.fields[key]
        if f.data_loc:
            text = str(value).encode() + b"\0"
            struct.pack_into("<I", payload, f.offset, (len(text) << 16) | len(payload))
            payload += text
        elif isinstance(value, str):
            payload[f.offset : f.offset + f.size] = value.encode().ljust(f.size, b"\0")
        else:
            struct.pack_into("<" + {4: "i", 8: "q", 2: "h", 1: "b"}[f.size], payload, f.offset,
                             value)  # fmt: skip
    return bytes(payload + b"\0" * (-len(payload) % 4))


def page(start: int, events: list[tuple[int, bytes]], size: int = 4096) -> bytes:
    """A ring-buffer page: timestamp, commit, then each event's header (type_len, delta),
    with a time-extend record where a delta does not fit in 27 bits."""
    data = bytearray()
    ts = start
    for at, payload in events:
        delta = at - ts
        if delta >= 1 << 27:
            data += struct.pack("<II", 30 | ((delta & ((1 << 27) - 1)) << 5), delta >> 27)
            delta = 0
        if len(payload) <= 28 * 4:
            data += struct.pack("<I", (len(payload) // 4) | (delta << 5)) + payload
        else:  # type_len 0: the length word (counting itself) first
            data += struct.pack("<II", delta << 5, len(payload) + 4) + payload
        ts = at
    head = struct.pack("<Qq", start, len(data))
    return (head + data).ljust(size, b"\0")


def test_formats_and_the_page_header_read_from_tracefs_files() -> None:
    entry = FORMATS["irq_handler_entry"]
    assert entry.fields["irq"].offset == 8 and entry.fields["name"].data_loc
    switch = FORMATS["sched_switch"]
    assert switch.fields["next_comm"].size == 16 and switch.fields["next_pid"].signed
    assert N.parse_header_page((DATA / "header_page").read_text()) == N.PageLayout(8, 8, 16)
    with pytest.raises(ValueError, match="not a tracefs event format"):
        N.parse_format("irq", "field:int x;\toffset:0;\tsize:4;\tsigned:1;")


def test_page_events_follow_deltas_extends_and_long_events() -> None:
    irq = event("irq_handler_entry", irq=28, name="virtio1-input.0" + "x" * 120)
    assert len(irq) > 28 * 4  # a type_len 0 record
    timer = event("local_timer_entry", vector=236)
    later = 1_000 + (1 << 28)  # needs a time-extend record
    got = list(N.page_events(page(1_000, [(1_500, timer), (2_000, irq), (later, timer)])))
    assert [ts for ts, _ in got] == [1_500, 2_000, later]
    assert FORMATS["irq_handler_entry"].value(got[1][1], "name").startswith("virtio1-input.0")
    assert FORMATS["local_timer_entry"].value(got[0][1], "vector") == 236
    # Padding with no delta ends the page's data; an empty page has none.
    assert list(N.page_events(page(0, []))) == []


def decode(events: list[tuple[int, bytes]], expected: frozenset[int] = frozenset()) -> N.CpuNoise:
    cpu = N.CpuNoise(expected.__contains__)
    decoder = N.Decoder(FORMATS.values(), {28: "virtio1-input.0"})
    for ts, payload in N.page_events(page(0, events)):
        decoder.feed(cpu, ts, payload)
    return cpu


def test_interruptions_are_tallied_by_source_with_nested_time_taken_out() -> None:
    app, hog = 4242, 777
    cpu = decode(
        [  # common_pid: the task each event ran on the time of (0: idle)
            (1_000, event("sched_switch", next_pid=app, next_comm="app")),
            (2_000, event("local_timer_entry", vector=236, common_pid=app)),
            (2_700, event("local_timer_exit", vector=236, common_pid=app)),
            (3_000, event("sched_switch", next_pid=hog, next_comm="stress-ng", common_pid=app)),
            (4_000, event("irq_handler_entry", irq=28, name="virtio1", common_pid=hog)),
            (4_400, event("softirq_entry", vec=3, common_pid=hog)),  # NET_RX, in the IRQ
            (4_500, event("softirq_exit", vec=3, common_pid=hog)),
            (4_600, event("irq_handler_exit", irq=28, ret=1, common_pid=hog)),
            (9_000, event("sched_switch", next_pid=app, next_comm="app", common_pid=hog)),
            (9_100, event("local_timer_exit", vector=236, common_pid=app)),  # no entry: ignored
            (10_000, event("sched_switch", next_pid=0, next_comm="swapper/1", common_pid=app)),
        ],
        expected=frozenset({app}),
    )
    tallies = cpu.close(12_000)
    assert {k: (t.count, t.total_ns, t.max_ns) for k, t in tallies.items()} == {
        "local timer": (1, 700, 700),
        "irq 28 virtio1-input.0": (1, 500, 500),  # 600 less the softirq's 100
        "softirq NET_RX": (1, 100, 100),
        "task 777 stress-ng": (1, 5_400, 5_400),  # 6,000 on the CPU less the IRQ's 600
    }
    assert cpu.events == 11 and cpu.close(13_000) == {} and cpu.unseen_switches == 0


def test_a_task_still_running_at_the_end_of_an_interval_counts_in_both() -> None:
    cpu = decode([(1_000, event("sched_switch", next_pid=55, next_comm="kworker/1:1"))])
    assert cpu.close(3_000)["task 55 kworker/1:1"].total_ns == 2_000
    assert cpu.close(4_500)["task 55 kworker/1:1"].total_ns == 1_500


def test_a_task_that_execs_on_the_cpu_goes_on_under_its_new_name() -> None:
    """`taskset -c 1 sh -c loop` arrives on CPU 1 as "taskset" and execs sh there with no
    switch in between: the run after the exec is the shell's. A thread other than the
    leader that execs goes on as the leader's pid (old_pid is its own)."""
    long = "a-very-long-program-name"

    def exec_(pid: int, path: str, old_pid: int | None = None) -> bytes:
        old = pid if old_pid is None else old_pid
        return event("sched_process_exec", filename=path, pid=pid, old_pid=old, common_pid=pid)

    cpu = decode(
        [
            (1_000, event("sched_switch", next_pid=90, next_comm="taskset")),
            (1_500, exec_(90, "/usr/bin/sh")),
            (2_000, exec_(90, f"/opt/{long}")),
            (3_000, event("sched_switch", next_pid=93, next_comm="worker", common_pid=90)),
            (3_500, exec_(92, "/bin/true", old_pid=93)),  # thread 93 of process 92
        ]
    )
    tallies = cpu.close(4_000)
    assert {k: t.total_ns for k, t in tallies.items()} == {
        "task 90 taskset": 500,
        "task 90 sh": 500,
        "task 90 a-very-long-pro": 1_000,  # the kernel's comm: 15 bytes
        "task 93 worker": 500,
        "task 92 true": 500,
    }
    assert cpu.unseen_switches == 0


def test_a_switch_not_in_the_buffer_is_made_up_for_at_the_next_event() -> None:
    """A sched_switch can be missing (an overrun; or never written: these guests write
    none away from some tasks): the next event's task (common_pid) disagrees with the
    switches read, and the accounting goes on from there, naming it; its first
    sched_stat_runtime says when it began, and so when the one before it ended."""
    for runtime, (before, after) in ((None, (2_000, 1_900)), (1_050, (1_000, 2_900))):
        ran = [] if runtime is None else [
            (3_050, event("sched_stat_runtime", pid=66, runtime=runtime, common_pid=66)),
        ]  # fmt: skip
        cpu = decode(
            [
                (1_000, event("sched_switch", next_pid=55, next_comm="kworker/1:1")),
                # not read: 55 -> 66 (stress-ng) at 2,000
                (3_000, event("local_timer_entry", vector=236, common_pid=66)),
                *ran,
                (3_100, event("local_timer_exit", vector=236, common_pid=66)),
                (
                    5_000,
                    event("sched_switch", next_pid=0, prev_comm="stress-ng", common_pid=66),
                ),
            ]
        )
        assert {k: t.total_ns for k, t in cpu.close(6_000).items()} == {
            "task 55 kworker/1:1": before,  # to the first sign of the switch, or its time
            "task 66 stress-ng": after,  # named by the switch away from it
            "local timer": 100,
        }
        assert cpu.unseen_switches == 1
    # Two unseen in a row, the first with no sched_stat_runtime: each ran until the next.
    cpu = decode(
        [
            (1_000, event("sched_switch", next_pid=55, next_comm="kworker/1:1")),
            (3_000, event("local_timer_entry", vector=236, common_pid=66)),
            (3_000, event("local_timer_exit", vector=236, common_pid=66)),
            (5_000, event("local_timer_entry", vector=236, common_pid=77)),
            (5_000, event("local_timer_exit", vector=236, common_pid=77)),
        ]
    )
    assert {k: t.total_ns for k, t in N.named(cpu.close(6_000), str).items()} == {
        "local timer": 0,
        "task 55 kworker/1:1": 2_000,
        "task 66 66": 2_000,
        "task 77 77": 1_000,
    }
    # Still on the CPU at the poll: named as /proc has it then (here, the decoder's "?"),
    # or as its sched_stat_runtime says.
    for ran, name in (([], "task 77 ?"), ([(2_001, event("sched_stat_runtime", pid=77,
                      comm="spin", common_pid=77))], "task 77 spin")):  # fmt: skip
        lost = decode(
            [
                (1_000, event("sched_switch", next_pid=55, next_comm="kworker/1:1")),
                (2_000, event("local_timer_entry", vector=236, common_pid=77)),
                *ran,
            ]
        )
        tallies = N.named(lost.close(3_000), lambda pid: "?")
        assert {k: t.total_ns for k, t in tallies.items()} == {
            "task 55 kworker/1:1": 1_000,
            name: 1_000,
        }


def test_a_task_the_stream_did_not_name_is_named_at_the_poll_with_its_named_runs() -> None:
    tallies = {
        "task 77 spin": N.Tally(2, 300, 200),
        f"task 77 {N.UNNAMED}": N.Tally(1, 500, 500),
        f"task 78 {N.UNNAMED}": N.Tally(1, 5, 5),
        "local timer": N.Tally(4, 40, 10),
    }
    named = N.named(tallies, {77: "spin", 78: "(exited)"}.__getitem__)
    assert named == {
        "task 77 spin": N.Tally(3, 800, 500),
        "task 78 (exited)": N.Tally(1, 5, 5),
        "local timer": N.Tally(4, 40, 10),
    }


def test_a_task_woken_on_an_idle_cpu_is_timed_by_the_run_it_reports() -> None:
    """The 6.18 guests here write no switch away from the idle task: a task woken on an
    idle CPU is found by its first event, and its first sched_stat_runtime (its run since
    it was switched in) says when it began, never before the CPU was last seen idle."""
    kworker, idle = 66, 0

    def woken(runtime: int | None) -> dict[str, int]:
        ran = [] if runtime is None else [
            (9_001, event("sched_stat_runtime", pid=kworker, runtime=runtime,
                          comm="kworker/1:1", common_pid=kworker)),
        ]  # fmt: skip
        cpu = decode(
            [
                (1_000, event("sched_switch", next_pid=idle, prev_comm="sh", common_pid=9)),
                (5_000, event("irq_handler_entry", irq=28, name="virtio1", common_pid=idle)),
                (5_100, event("irq_handler_exit", irq=28, ret=1, common_pid=idle)),
                # switched to the kworker at 6,000: not in the buffer
                (9_000, event("local_timer_entry", vector=236, common_pid=kworker)),
                *ran,
                (9_100, event("local_timer_exit", vector=236, common_pid=kworker)),
                (
                    9_500,
                    event(
                        "sched_switch", next_pid=idle, prev_comm="kworker/1:1", common_pid=kworker
                    ),
                ),
            ]
        )
        assert cpu.unseen_switches == 1
        return {k: t.total_ns for k, t in cpu.close(10_000).items()}

    assert woken(runtime=3_001)["task 66 kworker/1:1"] == 3_400  # 6,000 to 9,500 less 100
    assert woken(runtime=8_000)["task 66 kworker/1:1"] == 4_300  # not before 5,100
    assert woken(runtime=None)["task 66 kworker/1:1"] == 400  # a kernel without it: from 9,000


def test_a_task_running_when_the_watch_began_is_named_from_the_first_event() -> None:
    """Every event carries the task it interrupted (common_pid): a busy loop already on
    the CPU is named at its first timer tick and counted from the watch's start, not at
    a switch away that may never come; a switch names it by prev_comm; the application
    or idle found there is nothing; until an event says, nothing is counted."""
    names = {777: "spin"}
    decoder = N.Decoder(FORMATS.values(), {})

    def close(cpu: N.CpuNoise, ts: int) -> dict[str, N.Tally]:
        return N.named(cpu.close(ts), lambda pid: names.get(pid, "gone"))

    tick, tock = (
        event("local_timer_entry", vector=236, common_pid=777),
        event("local_timer_exit", vector=236, common_pid=777),
    )

    spinning = N.CpuNoise(since=1_000)
    for ts, payload in N.page_events(page(0, [(5_000, tick), (5_400, tock)])):
        decoder.feed(spinning, ts, payload)
    assert {k: t.total_ns for k, t in close(spinning, 9_000).items()} == {
        "local timer": 400,
        "task 777 spin": 7_600,  # 1,000 to 9,000 less the tick
    }

    switched = N.CpuNoise(since=1_000)
    away = event("sched_switch", common_pid=778, prev_comm="kworker/1:2", next_pid=0)
    decoder.feed(switched, 3_000, away)
    assert {k: t.total_ns for k, t in close(switched, 4_000).items()} == {
        "task 778 kworker/1:2": 2_000
    }

    for pid, expected in ((0, frozenset()), (777, frozenset({777}))):  # idle; the app
        found = N.CpuNoise(expected.__contains__, since=1_000)
        decoder.feed(found, 5_000, event("local_timer_entry", vector=236, common_pid=pid))
        decoder.feed(found, 5_400, event("local_timer_exit", vector=236, common_pid=pid))
        assert list(found.close(9_000)) == ["local timer"]

    late = N.CpuNoise(since=1_000)
    assert late.close(2_000) == {}  # no event yet: nothing known of the first interval
    decoder.feed(late, 2_500, tick)
    assert close(late, 3_000)["task 777 spin"].total_ns == 1_000  # from the last close


def test_a_cpu_beyond_its_budget_or_single_limit_is_named_with_its_top_sources() -> None:
    tick, hog, irq = (
        N.Tally(250, 750_000, 4_000),
        N.Tally(1, 300_000, 300_000),
        N.Tally(3, 9_000, 4_000),
    )
    quiet = {"local timer": tick}
    noisy = {"local timer": tick, "task 77 stress-ng": hog, "irq 28 virtio1": irq}
    assert N.over_budget({1: quiet}, budget_us=1000, max_single_us=None) == []
    (breach,) = N.over_budget({1: quiet, 2: noisy}, budget_us=1000, max_single_us=None, top=2)
    assert (breach.cpu, breach.total_us, breach.longest_us) == (2, 1059.0, 300.0)
    assert [s for s, _ in breach.top] == ["local timer", "task 77 stress-ng"]
    assert (
        "CPU 2 took 1059 µs" in breach.line() and "task 77 stress-ng 300 µs (1x)" in breach.line()
    )
    (single,) = N.over_budget({2: noisy}, budget_us=None, max_single_us=100)
    assert single.why == "max single 100 µs"
    assert single.sources_json()[0] == {"source": "local timer", "count": 250, "total_us": 750.0,
                                        "max_us": 4.0}  # fmt: skip


def test_a_culprit_is_reported_once_per_window_a_new_one_at_once_and_floods_are_capped() -> None:
    """The CI run that found this: the test's own process broke CPU 1's budget in the first
    interval, and the task injected next was silenced by a per-CPU 10 s limit."""

    def breach(cpu: int, culprit: str) -> N.Breach:
        return N.Breach(cpu, 50_000.0, 40_000.0, "budget 20000 µs", ((culprit, N.Tally(1, 1, 1)),))

    limit = N.ReportLimit(every_s=10.0, per_cpu=3)
    assert limit.due(breach(1, "task 7719 python"), now=0.0)
    assert not limit.due(breach(1, "task 7719 python"), now=0.2)  # the same leak goes on
    assert limit.due(breach(1, "task 9000 sh"), now=0.4)  # a new culprit: named at once
    assert limit.due(breach(2, "task 7719 python"), now=0.4)  # another CPU: its own window
    assert limit.due(breach(1, "task 9001 sh"), now=0.6)
    assert not limit.due(breach(1, "task 9002 sh"), now=0.8)  # three in 10 s on CPU 1: capped
    assert limit.due(breach(1, "task 7719 python"), now=10.1)  # its window is over
