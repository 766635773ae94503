"""`latencyctl measure`: what a profile buys, as the field's standard tools see it.

- sockperf UDP ping-pong over a veth pair between two network namespaces made for the
  run (server on the application CPUs, client on housekeeping): RTT/2 per packet. The
  client stands in for the remote peer, so it runs at SCHED_FIFO 1: a load on the
  housekeeping CPUs must not slow the peer, or a 2-CPU machine measures the load's
  CPU instead of the application's (measured here under stress-ng: client at normal
  priority, cpu-partitioning p99 1,377 µs, all of it the client waiting behind the load
  on CPU 0; at FIFO 1, 35 µs);
- cyclictest timer wake-up latency on the application CPUs (`--default-system`, so
  the profile, not the tool, holds PM QoS);
- oslat (OS noise seen by a busy loop) where it is installed.

Scenarios alternate in short rounds (A B A B ...: the machine is noisy, alternation is
what makes a ratio fair). A scenario is a latencyd profile, held through the daemon
while it is measured (a hold ends by itself if this process dies), "untuned" (the empty
profile of that name: every original), "current" (nothing switched), or "tuned:NAME"
(TuneD applies NAME while latencyd holds "untuned": for comparisons only).

Nothing but this run's own namespaces, veth pair and processes, and the profile holds
it announces, is changed; all of it is undone on success, failure and Ctrl-C (and, if
the run is killed outright, by its guard: runguard), and every tool runs under a time
limit. Attribution (what ran or interrupted on the measured
CPUs) comes from /proc/interrupts, /proc/softirqs, /proc/schedstat and per-task
schedstat, plus perf tracepoint counts where tracefs is mounted. Where a scenario's profile
shields CPUs, the scheduler tick there during its tools, as the daemon's noise watch counted
it, beside what nohz_full= would remove after a reboot (latencyd.tools.ticks).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from latencyd.core import procstat
from latencyd.core.cpuset import CpuSet
from latencyd.core.errors import LatencydError
from latencyd.core.idle import state_counters
from latencyd.core.idle import states_of as idle_states_of
from latencyd.core.plugin import Plugin, Target, decode_target, discover
from latencyd.core.system import System
from latencyd.core.text import printable
from latencyd.tools import ticks
from latencyd.tools.latency import Histogram, ratios
from latencyd.tools.runguard import Guard

TOOLS = {  # tool -> (the command, the Debian package)
    "sockperf": ("sockperf", "sockperf"),
    "cyclictest": ("cyclictest", "rt-tests"),
    "oslat": ("oslat", "rt-tests"),
}
UNITS = {
    "sockperf": "µs, UDP RTT/2",
    "cyclictest": "µs, timer wake-up",
    "oslat": "µs, busy-loop noise",
}
SERVER_IP, CLIENT_IP = "10.231.0.1", "10.231.0.2"
CYCLICTEST_RANGE_US = 20000  # histogram range; beyond it samples are counted as overflow
OSLAT_BUCKETS = 1024  # µs; the last bucket holds everything above
# The control hog's name (its comm): Python started through a link of this name, parked
# on the housekeeping CPUs (asleep: it must not load them) until the control group's
# [[shield.rule]] moves it onto the measured ones; there it makes itself SCHED_FIFO 1
# and is busy 80 µs of every 100: a real-time task the application cannot preempt, so
# most wake-ups wait, whatever else runs. The period is shorter than a round trip's
# work so the median moves, not only the tail: at 0.8 ms of every ms a dozen round trips
# fit in each gap and only one waits, so sockperf p50 moved 1.3x and p99 8-9x, one vote,
# under load on a haltpoll guest (a plain CPU hog shares the CPU by EEVDF's rules and
# beside a load made no difference some rounds). The fifth left keeps the CPU's kernel
# threads alive. It ends by itself when measure dies (even by SIGKILL).
CONTROL_HOG = "ltdm-hog"
CONTROL_HOG_LOOP = """
import os, sys, time
parent, measured = int(sys.argv[1]), {int(c) for c in sys.argv[2].split(",")}
busy, period, fifo = 0.00008, 0.0001, False
while True:
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
    there = os.sched_getaffinity(0) <= measured
    if there != fifo:
        policy = os.SCHED_FIFO if there else os.SCHED_OTHER
        os.sched_setscheduler(0, policy, os.sched_param(1 if there else 0))
        fifo = there
    if not there:
        time.sleep(0.02)
        continue
    end = time.perf_counter() + busy
    while time.perf_counter() < end:
        pass
    time.sleep(period - busy)
