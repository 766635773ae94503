"""The noise watch in the daemon: a profile's [monitor] section watches a CPU; a task
injected there beyond the budget gives a log line and the NoiseExceeded signal, named by
pid and comm (how soon: bench noise); `status` shows the mechanism and the last interval; a
switch away closes the private tracefs instance."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from latencyd.kernel.noise import task_of
from latencyd.kernel.system import System
from tests.harness import Latencyd, free_port, signal_listener, wait_for
from tests.machine_state import trace_instances

CPU = max(System("/").online_cpus())
INTERVAL_MS = 200
PROFILE = f"""
[main]
summary = "watch the last CPU"

[monitor]
cpus = "{CPU}"
interval_ms = {INTERVAL_MS}
budget_us = 20000
"""


def test_a_task_beyond_the_budget_is_logged_and_signalled_by_name(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    (profiles / "watch.toml").write_text(PROFILE)
    d = start_daemon("watch", extra=["--verbose"])  # each poll's reads in the log
    assert "latencyd" in trace_instances()
    monitor = signal_listener(d.address, "NoiseExceeded")
    # Busy for a few intervals, not one: the exposition names a source seen again (a
    # one-off burst is counted in source="other", so that churn cannot grow it).
    loop = "i=0; while [ $i -lt 4000000 ]; do i=$((i+1)); done"
    hog = subprocess.Popen(["taskset", "-c", str(CPU), "sh", "-c", loop])
    try:
        started = time.monotonic()
        line = f"task {hog.pid} sh"
        try:
            took = wait_for(lambda: line in d.log())
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}\n{watch_state(hog.pid)}\nlog tail: {d.log()[-3000:]}"
            ) from exc
        # How soon (within two intervals, on a quiet machine) is a figure the machine's
        # load moves: bench noise prints it, and this test only says it.
        print(f"logged {time.monotonic() - started:.2f} s after the hog started ({took:.2f})")
    finally:
        hog.kill()
        hog.wait()
        wait_for(lambda: f'"source": "task {hog.pid} sh"' in monitor.heard())
        out = monitor.stop()
    assert f"noise: CPU {CPU} took" in d.log() and "budget 20000 µs" in d.log()
    assert "member=NoiseExceeded" in out and f'"source": "task {hog.pid} sh"' in out
    status = json.loads(d.ctl("status", "--json").stdout)["plugins"]["monitor"]
    assert status["facts"]["mechanism"].startswith("tracefs instance")
    assert status["facts"]["budget_us"] == 20000
    assert status["tables"][0]["columns"] == ["cpu", "source", "count", "total µs", "max µs"]
    top = json.loads(d.ctl("top", "--once", "--json").stdout)
    assert top["watching"] and top["budget_us"] == 20000 and str(CPU) in top["cpus"]
    assert {"source", "count", "total_us", "max_us", "profile"} <= set(top["cpus"][str(CPU)][0])
    d.ctl("switch", "test-a")
    wait_for(lambda: "latencyd" not in trace_instances())  # the watch is closed


def test_a_quiet_watched_cpu_gives_no_report_of_a_user_task(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    """A shielded CPU (user tasks and IRQs moved off it) watched for fifteen intervals:
    what is left is what the kernel must do there, and no user task. (Unshielded, the
    CPU is anyone's: this VM's agent once ran there 55 ms in one interval.) How much the
    kernel does there depends on the load elsewhere (a busy neighbour's kworkers and RCU
    once took 37 ms of an interval): only the kernel's is allowed, not a budget kept; the
    figure is bench noise's."""
    shield = f'\n[shield]\ncpus = "{CPU}"\n\n[irq]\nisolate = "{CPU}"\n'
    (profiles / "watch.toml").write_text(PROFILE + shield)
    d = start_daemon("watch")
    time.sleep(3)  # fifteen intervals
    status = json.loads(d.ctl("status", "--json").stdout)["plugins"]["monitor"]
    rows = status["tables"][0]["rows"]
    print("last interval on a quiet CPU:", rows)
    assert_only_the_kernel_reported(d.log())
    d.stop()
    assert "latencyd" not in trace_instances()


_BREACH = re.compile(r"noise: CPU \d+ took .*?\): (.*)$", re.M)
_SOURCE = re.compile(r"(.+?) \d+ µs \(\d+x\)(?:, |$)")


