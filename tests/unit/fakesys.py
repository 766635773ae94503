"""A fake /proc + /sys tree for unit tests: the System facade rooted at a temp dir.

`make_fake_root` writes the few files latencyd reads (online CPUs, MemTotal) and
the sysctls its plugins touch, each as one value with a trailing newline like the
kernel prints. `KernelLikeSystem` adds the one piece of kernel behaviour plain
files cannot show: writing vm.dirty_ratio zeroes vm.dirty_bytes and vice versa
(and likewise for the background pair), as mm/page-writeback.c does.

For the cstate, irq and kthread plugins: `add_cpuidle` (cpuidle states, resume
latency, /dev/cpu_dma_latency as a plain file), `add_irqs` (/proc/interrupts and
/proc/irq), `add_task`/`add_kthread` (/proc/PID/stat in the kernel's layout),
`FakeSched` (affinities and policies, with refusals and exited tasks) and
`RefusingSystem` (writes the kernel refuses with an errno, or accepts and ignores).

For the cpu and sysfs plugins: `add_intel_pstate`, `add_amd_pstate` and
`add_acpi_cpufreq` (the cpufreq trees of three kinds of machine, file for file),
`SysfsLikeSystem` (attributes shown back as the kernel prints them, bracketed choices
included) and `CpufreqLikeSystem` (what the cpufreq drivers refuse or clamp).
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused
from latencyd.kernel.ethtool import Features
from latencyd.kernel.system import System

GiB_KB = 1 << 20  # one GiB in /proc/meminfo's kB

DEFAULT_SYSCTLS: dict[str, str] = {
    "vm/dirty_ratio": "20",
    "vm/dirty_bytes": "0",
    "vm/dirty_background_ratio": "10",
    "vm/dirty_background_bytes": "0",
    "vm/dirty_expire_centisecs": "3000",
    "vm/dirty_writeback_centisecs": "500",
    "vm/swappiness": "60",
    "vm/stat_interval": "1",
    "kernel/timer_migration": "1",
    "net/core/busy_read": "0",
    "net/core/busy_poll": "0",
    "net/ipv4/tcp_fastopen": "1",
    "net/ipv4/tcp_rmem": "4096\t131072\t6291456",
}


def make_fake_root(
    tmp_path: Path,
    cpus: str = "0-3",
    mem_kb: int = 8 * GiB_KB,
    sysctls: Mapping[str, str] | None = None,
    defaults: bool = True,
) -> Path:
    """Create `tmp_path/root` with proc/sys/..., proc/meminfo and the online CPU list.

    `sysctls` maps paths under /proc/sys (``vm/swappiness``) to contents; they are
    added to (or override) DEFAULT_SYSCTLS unless `defaults` is false.
    """
    root = tmp_path / "root"
    values = {**(DEFAULT_SYSCTLS if defaults else {}), **(sysctls or {})}
    for rel, value in values.items():
        f = root / "proc/sys" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"{value}\n")
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/meminfo").write_text(
        f"MemTotal:       {mem_kb} kB\nMemFree:        {mem_kb // 2} kB\n"
    )
    online = root / "sys/devices/system/cpu/online"
    online.parent.mkdir(parents=True, exist_ok=True)
    online.write_text(f"{cpus}\n")
    return root


def sysctl_values(root: Path) -> dict[str, str]:
    """Every file under the fake /proc/sys, by relative path, stripped: a snapshot to compare."""
    base = root / "proc/sys"
    return {
        str(p.relative_to(base)): p.read_text().strip()
        for p in sorted(base.rglob("*"))
        if p.is_file()
    }


def read_sysctl(root: Path, rel: str) -> str:
    return (root / "proc/sys" / rel).read_text().strip()


def write_sysctl(root: Path, rel: str, value: str) -> None:
    """Change a value behind latencyd's back (what another tool or admin would do)."""
    (root / "proc/sys" / rel).write_text(f"{value}\n")


_PARTNER = {
    "proc/sys/vm/dirty_ratio": "proc/sys/vm/dirty_bytes",
    "proc/sys/vm/dirty_bytes": "proc/sys/vm/dirty_ratio",
    "proc/sys/vm/dirty_background_ratio": "proc/sys/vm/dirty_background_bytes",
    "proc/sys/vm/dirty_background_bytes": "proc/sys/vm/dirty_background_ratio",
}


class KernelLikeSystem(System):
    """A fake tree that keeps the kernel's dirty_ratio/dirty_bytes exclusivity.

    As in dirty_ratio_handler()/dirty_bytes_handler(): a write that changes one of
    a pair sets the other to 0. It also logs every write, so tests can tell what
    was touched and what was left alone.
    """

    def __init__(self, root: Path | str = "/", **backends: Any) -> None:
        super().__init__(root, **backends)
        self.writes: list[tuple[str, str]] = []  # every write, as (path under root, value)

    def write(self, rel: str, value: str) -> None:
        rel = rel.lstrip("/")
        self.writes.append((rel, value))
        partner = _PARTNER.get(rel)
        old = self.read(rel) if partner else None
        super().write(rel, value)
        if partner and old != value.strip():
            super().write(partner, "0")


# -- files: snapshots of the whole fake tree ---------------------------------------------


