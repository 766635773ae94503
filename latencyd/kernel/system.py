"""System: the only place latencyd touches the kernel.

Every read and write of /proc, /sys and /dev goes through here, rooted at a
path (default "/") so unit tests run the same plugin code against a fake tree.
Errors become `KernelRefused` with the errno spelled out, never a bare OSError.
Files latencyd is given to read (profiles) are read here too, by `read_guarded`: never
one that could block, and as root only one that root alone could have written.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import posixpath
import socket
import stat
import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

from latencyd.cpuset import CpuSet
from latencyd.errors import FileRefused, KernelRefused, describe_oserror
from latencyd.kernel.boot import BootReadings
from latencyd.kernel.cgroups import (
    CGROUP_ROOT,
    CgroupFacts,
    kernel_version,
    parse_mountinfo,
    systemd_unit,
    task_cgroup,
)
from latencyd.kernel.trust import untrusted
from latencyd.text import printable

KERNEL_SETTINGS = ("/proc/", "/sys/")  # where System.write may write
CGROUP_DRAIN_SECONDS = 5.0  # how long a cgroup's tasks are moved out before removing it gives up

if TYPE_CHECKING:
    from latencyd.kernel.ethtool import Ethtool
    from latencyd.kernel.systemd import SystemdManager


@dataclass(frozen=True)
class Machine:
    """Facts about the machine that values may refer to (``all`` CPUs, % of RAM)."""

    all_cpus: CpuSet
    mem_total_bytes: int


@dataclass(frozen=True)
class Tracefs:
    """tracefs as `System.tracefs` found or mounted it."""

    base: str  # where its files are, relative to the system's root
    where: str  # the same, for people
    release: Callable[[], object]  # gives back what `tracefs()` took (nothing, if found)


# How long a bootloader tool may run: update-grub probing many kernels (or os-prober many
# disks) takes minutes, and more under load.
TOOL_TIMEOUT_S = 600.0


class KeptFds(Protocol):
    """Where open fds outlive the process (systemd's fd store: latencyd.service.sdnotify),
    and the service manager that keeps them, which gives a start or stop only so long."""

    def take(self, prefix: str) -> list[tuple[str, int]]: ...

    def store(self, fd: int, name: str) -> bool: ...

    def remove(self, name: str) -> bool: ...

    def extend_timeout(self, seconds: float) -> bool: ...


class PmQos:
    """The daemon's one CPU latency request on /dev/cpu_dma_latency.

    The kernel keeps a request only while its fd is open, so the fd is the request.
    Changing the value opens the new request before closing the old one (make before
    break). With systemd's fd store the fd is also handed to the service manager, which
    passes it back on the next start: a restart or crash never drops the request.
    """

    FD_PREFIX = "pmqos-"  # fd-store names: pmqos-<µs>-<sequence>

    def __init__(self, device: Path, fdstore: KeptFds | None = None) -> None:
        self.device = device
        self.fdstore = fdstore
        self.fd = -1
        self.value_us: int | None = None
        self.name = ""
        if fdstore is not None:
            self._adopt(fdstore.take(self.FD_PREFIX))

    def _adopt(self, passed: list[tuple[str, int]]) -> None:
        """Keep the newest request a previous run stored; close any others."""
        newest = max(passed, key=lambda p: int(p[0].rsplit("-", 1)[1]), default=None)
        for name, fd in passed:
            if (name, fd) != newest:
                os.close(fd)
                self._forget(name)
        if newest is not None:
            self.name, self.fd = newest
            self.value_us = int(self.name.split("-")[1])

    def held(self) -> int | None:
        return self.value_us

    def hold(self, value_us: int) -> None:
        try:
            fd = os.open(self.device, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise KernelRefused(f"opening {self.device}", describe_oserror(exc)) from exc
        try:
            # The kernel takes a binary s32 (a hex string also works, but binary is exact).
            os.write(fd, struct.pack("=i", value_us))
        except OSError as exc:
            os.close(fd)
            raise KernelRefused(
                f"holding {value_us} µs on {self.device}", describe_oserror(exc)
            ) from exc
        old_fd, old_name = self.fd, self.name
        self.fd, self.value_us = fd, value_us
        self.name = f"{self.FD_PREFIX}{value_us}-{time.monotonic_ns()}"
        if self.fdstore is not None:
            self.fdstore.store(fd, self.name)
        self._close(old_fd, old_name)

    def release(self) -> None:
        self._close(self.fd, self.name)
        self.fd, self.value_us, self.name = -1, None, ""

    def _close(self, fd: int, name: str) -> None:
        if fd >= 0:
            os.close(fd)
            self._forget(name)

    def _forget(self, name: str) -> None:
        if self.fdstore is not None and name:
            self.fdstore.remove(name)

    def effective(self) -> int | None:
        """The kernel's aggregate CPU latency target (the minimum of every request)."""
        try:
            fd = os.open(self.device, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.read(fd, 4)
        finally:
            os.close(fd)
        return int(struct.unpack("=i", data)[0]) if len(data) == 4 else None


PF_EXITING = 0x00000004
PF_KTHREAD = 0x00200000
PF_NO_SETAFFINITY = 0x04000000
POLICIES = {
    "other": os.SCHED_OTHER,
    "fifo": os.SCHED_FIFO,
    "rr": os.SCHED_RR,
    "batch": os.SCHED_BATCH,
    "idle": os.SCHED_IDLE,
}
POLICY_NAMES = {v: k for k, v in POLICIES.items()}


@dataclass(frozen=True)
class Task:
    """What /proc/PID/stat says about a task, as far as latencyd cares."""

    pid: int
    comm: str
    ppid: int
    flags: int
    start_time: int  # clock ticks after boot: with pid, identifies the task across pid reuse
    # The CPU it last ran on (-1: not in the text read); not part of what the task is.
    last_cpu: int = field(default=-1, compare=False)

    @property
    def is_kthread(self) -> bool:
        """By the kernel's own flag: a usermode helper (modprobe, a hotplug script) is a
        child of kthreadd too, but a user process."""
        return bool(self.flags & PF_KTHREAD)

    @property
    def exiting(self) -> bool:
        """Being torn down (PF_EXITING): what its /proc files say is no longer its own (a
        dying task already shows the root cgroup)."""
        return bool(self.flags & PF_EXITING)

    @property
    def pinnable(self) -> bool:
        return not self.flags & PF_NO_SETAFFINITY

    @property
    def ident(self) -> str:
        return f"{self.pid}@{self.start_time}"


def parse_stat(pid: int, text: str) -> Task:
    # comm may contain spaces and parentheses: it runs to the *last* ')'.
    head, _, rest = text.rpartition(")")
    comm = head.partition("(")[2]
    fields = rest.split()
    last_cpu = int(fields[36]) if len(fields) > 36 else -1
    return Task(pid, comm, int(fields[1]), int(fields[6]), int(fields[19]), last_cpu)


# The pid fanotify reports for a writer whose pid the listener's PID namespace cannot name
# (a container's process, when latencyd runs in another namespace): no process of ours.
OUTSIDE_PID_NAMESPACE = 0


@dataclass(frozen=True)
class Writer:
    """A process that wrote a file, as fanotify names it (its pid) and as /proc said right
    after (comm and command line; "" once it had exited). Its own words are untrusted:
    `str()` escapes them for a log line or a terminal."""

    pid: int
    comm: str = ""
    cmdline: str = ""

    def __str__(self) -> str:
        if self.pid == OUTSIDE_PID_NAMESPACE:
            return "a process outside latencyd's PID namespace"
        return f"{self.pid} ({printable(self.comm)})" if self.comm else str(self.pid)

    def as_json(self) -> dict[str, object]:
        return {"pid": self.pid, "comm": self.comm, "cmdline": self.cmdline}


CMDLINE_HEAD = 4096  # of a writer's command line: what names it, not its 2 MB of arguments


@dataclass(frozen=True)
class Executable:
    path: str  # as the process's mount namespace names it
    # The file is latencyd's own user's and nobody else may write it: what another user
    # cannot forge by copying a program under the same name (a comm is anyone's choice).
    trusted: bool


class System:
    """The kernel, rooted at `root`. Backends for what is not a plain file: `sched`
    (scheduler calls; the os module, or a fake with its functions), `pmqos` (the PM QoS
    request fd, with systemd's fd store when given one), `ethtool` (NIC settings over
    netlink; unit tests pass a fake)."""

    def __init__(
        self,
        root: Path | str = "/",
        sched: ModuleType | Any = os,
        fdstore: KeptFds | None = None,
        ethtool: Ethtool | None = None,
    ) -> None:
        self.root = Path(root)
        self._prefix = str(self.root).rstrip("/") + "/"
        self.sched = sched
        self.pmqos = PmQos(self.path("dev/cpu_dma_latency"), fdstore)
        self.service_manager = fdstore
        self._ethtool = ethtool

    @property
    def ethtool(self) -> Ethtool:
        """NIC settings over ethtool netlink; its socket opens when a profile first needs it."""
        if self._ethtool is None:
            from latencyd.kernel.ethtool import NetlinkEthtool

            self._ethtool = NetlinkEthtool()
        return self._ethtool

    @property
    def systemd(self) -> SystemdManager:
        """systemd as PID 1, over its private socket under this root."""
        from latencyd.kernel.systemd import SystemdManager

        return SystemdManager(self.fspath("run/systemd/private"))

    @property
    def is_real(self) -> bool:
        return self.root == Path("/")

    def fspath(self, rel: str) -> str:
        """`path` as a string: building a Path costs more than the read it names, and the
        daemon does tens of thousands of small procfs reads for a big machine's threads."""
        return self._prefix + rel.lstrip("/")

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    # -- files ---------------------------------------------------------------
    def exists(self, rel: str) -> bool:
        return os.path.exists(self.fspath(rel))

    def read_only(self, rel: str) -> bool:
        """Whether the file's mode lets no one write it: procfs makes a setting the kernel
        takes from no one read-only (a kernel-managed IRQ's affinity), which root could
        still open for writing, to be refused at the write. False if it is missing."""
        try:
            return not os.stat(self.fspath(rel)).st_mode & 0o222
        except OSError:
            return False

    def realpath(self, rel: str) -> str:
        """Where a symlink (a device's sysfs link) leads, as an absolute path."""
        return os.path.realpath(self.path(rel))

    def glob(self, pattern: str) -> list[str]:
        """The paths that match `pattern` (glob syntax, relative to the root), sorted and
        relative to the root."""
        import glob

        return sorted(p[len(self._prefix) :] for p in glob.glob(self.fspath(pattern)))

    def listdir(self, rel: str) -> list[str]:
        """Entries of a directory; none if it is missing or not a directory."""
        try:
            return sorted(os.listdir(self.fspath(rel)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def entries(self, rel: str) -> Iterator[str]:
        """Entries of a directory as the kernel lists them (unsorted, read as iterated: a
        process's 20,000 thread ids come a batch at a time); none if it is missing."""
        try:
            with os.scandir(self.fspath(rel)) as listing:
                for entry in listing:
                    yield entry.name
        except (FileNotFoundError, NotADirectoryError):
            return

    def read(self, rel: str) -> str:
        try:
            return _read_text(self.fspath(rel)).strip()
        except OSError as exc:
            raise KernelRefused(f"reading /{rel.lstrip('/')}", describe_oserror(exc)) from exc

    def write(self, rel: str, value: str) -> None:
        """Write one value in a single write(2), as the kernel expects for sysfs/procfs.
        Only kernel settings are written here: a path that leads out of /proc and /sys
        (a journal's tampered target) is refused whatever asked for it."""
        where = posixpath.normpath("/" + rel.lstrip("/"))
        what = f"writing {value!r} to {where}"
        if not where.startswith(KERNEL_SETTINGS):
            raise KernelRefused(what, "latencyd writes kernel settings under /proc and /sys only")
        data = value.encode()
        try:
            fd = os.open(self.fspath(where), os.O_WRONLY | os.O_TRUNC)
        except OSError as exc:
            raise KernelRefused(what, describe_oserror(exc)) from exc
        try:
            written = os.write(fd, data)
        except OSError as exc:
            raise KernelRefused(what, f"the kernel refused it: {describe_oserror(exc)}") from exc
        finally:
            os.close(fd)
        if written != len(data):  # the kernel took part of it: what it holds is unknown
            raise KernelRefused(what, f"the kernel took {written} of its {len(data)} bytes")

    # -- machine facts ---------------------------------------------------------
    def interface_name(self, ifindex: int) -> str | None:
        """The network interface with this index now, or None: one ioctl on the real
        system (a burst of removals must not list every NIC for each), a scan of the
        fake root's sysfs otherwise."""
        if self.is_real:
            try:
                return socket.if_indextoname(ifindex)
            except OSError:
                return None
        for name in self.listdir("sys/class/net"):
            try:
                if self.read(f"sys/class/net/{name}/ifindex") == str(ifindex):
                    return name
            except KernelRefused:
                continue
        return None

    def boot_readings(self) -> BootReadings:
        """How the running kernel booted, as it shows it (latencyd.kernel.boot)."""
        cpu = "sys/devices/system/cpu"

        def cpus(rel: str) -> CpuSet | None:
            if not self.exists(rel):
                return None
            try:  # "(null)" where the mask was never allocated: none
                return CpuSet.from_list(self.read(rel))
            except ValueError:
                return CpuSet()

        offloaded = []
        with contextlib.suppress(KernelRefused):  # kthreadd's children: the kernel threads
            for pid in self.read("proc/2/task/2/children").split():
                with contextlib.suppress(KernelRefused):
                    comm = self.read(f"proc/{pid}/comm")
                    kind, _, number = comm.partition("/")
                    if kind == "rcuop" and number.isdigit():
                        offloaded.append(int(number))
        return BootReadings(
            cmdline=self.read("proc/cmdline"),
            possible=cpus(f"{cpu}/possible") or self.online_cpus(),
            isolated=cpus(f"{cpu}/isolated"),
            nohz_full=cpus(f"{cpu}/nohz_full"),
            rcu_nocb_capable=self.exists("sys/module/rcutree/parameters/rcu_nocb_gp_stride"),
            rcu_offloaded=CpuSet(offloaded),
        )

    def online_cpus(self) -> CpuSet:
        return CpuSet.from_list(self.read("sys/devices/system/cpu/online"))

    def machine(self) -> Machine:
        """The facts profile values may refer to: the online CPUs ("all") and RAM ("3%")."""
        return Machine(self.online_cpus(), self.mem_total_bytes())

    def mem_total_bytes(self) -> int:
        for line in self.read("proc/meminfo").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
        raise KernelRefused("reading /proc/meminfo", "no MemTotal line")

    def read_file(self, rel: str) -> str:
        """A configuration file's whole text as it is (read strips kernel values), read
        without blocking and at most 1 MiB of it."""
        try:
            return read_guarded(self.path(rel), 1 << 20, False, "file").decode(errors="replace")
        except FileRefused as exc:
            raise KernelRefused(f"reading /{rel.lstrip('/')}", str(exc)) from exc

    def replace_file(self, rel: str, text: str) -> None:
        """Replace a configuration file (/etc/kernel/cmdline, a GRUB drop-in, latencyd's
        record of them) atomically and durably: a fresh temporary file beside it (O_EXCL,
        no symlink followed), written whole, given the file's mode and fsync'd, renamed
        over it, the directory fsync'd. A crash at any moment leaves the old file or the
        new one, whole, never an empty or torn one, and once this returns the new one
        survives a power cut."""
        path = self.path(rel)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                replace_at(directory, path.name, text.encode())
            finally:
                os.close(directory)
        except OSError as exc:
            raise KernelRefused(
                f"writing /{rel.lstrip('/')}", describe_oserror(exc, nofollow=True)
            ) from exc

    def remove_file(self, rel: str) -> None:
        """Remove a file (none there: nothing to do), durably: the directory is fsync'd."""
        path = self.path(rel)
        try:
            path.unlink(missing_ok=True)
            with contextlib.suppress(FileNotFoundError):  # no directory: no file either
                directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
        except OSError as exc:
            raise KernelRefused(f"removing /{rel.lstrip('/')}", describe_oserror(exc)) from exc

    # -- cgroups -------------------------------------------------------------------
    def cgroup_facts(self) -> CgroupFacts:
        """The cgroup hierarchies mounted, what the unified one offers, the kernel's
        version and whether systemd runs the machine (latencyd.kernel.cgroups.choose)."""
        mounts = parse_mountinfo(self.read_or_empty("proc/self/mountinfo"))
        unified = next((m.path for m in mounts if m.version == 2), None)
        offered = self.read_or_empty(f"{unified}/cgroup.controllers") if unified else ""
        return CgroupFacts(
            tuple(mounts),
            frozenset(offered.split()),
            kernel_version(self.read_or_empty("proc/sys/kernel/osrelease")),
            self.exists("run/systemd/system"),
        )

    def names_kthreads_at_fork(self) -> bool:
        """Whether the kernel names a new kernel thread before its fork is reported (from
        Linux 6.4, "kernel: Allow a kernel thread's name to be set in copy_process"),
        instead of renaming it just after, which a rename event reports."""
        return kernel_version(self.read_or_empty("proc/sys/kernel/osrelease")) >= (6, 4)

    def read_or_empty(self, rel: str) -> str:
        """A file's whole text as it is (unstripped), or "" where it cannot be read."""
        try:
            return _read_text(self.fspath(rel))
        except OSError:
            return ""

    def writer(self, pid: int) -> Writer:
        """The process `pid` as it is now: its comm and the head of its command line
        (arguments joined by blanks), or the pid alone once it has exited (or when it is
        OUTSIDE_PID_NAMESPACE: /proc has no entry 0 to read)."""
        if pid == OUTSIDE_PID_NAMESPACE:
            return Writer(pid)
        comm = self.read_or_empty(f"proc/{pid}/comm").removesuffix("\n")
        try:
            fd = os.open(self.fspath(f"proc/{pid}/cmdline"), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return Writer(pid, comm)
        try:
            head = os.read(fd, CMDLINE_HEAD)
        except OSError:
            head = b""
        finally:
            os.close(fd)
        return Writer(pid, comm, head.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace"))

    def task_cgroup(self, pid: int) -> str | None:
        """The process's cpuset cgroup (latencyd.kernel.cgroups.task_cgroup); None once it
        has exited."""
        try:
            return task_cgroup(_read_text(self.fspath(f"proc/{pid}/cgroup")))
        except OSError:
            return None

    def task_unit(self, pid: int) -> str | None:
        """The systemd unit the process runs in (latencyd.kernel.cgroups.systemd_unit);
        None outside one, or once it has exited."""
        try:
            return systemd_unit(_read_text(self.fspath(f"proc/{pid}/cgroup")))
        except OSError:
            return None

    def executable(self, pid: int) -> Executable | None:
        """The process's executable (proc/PID/exe): its path and whether only latencyd's
        own user (root) could have put it there; None if it cannot be read (exited, a
        kernel thread)."""
        link = self.fspath(f"proc/{pid}/exe")
        try:
            path, st = os.readlink(link), os.stat(link)
        except OSError:
            return None
        if path.startswith(self._prefix):  # a fake root's link: the path inside it
            path = "/" + path[len(self._prefix) :]
        return Executable(path, st.st_uid == os.geteuid() and not st.st_mode & 0o022)

    def cgroup_pids(self, rel: str) -> list[int]:
        """The processes in a cgroup and in every cgroup below it; none if it is gone."""
        pids = [int(p) for p in self.read_or_empty(f"{rel}/cgroup.procs").split()]
        for name in self.listdir(rel):
            if self.exists(f"{rel}/{name}/cgroup.procs"):
                pids += self.cgroup_pids(f"{rel}/{name}")
        return pids

    def make_cgroup(self, rel: str) -> None:
        """Create a cgroup (a directory of a mounted hierarchy under /sys/fs/cgroup)."""
        where = self._cgroup_path(rel, "creating")
        try:
            os.mkdir(self.fspath(where), 0o755)
        except FileExistsError:
            return
        except OSError as exc:
            raise KernelRefused(f"creating cgroup {where}", describe_oserror(exc)) from exc

    def remove_cgroup(self, rel: str) -> None:
        """Remove a cgroup latencyd made, moving what runs in it to its parent first
        (a task born there after latencyd moved its parent in came from the parent's
        cgroup too). Tasks forking or exiting meanwhile are moved on a later round: rounds
        go on while the budget lasts, not for a count (16 rounds back to back ran out on a
        loaded machine, CI of 2026-11-29); a refusal names the tasks left and why."""
        where = self._cgroup_path(rel, "removing")
        parent = posixpath.dirname(where)
        deadline = time.monotonic() + CGROUP_DRAIN_SECONDS
        left: dict[str, str] = {}  # pid -> why its last move failed ("" if it did not)
        while True:
            try:
                self._rmdir_cgroup(where)
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise KernelRefused(f"removing cgroup {where}", describe_oserror(exc)) from exc
            if time.monotonic() > deadline:
                break
            left = {}
            for pid in self.read_or_empty(f"{where}/cgroup.procs").split():
                try:
                    self.write(f"{parent}/cgroup.procs", pid)
                    left[pid] = ""
                except KernelRefused as exc:  # exited meanwhile, or the kernel refused it
                    left[pid] = exc.reason
            time.sleep(0.001 if not left else 0.02)  # an exiting task leaves in its own time
        named = ", ".join(
            f"{pid} ({self.read_or_empty(f'proc/{pid}/comm').strip()})"
            + (f": {why}" if why else "")
            for pid, why in list(left.items())[:5]
        )
        raise KernelRefused(
            f"removing cgroup {where}",
            f"its tasks kept coming back for {CGROUP_DRAIN_SECONDS:.0f} s"
            + (f" (last seen: {named})" if named else ""),
        )

    def _rmdir_cgroup(self, where: str) -> None:
        """rmdir(2) of a cgroup: EBUSY while tasks are in it (a fake root overrides it)."""
        os.rmdir(self.fspath(where))

    @staticmethod
    def _cgroup_path(rel: str, doing: str) -> str:
        where = posixpath.normpath("/" + rel.lstrip("/"))
        if not where.startswith(f"/{CGROUP_ROOT}/") or where.count("/") < 5:
            raise KernelRefused(f"{doing} cgroup {where}", f"not a cgroup under /{CGROUP_ROOT}")
        return where

    # -- tasks -------------------------------------------------------------------
    def task(self, pid: int) -> Task | None:
        """The task's stat, or None if it has exited. Read from its main thread's own stat
        (proc/PID/task/PID/stat): the process's proc/PID/stat sums CPU times over every
        thread, so reading it once per thread of a 20,000-thread process is quadratic."""
        try:
            return parse_stat(pid, _read_text(self.fspath(f"proc/{pid}/task/{pid}/stat")))
        except (OSError, IndexError, ValueError):
            return None

    def task_uid(self, pid: int) -> int | None:
        """The effective uid the task runs as (proc/PID/status), None if it has exited:
        a name is anyone's to take, running as root is not."""
        try:
            for line in _read_text(self.fspath(f"proc/{pid}/status")).splitlines():
                if line.startswith("Uid:"):
                    return int(line.split()[2])
        except (OSError, IndexError, ValueError):
            pass
        return None

    def is_root_process(self, pid: int, comm: str) -> bool:
        """Whether `pid` is a process named `comm` that runs as root (irqbalance, say):
        anyone may name a process so, only root's is the service."""
        try:
            named = _read_text(self.fspath(f"proc/{pid}/comm")).strip() == comm
        except OSError:
            return False
        return named and self.task_uid(pid) == 0

    def root_process(self, comm: str) -> int | None:
        """The pid of a process named `comm` that runs as root (is_root_process)."""
        return next(iter(self.root_processes(comm)), None)

    def root_processes(self, comm: str) -> Iterator[int]:
        """The pids of the processes named `comm` that run as root (one scan of /proc)."""
        for entry in self.entries("proc"):
            if entry.isdigit() and self.is_root_process(int(entry), comm):
                yield int(entry)

    def root_process_by_pidfile(self, rel: str, comm: str) -> int | None:
        """The process a daemon's pid file names, if it is still that daemon (named `comm`,
        run by root): a stale file names nothing, or someone else."""
        try:
            pid = int(self.read_or_empty(rel).split()[0])
        except (IndexError, ValueError):
            return None
        return pid if pid > 0 and self.is_root_process(pid, comm) else None

    def ancestors(self, pid: int) -> list[int]:
        """pid, its parent, and so on up to init (bounded: a loop cannot trap us)."""
        chain = []
        for _ in range(64):
            task = self.task(pid)
            if task is None or pid in chain:
                break
            chain.append(pid)
            if task.ppid <= 1:
                break
            pid = task.ppid
        return chain

    def children(self, pid: int) -> list[int]:
        """The processes `pid`'s threads started (proc/PID/task/TID/children, where the
        kernel has CONFIG_PROC_CHILDREN; [] where it has not, or the process is gone)."""
        found: list[int] = []
        for tid in self.entries(f"proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError):
                found += map(
                    int, _read_text(self.fspath(f"proc/{pid}/task/{tid}/children")).split()
                )
        return found

    def tasks(self) -> list[Task]:
        out = []
        for entry in self.listdir("proc"):
            if entry.isdigit():
                task = self.task(int(entry))
                if task is not None:
                    out.append(task)
        return out

    def threads(self, pid: int) -> Iterator[tuple[Task, int]]:
        """Process `pid`'s threads: (each one's stat, the nanoseconds it has run: the
        first number of its schedstat). A thread that exits while read is left out, and
        only that one."""
        for tid in self.entries(f"proc/{pid}/task"):
            base = f"proc/{pid}/task/{tid}"
            try:
                ran = int(_read_text(self.fspath(f"{base}/schedstat")).split()[0])
                task = parse_stat(int(tid), _read_text(self.fspath(f"{base}/stat")))
            except (OSError, IndexError, ValueError):
                continue
            yield task, ran

    def affinity(self, pid: int) -> CpuSet:
        try:
            return CpuSet.from_kernel(self.sched.sched_getaffinity(pid))
        except OSError as exc:
            raise KernelRefused(
                f"reading the CPU affinity of pid {pid}", describe_oserror(exc)
            ) from exc

    def set_affinity(
        self, pid: int, cpus: CpuSet, only_from: CpuSet | None = None
    ) -> CpuSet | None:
        """Set the task's CPUs; None once written. With `only_from`, only if the task still
        holds those CPUs (and not already `cpus`), else what it holds, unwritten: the read
        and the write back to back, as sched_setaffinity has no compare-and-swap and a pin
        the task makes itself in between (`taskset -c 1 app` starting) would be undone."""
        wanted = cpus.as_frozenset()
        expected = only_from.as_frozenset() if only_from is not None else None
        try:
            if expected is not None:
                found = self.sched.sched_getaffinity(pid)
                if found != expected or found == wanted:
                    return CpuSet.from_kernel(found)
            self.sched.sched_setaffinity(pid, wanted)
        except OSError as exc:
            raise KernelRefused(
                f"setting the CPU affinity of pid {pid} to {cpus}", describe_oserror(exc)
            ) from exc
        return None

    def scheduler(self, pid: int) -> tuple[str, int]:
        try:
            policy = int(self.sched.sched_getscheduler(pid))
            priority = int(self.sched.sched_getparam(pid).sched_priority)
        except OSError as exc:
            raise KernelRefused(
                f"reading the scheduling policy of pid {pid}", describe_oserror(exc)
            ) from exc
        # SCHED_RESET_ON_FORK may be or-ed into the policy; it is not ours to change.
        return POLICY_NAMES.get(policy & ~0x40000000, str(policy)), priority

    def set_scheduler(self, pid: int, policy: str, priority: int) -> None:
        try:
            self.sched.sched_setscheduler(pid, POLICIES[policy], os.sched_param(priority))
        except OSError as exc:
            raise KernelRefused(
                f"setting pid {pid} to {policy} priority {priority}", describe_oserror(exc)
            ) from exc

    # -- services ------------------------------------------------------------------
    def restart_service(self, unit: str) -> bool:
        """`systemctl --no-block try-restart UNIT` when systemd runs the machine; False
        otherwise. Queued, not waited for: a unit slow to stop must not hold the daemon's
        main loop (its own stop timeout is seconds)."""
        if not self.is_real or not os.path.isdir("/run/systemd/system"):
            return False
        import subprocess

        try:
            result = subprocess.run(["systemctl", "--no-block", "try-restart", unit],
                                    capture_output=True, timeout=5, check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0

    def run_tool(self, argv: list[str], env: dict[str, str] | None = None,
                 timeout_s: float = TOOL_TIMEOUT_S) -> str:  # fmt: skip
        """Run a tool of the machine's own (kernel-install, grubby, update-grub) and give
        its output; KernelRefused saying what it printed when it fails. `env` is added to
        the daemon's environment. Under systemd, a start or stop that runs one is given
        the tool's time on top of its own (EXTEND_TIMEOUT_USEC): a start that finishes a
        boot write cut short, or takes out arguments, runs update-grub, which takes
        minutes on some machines, and a start killed at TimeoutStartSec= leaves that write
        unfinished again for the next, also killed, in a loop."""
        import subprocess

        what = " ".join(argv)
        if self.service_manager is not None:
            self.service_manager.extend_timeout(timeout_s + 30)
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                                    env={**os.environ, **(env or {})}, check=False)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise KernelRefused(f"running {what}", str(exc)) from exc
        if result.returncode != 0:
            said = (result.stderr or result.stdout).strip().splitlines()
            raise KernelRefused(
                f"running {what}", said[-1] if said else f"exit {result.returncode}"
            )
        return result.stdout

    def which(self, tool: str) -> str | None:
        """Where the machine's `tool` is: on PATH for the real system; in a staged root,
        its own /usr/sbin, /usr/bin, /sbin or /bin only (the host's grubby would change
        the host's boot configuration, whatever root it was meant for)."""
        import shutil

        if self.is_real:
            return shutil.which(tool)
        for where in ("usr/sbin", "usr/bin", "sbin", "bin"):
            if os.access(self.fspath(f"{where}/{tool}"), os.X_OK):
                return self.fspath(f"{where}/{tool}")
        return None

    def unix_request(self, rel: str, text: str, timeout_s: float = 1.0) -> bool:
        """Send `text` to the stream socket at `rel`, with this process's credentials
        (SCM_CREDENTIALS: a daemon that takes commands from root only checks them), and
        close. Whether it was delivered; False where there is no such socket."""
        import socket

        creds = struct.pack("3i", os.getpid(), os.geteuid(), os.getegid())
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout_s)
                sock.connect(self.fspath(rel))
                ancillary = [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)]
                data = text.encode()
                if sock.sendmsg([data], ancillary) != len(data):
                    return False
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            return False
        return True

    # -- perf counters -----------------------------------------------------------------
    TRACEFS = ("sys/kernel/tracing", "sys/kernel/debug/tracing")

    # -- a private tracefs instance (the noise watch) ------------------------------------
    def tracefs(self, mount: bool = True) -> Tracefs:
        """tracefs, to be given back with `release()` when done: where it is mounted
        already; else, on the real system, a mount of its own attached nowhere
        (`_private_mount`): the host's mount table never shows it, and the kernel drops it
        with this process, even one killed with SIGKILL (a mount at /sys/kernel/tracing
        outlived a killed daemon); else (before Linux 5.2, a fake root), with `mount`,
        mounted at /sys/kernel/tracing and unmounted by `release()`."""
        for base in self.TRACEFS:
            if self.exists(f"{base}/instances"):
                return Tracefs(base, f"/{base}", lambda: None)
        fd = _private_mount("tracefs") if self.is_real else None
        if fd is not None:
            return Tracefs(f"proc/self/fd/{fd}", "a private tracefs mount", lambda: os.close(fd))
        if not mount:
            raise KernelRefused("mounting tracefs privately", "not supported here")
        import subprocess

        where = self.TRACEFS[0]
        result = subprocess.run(["mount", "-t", "tracefs", "nodev", self.fspath(where)],
                                capture_output=True, text=True, check=False)  # fmt: skip
        if result.returncode != 0 or not self.exists(f"{where}/instances"):
            raise KernelRefused("mounting tracefs", result.stderr.strip() or "no instances dir")
        unmount = ["umount", self.fspath(where)]
        return Tracefs(
            where, f"/{where}", lambda: subprocess.run(unmount, capture_output=True, check=False)
        )

    def open_trace_instance(
        self, base: str, name: str, cpus: CpuSet, events: Iterable[tuple[str, str]],
        buffer_kb: int,
    ) -> dict[int, int]:  # fmt: skip
        """A private instance (its own buffers, nothing global touched) tracing `events`
        on `cpus` only: cpu -> non-blocking fd of its trace_pipe_raw."""
        inst = f"{base}/instances/{name}"
        try:
            os.mkdir(self.fspath(inst))
        except FileExistsError:
            pass  # left by a killed daemon: reused, as configured below
        except OSError as exc:
            raise KernelRefused(f"creating /{inst}", describe_oserror(exc)) from exc
        self.write(f"{inst}/tracing_on", "0")
        self.write(f"{inst}/buffer_size_kb", str(buffer_kb))
        self.write(f"{inst}/trace_clock", "mono")  # timestamps comparable to CLOCK_MONOTONIC
        self.write(f"{inst}/tracing_cpumask", cpus.to_mask())
        for system, event in events:
            self.write(f"{inst}/events/{system}/{event}/enable", "1")
        fds = {}
        for cpu in cpus:
            path = self.fspath(f"{inst}/per_cpu/cpu{cpu}/trace_pipe_raw")
            fds[cpu] = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.write(f"{inst}/tracing_on", "1")
        return fds

    @staticmethod
    def read_trace_pages(fd: int, page_size: int = 4096) -> list[bytes]:
        """The pages the kernel has for this CPU now (each read hands out one)."""
        pages = []
        while True:
            try:
                chunk = os.read(fd, page_size)
            except BlockingIOError:
                break
            if not chunk:
                break
            pages.append(chunk)
        return pages

    def close_trace_instance(self, base: str, name: str, fds: Iterable[int]) -> None:
        for fd in fds:
            os.close(fd)
        inst = f"{base}/instances/{name}"
        with contextlib.suppress(KernelRefused):  # one gone already is removed by nobody
            self.write(f"{inst}/tracing_on", "0")
        if not self.remove_trace_instance(base, name) and self.exists(inst):  # read elsewhere
            busy = OSError(errno.EBUSY, os.strerror(errno.EBUSY))
            raise KernelRefused(f"removing /{inst}", describe_oserror(busy))

    def remove_trace_instance(self, base: str, name: str) -> bool:
        """Remove an instance nobody reads, and its buffers with it. False if there is
        none, or if it is read (EBUSY: another latencyd's watch has its files open)."""
        inst = f"{base}/instances/{name}"
        try:
            os.rmdir(self.fspath(inst))
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            raise KernelRefused(f"removing /{inst}", describe_oserror(exc)) from exc
        return True

    def tracepoint_id(self, category: str, name: str) -> int | None:
        """The tracepoint's id, or None when tracefs is not mounted (or it does not exist)."""
        for base in self.TRACEFS:
            path = f"{base}/events/{category}/{name}/id"
            if self.exists(path):
                return int(self.read(path))
        return None

    def open_tracepoint_counters(self, tracepoint_id: int, cpus: CpuSet) -> dict[int, int]:
        """One counting perf event per CPU (no sampling, no ring buffer): cpu -> fd."""
        fds: dict[int, int] = {}
        if _NR_PERF_EVENT_OPEN is None:
            raise KernelRefused("opening perf counters", f"unsupported on {platform.machine()}")
        attr = _PerfEventAttr(
            type=_PERF_TYPE_TRACEPOINT, size=ctypes.sizeof(_PerfEventAttr), config=tracepoint_id
        )
        try:
            for cpu in cpus:
                fd = _libc.syscall(
                    _NR_PERF_EVENT_OPEN, ctypes.byref(attr), -1, cpu, -1, _PERF_FLAG_FD_CLOEXEC
                )
                if fd < 0:
                    err = ctypes.get_errno()
                    raise KernelRefused(
                        f"opening a perf counter on CPU {cpu}",
                        describe_oserror(OSError(err, os.strerror(err))),
                    )
                fds[cpu] = fd
        except KernelRefused:
            for fd in fds.values():
                os.close(fd)
            raise
        return fds

    @staticmethod
    def read_counter(fd: int) -> int:
        return int(struct.unpack("=Q", os.read(fd, 8))[0])

    @staticmethod
    def close_counters(fds: Iterable[int]) -> None:
        for fd in fds:
            os.close(fd)


def _read_text(path: str | Path) -> str:
    """A kernel file's text, with plain syscalls: half the cost of Path.read_text, which
    matters for the many small procfs/sysfs reads per event. Undecodable bytes (a task's
    comm may hold any) are replaced, never an exception."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


# perf_event_open(2): only the fields a plain counter needs; `size` tells the kernel.
_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}.get(platform.machine())
_PERF_TYPE_TRACEPOINT = 2
_PERF_FLAG_FD_CLOEXEC = 8
_libc = ctypes.CDLL(None, use_errno=True)


# fsopen(2), fsconfig(2), fsmount(2): one number on every architecture but alpha.
_NR_FSOPEN, _NR_FSCONFIG, _NR_FSMOUNT = 430, 431, 432
_FSCONFIG_CMD_CREATE = 6
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 1


def _private_mount(fstype: str) -> int | None:
    """A mount of `fstype` attached to no directory: its fd reaches the files (as
    /proc/self/fd/FD), and it is gone when the fd is closed. None where the kernel says no."""
    fs = _libc.syscall(_NR_FSOPEN, fstype.encode(), _FSOPEN_CLOEXEC)
    if fs < 0:
        return None
    try:
        if _libc.syscall(_NR_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0) < 0:
            return None
        mount = int(_libc.syscall(_NR_FSMOUNT, fs, _FSMOUNT_CLOEXEC, 0))
        return mount if mount >= 0 else None
    finally:
        os.close(fs)


# -- files latencyd is given to read -----------------------------------------------------

# File systems whose files are kernel interfaces, not files: a read may block forever
# (/proc/kmsg, tracefs's trace_pipe) or take what another reader waits for. From
# <linux/magic.h>, by statfs's f_type: a file system latencyd mounted itself, attached to
# no directory (tracefs, see _private_mount), is in no mount table, and a bind mount
# shows a name there that says nothing of what it holds; f_type always tells.
KERNEL_FILESYSTEMS = {
    0x9FA0: "procfs",
    0x62656572: "sysfs",
    0x74726163: "tracefs",
    0x64626720: "debugfs",
    0x73636673: "securityfs",
    0x62656570: "configfs",
    0x27E0EB: "cgroupfs",
    0x63677270: "cgroup2",
    0xCAFE4A11: "bpffs",
    0x6165676C: "pstore",
    0xDE5E81E4: "efivarfs",
    0xF97CFF8C: "selinuxfs",
}
_FILE_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}
# Looked at (fstat, fstatfs) without being opened: no driver's open() runs, nothing blocks.
_PROBE = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY


@dataclass(frozen=True)
class FileId:
    """One version of one file as stat tells it, for caches of what it holds: a write
    changes its size or mtime, a chmod or chown its mode, owner and ctime, a replacement
    its inode. (Two writes of the same size within one tick of the file system's clock
    look alike, as to every cache that goes by stat.)"""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int
    mode: int
    uid: int


def file_id(path: Path) -> FileId | None:
    """What `path` is now (a symbolic link itself, not what it names); None if nothing."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return FileId(
        st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid
    )


def filesystem_magic(fd: int) -> int:
    """statfs's f_type of the file system holding `fd` (os.fstatvfs has no f_type)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if _libc.fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    # f_type comes first, a long everywhere; unsigned, as <linux/magic.h> writes it.
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def read_guarded(path: Path, max_bytes: int, trusted: bool, what: str = "file") -> bytes:
    """The content of the regular file at `path`, read so that nothing can make it block
    or read more than `max_bytes`; any refusal is a FileRefused saying why (`what` names
    the file in it: "profile").

    The directory is resolved (symbolic links there are followed, as OpenSSH does), then
    opened one component at a time from / with O_NOFOLLOW; the file itself is not
    followed. It is looked at through an O_PATH descriptor before it is opened at all
    (no FIFO, device or kernel file system is ever opened), then opened with
    O_NONBLOCK|O_NOFOLLOW, checked to be the file looked at, and read to at most
    max_bytes + 1 bytes.

    `trusted` (the daemon as root): every directory from / down, and the file, must be
    owned by root and writable by no one else, as sudo and OpenSSH require, or a local
    user could swap in settings. A directory above may be writable by others if it is
    sticky (/tmp): no one else can then rename or remove what root made in it, and the
    next component's owner is checked in turn. The directory holding the file may not be,
    sticky or not: anyone could add a file to it that shadows a profile of the same name.
    """
    try:
        directory = _open_directory(Path(os.path.realpath(path.parent)), trusted)
        try:
            return read_regular_at(directory, path, max_bytes, trusted, what)
        finally:
            os.close(directory)
    except OSError as exc:
        raise FileRefused(f"cannot read {what}: {exc.strerror}") from exc


def _open_directory(directory: Path, trusted: bool) -> int:
    """An O_PATH descriptor of `directory` (absolute, resolved), reached from / one
    component at a time without following a link; each checked if `trusted`."""
    fd = os.open("/", _PROBE | os.O_DIRECTORY)
    try:
        here = Path("/")
        for part in ("", *directory.parts[1:]):
            if part:
                inner = os.open(part, _PROBE | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd, here = inner, here / part
            if trusted:  # the file's own directory may not be sticky: see read_guarded
                _check_owner(os.fstat(fd), f"directory {here}", sticky_allowed=here != directory)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _check_owner(st: os.stat_result, label: str, sticky_allowed: bool) -> None:
    """Root's alone: owned by root, and writable by no one else (but in a sticky directory
    where `sticky_allowed`): trust.untrusted's rule."""
    why = untrusted(st, (0,), sticky_allowed)
    if why:
        raise FileRefused(f"refusing {label}: {why}")


def write_all(fd: int, data: bytes) -> None:
    """Write every byte or fail: a write cut short (the disk filling up) is retried for the
    rest, which then fails with the reason (ENOSPC)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "the write made no progress")
        view = view[written:]


def replace_at(
    directory: int, name: str, data: bytes, tmp: str | None = None, mode: int | None = None
) -> None:
    """Make `name` in the directory open as `directory` hold `data`, never torn: a fresh
    temporary file `tmp` (O_EXCL, no symlink followed; a crash's leftover removed first),
    written whole, given `mode` (by default the mode of the file it replaces, 0644 for a
    new one) and fsync'd, renamed over it, the directory fsync'd. A failed write leaves
    the file as it was. How the journal and System.replace_file write."""
    tmp = tmp or f".{name}.latencyd-tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=directory)
    if mode is None:
        try:
            mode = stat.S_IMODE(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            mode = 0o644
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=directory)
    try:
        write_all(fd, data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=directory)
        raise
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)
    os.fsync(directory)


def read_regular_at(directory: int, path: Path, max_bytes: int, trusted: bool, what: str) -> bytes:
    """The regular file `path` in the directory open as `directory` (its name there; the
    whole path for messages), at most `max_bytes` of it, never blocking: how read_guarded
    and the journal read files. OSError when it cannot be opened (FileNotFoundError: there
    is none), FileRefused otherwise."""
    name = path.name
    label, larger = f"{what} {path}", f"{what} is larger than {max_bytes // 1024} KiB"
    probe = os.open(name, _PROBE, dir_fd=directory)
    try:
        looked_at = os.fstat(probe)
        kind = stat.S_IFMT(looked_at.st_mode)
        if kind != stat.S_IFREG:
            shown = _FILE_KINDS.get(kind, f"of file type {kind:o}")
            raise FileRefused(f"refusing {label}: {shown}, not a regular file")
        magic = filesystem_magic(probe)
    finally:
        os.close(probe)
    if magic in KERNEL_FILESYSTEMS:
        raise FileRefused(
            f"refusing {label}: a file of {KERNEL_FILESYSTEMS[magic]}, a kernel interface "
            "(reading it may block)"
        )
    if trusted:
        _check_owner(looked_at, label, sticky_allowed=False)
    if looked_at.st_size > max_bytes:
        raise FileRefused(larger)
    fd = os.open(name, _READ, dir_fd=directory)
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (looked_at.st_dev, looked_at.st_ino):
            raise FileRefused(f"refusing {label}: it was replaced while being opened")
        # Bounded however the file changes meanwhile; a regular file's reads are short
        # only at its end, so this is one read and the one that finds the end.
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > max_bytes:
        raise FileRefused(larger)
    return b"".join(chunks)


class _PerfEventAttr(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
    ]
