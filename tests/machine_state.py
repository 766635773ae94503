"""Snapshot every kernel setting the suite may touch, to prove it leaves the machine as found."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.qemu import CACHE

SYSCTL_DIRS = ["/proc/sys/vm"]
SYSCTL_KEYS = [
    "/proc/sys/kernel/timer_migration",
    "/proc/sys/kernel/numa_balancing",
    "/proc/sys/net/core/busy_read",
    "/proc/sys/net/core/busy_poll",
    "/proc/sys/net/ipv4/tcp_fastopen",
    "/proc/sys/net/ipv4/ip_local_port_range",
]
# Values that move on their own and are not settings.
VOLATILE = {"/proc/sys/vm/drop_caches", "/proc/sys/vm/stat_refresh", "/proc/sys/vm/compact_memory"}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def pm_qos_holders() -> list[int]:
    """PIDs (other than ours) holding /dev/cpu_dma_latency open."""
    holders = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/cpu_dma_latency":
                    holders.append(int(pid))
        except OSError:
            continue
    return sorted(holders)


def kthread_affinities() -> dict[str, str]:
    """pid:comm -> affinity and policy of every kernel thread (children of kthreadd)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        stat = _read(Path(f"/proc/{pid}/stat"))
        if not stat:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[1] != "2" and pid != "2":  # ppid
            continue
        try:
            cpus = os.sched_getaffinity(int(pid))
            policy = os.sched_getscheduler(int(pid))
            prio = os.sched_getparam(int(pid)).sched_priority
        except OSError:
            continue
        comm = _read(Path(f"/proc/{pid}/comm"))
        out[f"{pid}:{comm}"] = f"{sorted(cpus)} policy={policy} prio={prio}"
    return out


def nic_state() -> dict[str, str]:
    """Every host NIC's ethtool settings and steering files: the suite never changes eth0
    (beyond a no-op write) or any NIC it did not create."""
    out: dict[str, str] = {}
    for nic in sorted(os.listdir("/sys/class/net")):
        for flag in ("-c", "-g", "-l", "-k") if nic != "lo" else ():
            result = subprocess.run(["ethtool", flag, nic], capture_output=True, text=True)
            out[f"{nic} ethtool {flag}"] = result.stdout + result.stderr
        base = Path("/sys/class/net", nic)
        for name in ("napi_defer_hard_irqs", "gro_flush_timeout"):
            out[f"{nic} {name}"] = str(_read(base / name))
        for queue in sorted((base / "queues").glob("*-*")):
            for name in ("rps_cpus", "xps_cpus"):
                if (queue / name).exists():
                    out[f"{nic} {queue.name}/{name}"] = str(_read(queue / name))
    return out


def snapshot() -> dict[str, object]:
    files: dict[str, str | None] = {}
    for d in SYSCTL_DIRS:
        for p in sorted(Path(d).iterdir()):
            if str(p) not in VOLATILE:
                files[str(p)] = _read(p)
    for k in SYSCTL_KEYS:
        files[k] = _read(Path(k))
    for p in sorted(Path("/proc/irq").glob("*/smp_affinity_list")):
        files[str(p)] = _read(p)
    files["/proc/irq/default_smp_affinity"] = _read(Path("/proc/irq/default_smp_affinity"))
    cpu = Path("/sys/devices/system/cpu")
    for p in sorted(cpu.glob("cpu[0-9]*/cpuidle/state*/disable")):
        files[str(p)] = _read(p)
    for p in sorted(cpu.glob("cpu[0-9]*/power/pm_qos_resume_latency_us")):
        files[str(p)] = _read(p)
    files["cpuidle governor"] = _read(cpu / "cpuidle/current_governor")
    for p in sorted(Path("/sys/module/haltpoll/parameters").glob("*")):
        files[str(p)] = _read(p)
    thp = Path("/sys/kernel/mm/transparent_hugepage")  # the sysfs plugin's kernel test
    for name in ("enabled", "defrag"):
        files[str(thp / name)] = _read(thp / name)
    wq = Path("/sys/devices/virtual/workqueue")
    for p in [wq / "cpumask", *sorted(wq.glob("*/cpumask"))]:
        files[str(p)] = _read(p)
    # Where /sys/fs/cgroup is the unified hierarchy itself (systemd's default, the VM tier's
    # machine): each cgroup's cpuset and the controllers it hands down.
    if (UNIFIED_ROOT / "cgroup.controllers").exists():
        for cgroup in [UNIFIED_ROOT, *sorted(p for p in UNIFIED_ROOT.rglob("*") if p.is_dir())]:
            for name in V2_FILES:
                if (cgroup / name).exists():
                    files[str(cgroup / name)] = _read(cgroup / name)
    # TuneD (benchmarks run it) notes its state in /etc/tuned and may write /etc/modprobe.d.
    for etc in (Path("/etc/tuned"), Path("/etc/modprobe.d")):
        for conf in sorted(etc.rglob("*")) if etc.is_dir() else []:
            if conf.is_file():
                files[str(conf)] = _read(conf)
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    proc_mounts = (_read(Path("/proc/mounts")) or "").splitlines()
    mounts = [line for line in not_the_vm_tiers(proc_mounts) if "latencyd" in line]
    mounts += tracefs_mounts()
    mounts += [f"trace instance {name}" for name in trace_instances()]
    # What systemd's tools leave on a host whose PID 1 is not systemd: nspawn's
    # /run/systemd/nspawn (the boot test), the units-load stamp (systemd-analyze verify).
    run = Path("/run/systemd")
    run_systemd = sorted(p.name for p in run.iterdir()) if run.is_dir() else []
    return {
        "run_systemd": run_systemd,
        "files": files,
        "pm_qos_holders": pm_qos_holders(),
        "kthreads": kthread_affinities(),
        "netns": sorted(netns.split()),
        "loop_devices": "\n".join(not_the_vm_tiers(loops.strip().splitlines())),
        "mounts": mounts,
        "nics": nic_state(),
        "cgroups": cgroup_state(),
        "task_cpusets": task_cpusets(),
    }