"""


class MeasureError(LatencydError):
    dbus_name = "org.latencyd.Error.MeasureFailed"


@dataclass
class Plan:
    scenarios: list[str]
    app_cpus: CpuSet
    housekeeping: CpuSet
    seconds: float  # per tool, per scenario, per round
    rounds: int
    tools: list[str]
    load: list[str] | None = None  # a command line run for the whole measurement
    idle_seconds: float = 0.0  # per scenario and round: CPU busy share with no traffic
    tuned_etc: Path = Path("/etc/tuned")  # the configuration "tuned:NAME" scenarios read
    # What to hold for a scenario, where it is not the scenario's own name (a file).
    holds: dict[str, str] = field(default_factory=dict)
    # Profiles held on the way from one measured scenario to the next, not measured
    # (attribution walks the daemon there one group of settings at a time).
    route: Callable[[str, str], list[str]] | None = None
    control_hog: bool = False  # run the CONTROL_HOG for the whole measurement
    order: Callable[[int], list[str]] | None = None  # round -> its scenarios' order
    scratch: tuple[Path, ...] = ()  # the caller's temporary directories: the guard's too
    # The whole run's time, if it has one (--budget): the rounds after the first get the
    # seconds that fit what is left, at what the rounds so far cost besides the tools.
    budget_s: float | None = None

    @property
    def estimate_s(self) -> float:
        per = len(self.tools) * (self.seconds + 1) + 1 + self.idle_seconds
        return self.rounds * len(self.scenarios) * per


# -- processes: every one started is ended -------------------------------------------------


class Processes:
    """Children each in a process group of its own, so each can be ended with all it
    started. They stay in this process's session, as the load does: processes started from
    one shell share a session, and so an autogroup (kernel.sched_autogroup_enabled), and
    compete task by task. Separate sessions would give the tools a CPU share of their own
    against the load and hide what the load does to them."""

    def __init__(self, guard: Guard | None = None) -> None:
        # told of each group, to end it should this process die
        self.guard = guard if guard is not None else Guard(watch=False)
        self.running: list[subprocess.Popen[str]] = []
        self.detached: list[int] = []  # process groups started outside our tree
        # What a shell here would start things with: measure keeps itself to the
        # housekeeping CPUs once it runs, and what it detaches must not inherit that.
        self.shell_cpus = CpuSet(frozenset(os.sched_getaffinity(0)))

    def start(self, argv: list[str], grace: float = 3.0, **kwargs: Any) -> subprocess.Popen[str]:
        """Start `argv` in a process group of its own; `grace`: the seconds it gets to exit
        after SIGTERM, here and by the guard."""
        proc = subprocess.Popen(
            argv, process_group=0, text=True, stdin=subprocess.DEVNULL, **kwargs
        )
        self.running.append(proc)
        self.guard.group(proc.pid, grace)
        return proc

    def run(self, argv: list[str], timeout: float) -> str:
        proc = self.start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise MeasureError(f"{argv[0]} did not finish within {timeout:.0f} s") from exc
        finally:  # ended whatever happened (a timeout, Ctrl-C), then forgotten
            self.end(proc)
            with contextlib.suppress(ValueError):
                self.running.remove(proc)
        if proc.returncode != 0:
            raise MeasureError(
                f"{' '.join(argv[:3])}... failed ({proc.returncode}): {err.strip()[-300:]}"
            )
        return out

    def end(self, proc: subprocess.Popen[str], grace: float = 3.0) -> None:
        """SIGTERM its process group; SIGKILL what is left after `grace` seconds."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(3)
        self.guard.ended(proc.pid)

    def detach(self, argv: list[str], workdir: Path, name: str = "load") -> int:
        """Start `argv` outside this process tree, as a load or an application started from
        a shell would be: a shell in a process group of its own starts it in the
        background and exits, so it is re-parented and a hold's exemption (this process
        and its children) does not cover it; it stays in this session. Returns its
        process group; ended in end_all (or by the caller, with killpg)."""
        pidfile = workdir / f"{name}.pid"
        script = f'"$@" </dev/null >/dev/null 2>&1 & echo $$ > {shlex.quote(str(pidfile))}'
        argv = ["taskset", "-c", self.shell_cpus.to_list(), *argv]
        subprocess.run(["sh", "-c", script, "sh", *argv], check=True, process_group=0,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)  # fmt: skip
        pgid = int(pidfile.read_text())
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            raise MeasureError(f"the {name} did not start: {' '.join(argv)}") from None
        self.detached.append(pgid)
        self.guard.group(pgid, 0.0)  # SIGKILL at once, as end_group does
        return pgid

    def end_group(self, pgid: int, timeout: float = 5.0) -> None:
        """End one detached process group (SIGKILL: nothing of it needs to clean up), and
        wait until init has reaped it, so its port and CPU are free for the next round."""
        with contextlib.suppress(ValueError):
            self.detached.remove(pgid)
        deadline = time.monotonic() + timeout
        try:
            os.killpg(pgid, signal.SIGKILL)
            while time.monotonic() < deadline:
                os.killpg(pgid, 0)  # ProcessLookupError once no member is left, zombie or not
                time.sleep(0.005)
        except ProcessLookupError:
            pass
        self.guard.ended(pgid)

    def end_all(self) -> None:
        for proc in reversed(self.running):
            self.end(proc)
        self.running.clear()
        for pgid in list(self.detached):  # its group holds all it started; gone on return
            self.end_group(pgid)


# -- the network: two namespaces and a veth pair, made for this run --------------------------


