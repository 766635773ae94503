"""shield benchmark: starts of the application under load, for each shield mechanism.

With the last CPU shielded and `stress-ng --cpu 2 --io 1 --vm 1 --vm-bytes 256M` running
(started after the switch, as a user's load: on the housekeeping CPUs), the application
is started the way each mechanism supports, 8 at a time, and after 0.2 s says where it
may run (Cpus_allowed_list); counted: the starts that ended off the shielded CPU.
- affinity (the chase): `taskset -c ALL taskset -c LAST app`, a launcher allowed on every
  CPU and an application pinning itself inside, so the daemon narrows each exec as the
  application pins itself (the race the chase can lose);
- cpuset (where the machine has one): `latencyctl run -- app`, and an application by
  name (`[shield] apps`, started from a housekeeping shell);
- cpuset, plain starts of anything else (`/bin/true`, under the profile without `apps`,
  whose exec events are then not asked for): the daemon's per-start work, as its CPU
  time and the journal bytes written meanwhile (the kernel places those tasks);
- cpuset, crashes: kill -9 at a random point of `--crashes` switches into and out of the
  shield, each followed by a restart: how many left every cgroup, flag, task's cpuset
  and affinity as before.

    python -m bench shield [--starts 2000] [--plain 2000] [--crashes 50]
    python -m bench shield --quick       # 16 starts each: that it runs, not figures

Goal (issue 39): 0 starts off the shield for every mechanism; under a cpuset no per-start
work. Benchmarks print figures; they do not judge.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import arguments, not_root
from latencyd.cpuset import CpuSet
from latencyd.kernel.cgroups import choose
from latencyd.kernel.system import System
from scripts.private_bus import PrivateBus
from tests.harness import BIN, POLICY, Latencyd
from tests.machine_state import cgroup_state

PROFILE = """
[main]
summary = "bench: CPU {cpu} shielded ({mechanism})"

[shield]
cpus = "{cpu}"
mechanism = "{mechanism}"
{apps}
"""
APPS = 'apps = ["latencyapp"]'  # exec events are heard only for a profile naming apps
LOAD = ["stress-ng", "--cpu", "2", "--io", "1", "--vm", "1", "--vm-bytes", "256M", "--quiet"]
REPORT = "sleep 0.2; grep Cpus_allowed_list: /proc/$$/status"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


@contextlib.contextmanager
def shielded(
    bus: str, workdir: Path, cpu: str, mechanism: str, apps: str = APPS
) -> Iterator[Latencyd]:
    """A daemon shielding `cpu` by `mechanism`, and the load, started after the switch."""
    profiles = workdir / "profiles"
    profiles.mkdir(parents=True)
    text = PROFILE.format(cpu=cpu, mechanism=mechanism, apps=apps)
    (profiles / "shield-bench.toml").write_text(text)
    state = Path(tempfile.mkdtemp(prefix="latencyd-shield-bench-", dir="/dev/shm"))
    d = Latencyd(bus, state, "shield-bench", [profiles], config="")
    load = None
    try:
        d.start()
        load = subprocess.Popen(LOAD)
        time.sleep(1.0)  # the load running before the first start
        yield d
    finally:
        if load is not None:
            load.terminate()
            load.wait()
        d.stop()
        shutil.rmtree(state, ignore_errors=True)


def starts(argv: list[str], cpu: str, count: int, env: dict[str, str]) -> dict[str, Any]:
    """`count` starts of `argv` (its last output word: the CPUs it may run on), 8 at a
    time: how many ended off the shielded CPU."""
    kept = off = 0
    began = time.monotonic()
    for first in range(0, count, 8):
        batch = [
            subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env=env)
            for _ in range(min(8, count - first))
        ]  # fmt: skip
        for proc in batch:
            out, _ = proc.communicate()
            if out.split()[-1:] == [cpu]:
                kept += 1
            else:
                off += 1
    return {"starts": kept + off, "off_shield": off, "seconds": time.monotonic() - began}


def plain_starts(d: Latencyd, count: int) -> dict[str, Any]:
    """Starts of something that is not the application: the daemon's CPU and journal."""
    assert d.proc is not None
    journal = d.state_dir / "journal.jsonl"
    size = journal.stat().st_size if journal.exists() else 0
    before = cpu_seconds(d.proc.pid)
    loop = f"i=0; while [ $i -lt {count} ]; do /bin/true; i=$((i+1)); done"
    subprocess.run(["sh", "-c", loop], check=True)
    time.sleep(0.5)  # the last events drained
    return {
        "starts": count,
        "daemon_cpu_us_per_start": (cpu_seconds(d.proc.pid) - before) / count * 1e6,
        "journal_bytes": (journal.stat().st_size if journal.exists() else 0) - size,
    }


