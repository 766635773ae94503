"""What a reboot would buy a `measure` run: the tick the daemon's noise watch counted on
the shielded CPUs (its running total in Status, taken over a run; the daemon's side is in
test_noise_counters), beside the booted isolation (BootState and compare, as the daemon
puts them in Status): a saving only where nohz_full= is not booted and the kernel can
honour it, the reason where it cannot."""

from __future__ import annotations

from typing import Any

from latencyd.cpuset import CpuSet
from latencyd.kernel.boot import NO_NOHZ_FULL, BootReadings, booted, compare
from latencyd.kernel.noise import TICK, Tally, TickCount
from latencyd.tools.measure.report import format_measure
from latencyd.tools.ticks import (
    ELSEWHERE,
    NO_INTERVAL,
    NOT_WATCHED,
    Counted,
    counted,
    format_ticks,
    report,
)

FOUR = CpuSet.from_list("0-3")


def boot_status(shield: str, nohz_full: str | None = "", cmdline: str = "") -> dict[str, Any]:
    """Status' `boot` as the daemon gives it (Daemon.boot_status): a kernel with
    NO_HZ_FULL booted tickless on `nohz_full`, or one without it (None)."""
    state = booted(BootReadings(
        cmdline, FOUR, isolated=CpuSet(),
        nohz_full=None if nohz_full is None else CpuSet.from_list(nohz_full),
        rcu_nocb_capable=True, rcu_offloaded=CpuSet(),
    ))  # fmt: skip
    cpus = CpuSet.from_list(shield)
    return state.as_json() | {
        "shielded": cpus.to_list(),
        "findings": [f.as_json() for f in compare(cpus, state)],
    }


def status(ticks: TickCount | None) -> dict[str, Any]:
    """A Status answer whose monitor plugin shows `ticks` (no watch: no monitor section)."""
    if ticks is None:
        return {"plugins": {}}
    return {"plugins": {"monitor": {"facts": {"ticks": ticks.as_json()}}}}


def test_a_run_is_counted_between_two_status_answers() -> None:
    """The intervals that ended between the two answers; a watch begun in between (another
    since) counted whole; no watch at the end, nothing."""
    interval = {1: {TICK: Tally(250, 5_000_000, 30_000), "softirq TIMER": Tally(9, 90, 10)}}
    start = TickCount(100.0, True).plus(interval, 1.0)
    later = start.plus(interval, 1.0).plus(interval, 1.0)
    run = counted(status(start), status(later))
    assert run is not None
    assert (run.seconds, run.cpus[1].count, run.cpus[1].total_ns) == (2.0, 500, 10_000_000)
    restarted = TickCount(200.0, True).plus(interval, 1.0)
    assert counted(status(start), status(restarted)) == Counted(
        1.0, True, {1: Tally(250, 5_000_000)}
    )
    assert counted(status(None), status(restarted)) == counted(status(start), status(restarted))
    assert counted(status(start), status(None)) is None


def test_not_booted_nohz_full_is_what_a_reboot_would_remove() -> None:
    """Two rounds added up: 250 ticks and 5 ms a second on CPU 1, which nohz_full=1 would
    stop (the kernel has NO_HZ_FULL, booted tickless nowhere)."""
    one = Counted(2.0, True, {1: Tally(500, 10_000_000), 0: Tally(2000, 1)})
    r = report(boot_status("1"), one.plus(one))
    assert r is not None
    assert r["cpus"] == {"1": {"ticks_per_s": 250.0, "us_per_s": 5000.0}}  # CPU 0: not shielded
    assert r["nohz_full"]["state"] == "not booted" and r["nohz_full"]["argument"] == "nohz_full=1"
    assert r["reboot_would_remove"] == r["cpus"]
    assert r["counted_s"] == 4.0 and r["not_counted"] is None
    assert format_ticks({"cpu-partitioning": r}) == [
        "local timer interrupts on the shielded CPUs while the tools ran (the noise watch; "
        "the scheduler tick, and hrtimers such as cyclictest's own):",
        "  cpu-partitioning, CPUs 1 (4 s): CPU 1 250.0 a second, 5,000.0 µs/s",
        "    nohz_full=1 after a reboot: the tick among these, at most CPU 1 250.0 a second, "
        "5,000.0 µs/s less, while "
        "one task runs on the CPU (nohz_full stops the tick only then)",
    ]


