"""`latencyctl plan P` (and `switch --dry-run P`) against the real daemon: for every shipped
profile, from untuned and from another profile, the plan changes nothing on the machine
(sysctls, sysfs values, IRQ masks, task affinities and policies, cgroups, the journal),
and what it lists is what the switch then does, setting by setting (issue 52)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from latencyd.kernel import cgroups
from latencyd.kernel.system import Task, parse_stat
from latencyd.paths import shipped_profiles_dir
from tests.harness import Latencyd, wait_for
from tests.machine_state import differences, exited, snapshot

SHIPPED = sorted(p.stem for p in shipped_profiles_dir().glob("*.toml"))
# Sysctl trees a shipped profile sets keys in; what is in them changes only by a write,
# but for these counters and stamps the kernel keeps moving.
SYSCTL_TREES = ("kernel", "net/core", "net/ipv4", "vm")
MOVING = {
    "kernel/ns_last_pid",
    "kernel/random",
    "kernel/pty/nr",
    "kernel/tainted",
    "vm/drop_caches",
    "vm/stat_refresh",
    "vm/compact_memory",
    "net/ipv4/tcp_fastopen_key",
    "kernel/perf_event_max_sample_rate",  # the kernel lowers it when samples run long
}
SYSFS = (
    "/sys/kernel/mm/ksm/run",
    "/sys/kernel/mm/transparent_hugepage/enabled",
    "/sys/kernel/mm/transparent_hugepage/defrag",
)
# The cpu plugin's sysfs files (plugins/cpu.py) and the cgroup files the shield writes.
CPU_FILES = (
    "cpufreq/policy*/scaling_governor",
    "cpufreq/policy*/energy_performance_preference",
    "cpufreq/policy*/scaling_min_freq",
    "cpufreq/policy*/scaling_max_freq",
    "cpufreq/policy*/boost",
    "cpufreq/boost",
    "cpu[0-9]*/power/energy_perf_bias",
)
CGROUP_FILES = (*cgroups.CGROUP_FILES, "cgroup.subtree_control")
Key = tuple[str, str]  # (plugin, target as canonical JSON)


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return None


def sysctls() -> dict[str, str | None]:
    """Every readable sysctl of the trees shipped profiles set, byte for byte."""
    found: dict[str, str | None] = {}
    for tree in SYSCTL_TREES:
        for path in sorted(Path("/proc/sys", tree).rglob("*")):
            name = str(path.relative_to("/proc/sys"))
            if path.is_dir() or any(name == m or name.startswith(f"{m}/") for m in MOVING):
                continue
            if os.access(path, os.R_OK):
                found[name] = _read(path)
    found |= {p: _read(Path(p)) for p in SYSFS}
    for p in sorted(Path("/sys/devices/system/machinecheck").glob("machinecheck*/ignore_ce")):
        found[str(p)] = _read(p)
    cpu = Path("/sys/devices/system/cpu")
    for pattern in CPU_FILES:  # the cpu plugin's, where this machine has them
        found |= {str(p): _read(p) for p in sorted(cpu.glob(pattern))}
    return found


def cgroup_files() -> dict[str, str | None]:
    """What the shield's cgroups hold, not only that they exist (the snapshot's): each v1
    cpuset's and each latencyd v2 cgroup's CPUs, memory nodes and flags."""
    found: dict[str, str | None] = {}
    for top in (Path("/sys/fs/cgroup/cpuset"), Path("/sys/fs/cgroup/unified")):
        groups = [top, *sorted(p for p in top.rglob("*") if p.is_dir())] if top.is_dir() else []
        for group in groups:
            for name in CGROUP_FILES:
                if (group / name).exists():
                    found[str(group / name)] = _read(group / name)
    return found


def tasks() -> dict[str, tuple[str, int, int]]:
    """Every thread's CPUs and scheduling policy and priority, by "pid/tid:start"."""
    out: dict[str, tuple[str, int, int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            tids = [int(t.name) for t in (proc / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            stat = _read(proc / "task" / str(tid) / "stat")
            if not stat or exited(proc / "task" / str(tid)):
                continue
            start = stat.rsplit(")", 1)[1].split()[19]
            try:
                cpus = ",".join(map(str, sorted(os.sched_getaffinity(tid))))
                policy, prio = os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority
            except OSError:
                continue
            out[f"{proc.name}/{tid}:{start}"] = (cpus, policy, prio)
    return out


def machine(state_dir: Path) -> dict[str, Any]:
    """What a plan must leave byte-identical: the suite's snapshot (IRQ masks, cpuidle,
    PM QoS holders, NICs, workqueues, cgroups and each process's cpuset), every sysctl of
    the trees profiles set, the sysfs files they set (the cpu plugin's included), what
    each cgroup of the cpuset hierarchies holds, every thread's affinity and policy, and
    the daemon's state directory (its journal)."""
    return {
        "snapshot": snapshot(),
        "sysctls": sysctls(),
        "cgroups": cgroup_files(),
        "tasks": tasks(),
        "state": {str(p): p.read_bytes() for p in sorted(state_dir.rglob("*")) if p.is_file()},
    }


def changed_by_plan(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    # What systemd's tools leave in /run/systemd (the units-load stamp of another
    # session's systemd-analyze) is no setting, and comes and goes without the lock.
    diffs = [d for d in differences(before["snapshot"], after["snapshot"])
             if not d.startswith("run_systemd:")]  # fmt: skip
    for what in ("sysctls", "cgroups", "state"):
        b, a = before[what], after[what]
        diffs += [f"{what} {k}: {b.get(k)!r} -> {a.get(k)!r}"
                  for k in sorted(set(b) | set(a)) if b.get(k) != a.get(k)]  # fmt: skip
    b, a = before["tasks"], after["tasks"]
    diffs += [f"task {k}: {b[k]} -> {a[k]}" for k in sorted(set(b) & set(a)) if b[k] != a[k]]
    return diffs


def key(plugin: str, target: dict[str, Any]) -> Key:
    return plugin, json.dumps(target, sort_keys=True)


def live(target: dict[str, Any], alive: set[tuple[int, int]]) -> bool:
    """Whether a task's setting names a task that lived from before the plan to after the
    switch (others came or went in between: neither side can be asked to see them)."""
    if "pid" not in target:
        return True
    return (target["pid"], target.get("start")) in alive


def processes() -> set[tuple[int, int]]:
    """(pid, start time) of every process now that is not exiting: one being torn down,
    or a zombie not yet reaped, still has its /proc entry, but the daemon takes it for
    gone (PF_EXITING: ProcessCgroup.read_task). Counted alive, such a process failed the
    comparison once in a fresh-clone run of 2026-11-30 (a process of the VM tier beside,
    gone minutes later); the test below fails the same way without this."""
    out = set()
    for proc in Path("/proc").iterdir():
        task = _task(int(proc.name)) if proc.name.isdigit() else None
        if task is not None and not task.exiting:
            out.add((task.pid, task.start_time))
    return out


def _task(pid: int) -> Task | None:
    stat = _read(Path(f"/proc/{pid}/stat"))
    return parse_stat(pid, stat) if stat else None


def compare(
    plan: dict[str, Any], report: dict[str, Any], alive: set[tuple[int, int]], log: str = ""
) -> None:
    """The plan's list against what the switch did, setting by setting."""
    assert report["changed_left_off"] == 0
    would = {key(r["plugin"], r["target"]): r["would_be"] for r in plan["settings"]
             if r["action"] == "change" and live(r["target"], alive)}  # fmt: skip
    did = {key(c["plugin"], c["target"]): c["after"] for c in report["changed"]
           if live(c["target"], alive)}  # fmt: skip
    missed = {k: would[k] for k in sorted(set(would) - set(did))}
    assert missed == {}, f"planned, not done; {why_not_done(missed, report, log)}"
    assert {k: did[k] for k in sorted(set(did) - set(would))} == {}, "done, not planned"
    assert would == did
    na_planned = {key(r["plugin"], r["target"]) for r in plan["settings"]
                  if r["action"] == "not applicable" and live(r["target"], alive)}  # fmt: skip
    na_done = {key(r["plugin"], r["target"]) for r in report["not_applicable"]
               if live(r["target"], alive)}  # fmt: skip
    assert na_planned == na_done


def why_not_done(missed: dict[Key, str], report: dict[str, Any], log: str) -> str:
    """For a failure's message: what the switch said of each setting it did not change,
    and, for a task's, what the task is now and the daemon's lines that name its pid."""
    said = []
    refused = {key(r["plugin"], r["target"]): r for r in report["not_applicable"]}
    for k in missed:
        said.append(f"{k}: not applicable: {refused.get(k)}")
        pid = json.loads(k[1]).get("pid")
        if pid is not None:
            proc = Path(f"/proc/{pid}")
            said.append(f"  now: {_read(proc / 'comm')!r} in {_read(proc / 'cpuset')!r}")
            said += [f"  log: {ln}" for ln in log.splitlines() if str(pid) in ln][-10:]
    return "\n".join(said)


def plan_then_switch(
    d: Latencyd, profile: str, between: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Plan `profile`, then (after `between`, if given) switch to it: the plan changed
    nothing, and listed what the switch did. Returns the plan."""
    before = machine(d.state_dir)
    alive = processes()
    r = d.ctl("plan", profile, "--json")
    after = machine(d.state_dir)
    assert r.returncode in (0, 1), r.stderr
    plan = json.loads(r.stdout)
    assert r.returncode == (1 if plan["would_change"] else 0)
    assert changed_by_plan(before, after) == [], f"plan {profile} changed the machine"
    if between is not None:
        between()
    s = d.ctl("switch", profile, "--json")
    assert s.returncode == 0, s.stderr
    report = json.loads(s.stdout)
    compare(plan, report, alive & processes(), d.log())
    return plan


def another(profile: str) -> str:
    """The shipped profile after `profile` in the list that is neither it nor untuned (the
    next one alone made realtime-poll's second plan one from untuned again)."""
    at = SHIPPED.index(profile)
    return next(p for p in SHIPPED[at + 1 :] + SHIPPED[:at] if p != "untuned")


@pytest.mark.parametrize("profile", SHIPPED)
def test_plan_changes_nothing_and_lists_what_the_switch_then_does(
    start_daemon: Callable[..., Latencyd], profile: str
) -> None:
    """From untuned, then from another shipped profile than untuned and itself."""
    other = another(profile)
    d = start_daemon("untuned")
    plan_then_switch(d, profile)
    assert d.ctl("switch", other).returncode == 0
    plan_then_switch(d, profile)
    assert "Traceback" not in d.log()


# A parent that never reaps its child: once killed, the child stays a zombie.
UNREAPED_CHILD = """
import os, sys, time
child = os.fork()
if child == 0:
    time.sleep(3600)
    os._exit(0)
print(child, flush=True)
sys.stdin.read()
"""


def test_a_process_that_exits_between_the_plan_and_the_switch_is_left_out(
    start_daemon: Callable[..., Latencyd],
) -> None:
    """The plan lists a process that is a zombie by the time of the switch: the switch
    drops it as gone, and the comparison leaves it out as the daemon does, though its
    /proc entry is still there."""
    parent = subprocess.Popen([sys.executable, "-c", UNREAPED_CHILD], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        d = start_daemon("untuned")

        def kill_child() -> None:
            os.kill(child, signal.SIGKILL)
            wait_for(lambda: (task := _task(child)) is not None and task.exiting)

        plan = plan_then_switch(d, "cpu-partitioning", between=kill_child)
        planned = [r for r in plan["settings"] if r["target"].get("pid") == child]
        assert [r["action"] for r in planned] == ["change"], planned
        assert Path(f"/proc/{child}").exists()  # a zombie: listed, but not alive
    finally:
        parent.kill()
        parent.wait()


def test_plan_exit_status_table_and_dry_run(start_daemon: Callable[..., Latencyd]) -> None:
    """Exit 1 while something would change, 0 once nothing would; `switch --dry-run` is
    the plan and changes nothing; the table says now -> would be."""
    d = start_daemon("untuned")
    r = d.ctl("plan", "test-a")
    assert r.returncode == 1, r.stderr
    assert "plan: untuned -> test-a (nothing was changed)" in r.stdout
    assert "change          sysctl vm.swappiness = 11   (now: " in r.stdout
    dry = d.ctl("switch", "--dry-run", "test-a")
    assert dry.returncode == 1 and dry.stdout == r.stdout
    assert d.ctl("active").stdout.strip() == "untuned"
    assert d.ctl("switch", "test-a").returncode == 0
    again = d.ctl("plan", "test-a", "--json")
    assert again.returncode == 0, again.stdout
    assert json.loads(again.stdout)["would_change"] == 0
    bad = d.ctl("plan", "test-bad")
    assert bad.returncode == 2 and "no_such_option" in bad.stderr