def assert_only_the_kernel_reported(log: str) -> None:
    """Every task the noise reports in `log` name is a kernel thread (an IRQ, a softirq,
    the tick and IPIs are the kernel's by their names). A kernel worker made for a burst
    of work lives on idle for minutes, so the ones named are still there to be asked."""
    reports = [m[1] for m in _BREACH.finditer(log)]
    print(f"{len(reports)} reports:", *reports, sep="\n  ")
    named = {t for r in reports for s in _SOURCE.finditer(r) if (t := task_of(s[1]))}
    system = System("/")
    users = {(pid, comm) for pid, comm in named if not ((t := system.task(pid)) and t.is_kthread)}
    assert not users, f"user tasks reported on a shielded CPU: {sorted(users)}"


def watch_state(hog: int) -> str:
    """What the kernel says about the watch and the task, for a test that missed it: the
    private instance's switches and its CPU buffer's stats (entries, overruns, events
    read), and where the task was allowed to run and last ran."""
    state = "running" if Path(f"/proc/{hog}").exists() else "exited"
    lines = [f"task {hog}: {state}"]
    tracefs = System("/").tracefs()  # mounted, or a private mount of tracefs
    inst = Path("/", tracefs.base, "instances", "latencyd")
    for name in ("tracing_on", "tracing_cpumask", "trace_clock", f"per_cpu/cpu{CPU}/stats"):
        with contextlib.suppress(OSError):
            lines.append(f"instances/latencyd/{name}: {(inst / name).read_text().strip()!r}")
    tracefs.release()
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{hog}/status").read_text()
        lines += [line for line in status.splitlines() if line.startswith("Cpus_allowed_list")]
        lines.append("last cpu: " + Path(f"/proc/{hog}/stat").read_text().split()[38])
    return "\n".join(lines)


def top_sources(d: Latencyd) -> list[str]:
    top = json.loads(d.ctl("top", "--once", "--json").stdout)
    return [row["source"] for rows in top["cpus"].values() for row in rows]


def test_the_shipped_cpu_partitioning_quiet_then_a_taskset_task_named(
    start_daemon: Callable[..., Latencyd],
) -> None:
    """The shipped profile as a user runs it (its [monitor]: the isolated CPU, 1 s
    intervals, 20 ms budget): 50 s of quiet shield give no report, then a task that
    intrudes is named by pid and comm in `top`, logged and signalled: one started with
    `taskset -c 1`, or, where the shield is a cpuset (taskset is refused there), one root
    writes into the shield's cgroup behind latencyd's back."""
    d = start_daemon("cpu-partitioning", extra=["--verbose"])  # each poll's reads in the log
    facts = json.loads(d.ctl("status", "--json").stdout)["plugins"]["monitor"]["facts"]
    assert facts["cpus"] == "1" and facts["budget_us"] == 20000
    assert facts["mechanism"].startswith("tracefs instance")
    # 50 s, not 60: the shield plugin's rescan runs every 60 s, and a `taskset -c 1` task
    # started at that instant can lose its pin to the rescan's write (the race
    # docs/plugins.md names; suspected in a run of 2026-11-26: the rescan ran that
    # second, the task unseen).
    time.sleep(50)
    rows = json.loads(d.ctl("status", "--json").stdout)["plugins"]["monitor"]["tables"][0]
    print("last interval of 50 quiet seconds:", rows["rows"])
    quiet = d.log()
    assert_only_the_kernel_reported(quiet)
    # Busy for a few intervals, not one: the exposition names a source seen again (a
    # one-off burst is counted in source="other", so that churn cannot grow it).
    # It spins until killed, and is waited for up to 30 s: under load the daemon's 1 s
    # polls ran seconds late (CI's fresh-clone run of 2026-11-29: the report came 6 s in).
    loop = "while :; do :; done"
    inside = Path("/sys/fs/cgroup/cpuset/latencyd-shield/cgroup.procs")
    hog = subprocess.Popen([*([] if inside.exists() else ["taskset", "-c", "1"]), "sh", "-c", loop])
    try:
        if inside.exists():
            inside.write_text(str(hog.pid))
        started = time.monotonic()
        try:
            wait_for(lambda: f"task {hog.pid} sh" in top_sources(d))
            print(f"in top {time.monotonic() - started:.2f} s after the task started")
            wait_for(lambda: f"task {hog.pid} sh" in d.log())
        except AssertionError as exc:
            # Once, in a whole-suite run in reverse order, the task did not show up (its
            # switch in from the idle task was not in the buffer: these guests write none,
            # and the watch then waited for one; it no longer does): say what it saw.
            top = d.ctl("top", "--once", "--json").stdout
            raise AssertionError(
                f"{exc}: task {hog.pid} not reported; top: {top}\n{watch_state(hog.pid)}\n"
                f"log tail: {d.log()[-3000:]}"
            ) from exc
    finally:
        hog.kill()
        hog.wait()
    # Reported since the quiet seconds (by name unless the kernel's own reports, under a
    # busy neighbour, used up the CPU's reports for the while: ReportLimit).
    assert "noise: CPU 1 took" in d.log().removeprefix(quiet)