class Network:
    def __init__(self, procs: Processes) -> None:
        self.procs = procs
        tag = f"ltdm-{os.getpid()}"
        self.server_ns, self.client_ns = f"{tag}-s", f"{tag}-c"
        self.made: list[str] = []

    def __enter__(self) -> Network:
        try:
            for ns in (self.server_ns, self.client_ns):
                _ip("netns", "add", ns)
                self.made.append(ns)
                self.procs.guard.netns(ns)
            _ip("link", "add", "ltdm-s", "netns", self.server_ns, "type", "veth", "peer",
                "name", "ltdm-c", "netns", self.client_ns)  # fmt: skip
            for ns, dev, addr in (
                (self.server_ns, "ltdm-s", SERVER_IP),
                (self.client_ns, "ltdm-c", CLIENT_IP),
            ):
                _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        self.made.clear()

    def inside(self, ns: str, cpus: CpuSet, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", ns, "taskset", "-c", cpus.to_list(), *argv]


def scratch_dir() -> str | None:
    """Where measure's temporary directories go: /run for root, whose /tmp the daemon's
    unit hides from it (PrivateTmp=yes) though the daemon must read the scenario profiles
    kept there; the usual temporary directory otherwise."""
    return "/run" if os.geteuid() == 0 and os.access("/run", os.W_OK) else None


def remove_what_dead_runs_left(netns: Path = Path("/run/netns")) -> list[str]:
    """A run killed outright (SIGKILL) cannot remove its namespaces or temporary
    directories, so each run removes those of runs whose process is gone. Their names
    carry the run's PID (ltdm-PID-s, latencyd-measure-PID-*, latencyd-tuned-PID-*,
    latencyd-attribute-PID-*, latencyd-recommend-PID-*); a live run's are left alone."""
    names = [ns.name for ns in netns.glob("ltdm-*-[sc]")] if netns.is_dir() else []
    dirs = [
        path
        for tmp in {Path(tempfile.gettempdir()), Path(scratch_dir() or tempfile.gettempdir())}
        for kind in ("measure", "tuned", "attribute", "recommend")
        for path in tmp.glob(f"latencyd-{kind}-*-*")
    ]
    removed = []
    for name, path in [(n, None) for n in names] + [(d.name, d) for d in dirs]:
        pid = re.search(r"-(\d+)-", name)
        if pid is None or Path(f"/proc/{pid[1]}").exists():
            continue
        if path is not None and not _ours(path):
            continue  # another user's, by the same name: not a dead run's to remove
        if path is None:
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
        else:
            shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    return removed


def _ours(path: Path) -> bool:
    """Whether `path` is a directory of this user's (not a symlink): what a run made."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise MeasureError(f"ip {' '.join(args)}: {result.stderr.strip()}")


# -- the tools ----------------------------------------------------------------------------------


def parse_sockperf_log(text: str) -> Histogram:
    """sockperf --full-log: "packet, txTime(sec), rxTime(sec), latency(usec)" per packet."""
    values = []
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) == 4 and fields[0].strip().isdigit():
            values.append(float(fields[3]))
    return Histogram.of(values)


def parse_cyclictest(text: str) -> Histogram:
    """cyclictest -h: "BUCKET COUNT [COUNT...]" lines (µs, one column per thread), then
    "# Histogram Overflows: N [N...]"."""
    hist = Histogram(ceiling=CYCLICTEST_RANGE_US)
    for line in text.splitlines():
        if line.startswith("# Histogram Overflows:"):
            hist.overflow += sum(int(x) for x in line.split(":", 1)[1].split())
        elif re.fullmatch(r"\d+(\s+\d+)+", line.strip()):
            bucket, *counts = (int(x) for x in line.split())
            total = sum(counts)
            if total:
                hist.counts[float(bucket)] += total
    return hist


def parse_oslat(text: str) -> Histogram:
    """oslat: "NNN (us): COUNT" lines per core; the last bucket includes the overflows."""
    hist = Histogram(ceiling=OSLAT_BUCKETS)
    for line in text.splitlines():
        m = re.match(r"\s*(\d+) \(us\):\s*(\d+)( \(including overflows\))?", line)
        if m:
            value, count = float(m.group(1)), int(m.group(2))
            if m.group(3):
                hist.overflow += count
            elif count:
                hist.counts[value] += count
    return hist


def run_tool(tool: str, plan: Plan, procs: Processes, net: Network, workdir: Path) -> Histogram:
    limit = plan.seconds + 20
    if tool == "cyclictest":
        out = procs.run(
            ["cyclictest", "-q", "-m", "-p", "95", "-t", str(len(plan.app_cpus)),
             "-a", plan.app_cpus.to_list(), "-i", "200", "-D", f"{plan.seconds:g}",
             "-h", str(CYCLICTEST_RANGE_US), "--default-system"],
            timeout=limit,
        )  # fmt: skip
        return parse_cyclictest(out)
    if tool == "oslat":
        out = procs.run(
            ["oslat", "-c", plan.app_cpus.to_list(), "-C", str(min(plan.housekeeping)),
             "-D", f"{max(1, round(plan.seconds))}", "-b", str(OSLAT_BUCKETS)],
            timeout=limit + 2,
        )  # fmt: skip
        return parse_oslat(out)
    # sockperf: a server per round (a fresh socket), the client on housekeeping CPUs. The
    # server is the application: started as a user would, `taskset -c APP_CPUS` from a
    # shell, outside the hold's exemption, so the shield treats it as it treats theirs.
    log = workdir / "sockperf.csv"
    server = procs.detach(
        net.inside(net.server_ns, plan.app_cpus, "sockperf", "server", "-i", SERVER_IP,
                   "-p", "11111"),
        workdir, "sockperf-server",
    )  # fmt: skip
    try:
        time.sleep(0.2)
        procs.run(
            net.inside(net.client_ns, plan.housekeeping, "chrt", "-f", "1", "sockperf", "ping-pong",
                       "-i", SERVER_IP, "-p", "11111", "-t", f"{max(1, round(plan.seconds))}",
                       "--full-log", str(log)),
            timeout=limit,
        )  # fmt: skip
        return parse_sockperf_log(log.read_text())
    finally:
        procs.end_group(server)


# -- attribution: what interfered on the measured CPUs ----------------------------------------


@dataclass
class Counters:
    irqs: Counter[str] = field(default_factory=Counter)
    softirqs: Counter[str] = field(default_factory=Counter)
    schedule_calls: int = 0  # stays 0 where /proc/schedstat is absent
    tasks: dict[tuple[int, str], int] = field(default_factory=dict)  # (tid, comm) -> ns run
    last_cpu: dict[tuple[int, str], int] = field(default_factory=dict)


MEASURING = {"sockperf", "cyclictest", "oslat"}


def wake(system: System, cpus: list[int]) -> None:
    """Bring each of `cpus` out of its idle state by running there for a moment: the
    kernel adds a sleep to a state's residency only when the sleep ends, and a quiet
    tickless CPU sleeps through half a second and more (seen here: its counter still for
    0.52 s), so a window read without this counts a whole sleep in or out at random. A
    CPU this process may not run on (a cpuset) is left as it is."""
    ours = system.affinity(0)
    try:
        for cpu in cpus:
            # Returns on `cpu`: the migration wakes it, which ends its sleep.
            with contextlib.suppress(LatencydError):
                system.set_affinity(0, CpuSet({cpu}))
    finally:
        system.set_affinity(0, ours)


def busy_share(seconds: float, measured: CpuSet | None = None) -> float:
    """Share of the `measured` CPUs' time (default all) not spent in a real idle state
    (running, or polling) over `seconds`: what a scenario costs while nothing happens.
    Polling happens inside the idle task, so /proc/stat calls it idle; cpuidle residency
    does not (a VM's host sees a polling vCPU as busy, a bare-metal CPU spends the
    power). Without cpuidle, the share of time /proc/stat does not count idle."""
    system = System("/")
    cpus = system.online_cpus() if measured is None else measured
    # Per CPU with idle states, the ones it sleeps in (POLL is polling: awake); a CPU
    # without states has nothing to count and leaves the share to /proc/stat.
    sleeping = {
        cpu: [s.index for s in states if not s.is_poll]
        for cpu in cpus
        if (states := idle_states_of(system, cpu))
    }

    def asleep_us() -> int:
        wake(system, list(sleeping))
        total = 0
        for cpu, indexes in sleeping.items():
            for i in indexes:
                with contextlib.suppress(LatencydError, ValueError):  # a state gone: skipped
                    total += state_counters(system, cpu, i)[0]
        return total

    def stat() -> tuple[int, int]:
        ticks = procstat.stat_ticks(system.read("proc/stat"))
        mine = [t for cpu, t in ticks.items() if cpu in cpus]
        return sum(sum(t[:8]) for t in mine), sum(t[3] + t[4] for t in mine)

    if not sleeping:
        total0, idle0 = stat()
        time.sleep(seconds)
        total1, idle1 = stat()
        total = total1 - total0
        return (total - (idle1 - idle0)) / total if total else 0.0
    asleep0 = asleep_us()
    start = time.monotonic()
    time.sleep(seconds)
    asleep, wall_us = asleep_us() - asleep0, (time.monotonic() - start) * 1e6
    return max(0.0, 1 - asleep / (wall_us * len(sleeping)))


def counters(cpus: CpuSet, system: System) -> Counters:
    c = Counters()
    for row, (what, counts) in procstat.interrupt_counts(system.read("proc/interrupts")).items():
        label = procstat.interrupt_label(row, what)
        c.irqs[label] += sum(n for cpu, n in counts.items() if cpu in cpus)
    for kind, counts in procstat.softirq_counts(system.read("proc/softirqs")).items():
        c.softirqs[kind] += sum(n for cpu, n in counts.items() if cpu in cpus)
    with contextlib.suppress(LatencydError):  # only with CONFIG_SCHEDSTATS
        calls = procstat.schedule_calls(system.read("proc/schedstat"))
        c.schedule_calls = sum(n for cpu, n in calls.items() if cpu in cpus)
    for pid in system.entries("proc"):
        if pid.isdigit():
            for task, ran in system.threads(int(pid)):
                c.tasks[task.pid, task.comm] = ran
                c.last_cpu[task.pid, task.comm] = task.last_cpu
    return c


def attribution(before: Counters, after: Counters, cpus: CpuSet) -> dict[str, Any]:
    irqs = {k: v - before.irqs.get(k, 0) for k, v in after.irqs.items()}
    soft = {k: v - before.softirqs.get(k, 0) for k, v in after.softirqs.items()}
    ran: list[dict[str, Any]] = []
    for key, runtime in after.tasks.items():
        delta = runtime - before.tasks.get(key, 0)
        if delta > 0 and after.last_cpu.get(key) in cpus and key[1] not in MEASURING:
            ran.append({"tid": key[0], "comm": key[1], "ran_ms": round(delta / 1e6, 3)})
    ran.sort(key=lambda t: -float(t["ran_ms"]))
    return {
        "interrupts": {k: v for k, v in sorted(irqs.items(), key=lambda kv: -kv[1]) if v > 0},
        "softirqs": {k: v for k, v in sorted(soft.items(), key=lambda kv: -kv[1]) if v > 0},
        "schedule_calls": after.schedule_calls - before.schedule_calls,
        "tasks_that_ran": ran[:15],
    }


def merge_attribution(total: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    if not total:
        return part
    out = dict(total)
    for key in ("interrupts", "softirqs"):
        merged = Counter(total[key])
        merged.update(part[key])
        out[key] = dict(merged.most_common())
    out["schedule_calls"] = total["schedule_calls"] + part["schedule_calls"]
    runs: Counter[tuple[int, str]] = Counter()  # ms run, by (tid, comm)
    for t in (*total["tasks_that_ran"], *part["tasks_that_ran"]):
        runs[(int(t["tid"]), str(t["comm"]))] += float(t["ran_ms"])  # type: ignore[assignment]
    out["tasks_that_ran"] = [
        {"tid": tid, "comm": comm, "ran_ms": round(ms, 3)}
        for (tid, comm), ms in runs.most_common(15)
    ]
    return out


# -- scenarios ------------------------------------------------------------------------------


class TunedDaemon:
    """TuneD in the foreground without D-Bus or socket, for side-by-side comparisons only
    (latencyd never needs it). Stopped with SIGTERM, on which it rolls back its settings.

    TuneD keeps the originals it must put back only in its memory, so four things make a
    comparison safe even if this process is killed outright: TuneD gets SIGTERM when this
    process dies (PR_SET_PDEATHSIG, through setpriv); with `hold`, it runs under
    `latencyctl hold HOLD`, so latencyd keeps that profile until TuneD has rolled back
    (otherwise latencyd's own hold would end with this process, and latencyd would
    re-apply its profile while TuneD rolls back, recording TuneD's values as originals);
    between the two, `guard_tuned` puts back what TuneD's rollback is known to leave
    (RollbackLeftovers) before the hold ends; and it runs in a mount namespace of its own
    over private copies of /etc/tuned and /etc/modprobe.d, so its notes (active_profile,
    bootcmdline) and the module options its scripts write never reach the machine's
    files. `etc` is the configuration to copy instead of /etc/tuned (a comparison's own
    variables)."""

    FILES = (Path("/etc/tuned"), Path("/etc/modprobe.d"))
    ROLLBACK_S = 60.0  # its rollback joins its plugin threads: seconds, never SIGKILL it
    # Bind the private copies over the real directories, then become TuneD.
    PRIVATE = (
        'mount --bind "$1" /etc/tuned && mount --bind "$2" /etc/modprobe.d && shift 2 && exec "$@"'
    )

    def __init__(self, procs: Processes, etc: Path = FILES[0], hold: str | None = None) -> None:
        self.procs = procs
        self.etc = etc
        self.hold = hold
        self.proc: subprocess.Popen[str] | None = None
        self.workdir: Path | None = None
        self.copied: dict[Path, dict[str, bytes]] = {}  # the private copies as made
        self.wrote: list[str] = []  # the files TuneD changed in its private copies
        self.put_back: list[str] = []  # what TuneD's rollback left, put back

    def start(self, profile: str, timeout: float = 60.0) -> None:
        if shutil.which("tuned") is None:
            raise MeasureError("TuneD is not installed (apt-get install tuned)")
        self.stop()
        self.workdir = Path(
            tempfile.mkdtemp(prefix=f"latencyd-tuned-{os.getpid()}-", dir=scratch_dir())
        )
        self.procs.guard.path(self.workdir)
        copies = [self.workdir / "tuned", self.workdir / "modprobe.d"]
        for source, copy in zip((self.etc, self.FILES[1]), copies, strict=True):
            if source.is_dir():
                shutil.copytree(source, copy, symlinks=True)
            else:
                copy.mkdir()
        self.copied = {f: _files(c) for f, c in zip(self.FILES, copies, strict=True)}
        log = self.workdir / "tuned.log"
        argv = ["setpriv", "--pdeathsig", "TERM", "unshare", "--mount", "--propagation",
                "private", "sh", "-c", self.PRIVATE, "sh", *map(str, copies), "tuned",
                "--no-dbus", "--no-socket", "--profile", profile, "--log", str(log)]  # fmt: skip
        argv = ["setpriv", "--pdeathsig", "TERM", sys.executable, "-m", "latencyd.tools.measure",
                str(self.workdir / "put-back"), *argv]  # fmt: skip
        if self.hold is not None:
            argv = ["setpriv", "--pdeathsig", "TERM", sys.executable, "-m", "latencyd.tools.cli",
                    "hold", "--reason", f"TuneD {profile} (latencyctl measure)", self.hold,
                    "--", *argv]  # fmt: skip
        with open(self.workdir / "stderr", "w") as stderr:
            self.proc = self.procs.start(
                argv, grace=self.ROLLBACK_S, stdout=subprocess.DEVNULL, stderr=stderr
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log.read_text() if log.exists() else ""
            if self.proc.poll() is not None or "applied" in text:
                break
            time.sleep(0.1)
        else:
            text = "(no line says it applied the profile)"
        if self.proc.poll() is not None or "applied" not in text:
            text += (self.workdir / "stderr").read_text()
            self.stop()
            tail = " | ".join(text.strip().splitlines()[-3:]) or "no log"
            raise MeasureError(f"TuneD did not apply {profile}: {tail}")

    def stop(self) -> None:
        """End TuneD (it rolls back, then its guard puts back what the rollback left), note
        what it wrote in its copies, delete them."""
        if self.proc is not None:
            self.procs.end(self.proc, grace=self.ROLLBACK_S)
            with contextlib.suppress(ValueError):
                self.procs.running.remove(self.proc)
            self.proc = None
        if self.workdir is not None:
            report = self.workdir / "put-back"
            self.put_back += report.read_text().splitlines() if report.exists() else []
            for real, copy in zip(self.FILES, ("tuned", "modprobe.d"), strict=True):
                after = _files(self.workdir / copy)
                before = self.copied[real]
                self.wrote += sorted(str(real / f) for f in after.keys() | before.keys()
                                     if after.get(f) != before.get(f))  # fmt: skip
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


class RollbackLeftovers:
    """What TuneD's rollback is known to leave, read before TuneD starts and put back after
    it has exited.

    TuneD writes the writeback workqueue's mask through two paths (the workqueue/*/cpumask
    glob and /sys/bus/workqueue/devices/writeback/cpumask) and its rollback sometimes
    restores the second from a value read after the first was set: measured here, 2 of 4
    cpu-partitioning runs left it isolated. And it writes back the vm.dirty_*ratio it read:
    0 on a machine whose limits are in bytes, and the kernel then zeroes the bytes too."""

    def __init__(self) -> None:
        self.masks = workqueue_masks()
        self.limits = DirtyLimits()
        self.limits_before = self.limits.read()

    def put_back(self) -> list[str]:
        """Puts back what differs; says what it wrote."""
        done = []
        masks_now = workqueue_masks()
        for path, mask in self.masks.items():
            now = masks_now.get(path)
            if now is not None and now != mask:
                path.write_text(mask)
                done.append(f"{path}: {now} -> {mask}")
        return done + self.limits.put_back(self.limits_before)


def guard_tuned(report: Path, argv: list[str]) -> int:
    """Runs TuneD (`argv`) and, once it has exited (rolled back), puts back what its
    rollback left, writing one line per setting to `report`. SIGTERM and SIGHUP are passed
    to TuneD and waited for, never obeyed: the put-back must run after its rollback."""
    leftovers = RollbackLeftovers()
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: object) -> None:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, forward)
    child = subprocess.Popen(argv)
    code = child.wait()
    report.write_text("".join(f"{line}\n" for line in leftovers.put_back()))
    return code


def workqueue_masks() -> dict[Path, str]:
    """The unbound-workqueue cpumask and each workqueue's own."""
    wq = Path("/sys/devices/virtual/workqueue")
    return {p: p.read_text().strip() for p in [wq / "cpumask", *sorted(wq.glob("*/cpumask"))]}


class DirtyLimits:
    """The two vm dirty limits (dirty, dirty_background) through the writeback plugin, which
    knows the kernel keeps either the ratio or the bytes of each pair."""

    PAIRS = (
        {"kind": "dirty_limit", "pair": "dirty"},
        {"kind": "dirty_limit", "pair": "dirty_background"},
    )

    def __init__(self) -> None:
        self.plugin: Plugin[Any, Any] = discover()["writeback"](System("/"))
        kinds = {t.kind: t for t in self.plugin.targets}
        self.targets = [decode_target(kinds, pair) for pair in self.PAIRS]

    def read(self) -> dict[Target, Any]:
        return {t: self.plugin.read(t) for t in self.targets}

    def put_back(self, before: dict[Target, Any]) -> list[str]:
        """Writes each limit that differs from `before`; says what it wrote."""
        done = []
        for target, now in self.read().items():
            was = before.get(target)
            if was is not None and now != was:
                self.plugin.write(target, was)
                describe = self.plugin.describe
                done.append(f"{describe(target, now)} -> {describe(target, was)}")
        return done


def _files(root: Path) -> dict[str, bytes]:
    """Every regular file under `root`, by relative path."""
    return {
        str(f.relative_to(root)): f.read_bytes()
        for f in sorted(root.rglob("*"))
        if f.is_file() and not f.is_symlink()
    }


class Switcher:
    """Puts a scenario in force: latencyd holds (through the `hold`/`release` calls given),
    and TuneD for "tuned:NAME" scenarios. Holds stack and the newest wins, so the next
    scenario is held before the previous one is let go: nothing flips in between."""

    def __init__(
        self,
        hold: Callable[[str], int],
        release: Callable[[int], None],
        procs: Processes,
        tuned_etc: Path = Path("/etc/tuned"),
    ) -> None:
        self.hold = hold
        self.release = release
        self.cookie: int | None = None
        self.tuned = TunedDaemon(procs, tuned_etc, hold="untuned")

    def enter(self, scenario: str, hold: str | None = None, settle: float = 0.5) -> None:
        """Put `scenario` in force, holding `hold` (default: the scenario's name)."""
        self.tuned.stop()
        previous = self.cookie
        if scenario == "current":
            self.cookie = None
        else:
            self.cookie = self.hold(
                "untuned" if scenario.startswith("tuned:") else hold or scenario
            )
        if previous is not None:
            self.release(previous)
        if scenario.startswith("tuned:"):
            self.tuned.start(scenario.split(":", 1)[1])
        time.sleep(settle)  # let the machine settle (idle states, caches)

    def leave(self) -> None:
        self.tuned.stop()
        if self.cookie is not None:
            cookie, self.cookie = self.cookie, None
            self.release(cookie)


# -- the run --------------------------------------------------------------------------------


def control_hog(workdir: Path, parked: CpuSet, measured: CpuSet) -> list[str]:
    """The control hog (CONTROL_HOG_LOOP), parked on `parked` until moved onto `measured`;
    alive only as long as this process."""
    link = workdir / CONTROL_HOG
    link.symlink_to(sys.executable)  # exec through the link: its comm is the link's name
    cpus = ",".join(map(str, measured))
    return ["taskset", "-c", parked.to_list(), str(link), "-c", CONTROL_HOG_LOOP,
            str(os.getpid()), cpus]  # fmt: skip


def refit_seconds(
    budget_s: float, elapsed_s: float, rounds_done: int, rounds: int, tool_s: float, runs: int
) -> float:
    """Seconds per tool run for the rounds left so that the run ends within `budget_s`:
    what a round cost besides its `tool_s` seconds of tool runs (switches, settling,
    starting tools, reading counters: more than estimated on a busy or large machine) is
    taken from the rounds done; never below 1 s (no group is dropped: a budget too small
    for them all is exceeded)."""
    overhead = max(0.0, elapsed_s - tool_s) / rounds_done
    left = rounds - rounds_done
    return max(1.0, (budget_s - elapsed_s - left * overhead) / (left * runs))


def missing_tools(tools: list[str]) -> list[str]:
    return [f"{t} (apt-get install {TOOLS[t][1]})" for t in tools if not shutil.which(TOOLS[t][0])]


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM ends the run like Ctrl-C: through the clean-up, never around it."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(
    plan: Plan,
    hold: Callable[[str], int],
    release: Callable[[int], None],
    progress: Callable[[str, float], None] = lambda what, share: None,
    status: Callable[[], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Measure `plan`'s scenarios, held with `hold`/`release`; `status`, the daemon's
    Status, is read around each scenario's tools for the tick on its shielded CPUs."""
    missing = missing_tools(plan.tools)
    if missing:
        raise MeasureError(f"missing measurement tools: {', '.join(missing)}")
    if os.geteuid() != 0:
        raise MeasureError("measuring needs root (network namespaces, SCHED_FIFO, mlock)")
    remove_what_dead_runs_left()
    guard = Guard()
    procs = Processes(guard)
    system = System("/")
    switcher = Switcher(hold, release, procs, plan.tuned_etc)
    per_round: dict[str, dict[str, list[Histogram]]] = {t: {} for t in plan.tools}
    blame: dict[str, dict[str, Any]] = {}
    idle: dict[str, list[float]] = {}
    # Per scenario: the tick its watch counted, the booted isolation beside its shield.
    tick_counts: dict[str, ticks.Counted] = {}
    boot: dict[str, Any] = {}
    order: list[list[str]] = []
    previous: str | None = None
    started = time.time()
    steps = plan.rounds * len(plan.scenarios) * len(plan.tools)
    done = 0
    # measure itself is not the application: it reads counters and parses results
    # between rounds, and as the hold's holder it is exempt from the shield, so it keeps
    # to the housekeeping CPUs (found as ~1 s of "latencyctl" on the measured CPU).
    own_cpus = system.affinity(0)
    begun, seconds, tool_s, seconds_per_round = time.monotonic(), plan.seconds, 0.0, []
    with (
        interruptible(),
        tempfile.TemporaryDirectory(
            prefix=f"latencyd-measure-{os.getpid()}-", dir=scratch_dir()
        ) as tmp,
    ):
        for path in (*plan.scratch, Path(tmp)):
            guard.path(path)
        try:
            system.set_affinity(0, (plan.housekeeping & own_cpus) or own_cpus)
            with Network(procs) as net:
                if plan.load:
                    procs.detach(plan.load, Path(tmp))
                if plan.control_hog:
                    hog = control_hog(Path(tmp), plan.housekeeping, plan.app_cpus)
                    procs.detach(hog, Path(tmp), "hog")
                for r in range(plan.rounds):
                    # Alternate the order too, so no scenario always runs right after another.
                    if plan.order is not None:
                        scenarios = plan.order(r)
                    else:
                        scenarios = plan.scenarios if r % 2 == 0 else plan.scenarios[::-1]
                    order.append(list(scenarios))
                    runs = len(scenarios) * len(plan.tools)
                    if plan.budget_s is not None and r > 0:
                        seconds = refit_seconds(plan.budget_s, time.monotonic() - begun, r,
                                                plan.rounds, tool_s, runs)  # fmt: skip
                    seconds_per_round.append(seconds)
                    tool_s += seconds * runs
                    this_round = replace(plan, seconds=seconds)
                    for scenario in scenarios:
                        if plan.route is not None and previous is not None:
                            for via in plan.route(previous, scenario):
                                switcher.enter(via, plan.holds.get(via), settle=0.0)
                        switcher.enter(scenario, plan.holds.get(scenario))
                        previous = scenario
                        if plan.idle_seconds:
                            progress(f"round {r + 1}/{plan.rounds}: {scenario}: idle",
                                     done / steps)  # fmt: skip
                            idle.setdefault(scenario, []).append(
                                busy_share(plan.idle_seconds, plan.app_cpus)
                            )
                        seen = status() if status is not None else None
                        before = counters(plan.app_cpus, system)
                        for tool in plan.tools:
                            progress(f"round {r + 1}/{plan.rounds}: {scenario}: {tool}",
                                     done / steps)  # fmt: skip
                            hist = run_tool(tool, this_round, procs, net, Path(tmp))
                            per_round[tool].setdefault(scenario, []).append(hist)
                            done += 1
                        part = attribution(before, counters(plan.app_cpus, system), plan.app_cpus)
                        blame[scenario] = merge_attribution(blame.get(scenario, {}), part)
                        if status is not None:
                            now = status()
                            boot[scenario] = now.get("boot")
                            window = ticks.counted(seen, now)
                            if window is not None:
                                was = tick_counts.get(scenario, ticks.Counted())
                                tick_counts[scenario] = was.plus(window)
        finally:
            try:
                switcher.leave()
            finally:  # whatever leave raised, the processes end, and the guard with them
                procs.end_all()
                guard.done()
                system.set_affinity(0, own_cpus)
    progress("done", 1.0)
    out = result(plan, per_round, blame, order, started)
    out["plan"]["seconds_per_round"] = seconds_per_round
    if idle:
        out["idle_busy_pct"] = {s: round(100 * sum(v) / len(v), 2) for s, v in idle.items()}
    if switcher.tuned.put_back:
        out["tuned_left_put_back"] = switcher.tuned.put_back
    tick = {s: t for s in plan.scenarios if (t := ticks.report(boot.get(s), tick_counts.get(s)))}
    if tick:
        out["tick"] = tick
    return out


def result(
    plan: Plan,
    per_round: dict[str, dict[str, list[Histogram]]],
    blame: dict[str, dict[str, Any]],
    order: list[list[str]],
    started: float,
) -> dict[str, Any]:
    baseline = plan.scenarios[0]
    tools: dict[str, Any] = {}
    for tool, by_scenario in per_round.items():
        pooled: dict[str, Histogram] = {}
        for scenario, hists in by_scenario.items():
            total = Histogram()
            for h in hists:
                total.add(h)
            pooled[scenario] = total
        tables = {}
        for scenario in plan.scenarios[1:]:
            pairs = list(zip(by_scenario.get(scenario, []), by_scenario.get(baseline, []),
                             strict=False))  # fmt: skip
            if scenario in pooled and baseline in pooled:
                per = ratios(pairs, (pooled[scenario], pooled[baseline]))
                tables[scenario] = {k: vars(v) for k, v in per.items()}
        tools[tool] = {
            "unit": UNITS[tool],
            "stats": {s: pooled[s].summary() for s in plan.scenarios if s in pooled},
            "per_round": {s: [h.summary() for h in hs] for s, hs in by_scenario.items()},
            "ratios": tables,
            "histograms": {s: h.as_json() for s, h in pooled.items()},
        }
    return {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "plan": {
            "scenarios": plan.scenarios,
            "app_cpus": plan.app_cpus.to_list(),
            "housekeeping_cpus": plan.housekeeping.to_list(),
            "seconds_per_tool": plan.seconds,
            "rounds": plan.rounds,
            "tools": plan.tools,
            "load": " ".join(plan.load) if plan.load else None,
            "idle_seconds": plan.idle_seconds,
        },
        "baseline": baseline,
        "round_order": order,
        "tools": tools,
        "attribution": blame,
    }


class ProgressBar:
    """A one-line bar on stderr, on a terminal only, with the time left at the pace so far."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def __call__(self, what: str, share: float) -> None:
        if not sys.stderr.isatty():
            return
        width = 30
        filled = int(share * width)
        elapsed = time.monotonic() - self.started
        left = f"{elapsed * (1 - share) / share / 60:4.1f} min left" if share > 0.01 else ""
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {share:4.0%} {left:>14} "
            f"{printable(what)[:50]:<50}"  # the daemon's `what` quotes a caller's profile name
        )
        if share >= 1:
            sys.stderr.write("\n")
        sys.stderr.flush()


if __name__ == "__main__":  # `python -m latencyd.tools.measure REPORT TUNED-ARGV...`: guard_tuned
    sys.exit(guard_tuned(Path(sys.argv[1]), sys.argv[2:]))