def crashes(bus: str, workdir: Path, cpu: str, count: int, seed: int) -> dict[str, Any]:
    """kill -9 at a random point of `count` switches into and out of the cpuset shield
    (alternately), each followed by a restart with no profile, which restores what the
    journal holds: how many left every task's cpuset and affinity, every cpuset file and
    no cgroup of latencyd's as they were."""
    rng = random.Random(seed)
    profiles = workdir / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "shield-bench.toml").write_text(
        PROFILE.format(cpu=cpu, mechanism="cpuset", apps="")
    )
    sentinels = [subprocess.Popen(["sleep", "3600"]),
                 subprocess.Popen(["taskset", "-c", cpu, "sleep", "3600"])]  # fmt: skip
    time.sleep(0.2)
    before = cpuset_state(sentinels)
    restored, misses = 0, []
    try:
        for n in range(count):
            state = Path(tempfile.mkdtemp(prefix="latencyd-shield-crash-", dir="/dev/shm"))
            into = n % 2 == 0
            d = Latencyd(bus, state, None if into else "shield-bench", [profiles],
                         extra=["--no-profile"] if into else [], config="")  # fmt: skip
            d.start()
            step = d.spawn_ctl(*(["switch", "shield-bench"] if into else ["off"]))
            time.sleep(rng.uniform(0.0, 0.06))  # somewhere in the step, or just after
            d.kill9()
            step.wait()
            d.profile, d.extra = None, ["--no-profile"]
            d.start()  # adopts the journal and, with no profile, restores it
            d.stop()
            shutil.rmtree(state, ignore_errors=True)
            after = cpuset_state(sentinels)
            if after == before:
                restored += 1
            else:
                misses.append({"run": n, "into": into, "after": after})
    finally:
        for proc in sentinels:
            proc.kill()
            proc.wait()
    return {"runs": count, "restored": restored, "misses": misses[:3]}


def cpuset_state(sentinels: list[subprocess.Popen[bytes]]) -> dict[str, Any]:
    """What a crash must not change: the cgroup state the suite's machine snapshot
    compares (cpusets, root flags, the controller's binding), and the sentinels'
    cpusets and affinities."""
    system = System()
    tasks = [(system.task_cgroup(p.pid), sorted(os.sched_getaffinity(p.pid))) for p in sentinels]
    return {"cgroups": cgroup_state(), "tasks": tasks}


def run(bus: str, workdir: Path, count: int, plain: int, crash_runs: int) -> dict[str, Any]:
    usable = os.sched_getaffinity(0)
    every, cpu = CpuSet(usable).to_list(), str(max(usable))
    app = workdir / "latencyapp"
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy("/bin/sh", app)
    env = dict(os.environ) | {"DBUS_SYSTEM_BUS_ADDRESS": bus}
    results: dict[str, Any] = {"cpu": cpu}
    with shielded(bus, workdir / "affinity", cpu, "affinity"):
        argv = ["taskset", "-c", every, "taskset", "-c", cpu, "sh", "-c", REPORT]
        results["affinity: taskset -c"] = starts(argv, cpu, count, env)
    chosen = choose(System().cgroup_facts(), "cpuset")
    if chosen.mechanism is None:
        results["cpuset"] = "; ".join(f"{m}: {why}" for m, why in chosen.why_not.items())
        return results
    results["mechanism"] = chosen.mechanism
    with shielded(bus, workdir / "cpuset", cpu, "cpuset"):
        argv = [str(BIN / "latencyctl"), "run", "--", "sh", "-c", REPORT]
        results["cpuset: latencyctl run"] = starts(argv, cpu, count, env)
        results["cpuset: [shield] apps"] = starts([str(app), "-c", REPORT], cpu, count, env)
    with shielded(bus, workdir / "plain", cpu, "cpuset", apps="") as d:
        results["cpuset: plain starts"] = plain_starts(d, plain)
    return results | {"crashes": crashes(bus, workdir / "crashes", cpu, crash_runs, 39)}


def report(r: dict[str, Any]) -> None:
    print(f"[shield] CPU {r['cpu']} shielded, under `{' '.join(LOAD[:-1])}`")
    for name, got in r.items():
        if not isinstance(got, dict) or name == "crashes":
            continue
        if "off_shield" in got:
            print(
                f"  {name}: {got['starts']} starts in {got['seconds']:.1f} s, ended off the "
                f"shield: {got['off_shield']}  (goal 0)"
            )
        else:
            print(
                f"  {name}: {got['starts']} starts of /bin/true: daemon CPU "
                f"{got['daemon_cpu_us_per_start']:.1f} µs per start, journal bytes written "
                f"{got['journal_bytes']}  (goal: no per-start work)"
            )
    if "crashes" in r:
        c = r["crashes"]
        print(
            f"  kill -9 in {c['runs']} switches into and out of the cpuset shield: "
            f"{c['restored']} of {c['runs']} restored by the restart  (goal all)"
        )
        for miss in c["misses"]:
            print(f"    not restored: {miss}")
    if isinstance(r.get("cpuset"), str):
        print(f"  cpuset: not on this machine ({r['cpuset']})")
    elif "mechanism" in r:
        print(f"  (the cpuset shield here is {r['mechanism']})")


def main(argv: list[str]) -> int:
    parser = arguments("shield", __doc__, quick="16 starts of each kind")
    parser.add_argument("--starts", type=int, default=2000, help="application starts per way")
    parser.add_argument("--plain", type=int, default=2000, help="plain starts under a cpuset")
    parser.add_argument("--crashes", type=int, default=50, help="switches killed with -9")
    args = parser.parse_args(argv)
    if args.quick:
        args.starts, args.plain, args.crashes = 16, 100, 4
    if not_root("shield", "cgroups, a tuning daemon"):
        return 2
    if len(os.sched_getaffinity(0)) < 2:
        print("bench shield: needs two CPUs", file=sys.stderr)
        return 2
    with PrivateBus(POLICY) as bus, tempfile.TemporaryDirectory(prefix="latencyd-sbench-") as tmp:
        results = run(bus.address, Path(tmp), args.starts, args.plain, args.crashes)
    if args.json:
        print(json.dumps({"benchmark": "shield", "results": results}))
    else:
        report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