def test_the_held_application_is_not_noise_and_a_task_beside_it_is(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    """The process holding the profile and what it starts are the application, expected
    on the watched CPU: never named as noise, though it runs there all along; a task
    someone else starts there beside it is named."""
    (profiles / "watch.toml").write_text(PROFILE)
    d = start_daemon("test-a")
    loop = "i=0; while [ $i -lt 1500000 ]; do i=$((i+1)); done"
    holder = d.spawn_ctl("hold", "watch", "--", "taskset", "-c", str(CPU), "sh", "-c", loop)
    stranger, app = None, None
    try:
        wait_for(lambda: "hold 1 on watch" in d.log())
        children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children")
        wait_for(lambda: children.read_text().strip() != "")
        app = int(children.read_text().split()[0])  # taskset, then sh: one pid
        stranger = subprocess.Popen(["taskset", "-c", str(CPU), "sh", "-c", loop])
        wait_for(lambda: f"task {stranger.pid} sh" in top_sources(d))
        time.sleep(3 * INTERVAL_MS / 1000)
        assert holder.poll() is None, "the application ended before the check"
        sources = top_sources(d)
        print("top:", sources)
        assert not [s for s in sources if s.startswith(f"task {app} ")]
        assert f"task {app} " not in d.log() and f"task {holder.pid} " not in d.log()
        # Over the budget: logged. By name only when among the interval's top sources,
        # which a busy neighbour's tasks on the same CPU can crowd it out of (seen: two
        # pythons and a compiler there); top names every source.
        assert f"noise: CPU {CPU} took" in d.log()
    finally:
        # The holder passes SIGTERM on to the application; a SIGKILL would leave it
        # running on the watched CPU, as noise in whatever test comes next.
        holder.terminate()
        holder.wait(10)
        if stranger is not None:
            stranger.kill()
            stranger.wait()
        if app is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(app, signal.SIGKILL)
            wait_for(lambda: not running(app))


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_real_prometheus_scrapes_the_injected_noise_source(
    start_daemon: Callable[..., Latencyd], profiles: Path, tmp_path: Path
) -> None:
    """Debian's prometheus, started here on a free port, scrapes the daemon's exposition
    every 200 ms; a PromQL query through its HTTP API finds the task injected on the
    watched CPU."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus; make setup does)")
    (profiles / "watch.toml").write_text(PROFILE)
    metrics_port, prom_port = free_port(), free_port()
    d = start_daemon("watch", config=f'metrics_listen = "127.0.0.1:{metrics_port}"\n')
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read()
    assert b'latencyd_profile_info{profile="watch"} 1.0' in body
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 200ms, scrape_timeout: 150ms}\n"
        "scrape_configs:\n"
        f"  - job_name: latencyd\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    server = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    # Busy for a few intervals, not one: the exposition names a source seen again (a
    # one-off burst is counted in source="other", so that churn cannot grow it).
    loop = "i=0; while [ $i -lt 4000000 ]; do i=$((i+1)); done"
    hog = subprocess.Popen(["taskset", "-c", str(CPU), "sh", "-c", loop])
    query = urllib.parse.quote(f'latencyd_noise_seconds_total{{cpu="{CPU}",source="task sh"}}')

    def found() -> bool:
        url = f"http://127.0.0.1:{prom_port}/api/v1/query?query={query}"
        try:
            answer = json.loads(urllib.request.urlopen(url, timeout=2).read())
        except OSError:
            return False
        return bool(answer["data"]["result"]) and float(answer["data"]["result"][0]["value"][1]) > 0

    try:
        wait_for(found)
    finally:
        hog.kill()
        hog.wait()
        server.terminate()
        server.wait(10)
    d.stop()
