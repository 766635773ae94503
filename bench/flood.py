"""flood benchmark: an unprivileged user flooding the daemon while root switches and
turns the tuning off.

Calls (issue 37, item 4): the daemon holds cpu-partitioning beside --threads idle threads
(its shield narrows every one); --clients processes running as nobody call Status and
Verify back to back. Root then asks for Off and, once answered, switches back, --rounds
times. Figures:
- root's Off, from the call to its answer: p50 and max (target: max <= 1 s);
- every thread given back its CPUs after each Off (target: all of them);
- the daemon's CPU while flooded, and the calls the flood got answered per second.

Renames (issue 50, defect 4): a process of nobody's renames itself (prctl PR_SET_NAME) as
fast as it can while root asks for Off and then applies the profile again, --rounds
times, under each of: the shipped cpu-partitioning (no section follows renames: the kernel
drops them), a profile whose shield rule by name follows them (they reach the daemon), and
the affinity shield under a hold with the renamer 60 generations down (each rename asked
whether it descends from the holder). Figures: root's Off p50 and max (target: max <= 1 s;
OFF_GIVE_UP_S if it got no answer at all), the same rounds without the flood first (what
the machine gives an Off anyway), and the daemon's CPU while flooded.

    python -m bench flood [--threads 20000] [--clients 4] [--rounds 5] [--json] [--quick]
                          [--only calls|renames]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import arguments, not_root
from bench.daemon import CLK_TCK, cpu_sample
from scripts.private_bus import PrivateBus
from tests.harness import (
    HELD_CHASE,
    POLICY,
    RENAMES_FOLLOWED,
    REPO,
    Latencyd,
    idle_threads,
    wait_for,
)
from tests.nobody import renaming_as_nobody

NOBODY = 65534
OFF_TARGET_S = 1.0
OFF_GIVE_UP_S = 60.0  # an Off unanswered this long is reported as such, and the case ends
INTERFACE = "org.latencyd.Daemon1"
# Rename floods: (profile, held by root's application, generations below the fork).
RENAME_CASES = (
    ("cpu-partitioning", False, 0),
    ("renames-followed", False, 0),
    ("held-chase", True, 60),
)


def flood(address: str, until: float) -> tuple[int, int]:
    """A process of nobody's calling Status and Verify back to back until `until`. Returns
    (its pid, the read end of a pipe where it writes how many calls were answered, or the
    first error)."""
    import dbus

    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return pid, read
    os.close(read)
    said = "0"
    try:  # never leaves this block but through os._exit: the parent's stack is not ours
        os.setgroups([])
        os.setresgid(NOBODY, NOBODY, NOBODY)
        os.setresuid(NOBODY, NOBODY, NOBODY)
        obj = dbus.bus.BusConnection(address).get_object(INTERFACE, "/org/latencyd/Daemon1")
        calls = [obj.get_dbus_method(m, INTERFACE) for m in ("Status", "Verify")]
        answered = 0
        while time.monotonic() < until:
            for call in calls:
                call(timeout=30)
                answered += 1
        said = str(answered)
    except BaseException as exc:
        said = f"error: {exc}"
    finally:
        os.write(write, said.encode()[:4000])
        os._exit(0)


def narrowed(pid: int) -> int:
    """How many threads of `pid` are kept off some online CPU."""
    every = set(range(os.cpu_count() or 1))
    count = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if os.sched_getaffinity(int(task.name)) != every:
                count += 1
        except OSError:
            continue
    return count


def run(threads: int, clients: int, rounds: int) -> dict[str, Any]:
    import dbus

    with (
        PrivateBus(POLICY) as bus,
        tempfile.TemporaryDirectory() as tmp,
        idle_threads(threads) as app,
    ):
        d = Latencyd(bus.address, Path(tmp), "cpu-partitioning", [REPO / "profiles"]).start(60)
        try:
            assert d.proc is not None
            root = dbus.bus.BusConnection(bus.address)
            obj = root.get_object(INTERFACE, "/org/latencyd/Daemon1")
            wait_for(lambda: narrowed(app.pid) >= threads, timeout=120)
            seconds = rounds * 6.0 + 30
            until = time.monotonic() + seconds
            before, started = cpu_sample(d.proc.pid), time.monotonic()
            floods = [flood(bus.address, until) for _ in range(clients)]
            off_s, left = [], []
            for _ in range(rounds):
                time.sleep(1.0)
                t0 = time.monotonic()
                obj.get_dbus_method("Off", INTERFACE)(timeout=120)
                off_s.append(time.monotonic() - t0)
                left.append(narrowed(app.pid))
                obj.get_dbus_method("SwitchProfile", INTERFACE)("cpu-partitioning", timeout=300)
            after, ended = cpu_sample(d.proc.pid), time.monotonic()
            said = []
            for pid, fd in floods:
                os.waitpid(pid, 0)
                with os.fdopen(fd) as pipe:
                    said.append(pipe.read())
            errors = [s for s in said if not s.isdigit()]
            if errors:
                raise RuntimeError(f"a flooding client failed: {errors[0]}")
            answered = sum(int(s) for s in said)
            busy = (after["ticks"] - before["ticks"]) / CLK_TCK / (ended - started) * 100
            return {
                "threads": threads,
                "clients": clients,
                "off_p50_s": statistics.median(off_s),
                "off_max_s": max(off_s),
                "threads_left_narrowed_after_off": max(left),
                "daemon_cpu_pct": round(busy, 1),
                "flood_calls_per_s": round(answered / seconds, 1),
            }
        finally:
            d.stop(60)


def renames(rounds: int) -> list[dict[str, Any]]:
    """Root's Off while nobody renames a process in a loop, under each RENAME_CASES."""
    import dbus

    results = []
    with PrivateBus(POLICY) as bus, tempfile.TemporaryDirectory() as tmp:
        profiles = Path(tmp) / "profiles"
        profiles.mkdir()
        (profiles / "renames-followed.toml").write_text(RENAMES_FOLLOWED)
        (profiles / "held-chase.toml").write_text(HELD_CHASE)
        for profile, held, depth in RENAME_CASES:
            workdir = Path(tmp) / profile
            workdir.mkdir()
            d = Latencyd(bus.address, workdir, None if held else profile, [profiles])
            d.extra = ["--no-profile"] if held else []
            d.start(60)
            try:
                results.append(rename_case(dbus, d, profile, held, depth, rounds))
            finally:
                d.stop(120)
    return results


