"""tuned benchmark: what TuneD sets for a profile, beside what latencyd sets for the same
profile converted with `latencyctl import-tuned` — value for value, read from the kernel.

For each profile (default: latency-performance, network-latency, cpu-partitioning,
realtime):
1. read the kernel: every /proc/sys file (those that move on their own excluded), THP,
   cpuidle and haltpoll knobs, the PM QoS limit, IRQ and workqueue masks, kernel-thread
   and user-task affinities, KSM, irqbalance's config, and eth0 (which must not change);
2. run TuneD in the foreground with the profile (`tuned --no-dbus --no-socket`), read the
   kernel again, stop it (SIGTERM: it rolls back) and check the kernel is back;
3. `latencyctl import-tuned PROFILE`, run latencyd with the converted chain on a private
   bus, read the kernel again and latencyd's status (what it found not applicable, and
   why), stop it and check the kernel is back;
4. print every value either of them changed, side by side, with what import-tuned did not
   convert and what latencyd found not applicable.

TuneD is configured for the run as a user of these profiles would: isolated_cores = 1 in
its variables files, netdev_queue_count = eth0's own queue count (so realtime's
`channels` is a no-op on eth0), and dynamic tuning off (realtime's [net] would otherwise
change eth0's link speed on these VMs), in a copy of /etc/tuned; TuneD runs over private
copies of /etc/tuned and /etc/modprobe.d (see latencyd.tools.measure.tuned.TunedDaemon), so the
machine's files are never written.

    python -m bench tuned [--profiles a,b] [--json] [--quick]
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import arguments, not_root
from latencyd.kernel.system import System
from latencyd.text import printable
from latencyd.tools.measure.processes import Processes
from latencyd.tools.measure.tuned import TunedDaemon, workqueue_masks
from scripts.private_bus import PrivateBus
from tests.harness import BIN, POLICY, REPO, Latencyd

PROFILES = ("latency-performance", "network-latency", "cpu-partitioning", "realtime")
ISOLATED = "1"
TUNED = Path("/etc/tuned")
# Keys that count things rather than set them.
VOLATILE = re.compile(
    r"/proc/sys/(fs/(dentry-state|inode-nr|inode-state|file-nr|dquot-nr|aio-nr)"
    r"|kernel/(random/.*|ns_last_pid|pty/nr|tainted)"
    r"|vm/(drop_caches|compact_memory|stat_refresh)|net/netfilter/nf_conntrack_count)$"
)
Values = dict[str, str]


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def proc_sys() -> Values:
    out = {}
    for path in sorted(Path("/proc/sys").rglob("*")):
        if path.is_file() and not VOLATILE.match(str(path)) and os.access(path, os.R_OK):
            value = _read(path)
            if value is not None:
                out[str(path)] = " ".join(value.split())
    return out


def affinity(pid: int) -> str | None:
    try:
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError:
        return None
    return ",".join(map(str, cpus))


def tasks() -> Values:
    """Kernel threads by name (per-CPU threads keep their own CPU: left out), and the
    user tasks kept off the isolated CPU, by name and pid: a task a daemon narrowed and
    left so is a leak; processes born or ended meanwhile (a shell polling beside the
    bench, a cron job) are not, so user tasks are not counted in all."""
    out: Values = {}
    kept_off = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(Path(f"/proc/{entry}/stat"))
        if not stat:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = stat.rsplit(")", 1)[1].split()[1]
        cpus = affinity(int(entry))
        if cpus is None:
            continue
        if entry == "2" or ppid == "2":
            if "/" in comm and comm.rsplit("/", 1)[1].isdigit():
                continue  # per-CPU kernel thread (ksoftirqd/1, cpuhp/0): bound by the kernel
            if re.match(r"kworker/u?\d", comm):
                continue  # pool workers: come and go, named after their current work
            out[f"kernel thread {re.sub(r'[0-9]+', 'N', comm)}"] = cpus
        elif int(ISOLATED) not in [int(c) for c in cpus.split(",")]:
            kept_off.append(f"{printable(comm)}[{entry}]")  # a task names itself
    out["user tasks kept off the isolated CPU"] = ", ".join(sorted(kept_off)) or "none"
    return out


def pm_qos_limit() -> str:
    with open("/dev/cpu_dma_latency", "rb") as f:  # reading opens no request of its own
        return str(struct.unpack("i", f.read(4))[0])


def eth0() -> Values:
    out = {}
    if Path("/sys/class/net/eth0").exists():
        for flag in ("-c", "-g", "-l", "-k"):
            r = subprocess.run(["ethtool", flag, "eth0"], capture_output=True, text=True)
            out[f"eth0 ethtool {flag}"] = " ".join((r.stdout + r.stderr).split())
    return out


def kernel() -> Values:
    values = proc_sys()
    sysfs = [
        *Path("/sys/kernel/mm/transparent_hugepage").glob("*"),
        Path("/sys/kernel/mm/ksm/run"),
        Path("/sys/devices/system/cpu/cpuidle/current_governor"),
        *Path("/sys/module/haltpoll/parameters").glob("*"),
        *Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpuidle/state*/disable"),
        *Path("/sys/devices/system/cpu").glob("cpu[0-9]*/power/pm_qos_resume_latency_us"),
        *Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor"),
        *Path("/proc/irq").glob("*/smp_affinity_list"),
        Path("/proc/irq/default_smp_affinity"),
        *Path("/sys/devices/system/machinecheck").glob("machinecheck*/ignore_ce"),
        Path("/etc/default/irqbalance"),
        Path("/etc/sysconfig/irqbalance"),
    ]
    for path in sysfs:
        if path.is_file():
            values[str(path)] = " ".join((_read(path) or "").split())
    values |= {str(path): mask for path, mask in workqueue_masks(System("/")).items()}
    values["PM QoS CPU latency limit (µs)"] = pm_qos_limit()
    return values | tasks() | eth0()


def volatile_keys() -> set[str]:
    """What changes with nothing tuning (counters, timestamps): read twice."""
    first = kernel()
    time.sleep(1.0)
    second = kernel()
    return {k for k in first.keys() | second.keys() if first.get(k) != second.get(k)}


def differences(before: Values, after: Values, ignore: set[str]) -> dict[str, tuple[str, str]]:
    return {
        k: (before.get(k, "-"), after.get(k, "-"))
        for k in sorted(before.keys() | after.keys())
        if k not in ignore and before.get(k) != after.get(k)
    }


def group(key: str) -> str:
    """One row for many files that differ only by a number (IRQs, CPUs, workqueues)."""
    key = re.sub(r"/proc/irq/\d+/", "/proc/irq/*/", key)
    key = re.sub(r"/cpu\d+/", "/cpu*/", key)
    key = re.sub(r"/state\d+/", "/state*/", key)
    return re.sub(r"/workqueue/[^/]+/cpumask", "/workqueue/*/cpumask", key)


def configure_tuned(etc: Path) -> None:
    """isolated_cores, a no-op queue count for eth0, no dynamic tuning (see the docstring),
    written into `etc`, a copy of /etc/tuned."""
    queues = re.search(r"Combined:\s*(\d+)\s*$", subprocess.run(
        ["ethtool", "-l", "eth0"], capture_output=True, text=True).stdout)  # fmt: skip
    count = queues[1] if queues else "1"
    (etc / "cpu-partitioning-variables.conf").write_text(f"isolated_cores={ISOLATED}\n")
    (etc / "realtime-variables.conf").write_text(
        f"isolated_cores={ISOLATED}\nisolate_managed_irq=Y\nnetdev_queue_count={count}\n"
    )
    main_conf = etc / "tuned-main.conf"
    text = main_conf.read_text() if main_conf.exists() else ""
    text = re.sub(r"(?m)^\s*dynamic_tuning\s*=.*$", "", text) + "\ndynamic_tuning = 0\n"
    main_conf.write_text(text)


def latencyctl(d: Latencyd | None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "latencyctl"), *args], env=d.env if d else None,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def compare(profile: str, bus: PrivateBus, work: Path, ignore: set[str]) -> dict[str, Any]:
    etc = work / f"etc-tuned-{profile}"
    shutil.copytree(TUNED, etc, symlinks=True)
    configure_tuned(etc)
    tuned = TunedDaemon(Processes(System("/")), etc)
    base = kernel()
    try:
        tuned.start(profile)
        time.sleep(2)  # its scheduler plugin moves tasks in a thread of its own
        by_tuned = kernel()
    finally:
        tuned.stop()
    left_by_tuned = differences(base, kernel(), ignore)
    put_back({k: base[k] for k in left_by_tuned if k.startswith("/") and k in base})
    before_latencyd = kernel()
    out_dir = work / profile
    imported = latencyctl(None, "import-tuned", profile, "-o", str(out_dir), "--json")
    if imported.returncode == 2:
        raise RuntimeError(f"import-tuned {profile}: {imported.stderr}")
    not_converted = [line.split(": not converted: ", 1)[1] for line in
                     imported.stderr.splitlines() if ": not converted: " in line]  # fmt: skip
    (out_dir / "latencyd.d").mkdir()
    d = Latencyd(bus.address, out_dir / "latencyd.d", profile, [out_dir, REPO / "profiles"])
    try:
        d.start(timeout=60)
        time.sleep(2)
        by_latencyd = kernel()
        status = json.loads(latencyctl(d, "status", "--json").stdout)
    finally:
        d.stop(60)
    left_by_latencyd = differences(before_latencyd, kernel(), ignore)
    rows: dict[str, dict[str, Any]] = {}
    for key in sorted(differences(base, by_tuned, ignore).keys()
                      | differences(base, by_latencyd, ignore).keys()):  # fmt: skip
        cells = (base.get(key, "-"), by_tuned.get(key, "-"), by_latencyd.get(key, "-"))
        row = rows.setdefault(f"{group(key)}  {cells}", {"key": group(key), "files": 0})
        row.update(original=cells[0], tuned=cells[1], latencyd=cells[2])
        row["files"] += 1
    return {
        "profile": profile,
        "rows": list(rows.values()),
        "import_exit": imported.returncode,
        "not_converted": not_converted,
        "not_applicable": not_applicable(status),
        "tuned_left_behind": {k: list(v) for k, v in left_by_tuned.items()},
        "tuned_wrote_in_its_copy": tuned.wrote,
        "tuned_left_put_back": tuned.put_back,  # by TunedDaemon, before the reading above
        "latencyd_left_behind": {k: list(v) for k, v in left_by_latencyd.items()},
    }


def put_back(values: Values) -> None:
    """What TuneD left behind, so latencyd starts from the machine's own values."""
    for path, value in values.items():
        with contextlib.suppress(OSError):
            Path(path).write_text(value)