def test_a_kernel_without_nohz_full_is_never_promised_a_saving() -> None:
    r = report(boot_status("1", nohz_full=None), Counted(1.0, True, {1: Tally(250, 5_000_000)}))
    assert r is not None
    assert r["nohz_full"]["state"] == "not applicable"
    assert r["nohz_full"]["detail"] == NO_NOHZ_FULL
    assert r["reboot_would_remove"] is None
    assert format_ticks({"p": r})[2] == f"    nohz_full=1: not applicable: {NO_NOHZ_FULL}"


def test_booted_tickless_cpus_show_their_count_and_no_saving() -> None:
    """nohz_full=1-2 booted: CPU 1's residual tick is shown, nothing more to remove; with
    CPU 3 shielded too, only CPU 3 would gain."""
    count = Counted(1.0, True, {1: Tally(1, 20_000), 3: Tally(250, 5_000_000)})
    r = report(boot_status("1", nohz_full="1-2", cmdline="nohz_full=1-2"), count)
    assert r is not None and r["nohz_full"]["state"] == "booted"
    assert r["reboot_would_remove"] is None and r["cpus"]["1"]["ticks_per_s"] == 1.0
    assert format_ticks({"p": r})[-1] == (
        "    nohz_full booted for CPUs 1: the tick stops there while one task runs"
    )
    both = report(boot_status("1,3", nohz_full="1-2", cmdline="nohz_full=1-2"), count)
    assert both is not None and both["nohz_full"]["cpus"] == "3"
    assert set(both["cpus"]) == {"1", "3"} and set(both["reboot_would_remove"]) == {"3"}


def test_without_the_watch_or_its_time_nothing_is_made_up() -> None:
    r = report(boot_status("1"), None)
    assert r is not None and r["cpus"] == {} and r["not_counted"] == NOT_WATCHED
    assert r["reboot_would_remove"] is None
    assert format_ticks({"p": r})[1:] == [
        f"  p, CPUs 1 (0 s): not counted: {NOT_WATCHED}",
        "    nohz_full=1 after a reboot: the tick (not counted here), while one task runs on "
        "the CPU (nohz_full stops the tick only then)",
    ]
    counters = report(boot_status("1"), Counted(2.0, False, {1: Tally(500, 0)}))
    assert counters is not None and counters["cpus"]["1"] == {
        "ticks_per_s": 250.0,
        "us_per_s": None,
    }
    assert "CPU 1 250.0 a second, time not known" in format_ticks({"p": counters})[1]
    short = report(boot_status("1"), Counted(0.0, True, {1: Tally()}))
    assert short is not None and short["not_counted"] == NO_INTERVAL
    elsewhere = report(boot_status("1"), Counted(1.0, True, {2: Tally(250, 1)}))
    assert elsewhere is not None and elsewhere["not_counted"] == ELSEWHERE


def test_no_shield_no_report() -> None:
    assert report(boot_status(""), Counted(1.0, True, {1: Tally(250, 1)})) is None
    assert report(None, None) is None


def test_measures_text_report_ends_with_the_tick() -> None:
    r = report(boot_status("1", nohz_full=None), Counted(1.0, True, {1: Tally(250, 5_000_000)}))
    result: dict[str, Any] = {"baseline": "p", "tools": {}, "attribution": {}, "tick": {"p": r}}
    lines = format_measure(result)
    assert lines[-3:] == format_ticks({"p": r})
