"""What a reboot would buy a `measure` run: the scheduler tick on the CPUs a scenario's
profile shields while the tools ran, as the daemon's noise watch counted it (the monitor
plugin's `ticks` in Status: one accounting, the watch's), beside what the booted isolation
allows there (Status' `boot`, latencyd.kernel.boot.compare in the daemon): the nohz_full=
that would stop it after a reboot, or why this kernel cannot (then no saving is claimed).

Pure: Status answers in, a report out. measure reads Status before and after each
scenario's tools; the watch adds up whole intervals, so a run is counted in the intervals
that ended during it, and rates are per second of those.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from latencyd.cpuset import CpuSet
from latencyd.kernel.noise import Tally, TickCount

NOT_WATCHED = "the noise watch did not run (the profile has no [monitor] section)"
NO_INTERVAL = "the noise watch ended no interval while the tools ran (a run shorter than one)"
ELSEWHERE = "the noise watch does not watch them (its [monitor] cpus are others)"


@dataclass(frozen=True)
class Counted:
    """The tick on each watched CPU over `seconds` of the watch's intervals."""

    seconds: float = 0.0
    timed: bool = True  # False: counts without their time (the watch's /proc fallback)
    cpus: Mapping[int, Tally] = field(default_factory=dict)

    def plus(self, other: Counted) -> Counted:
        """This run and `other` together (a scenario's rounds)."""
        cpus = dict(self.cpus)
        for cpu, tally in other.cpus.items():
            cpus[cpu] = cpus.get(cpu, Tally()).merged(tally)
        return Counted(self.seconds + other.seconds, self.timed and other.timed, cpus)


def ticks_of(status: Mapping[str, Any] | None) -> TickCount | None:
    """The watch's tick since it began, from a Status answer; None: no watch running."""
    plugins = (status or {}).get("plugins") or {}
    monitor = plugins.get("monitor") if isinstance(plugins, dict) else None
    data = monitor.get("facts", {}).get("ticks") if isinstance(monitor, dict) else None
    return TickCount.from_json(data) if data else None


def counted(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> Counted | None:
    """The tick counted between two Status answers: the intervals that ended between them
    (all of a watch begun in between). None: no watch running at the second."""
    now = ticks_of(after)
    if now is None:
        return None
    was = ticks_of(before)
    if was is None or was.since != now.since:
        was = TickCount(now.since, now.timed)
    cpus = {}
    for cpu, tally in now.cpus.items():
        old = was.cpus.get(cpu, Tally())
        cpus[cpu] = Tally(tally.count - old.count, tally.total_ns - old.total_ns)
    return Counted(now.seconds - was.seconds, now.timed, cpus)


def _rate(tally: Tally, count: Counted) -> dict[str, float | None]:
    return {
        "ticks_per_s": round(tally.count / count.seconds, 1),
        "us_per_s": round(tally.total_ns / 1000 / count.seconds, 1) if count.timed else None,
    }


def report(boot: Mapping[str, Any] | None, count: Counted | None) -> dict[str, Any] | None:
    """One scenario's tick report (JSON), from Status' `boot` while it was in force and
    what the watch counted during its runs; None where its profile shields no CPU."""
    shield = CpuSet.from_list(str(boot.get("shielded") or "")) if boot else CpuSet()
    if not boot or not shield:
        return None
    tick = next(f for f in boot["findings"] if f["feature"] == "tick" and f["state"] != "mismatch")
    rates: dict[str, dict[str, float | None]] = {}
    why = NOT_WATCHED
    if count is not None and count.seconds <= 0:
        why = NO_INTERVAL
    elif count is not None:
        rates = {str(c): _rate(count.cpus[c], count) for c in shield if c in count.cpus}
        why = ELSEWHERE
    removed = None
    if tick["state"] == "not booted" and rates:  # an upper bound: see format_ticks
        # compare names the shielded CPUs still ticking; what nohz_full would stop is theirs
        missing = CpuSet.from_list(tick["cpus"])
        removed = {cpu: r for cpu, r in rates.items() if int(cpu) in missing} or None
    return {
        "shielded": shield.to_list(),
        "counted_s": round(count.seconds, 1) if count else 0.0,
        "cpus": rates,
        "not_counted": None if rates else why,
        "nohz_full": {key: tick[key] for key in ("state", "cpus", "argument", "detail")},
        "reboot_would_remove": removed,
    }


def _rates(rates: Mapping[str, Mapping[str, float | None]]) -> str:
    return ", ".join(
        f"CPU {cpu} {r['ticks_per_s']:,.1f} a second, "
        + (f"{r['us_per_s']:,.1f} µs/s" if r["us_per_s"] is not None else "time not known")
        for cpu, r in rates.items()
    )


def format_ticks(reports: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """`report`s by scenario as lines, for latencyctl to print (it escapes each)."""
    if not reports:
        return []
    # The local timer's vector counts hrtimer expiries too (cyclictest arms one a
    # millisecond): measured under cyclictest, 1,169 a second on a 250 Hz kernel. So the
    # count bounds the tick from above, and so does what nohz_full is said to remove.
    out = [
        "local timer interrupts on the shielded CPUs while the tools ran (the noise watch; "
        "the scheduler tick, and hrtimers such as cyclictest's own):"
    ]
    for scenario, r in reports.items():
        counted = _rates(r["cpus"]) if r["cpus"] else f"not counted: {r['not_counted']}"
        out.append(f"  {scenario}, CPUs {r['shielded']} ({r['counted_s']:g} s): {counted}")
        nohz = r["nohz_full"]
        if nohz["state"] == "not applicable":
            out.append(f"    {nohz['argument']}: not applicable: {nohz['detail']}")
        elif nohz["state"] == "not booted":
            gain = r["reboot_would_remove"]
            what = (
                f"the tick among these, at most {_rates(gain)} less"
                if gain
                else "the tick (not counted here)"
            )
            out.append(f"    {nohz['argument']} after a reboot: {what}, while one task runs "
                       "on the CPU (nohz_full stops the tick only then)")  # fmt: skip
        elif nohz["state"] == "booted":
            out.append(f"    nohz_full booted for CPUs {nohz['cpus']}: the tick stops there "
                       "while one task runs")  # fmt: skip
    return out