def rename_case(
    dbus: Any, d: Latencyd, profile: str, held: bool, depth: int, rounds: int
) -> dict[str, Any]:
    assert d.proc is not None
    root = dbus.bus.BusConnection(d.address)
    obj = root.get_object(INTERFACE, "/org/latencyd/Daemon1")

    def apply() -> None:  # a hold ends with Off, or when this connection leaves the bus
        if held:
            obj.get_dbus_method("HoldProfile", INTERFACE)(profile, "bench", timeout=300)
        else:
            obj.get_dbus_method("SwitchProfile", INTERFACE)(profile, timeout=300)

    def offs() -> tuple[list[float], bool]:
        """Off then the profile again, `rounds` times: the seconds each Off took, and
        whether one got no answer in OFF_GIVE_UP_S (the rounds end there)."""
        took: list[float] = []
        for _ in range(rounds):
            time.sleep(1.0)
            t0 = time.monotonic()
            try:
                obj.get_dbus_method("Off", INTERFACE)(timeout=OFF_GIVE_UP_S)
            except dbus.exceptions.DBusException:
                return took, True
            took.append(time.monotonic() - t0)
            apply()
        return took, False

    if held:
        apply()
    quiet, _ = offs()  # the same rounds without the flood, to compare with
    with renaming_as_nobody(depth):
        time.sleep(1.0)
        before, started = cpu_sample(d.proc.pid), time.monotonic()
        off_s, stalled = offs()
        after, ended = cpu_sample(d.proc.pid), time.monotonic()
    root.close()
    busy = (after["ticks"] - before["ticks"]) / CLK_TCK / (ended - started) * 100
    return {
        "profile": profile,
        "held": held,
        "depth": depth,
        "answered": len(off_s),
        "stalled": stalled,  # an Off got no answer in OFF_GIVE_UP_S: the case ended there
        "off_p50_s": statistics.median(off_s) if off_s else None,
        "off_max_s": max(off_s) if off_s else None,
        "quiet_off_p50_s": statistics.median(quiet) if quiet else None,
        "quiet_off_max_s": max(quiet) if quiet else None,
        "daemon_cpu_pct": round(busy, 1),
    }


def main(argv: list[str]) -> int:
    parser = arguments("flood", __doc__, "2,000 threads, 2 clients, 2 rounds")
    parser.add_argument("--threads", type=int, default=20000)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=("calls", "renames"), help="run one of the two floods")
    args = parser.parse_args(argv)
    if not_root("flood", "it runs latencyd, which tunes the machine"):
        return 1
    if args.quick:
        args.threads, args.clients, args.rounds = 2000, 2, 2
    out = run(args.threads, args.clients, args.rounds) if args.only != "renames" else None
    renamed = renames(1 if args.quick else args.rounds) if args.only != "calls" else []
    if args.json:
        print(json.dumps({"calls": out, "renames": renamed}))
        return 0
    if out is not None:
        print_calls(out)
    for case in renamed:
        print_renames(case)
    return 0


def print_renames(case: dict[str, Any]) -> None:
    what = f"{case['depth']} generations down, under a hold" if case["held"] else "at the top"
    print(f"flood: nobody renaming a process in a loop ({what}) under {case['profile']}")
    if case["answered"]:
        mark = "PASS" if case["off_max_s"] <= OFF_TARGET_S and not case["stalled"] else "MISS"
        print(f"  root's Off answered in p50 {case['off_p50_s']:.3f} s, max "
              f"{case['off_max_s']:.3f} s, {case['answered']} answered "
              f"(target <= {OFF_TARGET_S:g} s: {mark})")  # fmt: skip
    if case["stalled"]:
        target = f"target <= {OFF_TARGET_S:g} s: MISS"
        print(f"  root's Off: no answer in {OFF_GIVE_UP_S:g} s ({target})")
    if case["quiet_off_p50_s"] is not None:
        print(f"  without the flood: p50 {case['quiet_off_p50_s']:.3f} s, "
              f"max {case['quiet_off_max_s']:.3f} s")  # fmt: skip
    print(f"  daemon CPU while flooded: {case['daemon_cpu_pct']} %")


def print_calls(out: dict[str, Any]) -> None:
    mark = "PASS" if out["off_max_s"] <= OFF_TARGET_S else "MISS"
    print(f"flood: {out['clients']} unprivileged clients calling Status and Verify beside "
          f"{out['threads']} threads under cpu-partitioning")  # fmt: skip
    print(f"  root's Off answered in p50 {out['off_p50_s']:.3f} s, max {out['off_max_s']:.3f} s "
          f"(target <= {OFF_TARGET_S:g} s: {mark})")  # fmt: skip
    print(f"  threads still narrowed after Off: {out['threads_left_narrowed_after_off']}")
    print(f"  daemon CPU while flooded: {out['daemon_cpu_pct']} %; flood answered "
          f"{out['flood_calls_per_s']} calls/s")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