def tree_values(root: Path, under: str = "") -> dict[str, str]:
    """Every regular file under `root/under` by path under root, stripped like System.read
    (the kernel prints a newline that writes leave out): a snapshot to compare."""
    base = root / under if under else root
    return {
        str(p.relative_to(root)): p.read_bytes().decode(errors="surrogateescape").strip()
        for p in sorted(base.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def tree_bytes(root: Path, under: str = "") -> dict[str, bytes]:
    """Every regular file under `root/under` by path under root, byte for byte (newlines
    included): to check that a restore leaves each file exactly as it was."""
    base = root / under if under else root
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def put(root: Path, rel: str, text: str) -> Path:
    """Write one fake kernel file (with the kernel's trailing newline), creating its parents."""
    f = root / rel
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(f"{text}\n")
    return f


# -- cpuidle and PM QoS --------------------------------------------------------------------

# (name, exit latency µs, time µs, usage) as a small x86 VM might show them.
DEFAULT_IDLE_STATES: tuple[tuple[str, int, int, int], ...] = (
    ("POLL", 0, 1000, 10),
    ("C1", 2, 2000, 20),
    ("C1E", 10, 3000, 30),
    ("C6", 133, 4000, 40),
)
PM_QOS_DEFAULT_US = 2_000_000_000  # what /dev/cpu_dma_latency reads with no request held


def add_cpuidle(
    root: Path,
    cpus: range | list[int] = range(4),
    states: tuple[tuple[str, int, int, int], ...] = DEFAULT_IDLE_STATES,
) -> None:
    """cpuN/cpuidle/stateK/{name,latency,disable,time,usage}, and the PM QoS files of
    add_pm_qos."""
    add_pm_qos(root, cpus)
    for cpu in cpus:
        base = f"sys/devices/system/cpu/cpu{cpu}"
        for index, (name, latency, time_us, usage) in enumerate(states):
            d = f"{base}/cpuidle/state{index}"
            put(root, f"{d}/name", name)
            put(root, f"{d}/latency", str(latency))
            put(root, f"{d}/disable", "0")
            put(root, f"{d}/time", str(time_us))
            put(root, f"{d}/usage", str(usage))


def add_pm_qos(root: Path, cpus: range | list[int]) -> None:
    """cpuN/power/pm_qos_resume_latency_us ("0": no limit) and /dev/cpu_dma_latency as a
    plain file holding the kernel's default as a binary s32: there with or without a
    cpuidle driver."""
    for cpu in cpus:
        put(root, f"sys/devices/system/cpu/cpu{cpu}/power/pm_qos_resume_latency_us", "0")
    dev = root / "dev/cpu_dma_latency"
    dev.parent.mkdir(parents=True, exist_ok=True)
    dev.write_bytes(struct.pack("=i", PM_QOS_DEFAULT_US))


# -- tasks ---------------------------------------------------------------------------------


def stat_line(pid: int, comm: str, ppid: int, flags: int, start_time: int) -> str:
    """A /proc/PID/stat line in the kernel's layout (52 fields, comm in parentheses)."""
    after_comm = [
        "S", ppid, 0, 0, 0, -1, flags,  # state ppid pgrp session tty_nr tpgid flags
        0, 0, 0, 0, 0, 0, 0, 0,  # minflt cminflt majflt cmajflt utime stime cutime cstime
        20, 0, 1, 0, start_time,  # priority nice num_threads itrealvalue starttime
        0, 0, 18446744073709551615, 0, 0, 0, 0, 0, 0, 0, 2147483647, 0, 1, 0, 0, 17, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]  # fmt: skip
    return f"{pid} ({comm}) " + " ".join(str(f) for f in after_comm)


def add_task(
    root: Path,
    pid: int,
    comm: str,
    ppid: int = 1,
    flags: int = 0x00400100,
    start_time: int = 1000,
    threads: tuple[int, ...] = (),
    uid: int = 0,
    exe: str | None = None,
) -> None:
    """proc/PID/{stat,comm,status} and proc/PID/task/TID/ for the task and each extra
    thread (the main thread's own stat too: latencyd reads that one, see System.task);
    with `exe` (a path inside the root), proc/PID/exe links to that file, made if missing
    (the test's user's, mode 0755)."""
    if exe is not None:
        program = root / exe.lstrip("/")
        if not program.exists():
            program.parent.mkdir(parents=True, exist_ok=True)
            program.write_text("")
            program.chmod(0o755)
        (root / f"proc/{pid}").mkdir(parents=True, exist_ok=True)
        (root / f"proc/{pid}/exe").symlink_to(program)
    put(root, f"proc/{pid}/stat", stat_line(pid, comm, ppid, flags, start_time))
    put(root, f"proc/{pid}/comm", comm)
    put(root, f"proc/{pid}/status", f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    for tid in (pid, *threads):
        (root / f"proc/{pid}/task/{tid}").mkdir(parents=True, exist_ok=True)
    put(root, f"proc/{pid}/task/{pid}/stat", stat_line(pid, comm, ppid, flags, start_time))


def add_kthread(
    root: Path,
    pid: int,
    comm: str,
    per_cpu: bool = False,
    start_time: int = 10,
) -> None:
    """A child of kthreadd: ppid 2, PF_KTHREAD, and PF_NO_SETAFFINITY when `per_cpu`."""
    flags = 0x00208040 | (0x04000000 if per_cpu else 0)
    add_task(root, pid, comm, ppid=2, flags=flags, start_time=start_time)


class FakeSched:
    """The os module's sched_* calls over dicts; chosen pids refuse or have exited.

    `refuse` maps a pid to the errno its sched_set* calls fail with (EINVAL is what
    the kernel says for PF_NO_SETAFFINITY threads, EPERM for others); pids missing
    from `affinity` fail every call with ESRCH, like an exited task.
    """

    def __init__(self, cpus: set[int] | None = None) -> None:
        self.all = set(cpus if cpus is not None else {0, 1, 2, 3})
        # Equal CPU sets are one frozenset: 50,000 tasks' sets of 256 CPUs would otherwise
        # be the rig's own garbage-collector load, billed to the daemon in `bench scale`.
        self.affinity: dict[int, AbstractSet[int]] = {}
        self._sets: dict[frozenset[int], frozenset[int]] = {}
        self.policy: dict[int, tuple[int, int]] = {}  # pid -> (policy, priority)
        self.refuse: dict[int, int] = {}
        self.calls: list[tuple[str, int]] = []
        # Runs before a sched_set* call takes effect (e.g. to make the task exit now).
        self.before_set: dict[int, Callable[[], None]] = {}

    def add(self, pid: int, cpus: set[int] | None = None, policy: int = 0, prio: int = 0) -> None:
        self.affinity[pid] = self._one(cpus if cpus is not None else self.all)
        self.policy[pid] = (policy, prio)

    def _one(self, cpus: Iterable[int]) -> frozenset[int]:
        key = frozenset(cpus)
        return self._sets.setdefault(key, key)

    def _check(self, call: str, pid: int, setting: bool = False) -> None:
        self.calls.append((call, pid))
        if setting and pid in self.before_set:
            self.before_set.pop(pid)()
        if pid not in self.affinity:
            raise OSError(errno.ESRCH, os.strerror(errno.ESRCH))
        if setting and pid in self.refuse:
            code = self.refuse[pid]
            raise OSError(code, os.strerror(code))

    def sched_getaffinity(self, pid: int) -> set[int]:
        self._check("getaffinity", pid)
        return set(self.affinity[pid])

    def sched_setaffinity(self, pid: int, cpus: Iterable[int]) -> None:
        self._check("setaffinity", pid, setting=True)
        wanted = set(cpus) & self.all
        if not wanted:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        self.affinity[pid] = self._one(wanted)

    def sched_getscheduler(self, pid: int) -> int:
        self._check("getscheduler", pid)
        return self.policy[pid][0]

    def sched_getparam(self, pid: int) -> os.sched_param:
        self._check("getparam", pid)
        return os.sched_param(self.policy[pid][1])

    def sched_setscheduler(self, pid: int, policy: int, param: os.sched_param) -> None:
        self._check("setscheduler", pid, setting=True)
        realtime = policy in (os.SCHED_FIFO, os.SCHED_RR)
        if not (1 <= param.sched_priority <= 99 if realtime else param.sched_priority == 0):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        self.policy[pid] = (policy, param.sched_priority)

    def state(self) -> tuple[dict[int, set[int]], dict[int, tuple[int, int]]]:
        """A copy of every affinity and policy, to compare before and after."""
        return {p: set(c) for p, c in self.affinity.items()}, dict(self.policy)


# -- interrupts ----------------------------------------------------------------------------


def add_irqs(root: Path, interrupts: str, affinity: str = "0-3", default_mask: str = "f") -> None:
    """proc/interrupts, proc/irq/N/smp_affinity_list for each numbered line, and the default."""
    put(root, "proc/interrupts", interrupts.rstrip("\n"))
    for line in interrupts.splitlines()[1:]:
        label = line.partition(":")[0].strip()
        if label.isdigit():
            put(root, f"proc/irq/{label}/smp_affinity_list", affinity)
    put(root, "proc/irq/default_smp_affinity", default_mask)


# -- a System whose writes the kernel refuses or ignores -------------------------------------

EPERM_REASON = "the kernel refused it: Operation not permitted (EPERM)"
EIO_REASON = "the kernel refused it: Input/output error (EIO)"


class RefusingSystem(System):
    """Writes to paths in `refuse` fail like the kernel's EPERM/EIO; paths in `ignore` are
    accepted and dropped (the kernel "took" the write but kept its value). Logs every write.
    """

    def __init__(self, root: Path | str = "/", sched: Any = os) -> None:
        super().__init__(root, sched)
        self.refuse: dict[str, str] = {}  # path under root -> KernelRefused reason
        self.ignore: set[str] = set()
        self.writes: list[tuple[str, str]] = []

    def write(self, rel: str, value: str) -> None:
        rel = rel.lstrip("/")
        self.writes.append((rel, value))
        if rel in self.refuse:
            raise KernelRefused(f"writing {value!r} to /{rel}", self.refuse[rel])
        if rel in self.ignore:
            return
        super().write(rel, value)


# -- NICs ----------------------------------------------------------------------------------


def add_nic(
    root: Path,
    name: str,
    ifindex: int,
    mac: str = "",
    assign: int = 1,
    bus: str = "",
    driver: str = "",
    queues: int = 1,
) -> None:
    """sys/class/net/NAME with the files the net plugin reads; `bus` (a PCI address) and
    `driver` make it a "physical" NIC with a device link (assign 0: a permanent MAC)."""
    base = f"sys/class/net/{name}"
    put(root, f"{base}/ifindex", str(ifindex))
    put(root, f"{base}/address", mac or f"5a:00:00:00:00:{ifindex:02x}")
    put(root, f"{base}/addr_assign_type", str(assign))
    put(root, f"{base}/napi_defer_hard_irqs", "0")
    put(root, f"{base}/gro_flush_timeout", "0")
    for q in range(queues):
        put(root, f"{base}/queues/rx-{q}/rps_cpus", "0")
        put(root, f"{base}/queues/tx-{q}/xps_cpus", "0")
    if bus:
        device = root / f"sys/devices/pci0000:00/{bus}"
        device.mkdir(parents=True, exist_ok=True)
        (root / base / "device").symlink_to(device)
        put(root, f"{base}/dev_port", "0")
        if driver:
            drv = root / f"sys/bus/pci/drivers/{driver}"
            drv.mkdir(parents=True, exist_ok=True)
            (device / "driver").symlink_to(drv)


def rename_nic(root: Path, old: str, new: str) -> None:
    (root / f"sys/class/net/{old}").rename(root / f"sys/class/net/{new}")


@dataclass
class FakeNic:
    """What one driver reports and accepts, like a real one would.

    `values`: group -> key -> value (only what the driver supports); `ignored`: (group,
    key) pairs it accepts and keeps (virtio_net's adaptive-rx); `refused`: group -> errno
    for every write to the group (veth's coalescing: EOPNOTSUPP); `limits`: (group, key)
    -> maximum (ring sizes).
    """

    values: dict[str, dict[str, int | bool]] = field(default_factory=dict)
    features: dict[str, bool] = field(default_factory=dict)
    changeable: set[str] = field(default_factory=set)
    ignored: set[tuple[str, str]] = field(default_factory=set)
    refused: dict[str, int] = field(default_factory=dict)
    limits: dict[tuple[str, str], int] = field(default_factory=dict)


KERNEL_FEATURES = frozenset(
    {"rx-gro", "rx-lro", "rx-checksum", "tx-scatter-gather", "tx-generic-segmentation",
     "tx-tcp-segmentation", "tx-tcp6-segmentation", "rx-hashing", "rx-gro-hw"}
)  # fmt: skip


class FakeEthtool:
    """The Ethtool backend over FakeNics by interface name, with refusals like drivers'."""

    def __init__(
        self, nics: dict[str, FakeNic] | None = None, drivers: dict[str, str] | None = None
    ) -> None:
        self.nics = nics or {}
        self.drivers = drivers or {}  # virtual NICs' drivers (veth, tun), by name
        self.writes: list[tuple[str, str, str, int | bool]] = []

    def _nic(self, ifname: str) -> FakeNic:
        if ifname not in self.nics:
            raise KernelRefused(f"reading {ifname}", "No such device (ENODEV)")
        return self.nics[ifname]

    def read(self, ifname: str, group: str) -> dict[str, int | bool]:
        nic = self._nic(ifname)
        if group not in nic.values:
            raise KernelRefused(f"reading {ifname} {group}", "Operation not supported (ENOTSUP)")
        return dict(nic.values[group])

    def write(self, ifname: str, group: str, key: str, value: int | bool) -> None:
        nic = self._nic(ifname)
        self.writes.append((ifname, group, key, value))
        what = f"setting {ifname} {group} {key} = {value}"
        if group in nic.refused:
            code = nic.refused[group]
            raise KernelRefused(what, f"{os.strerror(code)} ({errno.errorcode[code]})")
        if key not in nic.values.get(group, {}):
            raise KernelRefused(
                what, "cannot modify an unsupported parameter: Invalid argument (EINVAL)"
            )
        limit = nic.limits.get((group, key))
        if limit is not None and int(value) > limit:
            raise KernelRefused(what, "requested ring size exceeds maximum: Invalid argument")
        if (group, key) not in nic.ignored:
            nic.values[group][key] = value

    def features(self, ifname: str) -> Features:
        nic = self._nic(ifname)
        active = frozenset(n for n, on in nic.features.items() if on)
        return Features(active, frozenset(nic.changeable), KERNEL_FEATURES)

    def driver(self, ifname: str) -> str:
        return self.drivers.get(ifname, "")

    def set_feature(self, ifname: str, name: str, on: bool) -> None:
        nic = self._nic(ifname)
        self.writes.append((ifname, "feature", name, on))
        if name in nic.changeable:
            nic.features[name] = on


# -- sysfs attributes as the kernel shows them ------------------------------------------------


def refusal(code: int) -> str:
    """A KernelRefused reason as System.write words it for `code`."""
    return f"the kernel refused it: {os.strerror(code)} ({errno.errorcode[code]})"


def bracketed_choices(text: str) -> tuple[list[str], str] | None:
    """A bracketed-choice attribute ("always madvise [never]"): its words and the chosen one."""
    words = text.split()
    chosen = [w[1:-1] for w in words if len(w) > 2 and w[0] == "[" and w[-1] == "]"]
    if len(words) < 2 or len(chosen) != 1:
        return None
    return [w.strip("[]") for w in words], chosen[0]


class SysfsLikeSystem(KernelLikeSystem):
    """A write is shown back the way sysfs prints the attribute: the value and a newline (so
    a restore leaves the file byte for byte as it was), and a bracketed-choice attribute
    (THP's "always madvise [never]", a block queue's scheduler) with the new choice in
    brackets; a word such a file does not list is EINVAL, as the kernel answers. `refuse`
    makes chosen paths (under root) fail with an errno, e.g. EIO where a hypervisor traps
    the MSR behind the file."""

    def __init__(self, root: Path | str = "/", **backends: Any) -> None:
        super().__init__(root, **backends)
        self.refuse: dict[str, int] = {}

    def shown(self, rel: str, value: str) -> str:
        """What the file shows after `value` is written to it (KernelRefused if refused)."""
        path = self.path(rel)
        found = bracketed_choices(path.read_text()) if path.is_file() else None
        if found is None:
            return value
        words, _ = found
        if value not in words:
            raise KernelRefused(f"writing {value!r} to /{rel}", refusal(errno.EINVAL))
        return " ".join(f"[{w}]" if w == value else w for w in words)

    def write(self, rel: str, value: str) -> None:
        rel = rel.lstrip("/")
        if rel in self.refuse:
            raise KernelRefused(f"writing {value!r} to /{rel}", refusal(self.refuse[rel]))
        shown = self.shown(rel, value.strip())
        super().write(rel, value)
        self.path(rel).write_text(f"{shown}\n")


# -- CPU frequency scaling ------------------------------------------------------------------
#
# The trees below hold the files the kernel creates, as listed in
# Documentation/admin-guide/pm/cpufreq.rst ("Policy Interface in sysfs": the cpufreq core's
# files in every policyN, bios_limit and scaling_available_frequencies of acpi-cpufreq),
# intel_pstate.rst ("User Space Interface in sysfs": intel_pstate/; "Energy vs Performance
# Hints": energy_performance_{preference,available_preferences} with HWP), amd-pstate.rst
# ("User Space Interface in sysfs": amd_pstate/, the amd_pstate_* policy files, and the
# per-policy boost file it documents since Linux 6.11) and
# Documentation/ABI/testing/sysfs-devices-system-cpu (cpuN/power/energy_perf_bias,
# cpufreq/boost), with values such machines show. cpuN/cpufreq is a link to its policy.

CPU_SYS = "sys/devices/system/cpu"
EPP_PREFERENCES = ("default", "performance", "balance_performance", "balance_power", "power")
INTEL_CPUINFO = (800_000, 3_700_000)  # kHz: lowest P-state, highest turbo
INTEL_MIN_PERF_PCT = 22  # the lowest P-state in % of the highest: min_perf_pct's floor
AMD_CPUINFO = (400_000, 5_759_000)
ACPI_CPUINFO = (1_500_000, 2_800_000)
ACPI_GOVERNORS = ("conservative", "ondemand", "userspace", "powersave", "performance", "schedutil")
EPB_NAMES = {
    "performance": 0,
    "balance-performance": 4,
    "normal": 6,
    "balance-power": 8,
    "power": 15,
}


def policy_groups(cpus: int, per_policy: int) -> list[list[int]]:
    """CPUs 0..cpus-1 in policies of `per_policy` CPUs (x86: one each; shared clocks: more)."""
    return [list(range(i, min(i + per_policy, cpus))) for i in range(0, cpus, per_policy)]


def add_cpufreq_policy(
    root: Path,
    cpus: Sequence[int],
    driver: str,
    governor: str,
    governors: Sequence[str],
    cpuinfo: tuple[int, int],
    extra: Mapping[str, str],
) -> None:
    """cpufreq/policyN (N: its first CPU) with the core's files and the driver's `extra`,
    and cpuN/cpufreq linking to it for each of its CPUs."""
    base = f"{CPU_SYS}/cpufreq/policy{cpus[0]}"
    listed = " ".join(map(str, cpus))
    lo, hi = cpuinfo
    files = {
        "affected_cpus": listed,
        "related_cpus": listed,
        "cpuinfo_min_freq": str(lo),
        "cpuinfo_max_freq": str(hi),
        "cpuinfo_transition_latency": "0",
        "scaling_available_governors": " ".join(governors),
        "scaling_cur_freq": str(lo),
        "scaling_driver": driver,
        "scaling_governor": governor,
        "scaling_max_freq": str(hi),
        "scaling_min_freq": str(lo),
        "scaling_setspeed": "<unsupported>",
        **extra,
    }
    for name, text in files.items():
        put(root, f"{base}/{name}", text)
    for cpu in cpus:
        link = root / f"{CPU_SYS}/cpu{cpu}/cpufreq"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(f"../cpufreq/policy{cpus[0]}")


def add_intel_pstate(
    root: Path, cpus: int = 4, per_policy: int = 1, turbo_disabled: bool = False
) -> None:
    """An Intel machine on intel_pstate in active mode with HWP (the default since Skylake):
    governors performance and powersave, EPP per policy, intel_pstate/ with no_turbo and
    the perf limits, and EPB per CPU. No boost file: intel_pstate has no set_boost."""
    for group in policy_groups(cpus, per_policy):
        add_cpufreq_policy(
            root, group, "intel_pstate", "powersave", ("performance", "powersave"), INTEL_CPUINFO,
            {
                "base_frequency": "2100000",
                "energy_performance_available_preferences": " ".join(EPP_PREFERENCES),
                "energy_performance_preference": "balance_performance",
            },
        )  # fmt: skip
    pstate = {
        "status": "active",
        "no_turbo": "1" if turbo_disabled else "0",
        "min_perf_pct": str(INTEL_MIN_PERF_PCT),
        "max_perf_pct": "100",
        "num_pstates": "30",
        "turbo_pct": "33",
        "hwp_dynamic_boost": "0",
    }
    for name, text in pstate.items():
        put(root, f"{CPU_SYS}/intel_pstate/{name}", text)
    for cpu in range(cpus):
        put(root, f"{CPU_SYS}/cpu{cpu}/power/energy_perf_bias", "6")


def add_amd_pstate(
    root: Path, cpus: int = 4, per_policy: int = 1, boost: str = "1", policy_boost: bool = True
) -> None:
    """An AMD Zen 4 machine on amd-pstate-epp (active mode), Linux 6.11 or later: EPP per
    policy, amd_pstate/, the global cpufreq/boost and (`policy_boost`) each policy's own
    boost file. No EPB and no intel_pstate/."""
    extra = {
        "amd_pstate_highest_perf": "166",
        "amd_pstate_hw_prefcore": "enabled",
        "amd_pstate_lowest_nonlinear_freq": "1748000",
        "amd_pstate_max_freq": str(AMD_CPUINFO[1]),
        "amd_pstate_prefcore_ranking": "166",
        "energy_performance_available_preferences": " ".join(EPP_PREFERENCES),
        "energy_performance_preference": "balance_performance",
    }
    if policy_boost:
        extra["boost"] = boost
    for group in policy_groups(cpus, per_policy):
        add_cpufreq_policy(
            root, group, "amd-pstate-epp", "powersave", ("performance", "powersave"), AMD_CPUINFO,
            extra,
        )  # fmt: skip
    put(root, f"{CPU_SYS}/amd_pstate/status", "active")
    put(root, f"{CPU_SYS}/amd_pstate/prefcore", "enabled")
    put(root, f"{CPU_SYS}/cpufreq/boost", boost)


def add_acpi_cpufreq(root: Path, cpus: int = 4, per_policy: int = 1) -> None:
    """A machine on acpi-cpufreq (an older AMD, or Intel with intel_pstate=disable), Linux
    6.1: every governor, a frequency table, the global cpufreq/boost; no EPP, no EPB."""
    for group in policy_groups(cpus, per_policy):
        add_cpufreq_policy(
            root, group, "acpi-cpufreq", "schedutil", ACPI_GOVERNORS, ACPI_CPUINFO,
            {
                "bios_limit": str(ACPI_CPUINFO[1]),
                "cpuinfo_cur_freq": str(ACPI_CPUINFO[0]),
                "freqdomain_cpus": " ".join(map(str, group)),
                "scaling_available_frequencies": "2800000 2100000 1500000",
            },
        )  # fmt: skip
    put(root, f"{CPU_SYS}/cpufreq/boost", "1")


class CpufreqLikeSystem(SysfsLikeSystem):
    """The cpufreq, intel_pstate, amd-pstate and EPB files as their drivers treat writes
    (drivers/cpufreq/cpufreq.c, intel_pstate.c, amd-pstate.c, arch/x86/kernel/cpu/intel_epb.c):

    - scaling_governor and energy_performance_preference take only what the policy lists
      (EINVAL), and an EPP other than "performance" under the performance governor is EBUSY;
    - scaling_{min,max}_freq are requests, and the files show the effective limits: the
      max within cpuinfo_{min,max}_freq, the min within cpuinfo_min_freq and that max;
    - intel_pstate clamps max_perf_pct to [min_perf_pct, 100] and min_perf_pct to
      [INTEL_MIN_PERF_PCT, max_perf_pct]; no_turbo = 0 is EPERM while the firmware keeps
      turbo off (`turbo_disabled`);
    - a policy's boost is EINVAL while the global cpufreq/boost is 0, and writing the
      global one sets every policy's;
    - energy_perf_bias takes 0-15 or the kernel's names, and shows the number.
    """

    def __init__(self, root: Path | str = "/", turbo_disabled: bool = False, **backends: Any):
        super().__init__(root, **backends)
        self.turbo_disabled = turbo_disabled
        self.requests: dict[str, int] = {}  # scaling_{min,max}_freq path -> the last request

    def _refused(self, rel: str, value: str, code: int) -> KernelRefused:
        return KernelRefused(f"writing {value!r} to /{rel}", refusal(code))

    def _number(self, rel: str, value: str, lo: int, hi: int) -> int:
        if not value.isdigit():
            raise self._refused(rel, value, errno.EINVAL)
        return min(max(int(value), lo), hi)

    def shown(self, rel: str, value: str) -> str:
        directory, _, name = rel.rpartition("/")
        if name in ("scaling_governor", "energy_performance_preference"):
            listed = {
                "scaling_governor": "scaling_available_governors",
                "energy_performance_preference": "energy_performance_available_preferences",
            }[name]
            if value not in self.read(f"{directory}/{listed}").split():
                raise self._refused(rel, value, errno.EINVAL)
            governor = self.read(f"{directory}/scaling_governor")
            if name != "scaling_governor" and value != "performance" and governor == "performance":
                raise self._refused(rel, value, errno.EBUSY)
        elif name == "energy_perf_bias":
            number = str(EPB_NAMES.get(value, value))
            if not number.isdigit() or int(number) > 15:
                raise self._refused(rel, value, errno.EINVAL)
            value = str(int(number))
        elif name in ("no_turbo", "boost"):
            if value not in ("0", "1"):
                raise self._refused(rel, value, errno.EINVAL)
            if name == "no_turbo" and value == "0" and self.turbo_disabled:
                raise self._refused(rel, value, errno.EPERM)
            boost = f"{CPU_SYS}/cpufreq/boost"
            if name == "boost" and rel != boost and self.exists(boost) and self.read(boost) == "0":
                raise self._refused(rel, value, errno.EINVAL)
        elif name == "max_perf_pct":
            low = int(self.read(f"{directory}/min_perf_pct"))
            value = str(self._number(rel, value, low, 100))
        elif name == "min_perf_pct":
            high = int(self.read(f"{directory}/max_perf_pct"))
            value = str(self._number(rel, value, INTEL_MIN_PERF_PCT, high))
        return super().shown(rel, value)

    def write(self, rel: str, value: str) -> None:
        rel = rel.lstrip("/")
        directory = rel.rpartition("/")[0]
        limits = [f"{directory}/scaling_{b}_freq" for b in ("min", "max")]
        if rel in limits:
            for path in limits:
                self.requests.setdefault(path, int(self.read(path)))
            self.requests[rel] = self._number(rel, value.strip(), 0, 2**32 - 1)
        super().write(rel, value)
        if rel in limits:
            lo = int(self.read(f"{directory}/cpuinfo_min_freq"))
            hi = int(self.read(f"{directory}/cpuinfo_max_freq"))
            high = min(max(self.requests[limits[1]], lo), hi)
            low = min(max(self.requests[limits[0]], lo), high)
            self.path(limits[0]).write_text(f"{low}\n")
            self.path(limits[1]).write_text(f"{high}\n")
        if rel == f"{CPU_SYS}/cpufreq/boost":
            for policy in sorted(self.path(f"{CPU_SYS}/cpufreq").glob("policy*/boost")):
                policy.write_text(f"{value.strip()}\n")


# -- one fake machine with everything the built-in plugins touch ---------------------------

INTERRUPTS = """\
           CPU0       CPU1       CPU2       CPU3
 24:          1          0          0          0   IO-APIC   5-edge      ACPI:Ged
 41:        696          0          0          0   PCI-MSIX-0000:00:04.0   1-edge      virtio3-rx
"""


def make_fake_machine(tmp_path: Path) -> System:
    """A 4-CPU machine: sysctls, cpuidle and PM QoS, two IRQs, kthreadd and kswapd0, the
    workqueue cpumasks, a NIC with a driver (FakeEthtool), KSM, intel_pstate's cpufreq tree
    and transparent hugepages; its writes behave like the kernel's (CpufreqLikeSystem)."""
    root = make_fake_root(tmp_path)
    add_cpuidle(root)
    add_irqs(root, INTERRUPTS)
    sched = FakeSched({0, 1, 2, 3})
    add_task(root, 1, "systemd", ppid=0, start_time=5)
    add_task(root, 2, "kthreadd", ppid=0, flags=0x00208040, start_time=5)
    add_kthread(root, 45, "kswapd0")
    for pid in (1, 2, 45):
        sched.add(pid)
    put(root, "sys/devices/virtual/workqueue/writeback/cpumask", "f")
    put(root, "sys/devices/virtual/workqueue/cpumask", "f")
    add_nic(root, "eth0", 2, mac="52:54:00:12:34:56", assign=0, bus="0000:00:04.0",
            driver="virtio_net")  # fmt: skip
    ethtool = FakeEthtool(
        {
            "eth0": FakeNic(
                values={"coalesce": {"rx-frames": 1, "rx-usecs": 0}, "channels": {"combined": 1}},
                features={"rx-gro": False},
                changeable={"rx-gro"},
            )
        }
    )
    put(root, "sys/kernel/mm/ksm/run", "0")
    add_intel_pstate(root)
    put(root, "sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never")
    return CpufreqLikeSystem(root, sched=sched, ethtool=ethtool)


# -- one fake machine per kind latencyd has met --------------------------------------------
# What decides how idle CPUs wait differs by kind (see latencyd/kernel/idle.py); so do the claims
# latencyd may make. Each builder lays out the files the kernel shows on that kind.

HALTPOLL_GUEST = "haltpoll guest"
NO_CPUIDLE_GUEST = "guest without a cpuidle driver"
INTEL_METAL = "bare metal with intel_idle"
MACHINE_KINDS = (HALTPOLL_GUEST, NO_CPUIDLE_GUEST, INTEL_METAL)

# The haltpoll governor's parameters, as the development VMs show them.
HALTPOLL_PARAMS = {"ns": "0", "grow": "2", "shrink": "2", "grow_start": "50000",
                   "allow_shrink": "Y"}  # fmt: skip
HALTPOLL_STATES = (("POLL", 0, 1000, 10), ("haltpoll idle", 1, 9000, 90))
# intel_idle on a Skylake-SP server: exit latencies 0, 1, 2 and 133 µs (85-170 on others).
INTEL_IDLE_STATES = (("POLL", 0, 100, 10), ("C1", 1, 2000, 20), ("C1E", 2, 3000, 30),
                     ("C6", 133, 90000, 40))  # fmt: skip


@dataclass(frozen=True)
class FakeMachine:
    kind: str
    root: Path
    system: System


def _cpuidle_dir(root: Path, driver: str, governor: str, governors: str) -> None:
    base = "sys/devices/system/cpu/cpuidle"
    put(root, f"{base}/current_driver", driver)
    put(root, f"{base}/current_governor", governor)
    put(root, f"{base}/current_governor_ro", governor)
    put(root, f"{base}/available_governors", governors)


def _common(root: Path, cpus: int, siblings: Callable[[int], str], hypervisor: bool) -> None:
    flags = "fpu vme sse hypervisor" if hypervisor else "fpu vme sse avx2"
    put(root, "proc/cpuinfo", "".join(f"processor\t: {c}\nflags\t\t: {flags}\n\n"
                                      for c in range(cpus)))  # fmt: skip
    for cpu in range(cpus):
        put(root, f"sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list", siblings(cpu))
    put(root, "sys/devices/system/node/node0/cpulist", f"0-{cpus - 1}")
    for name, value in HALTPOLL_PARAMS.items():
        put(root, f"sys/module/haltpoll/parameters/guest_halt_poll_{name}", value)


def make_machine_kind(tmp_path: Path, kind: str) -> FakeMachine:
    """A fake machine of one of MACHINE_KINDS, with a NIC, topology and cpuinfo for
    `recommend`:

    - haltpoll guest (the development VMs): 2 vCPUs, cpuidle driver and governor haltpoll,
      states POLL (0 µs) and "haltpoll idle" (1 µs), guest halt-polling off (0 ns),
      cpuidle_haltpoll force=Y, a virtio_net NIC;
    - guest without a cpuidle driver: 2 vCPUs, current_driver "none" and no cpuN/cpuidle
      (the governors are still registered), resume-latency files and /dev/cpu_dma_latency
      present, the haltpoll governor's parameters present but unused (force=N);
    - bare metal with intel_idle: 8 CPUs (4 cores with SMT, siblings N and N+4), states
      POLL, C1, C1E, C6, the menu governor, intel_pstate's cpufreq, an ice NIC, no
      hypervisor flag; the haltpoll parameters exist too (a distro kernel with the haltpoll
      governor built in, which registers it only under KVM).
    """
    if kind == INTEL_METAL:
        root = make_fake_root(tmp_path, cpus="0-7")
        add_cpuidle(root, range(8), INTEL_IDLE_STATES)
        _cpuidle_dir(root, "intel_idle", "menu", "ladder menu teo")
        _common(root, 8, lambda c: f"{c % 4},{c % 4 + 4}", hypervisor=False)
        add_intel_pstate(root, 8)
        add_nic(root, "ens1f0", 2, bus="0000:3b:00.0", driver="ice", queues=4)
        put(root, "sys/class/net/ens1f0/device/numa_node", "0")
        return FakeMachine(kind, root, CpufreqLikeSystem(root))
    root = make_fake_root(tmp_path, cpus="0-1")
    if kind == HALTPOLL_GUEST:
        add_cpuidle(root, range(2), HALTPOLL_STATES)
        _cpuidle_dir(root, "haltpoll", "haltpoll", "ladder menu haltpoll")
        put(root, "sys/module/cpuidle_haltpoll/parameters/force", "Y")
    elif kind == NO_CPUIDLE_GUEST:
        add_pm_qos(root, range(2))
        _cpuidle_dir(root, "none", "menu", "ladder menu haltpoll")
        put(root, "sys/module/cpuidle_haltpoll/parameters/force", "N")
    else:
        raise ValueError(f"unknown machine kind {kind!r}")
    _common(root, 2, str, hypervisor=True)
    add_nic(root, "eth0", 2, bus="0000:00:04.0", driver="virtio_net")
    put(root, "sys/class/net/eth0/device/numa_node", "-1")
    return FakeMachine(kind, root, SysfsLikeSystem(root))


# -- cgroups -------------------------------------------------------------------------------

V1_CPUSET_FILES = {
    "cpuset.cpus": "",
    "cpuset.mems": "",
    "cpuset.effective_mems": "0",
    "cpuset.cpu_exclusive": "0",
    "cpuset.sched_load_balance": "1",
    "cgroup.procs": "",
}
V2_CPUSET_FILES = {"cpuset.cpus": "", "cpuset.cpus.partition": "member", "cgroup.procs": ""}


def add_cgroups(root: Path, cpus: str, v1_cpuset: bool, v2_cpuset: bool) -> None:
    """A mountinfo with a v1 cpuset hierarchy and/or a unified one offering cpuset, and
    their root cgroups' files (every task starts in the root: add_task's tasks get a
    proc/PID/cgroup from `place`)."""
    lines = ["31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw"]
    if v1_cpuset:
        lines.append("34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset")
        base = "sys/fs/cgroup/cpuset"
        for name, value in V1_CPUSET_FILES.items():
            put(root, f"{base}/{name}", value)
        put(root, f"{base}/cpuset.cpus", cpus)
        put(root, f"{base}/cpuset.mems", "0")
    lines.append("41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw")
    put(root, "sys/fs/cgroup/unified/cgroup.controllers", "cpuset cpu" if v2_cpuset else "cpu")
    put(root, "sys/fs/cgroup/unified/cgroup.subtree_control", "")
    put(root, "sys/fs/cgroup/unified/cgroup.procs", "")
    put(root, "proc/self/mountinfo", "\n".join(lines))
    put(root, "proc/sys/kernel/osrelease", "6.18.0")


class CgroupLikeSystem(System):
    """cgroupfs as the kernel keeps it, for what cannot run here (cpuset bound to v2): a
    cgroup made has its controller's files, subtree_control takes +/- words, a task
    written to cgroup.procs leaves its old cgroup (its proc/PID/cgroup follows), an
    isolated partition whose CPUs a sibling also claims reads "isolated invalid (...)",
    and a cgroup with tasks or child cgroups is not removed (EBUSY) until they are moved
    out (the facade's remove_cgroup moves the tasks). v1 cpusets nest as cpusets.rst
    says: a child's CPUs within its parent's (EINVAL), a parent's not shrunk from under a
    child's (EBUSY)."""

    def __init__(self, root: Path | str = "/", **backends: Any) -> None:
        super().__init__(root, **backends)
        self.writes: list[tuple[str, str]] = []
        # What each task's user asked with sched_setaffinity (the kernel's user_cpus_ptr),
        # taken at its first move: a move sets its CPUs to this and the cgroup's together.
        self.user_masks: dict[int, frozenset[int]] = {}

    def _follow_cpus(self, pid: int, folder: str, hierarchy: str) -> None:
        """A task's CPUs after a move, with a FakeSched: its user's, within the cgroup's."""
        sched = self.sched
        if not isinstance(sched, FakeSched) or pid not in sched.affinity:
            return
        user = self.user_masks.setdefault(pid, frozenset(sched.affinity[pid]))
        inside = (
            sched.all
            if folder == hierarchy
            else set(CpuSet.from_list(self.read(f"{folder}/cpuset.cpus")))
        )
        sched.affinity[pid] = frozenset(user & inside or inside)

    def cpuset_cpus(self, pid: int) -> CpuSet | None:
        """The CPUs the task's cpuset lets it run on: the nearest cpuset.cpus from its
        cgroup up that is not empty (v2's empty one means its parent's); None at the root
        or outside a cpuset."""
        cgroup = self.task_cgroup(pid)
        if cgroup is None:
            return None
        line = self.read(f"proc/{pid}/cgroup")
        hierarchy = "sys/fs/cgroup/cpuset" if ":cpuset:" in line else "sys/fs/cgroup/unified"
        folder = f"{hierarchy}{cgroup.rstrip('/')}"
        while folder != hierarchy:
            cpus = self.path(f"{folder}/cpuset.cpus")
            if cpus.exists() and cpus.read_text().strip():
                return CpuSet.from_list(cpus.read_text().strip())
            folder = folder.rsplit("/", 1)[0]
        return None

    def set_affinity(
        self, pid: int, cpus: CpuSet, only_from: CpuSet | None = None
    ) -> CpuSet | None:
        """As the kernel's sched_setaffinity: within the task's cpuset, which must allow
        one of the CPUs asked for (else EINVAL)."""
        if only_from is not None:
            found = self.affinity(pid)
            if found != only_from or found == cpus:
                return found
        allowed = self.cpuset_cpus(pid)
        if allowed is not None and not cpus & allowed:
            raise KernelRefused(
                f"setting the CPU affinity of pid {pid} to {cpus}",
                f"{os.strerror(errno.EINVAL)} (EINVAL)",
            )
        return super().set_affinity(pid, cpus)

    def place(self, pid: int, hierarchy: str, cgroup: str = "/") -> None:
        """Put a task in a cgroup as the kernel would show it."""
        procs = f"{hierarchy}{cgroup.rstrip('/')}/cgroup.procs"
        pids = sorted({*map(int, self.read(procs).split()), pid})  # as `sort -n` shows it
        put(self.root, procs, "\n".join(map(str, pids)))
        line = f"3:cpuset:{cgroup}" if hierarchy.endswith("cpuset") else f"0::{cgroup}"
        put(self.root, f"proc/{pid}/cgroup", line)

    def make_cgroup(self, rel: str) -> None:
        path = self.path(rel)
        if path.exists():
            return
        path.mkdir()
        parent = rel.rsplit("/", 1)[0]
        if parent.startswith("sys/fs/cgroup/cpuset"):
            files = V1_CPUSET_FILES
        elif "cpuset" in self.read(f"{parent}/cgroup.subtree_control").split():
            files = V2_CPUSET_FILES
        else:
            files = {"cgroup.procs": ""}
        for name, value in files.items():
            put(self.root, f"{rel}/{name}", value)

    def _v1_nest(self, folder: str, cpus: CpuSet) -> None:
        """v1's rules for a cpuset's new CPUs: within its parent's, around its children's."""
        parent = folder.rsplit("/", 1)[0]
        if parent != "sys/fs/cgroup/cpuset":
            theirs = CpuSet.from_list(self.read(f"{parent}/cpuset.cpus"))
            if not cpus.issubset(theirs):
                raise KernelRefused(f"writing {cpus} to /{folder}/cpuset.cpus", refusal(22))
        for child in self.path(folder).iterdir():
            if child.is_dir() and not CpuSet.from_list(
                (child / "cpuset.cpus").read_text().strip()
            ).issubset(cpus):
                raise KernelRefused(f"writing {cpus} to /{folder}/cpuset.cpus", refusal(16))

    def _rmdir_cgroup(self, where: str) -> None:
        path = self.path(where)
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory")
        if self.read(f"{where}/cgroup.procs") or any(c.is_dir() for c in path.iterdir()):
            raise OSError(errno.EBUSY, "Device or resource busy")
        for child in path.iterdir():
            child.unlink()
        path.rmdir()

    def write(self, rel: str, value: str) -> None:
        rel = rel.lstrip("/")
        self.writes.append((rel, value))
        folder, _, name = rel.rpartition("/")
        if name == "cgroup.subtree_control":
            words = set(self.read(rel).split())
            words = words | {value[1:]} if value.startswith("+") else words - {value[1:]}
            put(self.root, rel, " ".join(sorted(words)))
        elif name == "cgroup.procs":
            if not self.path(rel).exists():
                raise KernelRefused(f"writing {value!r} to /{rel}", "No such file or directory")
            hierarchy = (
                "sys/fs/cgroup/cpuset"
                if rel.startswith("sys/fs/cgroup/cpuset")
                else "sys/fs/cgroup/unified"
            )
            for procs in self.path(hierarchy).rglob("cgroup.procs"):
                procs.write_text("\n".join(p for p in procs.read_text().split() if p != value))
            self.place(int(value), hierarchy, folder[len(hierarchy) :] or "/")
            self._follow_cpus(int(value), folder, hierarchy)
        elif name == "cpuset.cpus" and rel.startswith("sys/fs/cgroup/cpuset/"):
            self._v1_nest(folder, CpuSet.from_list(value))
            super().write(rel, value)
        elif name == "cpuset.cpus.partition" and value == "isolated":
            mine = self.read(f"{folder}/cpuset.cpus")
            siblings = [p for p in self.path(folder).parent.glob("*/cpuset.cpus")
                        if p.parent != self.path(folder)]  # fmt: skip
            taken = any(
                CpuSet.from_list(p.read_text().strip()) & CpuSet.from_list(mine) for p in siblings
            )
            put(self.root, rel, "isolated invalid (Cpu list in cpuset.cpus not exclusive)"
                if taken or not mine else "isolated")  # fmt: skip
        else:
            super().write(rel, value)
