"""scale benchmark: latencyd's cpu-partitioning beside one process with thousands of idle
threads (a JVM, a Kubernetes node), and TuneD's cpu-partitioning beside the same, as in
issue 19's table.

Per size (extra threads, all allowed on every CPU) and per profile (the shipped
cpu-partitioning, whose shield is a cpuset where the machine has one, and the same with
the affinity chase): `latencyctl plan PROFILE` (its round trip: what the switch would
do, nothing written), `latencyctl switch PROFILE` (the call's round trip), the time
until every thread is off the isolated CPU (from the start of the switch), the
daemon's CPU while it holds the profile (nanosecond schedstat over `--hold` seconds,
all its threads) and its RSS, `latencyctl verify`, and
`latencyctl off` with every thread allowed on every CPU again. TuneD (where installed,
not with --quick), at the same sizes: until it says the profile is applied, until every
thread is off the isolated CPU, its CPU while holding and RSS, and its stop (rollback)
with every thread back.

Also `latencyctl status` (its round trip) before the off. Switch to off is done
`--rounds` times (3) and each figure is the median of the rounds (single runs move by
+-40 % on this VM's host; each round's switch is printed too); CPU and RSS while holding
are the first round's. Then the same switch again while this process calls Status every
10 ms on a connection of its own: that switch's time, and the slowest Status reply
among those that found the switch in progress (the daemon answers between slices of
the switch).

Targets (issue 19, 20,000 threads): switch <= 1 s, all narrowed <= 1.5 s, CPU while
holding <= 1 % of one CPU, RSS <= 64 MiB, verify <= 0.5 s, off <= 0.5 s, status
<= 0.5 s, Status during the switch <= 100 ms.

With --fake, the engine on a fake server instead (bench/fakescale.py): 1, 4, 16 and 64
times a base size (x64: 256 CPUs, 4,096 IRQs, 64 NICs, 50,048 tasks), each operation's
seconds and its growth exponent from x1 to the largest (1.0 is linear; target <= 1.15),
the per-event costs (a kernel thread's: flat; an IRQ's or a NIC's: at most linear, one
pass over the IRQ table), and the bench's peak RSS. The fake /proc and /sys live on
tmpfs (/dev/shm) and the rig's own objects are frozen out of the garbage collector's
sight, so the figures are the daemon's work, not the rig's.

    python -m bench scale [--sizes 0,1000,5000,20000] [--hold 10] [--rounds 3] [--profiles A,B]
                          [--json] [--quick]
    python -m bench scale --fake [--multiples 1,4,16,64] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import CHASE, CHASE_PROFILE, arguments, not_root
from latencyd.kernel.system import System
from latencyd.tools.measure.processes import Processes
from latencyd.tools.measure.tuned import TunedDaemon
from scripts.private_bus import PrivateBus
from tests.harness import POLICY, REPO, Latencyd, idle_threads

ISOLATED = 1
TARGETS = {  # at the largest size, as issue 19 asks for 20,000 threads
    "switch_s": 1.0,
    "all_narrowed_s": 1.5,
    "cpu_holding_pct": 1.0,
    "rss_mib": 64.0,
    "verify_s": 0.5,
    "off_s": 0.5,
    "status_s": 0.5,
    "status_during_switch_ms": 100.0,
}


def tids(pid: int) -> list[int]:
    return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]


def wait_until(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


def all_off(pid: int) -> bool:
    return all(ISOLATED not in os.sched_getaffinity(t) for t in tids(pid))


def all_back(pid: int, every: set[int]) -> bool:
    return all(os.sched_getaffinity(t) == every for t in tids(pid))


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid`, in ns (schedstat's first field)."""
    total = 0
    for t in tids(pid):
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/{pid}/task/{t}/schedstat").read_text().split()[0])
    return total


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def holding(pid: int, seconds: float) -> float:
    """% of one CPU `pid` used over `seconds`."""
    before, t0 = cpu_ns(pid), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu_ns(pid) - before) / ((time.monotonic() - t0) * 1e9)


def timed(d: Latencyd, *args: str, ok: tuple[int, ...] = (0,)) -> float:
    t0 = time.monotonic()
    r = d.ctl(*args)
    if r.returncode not in ok:
        raise RuntimeError(f"latencyctl {' '.join(args)}: {r.stderr.strip()}")
    return time.monotonic() - t0