def not_the_vm_tiers(lines: list[str], cache: Path = CACHE) -> list[str]:
    """`lines` (of `losetup -a` or /proc/mounts) without those naming a path in the VM tier's
    cache: `make test` runs the tier beside this suite, and its image build holds a loop
    device and a mount there for a minute. It writes nothing of what the guard watches;
    the tier checks itself that it leaves no loop device behind (tests/vm/conftest.py)."""
    inside = f"{cache}/"
    return [line for line in lines if inside not in line]


CPUSET_V1 = Path("/sys/fs/cgroup/cpuset")
UNIFIED = Path("/sys/fs/cgroup/unified")
UNIFIED_ROOT = Path("/sys/fs/cgroup")
V2_FILES = (
    "cgroup.subtree_control",
    "cpuset.cpus",
    "cpuset.cpus.effective",
    "cpuset.cpus.partition",
    "cpuset.mems",
)


def cgroup_state() -> dict[str, object]:
    """The shield's cgroups: v1 child cpusets and root flags, the cpuset controller's
    binding to v2, latencyd's v2 cgroups."""
    v1_root = {n: _read(CPUSET_V1 / n) for n in ("cpuset.cpus", "cpuset.sched_load_balance")}
    return {
        "v1 mounted": (CPUSET_V1 / "cpuset.cpus").exists(),
        "v1 root": v1_root,
        "v1 children": sorted(str(p) for p in CPUSET_V1.rglob("*") if p.is_dir()),
        "v2 subtree_control": _read(UNIFIED / "cgroup.subtree_control"),
        "v2 children": sorted(str(p) for p in UNIFIED.glob("latencyd-*")),
    }


def task_cpusets() -> dict[str, str]:
    """Each process's cpuset cgroup (v1, or v2 when cpuset is bound there). A zombie is
    left out: once it has exited the kernel shows it in the root cgroup, a move no one
    made."""
    found: dict[str, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or exited(proc):
            continue
        if (text := _read(proc / "cgroup")) is not None:
            lines = [line.split(":", 2) for line in text.splitlines()]
            cpuset = [p for _, c, p in lines if "cpuset" in c.split(",")]
            found[proc.name] = (
                cpuset[0] if cpuset else next((p for n, c, p in lines if n == "0"), "?")
            )
    return found


def exited(task: Path) -> bool:
    """Whether a /proc/PID (or its task/TID) is a task that has exited (a zombie, or dead
    and not yet gone); a missing one counts as exited."""
    stat = _read(task / "stat")
    return stat is None or stat.rsplit(")", 1)[1].split()[0] in ("Z", "X", "x")


def differences(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """Human-readable list of what changed; threads that exited or appeared are ignored."""
    diffs: list[str] = []
    fb, fa = before["files"], after["files"]
    assert isinstance(fb, dict) and isinstance(fa, dict)
    for key in sorted(set(fb) | set(fa)):
        if fb.get(key) != fa.get(key):
            diffs.append(f"{key}: {fb.get(key)!r} -> {fa.get(key)!r}")
    kb, ka = before["kthreads"], after["kthreads"]
    assert isinstance(kb, dict) and isinstance(ka, dict)
    for key in sorted(set(kb) & set(ka)):
        if kb[key] != ka[key]:
            diffs.append(f"kthread {key}: {kb[key]} -> {ka[key]}")
    nb, na = before["nics"], after["nics"]
    assert isinstance(nb, dict) and isinstance(na, dict)
    for key in sorted(set(nb) | set(na)):
        if nb.get(key) != na.get(key):
            diffs.append(f"NIC {key}: {nb.get(key)!r} -> {na.get(key)!r}")
    tb, ta = before["task_cpusets"], after["task_cpusets"]
    assert isinstance(tb, dict) and isinstance(ta, dict)
    for pid in sorted(set(tb) & set(ta), key=int):
        if tb[pid] != ta[pid]:
            diffs.append(f"pid {pid}'s cpuset: {tb[pid]} -> {ta[pid]}")
    for key in ("pm_qos_holders", "netns", "loop_devices", "mounts", "run_systemd", "cgroups"):
        if before[key] != after[key]:
            diffs.append(f"{key}: {before[key]!r} -> {after[key]!r}")
    return diffs


def tracefs_mounts() -> list[str]:
    """/proc/mounts' tracefs lines, by type: one mounted by hand reads "nodev PATH tracefs"."""
    return [line for line in (_read(Path("/proc/mounts")) or "").splitlines()
            if line.split()[2:3] == ["tracefs"]]  # fmt: skip


def trace_instances() -> list[str]:
    """tracefs's instances, seen through a private mount where none is mounted (one that
    a killed daemon left is there all the same, holding its buffers)."""
    from latencyd.errors import KernelRefused
    from latencyd.kernel.system import System

    try:
        tracefs = System("/").tracefs()
    except KernelRefused:
        return []  # no tracefs in this kernel
    try:
        return sorted(os.listdir(Path("/", tracefs.base, "instances")))
    finally:
        tracefs.release()