def not_applicable(status: dict[str, Any]) -> list[str]:
    """One line per plugin and reason (with how many settings it covers and one of them)."""
    by_reason: dict[tuple[str, str], list[str]] = {}
    for name, plugin in status.get("plugins", {}).items():
        for item in plugin.get("not_applicable", []):
            by_reason.setdefault((name, item["reason"]), []).append(item["text"])
    return [
        f"[{name}] {texts[0]}{f' (and {len(texts) - 1} more)' if len(texts) > 1 else ''}: {reason}"
        for (name, reason), texts in by_reason.items()
    ]


def short(text: str, width: int = 34) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def report(results: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in results:
        lines += ["", f"== {r['profile']} (import-tuned exit {r['import_exit']}) =="]
        lines.append(f"  {'setting':<58} {'original':<22} {'TuneD':<22} {'latencyd':<22}")
        for row in r["rows"]:
            same = "  " if row["tuned"] == row["latencyd"] else "≠ "
            key = row["key"] + (f" ({row['files']} files)" if row["files"] > 1 else "")
            cells = (short(row[c], 22) for c in ("original", "tuned", "latencyd"))
            lines.append(f"{same}{short(key, 58):<58} " + " ".join(f"{c:<22}" for c in cells))
        for label, items in (("not converted by import-tuned", r["not_converted"]),
                             ("not applicable in latencyd", r["not_applicable"])):  # fmt: skip
            if items:
                lines.append(f"  {label}:")
                lines += [f"    - {short(i, 200)}" for i in items]
        for who, after in (("tuned", "put back before latencyd ran"), ("latencyd", "")):
            left = r[f"{who}_left_behind"]
            if who == "tuned" and r["tuned_left_put_back"]:
                left = {**left, "put back as TuneD stopped": r["tuned_left_put_back"]}
            verdict = "yes" if not left else f"NO ({after or 'a leak'}): {left}"
            lines.append(f"  {who} left the kernel as found: {verdict}")
        if r["tuned_wrote_in_its_copy"]:
            wrote = ", ".join(r["tuned_wrote_in_its_copy"])
            lines.append(f"  files TuneD wrote (in its private copy, not the machine's): {wrote}")
    return lines


def main(argv: list[str]) -> int:
    parser = arguments("tuned", __doc__, quick="latency-performance only")
    parser.add_argument("--profiles", default=",".join(PROFILES))
    args = parser.parse_args(argv)
    if not_root("tuned", "TuneD and latencyd tune the machine"):
        return 2
    if not Path("/usr/sbin/tuned").exists() and not Path("/usr/bin/tuned").exists():
        why = "TuneD is not installed (apt-get install tuned): nothing to compare"
        print(
            json.dumps({"benchmark": "tuned", "skipped": why})
            if args.json
            else f"bench tuned: {why}"
        )
        return 0
    profiles = ["latency-performance"] if args.quick else args.profiles.split(",")
    ignore = volatile_keys()
    results = []
    with PrivateBus(POLICY) as bus, tempfile.TemporaryDirectory(prefix="latencyd-tuned-") as tmp:
        for profile in profiles:
            print(f"bench tuned: {profile}", file=sys.stderr)
            results.append(compare(profile, bus, Path(tmp), ignore))
    with contextlib.suppress(BrokenPipeError):
        if args.json:
            print(json.dumps({"benchmark": "tuned", "profiles": results}))
        else:
            print("\n".join(report(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