def status_while(switch: subprocess.Popen[str]) -> tuple[float | None, int]:
    """Calls Status (on this process's own connection) until `switch` has replied: the
    longest a Status reply took among those that said the switch was in progress, in ms,
    and how many did."""
    import dbus

    from latencyd import BUS_NAME, INTERFACE, OBJECT_PATH

    bus = dbus.SystemBus(private=True)
    proxy = bus.get_object(BUS_NAME, OBJECT_PATH, introspect=False)
    longest, during = None, 0
    try:
        while switch.poll() is None:
            t0 = time.perf_counter()
            status = json.loads(str(proxy.Status(dbus_interface=INTERFACE, timeout=30)))
            took = (time.perf_counter() - t0) * 1000
            if status["in_progress"] is not None:
                during += 1
                longest = max(longest or 0.0, took)
            time.sleep(0.01)  # a client polling, not a flood that starves the switch
    finally:
        bus.close()
    return (None if longest is None else round(longest, 1)), during


def latencyd_at(
    d: Latencyd, profile: str, n: int, hold: float, every: set[int], rounds: int
) -> dict[str, Any]:
    """The issue's table (a user's `latencyctl switch`, nobody else calling), `rounds`
    times (the median printed: this VM's host moves single runs by +-40 %; the CPU and
    RSS while holding are the first round's), then the same switch again with a client
    polling Status throughout: how long Status took."""
    assert d.proc is not None
    with idle_threads(n) as app:
        each: list[dict[str, Any]] = []
        for r in range(rounds):
            plan = timed(d, "plan", profile, ok=(0, 1))  # 1: the switch would change things
            t0 = time.monotonic()
            switch = timed(d, "switch", profile)
            narrowed = time.monotonic() - t0 if wait_until(lambda: all_off(app.pid), 120) else None
            one: dict[str, Any] = {"plan_s": plan, "switch_s": switch, "all_narrowed_s": narrowed}
            if r == 0:
                one["cpu_holding_pct"] = round(holding(d.proc.pid, hold), 3)
                one["rss_mib"] = round(rss_mib(d.proc.pid), 1)
            one["verify_s"] = timed(d, "verify")
            one["status_s"] = timed(d, "status")
            one["off_s"] = timed(d, "off")
            one["all_back"] = all_back(app.pid, every)
            each.append(one)
        row: dict[str, Any] = {
            key: _median([e[key] for e in each])
            for key in ("plan_s", "switch_s", "all_narrowed_s", "verify_s", "status_s", "off_s")
        }
        row |= {"cpu_holding_pct": each[0]["cpu_holding_pct"], "rss_mib": each[0]["rss_mib"]}
        row["all_back"] = all(e["all_back"] for e in each)
        row["switch_s_each"] = [round(e["switch_s"], 3) for e in each]
        t0 = time.monotonic()
        spawned = d.spawn_ctl("switch", profile)
        status_ms, answered = status_while(spawned)
        _, err = spawned.communicate()
        if spawned.returncode != 0:
            raise RuntimeError(f"latencyctl switch {profile}: {err.strip()}")
        row["switch_polled_s"] = round(time.monotonic() - t0, 3)
        row["status_during_switch_ms"] = status_ms
        row["statuses_during_switch"] = answered
        timed(d, "off")
    return row


def _median(values: list[float | None]) -> float | None:
    """The median, rounded to ms; None if any run never got there."""
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if len(known) == len(values) else None


def tuned_at(d: Latencyd, n: int, hold: float, every: set[int], etc: Path) -> dict[str, Any]:
    procs = Processes(System("/"))
    tuned = TunedDaemon(procs, etc, hold="untuned")
    with idle_threads(n) as app:
        try:
            t0 = time.monotonic()
            tuned.start("cpu-partitioning")
            active = time.monotonic() - t0
            narrowed = time.monotonic() - t0 if wait_until(lambda: all_off(app.pid), 120) else None
            pids = subprocess.run(["pgrep", "-x", "tuned"], capture_output=True, text=True)
            pid = int(pids.stdout.split()[0])
            row = {
                "active_s": round(active, 3),
                "all_narrowed_s": None if narrowed is None else round(narrowed, 3),
                "cpu_holding_pct": round(holding(pid, hold), 3),
                "rss_mib": round(rss_mib(pid), 1),
            }
            t0 = time.monotonic()
            tuned.stop()
            row["stop_s"] = round(time.monotonic() - t0, 3)
            row["all_back"] = all_back(app.pid, every)
        finally:
            tuned.stop()
            procs.end_all()
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    every = set(os.sched_getaffinity(0))
    sizes = [0, 1000] if args.quick else [int(s) for s in args.sizes.split(",")]
    with_tuned = shutil.which("tuned") is not None and not args.quick
    result: dict[str, Any] = {"latencyd": {}, "tuned": {}}
    with PrivateBus(POLICY) as bus, tempfile.TemporaryDirectory(prefix="latencyd-scale-") as tmp:
        etc = Path(tmp, "etc-tuned")
        if Path("/etc/tuned").is_dir():
            shutil.copytree("/etc/tuned", etc, symlinks=True)
        else:
            etc.mkdir()
        (etc / "cpu-partitioning-variables.conf").write_text(f"isolated_cores={ISOLATED}\n")
        os.environ["DBUS_SYSTEM_BUS_ADDRESS"] = bus.address  # TuneD's `latencyctl hold`
        mine = Path(tmp, "profiles")
        mine.mkdir()
        (mine / f"{CHASE}.toml").write_text(CHASE_PROFILE)
        d = Latencyd(bus.address, Path(tmp), None, [mine, REPO / "profiles"],
                     extra=["--no-profile"])  # fmt: skip
        d.start()
        try:
            for n in sizes:
                for profile in args.profiles.split(","):
                    print(f"bench scale: latencyd {profile}, {n} threads", file=sys.stderr)
                    row = latencyd_at(d, profile, n, args.hold, every, args.rounds)
                    result["latencyd"].setdefault(profile, {})[n] = row
                if with_tuned:
                    print(f"bench scale: TuneD, {n} threads", file=sys.stderr)
                    result["tuned"][n] = tuned_at(d, n, args.hold, every, etc)
        finally:
            d.stop()
    result["largest"] = max(sizes)
    return result


def report(r: dict[str, Any]) -> str:
    lines = []
    for profile, rows in r["latencyd"].items():
        lines += [
            f"latencyd {profile} beside one process's idle threads (this machine; "
            "medians of the rounds):",
            f"  {'threads':>8} {'plan s':>7} {'switch s':>9} {'narrowed s':>11} "
            f"{'CPU holding %':>14} {'RSS MiB':>8} {'verify s':>9} {'status s':>9} "
            f"{'off s':>7} all back  "
            "switched again, Status polled: switch s, slowest Status ms (replies)",
        ]
        for n, row in rows.items():
            lines.append(
                f"  {n:>8} {row['plan_s']!s:>7} {row['switch_s']:>9} {row['all_narrowed_s']!s:>11} "
                f"{row['cpu_holding_pct']:>14} {row['rss_mib']:>8} {row['verify_s']:>9} "
                f"{row['status_s']:>9} {row['off_s']:>7} {row['all_back']!s:<8}  "
                f"{row['switch_polled_s']}, {row['status_during_switch_ms']!s} "
                f"({row['statuses_during_switch']})"
            )
    if r["tuned"]:
        lines += ["TuneD cpu-partitioning, same sizes:",
                  f"  {'threads':>8} {'active s':>9} {'narrowed s':>11} {'CPU holding %':>14} "
                  f"{'RSS MiB':>8} {'stop s':>7} all back"]  # fmt: skip
        for n, row in r["tuned"].items():
            lines.append(
                f"  {n:>8} {row['active_s']:>9} {row['all_narrowed_s']!s:>11} "
                f"{row['cpu_holding_pct']:>14} {row['rss_mib']:>8} {row['stop_s']:>7} "
                f"{row['all_back']}"
            )
    for profile, rows in r["latencyd"].items():
        largest = rows[r["largest"]]
        lines.append(f"{profile}: each round's switch at {r['largest']} threads (s): "
                     f"{largest['switch_s_each']}; targets (medians of the rounds):")  # fmt: skip
        for key, target in TARGETS.items():
            value = largest.get(key)
            verdict = "PASS" if value is not None and value <= target else "MISS"
            lines.append(f"  {key:<18} {value!s:>9}  (<= {target})  [{verdict}]")
    return "\n".join(lines)


def run_fake(args: argparse.Namespace) -> dict[str, Any]:
    import math
    import resource

    from bench.fakescale import measure as measure_fake

    multiples = [1, 2] if args.quick else [int(m) for m in args.multiples.split(",")]
    # The fake /proc and /sys in memory (tmpfs), as the kernel's are: on a disk-backed
    # /tmp, x64's 300,000 files cost the file system's lookups, not the daemon's work.
    where = "/dev/shm" if os.path.isdir("/dev/shm") else None
    sizes: dict[int, dict[str, float]] = {}
    for k in multiples:
        print(f"bench scale --fake: x{k}", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="latencyd-fakescale-", dir=where) as tmp:
            measure_fake(Path(tmp), 1)  # warm: imports and caches, not the machine's size
        with tempfile.TemporaryDirectory(prefix="latencyd-fakescale-", dir=where) as tmp:
            sizes[k] = measure_fake(Path(tmp), k)
    first, last = multiples[0], multiples[-1]
    exponents = {
        op: round(math.log(max(sizes[last][op], 1e-6) / max(sizes[first][op], 1e-6))
                  / math.log(last / first), 2)
        for op in sizes[first] if op != "owned"
    }  # fmt: skip
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"sizes": sizes, "exponents": exponents, "peak_rss_mib": round(peak, 1)}


# A new kernel thread is one task: flat. A device's IRQs are found in one pass over
# /proc/interrupts (the kernel offers no per-device listing that also shows IRQs a
# legacy line gains without a new /proc/irq entry): at most linear in the IRQs.
EVENT_TARGETS = {
    "event: kthread fork": ("flat", 0.2),
    "event: IRQ appears": ("<= 1.0, one pass over the IRQs", 1.0),
    "event: NIC appears": ("<= 1.0, one pass over the IRQs", 1.0),
}


def report_fake(r: dict[str, Any]) -> str:
    sizes, exponents = r["sizes"], r["exponents"]
    multiples = list(sizes)
    lines = ["engine on a fake server (seconds per operation; x64 = 256 CPUs, 4,096 IRQs, "
             "64 NICs, 50,048 tasks):",
             f"  {'operation':<22}" + "".join(f"{'x' + str(k):>10}" for k in multiples)
             + f"{'exponent':>10}"]  # fmt: skip
    for op, exponent in exponents.items():
        row = "".join(f"{sizes[k][op]:>10.4f}" for k in multiples)
        target, limit = EVENT_TARGETS.get(op, ("<= 1.15", 1.15))
        ok = exponent <= limit
        lines.append(f"  {op:<22}{row}{exponent:>10}  ({target}) [{'PASS' if ok else 'MISS'}]")
    lines.append(f"peak RSS of the bench: {r['peak_rss_mib']} MiB")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = arguments("scale", __doc__, "sizes 0 and 1,000 only, no TuneD (--fake: x1, x2)")
    parser.add_argument("--sizes", default="0,1000,5000,20000", help="extra threads per run")
    parser.add_argument("--hold", type=float, default=10.0, help="seconds to hold (CPU)")
    parser.add_argument("--rounds", type=int, default=3, help="switch..off rounds per size")
    parser.add_argument(
        "--profiles",
        default=f"cpu-partitioning,{CHASE}",
        help="latencyd profiles to switch to (the shipped one's shield: a cpuset where the "
        "machine has one; the second: the affinity chase)",
    )
    parser.add_argument("--fake", action="store_true", help="the engine on a fake server")
    parser.add_argument("--multiples", default="1,4,16,64", help="fake server sizes")
    args = parser.parse_args(argv)
    if args.quick:
        args.hold = min(args.hold, 2.0)
    if args.fake:
        f = run_fake(args)
        print(json.dumps(f) if args.json else report_fake(f))
        return 0
    if not_root("scale", "it tunes the real machine"):
        return 1
    r = run(args)
    print(json.dumps(r) if args.json else report(r))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
