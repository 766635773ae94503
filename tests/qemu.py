"""A machine like our users' for the VM tier (tests/vm): the Debian 12 image that
scripts/vm/build-image.sh builds once per machine, booted under QEMU as a copy-on-write
overlay of it (the image itself is never written), with systemd as PID 1 on cgroup v2,
GRUB, Debian's kernel 6.12, a multi-queue virtio-net NIC carrying ssh and an e1000e.

QEMU runs with TCG, the software emulator (nested KVM does not run on the development
guests): ~40 s from power-on to ssh with 4 vCPUs, ~60 s a reboot, timings inside 10-50x a
real machine's. The tier checks behaviour and counts, never latency.

Networking is QEMU's user mode with `restrict=on`: the guest reaches nothing outside,
and only ssh is forwarded to it, from a free port on 127.0.0.1.

The known emulator flake: multi-threaded TCG sometimes gets the guest kernel's live code
patching (a static key flipped) wrong, and the kernel dies with `Oops: int3` on the serial
console; or the guest never answers ssh (tests/flake.py reproduces it; TCG_THREADS says
why the tier lives with it). A boot that shows either is retried once (a fresh overlay at
power-on; a reset of the same disk after a reboot, which keeps what the test wrote). A
test that failed because its guest died of it at any other moment (the oops on the
console while it ran, not met by such a retry: retry_for) is run again, loudly
(tests/vm/conftest.py); a failure without it never is. QEMU dies with the process that
started it (PR_SET_PDEATHSIG), and `stop` kills it.

`python -m tests.qemu [--cpus N] [--numa-nodes N]` boots one for a developer
(scripts/vm/boot.sh), prints how to reach it, and kills it at Ctrl-C.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import io
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from tests.harness import free_port

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("LATENCYD_VM_CACHE", "/var/cache/latencyd-test/vm"))
IMAGE = CACHE / "image"
KEY = CACHE / "id"
QEMU = Path("qemu-system-x86_64")  # Debian 12's (7.2), found on PATH
# TCG's threading: a host thread per vCPU. It breaks the guest kernel's live code patching
# now and then (the flake; tests/flake.py's guest died of it in 2 of 2 runs under QEMU 7.2
# and 3 of 3 under 10.0). Single-threaded TCG, one host thread running every vCPU in turn,
# showed no oops in 4 runs, but a vCPU spinning (the tests' applications, the isolated
# CPUs' polling) then holds the others off for its whole time slice: in the fresh-clone
# run of 2026-11-30 the guest's sshd went unanswered for up to 759 s after a boot, and the
# tier took 48 min. So the tier lives with the flake: a boot that meets it is retried, and
# a test whose guest died of it runs again (tests/vm/conftest.py).
TCG_THREADS = "multi"
# What the guest kernel prints when the emulator flake hits (see the module's docstring):
# its oops line, after printk's time stamp (or at the start of the line without one).
FLAKE = re.compile(r"(?:^|\] )Oops: int3\b")
# Power-on to ssh takes ~40 s on an idle 2-CPU machine and many minutes on a loaded one
# (every vCPU is a host thread emulating instructions; `make test` runs the tier at nice 10
# beside the host suites, which then leave it little). A boot is given up (a hung kernel,
# or a guest up without sshd) when its console has been silent without ssh answering
# while QEMU had STALL_CPU seconds of host CPU; or for IDLE_STALL seconds in which QEMU
# neither ran nor waited for a CPU more than IDLE_SHARE of the time (an idle guest that
# does not answer: seen once after a reboot, its login prompt on the console, sshd silent
# at the banner); or for STALL seconds whatever it had (a starved guest is slow, not
# hung); or after BOOT_TIMEOUT in all.
STALL_CPU = 180.0
IDLE_STALL = 180.0
IDLE_SHARE = 0.1
STALL = 900.0
BOOT_TIMEOUT = 1800.0
# The guest's own Python (Debian 12's 3.11), the one `make install` installs for: the
# host's /usr/bin/python3 is the same, so the wheels built with it fit the guest.
GUEST_PYTHON = "/usr/bin/python3"
SSH_OPTIONS = (
    "-q", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
    "-o", "ServerAliveInterval=10", "-o", "ServerAliveCountMax=6",
)  # fmt: skip
# How long ssh waits for the guest's sshd to take a connection (TCP and banner): as long
# as its keep-alive gives a command's answers (60 s), since the guest is as slow at both
# when the host suites leave the tier at nice 10 little CPU. A fresh-clone run of
# 2026-11-30 lost a restored guest at 10 s, the limit then, with nothing on the console.
# A boot's probe (_wait_up) keeps 10 s: a guest still booting is asked again anyway.
CONNECT_TIMEOUT = 60
PROBE_CONNECT_TIMEOUT = 10


class NotBuilt(RuntimeError):
    pass


def not_built() -> str | None:
    """Why no VM can boot here (the image not built into CACHE, or CACHE not readable by
    this user: it is root's), or None."""
    if not IMAGE.exists() or not KEY.exists():
        return f"no VM image in {CACHE}: run make vm-image (make test does)"
    return None


class BootFailed(RuntimeError):
    pass


class Flake(RuntimeError):
    """The emulator flake seen: the guest kernel died, or ssh never answered."""


class GuestCommandFailed(AssertionError):
    pass


class GuestLost(GuestCommandFailed):
    """ssh lost the guest (exit 255): not the command's exit status."""


@dataclass(frozen=True)
class Shape:
    """The VM's hardware: vCPUs, spread evenly over `numa_nodes` nodes, and memory."""

    cpus: int = 4
    numa_nodes: int = 1
    memory_mb: int = 2048


@dataclass(frozen=True)
class Snapshot:
    """A machine saved in its overlay (Vm.save): its shape, and the boot it was saved in."""

    shape: Shape
    boot_id: str


def qemu_argv(
    shape: Shape,
    overlay: Path,
    port: int,
    serial: Path,
    monitor: Path,
    loadvm: str | None = None,
    emulator: Path = QEMU,
    threads: str = TCG_THREADS,
) -> list[str]:
    """QEMU's command line for `shape`, its disk the qcow2 `overlay`, ssh on 127.0.0.1:port;
    started from the overlay's snapshot `loadvm` (Vm.save) instead of powered on; run by
    `emulator` with TCG `threads` (others only to compare: tests/flake.py)."""
    if shape.cpus % shape.numa_nodes:
        raise ValueError(f"{shape.cpus} vCPUs do not spread evenly over {shape.numa_nodes} nodes")
    numa: list[str] = []
    if shape.numa_nodes > 1:
        per_node, memory = shape.cpus // shape.numa_nodes, shape.memory_mb // shape.numa_nodes
        for n in range(shape.numa_nodes):
            first = n * per_node
            cpus = f"{first}-{first + per_node - 1}"
            numa += ["-object", f"memory-backend-ram,id=mem{n},size={memory}M",
                     "-numa", f"node,nodeid={n},cpus={cpus},memdev=mem{n}"]  # fmt: skip
    return [
        str(emulator), "-accel", f"tcg,thread={threads}", "-cpu", "max",
        "-smp", str(shape.cpus), "-m", f"{shape.memory_mb}M", *numa,
        "-drive", f"file={overlay},format=qcow2,if=virtio",
        "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{port}-:22",
        "-device", "virtio-net-pci,netdev=n0,mq=on,vectors=10",
        "-netdev", "user,id=n1,restrict=on", "-device", "e1000e,netdev=n1",
        "-serial", f"file:{serial}", "-monitor", f"unix:{monitor},server,nowait",
        "-display", "none", "-nodefaults", *(["-loadvm", loadvm] if loadvm else []),
    ]  # fmt: skip


def emulator_version(emulator: Path = QEMU) -> str:
    """QEMU's first line of --version, and how TCG is threaded, for the tier's summary."""
    said = subprocess.run([str(emulator), "--version"], capture_output=True, text=True)
    version = said.stdout.splitlines()[0] if said.stdout else said.stderr.strip()
    return f"{version}, TCG {TCG_THREADS}-threaded"


def flake_in(console: str) -> str | None:
    """The line of the serial console that shows the emulator flake, if one does."""
    for line in console.splitlines():
        if FLAKE.search(line.strip()):
            return line.strip()
    return None


def retry_for(failed: bool, console: str) -> str | None:
    """Whether a VM test is run once more, on a fresh machine: only when it failed and its
    guest died of the emulator flake, as the serial console written while it ran shows
    (Consoles.since: less what a retried boot met already); the flake's line, else None.
    A failure without the flake on the console is the test's own, never retried: ssh
    losing the guest is no sign by itself (a host too loaded to run it loses it too)."""
    return flake_in(console) if failed else None


SSH_LOST = 255  # ssh's own exit status: no connection, or the connection dropped


def why_lost(console: str, qemu_exit: int | None) -> str:
    """Why ssh lost the guest (exit SSH_LOST), from the serial console written since the
    command started and QEMU's exit status (None: still running): the emulator flake,
    QEMU gone, or neither seen (the guest silent for ssh's connect or keep-alive, 60 s)."""
    if oops := flake_in(console):
        return f"the emulator flake (see the module's docstring): {oops}"
    if qemu_exit is not None:
        return f"QEMU exited ({qemu_exit})"
    tail = "\n".join(console.splitlines()[-20:]) or "(nothing)"
    return (
        "no flake on the console and QEMU running: the guest did not take ssh's connection "
        "or answer its keep-alive for 60 s, or sshd dropped the connection; console "
        f"since:\n{tail}"
    )


@dataclass(frozen=True)
class HostTime:
    """What a process's threads (QEMU's vCPUs) had of the host: seconds on a CPU, and
    seconds runnable but waiting for one (a starved guest waits; an idle one does neither)."""

    ran: float
    waited: float

    def __sub__(self, earlier: HostTime) -> HostTime:
        return HostTime(self.ran - earlier.ran, self.waited - earlier.waited)


def host_time(pid: int) -> HostTime:
    """A process's HostTime so far, over all its threads (/proc/PID/task/TID/schedstat:
    nanoseconds run, nanoseconds waited on a run queue, time slices)."""
    ran = waited = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return HostTime(0.0, 0.0)  # exited: the caller sees it
    for tid in tids:
        try:
            run_ns, wait_ns, _ = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue  # a thread gone meanwhile
        ran, waited = ran + int(run_ns), waited + int(wait_ns)
    return HostTime(ran / 1e9, waited / 1e9)


def stalled(silent_seconds: float, had: HostTime) -> bool:
    """Whether a boot whose console has been silent that long, while QEMU had that much
    of the host, is given up (see STALL)."""
    idle = had.ran + had.waited < IDLE_SHARE * silent_seconds
    return (
        had.ran >= STALL_CPU or (silent_seconds >= IDLE_STALL and idle) or silent_seconds >= STALL
    )


MONITOR_PROMPT = b"(qemu) "


def _until_prompt(s: socket.socket) -> bytes:
    got = b""
    while not got.endswith(MONITOR_PROMPT):
        chunk = s.recv(4096)
        if not chunk:
            raise BootFailed(f"QEMU's monitor closed: {got!r}")
        got += chunk
    return got


def monitor_reply(raw: bytes) -> str:
    """What QEMU's human monitor answered, from all it sent after a command up to its next
    prompt: its line editor first redraws the line as each character arrives (escape
    sequences, no newline), then ends it with CR LF; the answer follows."""
    _, _, answer = raw.decode(errors="replace").partition("\r\n")
    return answer.removesuffix(MONITOR_PROMPT.decode()).strip()


def _die_with_parent() -> None:
    """In QEMU's child process before exec: SIGKILL when the process that started it dies,
    so a test run killed outright leaves no VM running."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Vm:
    def __init__(
        self, shape: Shape = Shape(), emulator: Path = QEMU, threads: str = TCG_THREADS
    ) -> None:
        if why := not_built():
            raise NotBuilt(why)
        self.shape = shape
        self.emulator, self.threads = emulator, threads
        self.dir = Path(tempfile.mkdtemp(prefix="latencyd-vm-"))
        self.overlay = self.dir / "overlay.qcow2"
        self.serial = self.dir / "serial.log"
        self.monitor_socket = self.dir / "monitor.sock"
        self.port = 0
        self.qemu: subprocess.Popen[bytes] | None = None
        self.boot_seconds: list[float] = []  # power-on or reboot to ssh, each boot
        self.snapshots: dict[str, Snapshot] = {}  # saved in the overlay (save), by tag
        self.snapshot_seconds: list[str] = []  # each save and restore, for the summary
        self.flakes: list[str] = []  # the flakes seen and retried
        self.consoles = Consoles(self.serial)

    # -- power -------------------------------------------------------------------------
    def boot(self) -> Vm:
        """Power on a fresh overlay of the image; returns when ssh answers. A flake on the
        first attempt is retried once on a new overlay."""
        for attempt in (1, 2):
            self._power_on()
            try:
                self._wait_up(serial_from=0, old_boot_id=None)
                return self
            except Flake as flake:
                self.flakes.append(f"power-on: {flake}")
                self._power_off()
                self.consoles.aside(f"serial-attempt{attempt}.log")
                if attempt == 2:
                    raise BootFailed(f"the emulator flake twice: {self.flakes}") from flake
        raise AssertionError("unreachable")

    def reboot(self, into: str | None = None) -> None:
        """`systemctl reboot` in the guest (into GRUB's entry `into` for that boot only, if
        given: grub-reboot); returns when the new boot answers ssh and systemd has finished
        starting it (latencyd is ready: Type=dbus, or has failed). A flake is met with a
        reset of the same disk, once; the boot it killed had used up the one-boot entry
        (GRUB clears it as it reads it), so the machine the reset booted is rebooted into
        `into` once more."""
        if self._reboot(into, reset_on_flake=True) and into is not None:
            self._reboot(into, reset_on_flake=False)
        # ssh answers before every unit has started: wait for the start-up jobs to end.
        self.ssh("systemctl is-system-running --wait", check=False, timeout=BOOT_TIMEOUT)

    def _reboot(self, into: str | None, reset_on_flake: bool) -> bool:
        """One `systemctl reboot` (see reboot); whether a flake was met with a reset."""
        if into is not None:
            self.ssh(f"grub-reboot {shlex.quote(into)}")
        old = self.boot_id()
        serial_from = self.serial.stat().st_size
        self.ssh(
            "systemctl reboot", check=False, lost_ok=True
        )  # ssh may see the connection dropped
        try:
            self._wait_up(serial_from, old)
            return False
        except Flake as flake:
            self.flakes.append(f"reboot: {flake}")
            if not reset_on_flake:
                raise BootFailed(f"the emulator flake twice: {self.flakes}") from flake
            serial_from = self.serial.stat().st_size
            self.consoles.flake_met()
            self._monitor("system_reset")
            try:
                self._wait_up(serial_from, old)
            except Flake as again:
                raise BootFailed(f"the emulator flake twice: {self.flakes}") from again
            return True

    def stop(self) -> None:
        """Kill QEMU (the overlay goes with the work directory; its last console is kept,
        for Consoles.since)."""
        self._power_off()
        self.consoles.keep()
        shutil.rmtree(self.dir, ignore_errors=True)

    def power_cycle(self, shape: Shape) -> None:
        """`systemctl poweroff` in the guest, then power on again as `shape` on the same disk
        (what was installed stays): another vCPU count or NUMA layout without another
        install. A flake is met with one more power-on of the same disk."""
        self.ssh("systemctl poweroff", check=False)  # ssh may see the connection dropped
        assert self.qemu is not None
        try:
            self.qemu.wait(timeout=600)
        except subprocess.TimeoutExpired:
            self.flakes.append("power-off: QEMU still running after 600 s: killed")
        self.shape = shape
        for attempt in (1, 2):
            self._power_off()
            self.consoles.aside(f"serial-{len(self.boot_seconds)}-{attempt}.log")
            self._start()
            try:
                self._wait_up(serial_from=0, old_boot_id=None)
                return
            except Flake as flake:
                self.flakes.append(f"power-cycle: {flake}")
                self.consoles.flake_met()
                if attempt == 2:
                    raise BootFailed(f"the emulator flake twice: {self.flakes}") from flake

    # -- snapshots: a set-up machine again in seconds -----------------------------------
    def save(self, tag: str) -> None:
        """The running machine, its memory, vCPUs and disk, saved in the overlay as `tag`
        (QEMU's savevm: a qcow2 internal snapshot) for `restore`. The guest's page cache is
        dropped first, so only memory in use is written; no ssh session is open during the
        save (each command's ended), so none is half-open in a restored guest."""
        boot_id = self.ssh(
            "sync && echo 3 > /proc/sys/vm/drop_caches && cat /proc/sys/kernel/random/boot_id"
        ).stdout.strip()
        started = time.monotonic()
        reply = self._monitor(f"savevm {tag}", timeout=BOOT_TIMEOUT)
        if reply:
            raise BootFailed(f"QEMU's savevm {tag}: {reply}")
        self.snapshots[tag] = Snapshot(self.shape, boot_id)
        self.snapshot_seconds.append(f"save {tag} {time.monotonic() - started:.0f} s")

    def restore(self, tag: str) -> None:
        """The machine as `save(tag)` left it: the same boot, memory and disk, in seconds
        where a boot takes one to three minutes. On a running QEMU of the snapshot's shape
        it is the monitor's loadvm; else QEMU starts again on the overlay with -loadvm. The
        guest's wall clock reads the moment of the save afterwards (its monotonic clock
        goes on from there, as after a suspend): set from the host's."""
        snapshot = self.snapshots[tag]
        started = time.monotonic()
        if self.qemu is not None and self.qemu.poll() is None and self.shape == snapshot.shape:
            reply = self._monitor(f"loadvm {tag}", timeout=BOOT_TIMEOUT)
            if reply:
                raise BootFailed(f"QEMU's loadvm {tag}: {reply}")
        else:
            self._power_off()
            self.consoles.aside(f"serial-{len(self.boot_seconds)}-before-{tag}.log")
            self.shape = snapshot.shape
            self._start(loadvm=tag)
        self._wait_restored(snapshot.boot_id)
        self.ssh(f"date --set=@{time.time():.3f} >/dev/null")
        self.snapshot_seconds.append(f"restore {tag} {time.monotonic() - started:.0f} s")

    def _wait_restored(self, boot_id: str) -> None:
        """Until ssh answers in the restored guest (its boot the saved one's); a starved
        guest is given STALL seconds."""
        deadline = time.monotonic() + STALL
        while time.monotonic() < deadline:
            self._fail_if_exited()
            probe = self.ssh("cat /proc/sys/kernel/random/boot_id", check=False, timeout=30,
                             lost_ok=True)  # fmt: skip
            if probe.returncode == 0:
                if probe.stdout.strip() != boot_id:
                    raise BootFailed(f"restored, but the guest's boot is {probe.stdout.strip()}, "
                                     f"not the saved one's {boot_id}")  # fmt: skip
                return
            time.sleep(1)
        raise BootFailed(f"no ssh {STALL:.0f} s after a restore")

    def _power_on(self) -> None:
        self.overlay.unlink(missing_ok=True)
        self.snapshots.clear()  # they were in the overlay
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw",
                        "-b", str(IMAGE.resolve()), str(self.overlay)], check=True)  # fmt: skip
        self._start()

    def _start(self, loadvm: str | None = None) -> None:
        self.serial.write_bytes(b"")
        self.port = free_port()
        argv = qemu_argv(
            self.shape, self.overlay, self.port, self.serial, self.monitor_socket, loadvm,
            self.emulator, self.threads,
        )  # fmt: skip
        with open(self.dir / "qemu.log", "ab") as log:
            self.qemu = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )  # fmt: skip

    def _power_off(self) -> None:
        if self.qemu is not None and self.qemu.poll() is None:
            self.qemu.kill()
        if self.qemu is not None:
            self.qemu.wait()
        self.qemu = None

    def _wait_up(self, serial_from: int, old_boot_id: str | None) -> None:
        started = quiet_since = time.monotonic()
        assert self.qemu is not None
        quiet_had = host_time(self.qemu.pid)
        console_size = serial_from
        while time.monotonic() - started < BOOT_TIMEOUT:
            self._fail_if_exited()
            with open(self.serial, "rb") as f:
                f.seek(serial_from)
                console = f.read()
            if oops := flake_in(console.decode(errors="replace")):
                raise Flake(oops)
            if serial_from + len(console) != console_size:
                console_size, quiet_since = serial_from + len(console), time.monotonic()
                quiet_had = host_time(self.qemu.pid)
            elif stalled(time.monotonic() - quiet_since, host_time(self.qemu.pid) - quiet_had):
                raise Flake(f"no ssh, and the console silent for "
                            f"{time.monotonic() - quiet_since:.0f} s:\n"
                            f"{self.console()[-2000:]}")  # fmt: skip
            try:
                probe = self.ssh("cat /proc/sys/kernel/random/boot_id", check=False, timeout=30,
                                 lost_ok=True, connect_timeout=PROBE_CONNECT_TIMEOUT)  # fmt: skip
            except GuestCommandFailed:
                continue  # sshd accepted but did not answer in time: still starting
            if probe.returncode == 0 and probe.stdout.strip() not in ("", old_boot_id):
                self.boot_seconds.append(time.monotonic() - started)
                return
            time.sleep(2)
        raise Flake(f"no ssh after {BOOT_TIMEOUT:.0f} s; console:\n{self.console()[-2000:]}")

    def _fail_if_exited(self) -> None:
        """While waiting for the guest: QEMU gone is a failed boot, with its last words."""
        assert self.qemu is not None
        if self.qemu.poll() is not None:
            raise BootFailed("QEMU exited:\n" + (self.dir / "qemu.log").read_text()[-3000:])

    def _monitor(self, command: str, timeout: float = 60) -> str:
        """A command to QEMU's human monitor; returns what it answered (empty when a
        command such as device_add succeeded)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(timeout)
            s.connect(str(self.monitor_socket))
            _until_prompt(s)  # the banner
            s.sendall(command.encode() + b"\n")
            return monitor_reply(_until_prompt(s))

    def _emulator_state(self) -> str:
        """What QEMU says of the guest when ssh lost it with nothing on the console, to tell
        a starved or hung guest (vCPUs running) from an idle one that does not answer (all
        halted): `info cpus`, and the host side of the guest's connections (`info usernet`:
        one in SYN_SENT was never answered)."""
        if self.qemu is None or self.qemu.poll() is not None:
            return "QEMU not running"
        try:
            cpus, usernet = self._monitor("info cpus"), self._monitor("info usernet")
        except (OSError, BootFailed) as failed:
            return f"QEMU's monitor did not answer: {failed}"
        return f"QEMU's info cpus:\n{cpus}\nQEMU's info usernet:\n{usernet[-1500:]}"

    def monitor(self, command: str) -> None:
        """A command to QEMU's monitor (device_add, netdev_add, ...) that must succeed."""
        reply = self._monitor(command)
        if reply:
            raise AssertionError(f"QEMU's monitor: {command!r}: {reply}")

    # -- inside ------------------------------------------------------------------------
    def ssh_argv(self, command: str, connect_timeout: int = CONNECT_TIMEOUT) -> list[str]:
        return ["ssh", *SSH_OPTIONS, "-o", f"ConnectTimeout={connect_timeout}", "-i", str(KEY),
                "-p", str(self.port), "root@127.0.0.1", command]  # fmt: skip

    def ssh(
        self,
        command: str,
        *,
        check: bool = True,
        timeout: float = 600,
        stdin: bytes = b"",
        lost_ok: bool = False,
        connect_timeout: int = CONNECT_TIMEOUT,
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command in the guest as root (in a session of ssh.service). ssh
        losing the guest raises GuestLost saying why (why_lost), check or not, unless
        `lost_ok` (a reboot, a probe while the guest boots)."""
        console_from = self.serial.stat().st_size if self.serial.exists() else 0
        try:
            done = subprocess.run(self.ssh_argv(command, connect_timeout), input=stdin,
                                  capture_output=True,
                                  timeout=timeout)  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise GuestCommandFailed(f"{command!r} did not end in {timeout:.0f} s") from exc
        result = subprocess.CompletedProcess(
            done.args, done.returncode, done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )  # fmt: skip
        if result.returncode == SSH_LOST and not lost_ok and self.qemu is not None:
            with open(self.serial, "rb") as f:
                f.seek(console_from)
                since = f.read().decode(errors="replace")
            why = why_lost(since, self.qemu.poll())
            raise GuestLost(
                f"in the VM: {command!r}: ssh lost the guest (exit {SSH_LOST}): {why}\n"
                f"stderr: {result.stderr[-2000:]}\n{self._emulator_state()}"
            )
        if check and result.returncode != 0:
            raise GuestCommandFailed(
                f"in the VM: {command!r} exited {result.returncode}\n"
                f"stdout: {result.stdout[-3000:]}\nstderr: {result.stderr[-3000:]}"
            )
        return result

    def as_user(
        self, user: str, command: str, *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a shell command in the guest as `user` (runuser from root's ssh session)."""
        return self.ssh(f"runuser -u {user} -- sh -c {shlex.quote(command)}", check=check)

    def boot_id(self) -> str:
        return self.ssh("cat /proc/sys/kernel/random/boot_id").stdout.strip()

    def put_tree(self, tar: bytes, into: str) -> None:
        """Unpack the tar archive `tar` into the guest's directory `into`."""
        self.ssh(f"mkdir -p {shlex.quote(into)} && tar -x -C {shlex.quote(into)}", stdin=tar)

    def console(self) -> str:
        """The serial console of the current power-on (of the last, once stopped)."""
        return self.consoles.current().decode(errors="replace")


@dataclass
class Consoles:
    """A VM's serial consoles as one stream over its power-ons: the file QEMU writes the
    current one to (`path`), the bytes of earlier ones set aside (`base`), the position up
    to which each flake was met by a retried boot (`met`), and the last one, kept once the
    VM is stopped (its directory goes)."""

    path: Path
    base: int = 0
    met: int = 0
    kept: bytes | None = None

    def current(self) -> bytes:
        if self.kept is not None:
            return self.kept
        return self.path.read_bytes() if self.path.exists() else b""

    def position(self) -> int:
        """Where the stream stands now."""
        return self.base + len(self.current())

    def aside(self, name: str) -> None:
        """The current console renamed `name` (beside it); the next starts at its end."""
        self.base += len(self.current())
        self.path.rename(self.path.with_name(name))

    def flake_met(self) -> None:
        """A retried boot met the flake on the console so far."""
        self.met = self.position()

    def keep(self) -> None:
        if self.kept is None:
            self.kept = self.current()

    def since(self, position: int) -> str:
        """What the current console said since `position`, but for what retried boots met
        (consoles set aside were those of flakes met, or of a machine since powered off)."""
        start = max(position, self.met) - self.base
        return self.current()[max(start, 0) :].decode(errors="replace")


# -- latencyd into the guest, as a user installs it ---------------------------------------
def source_archive() -> bytes:
    """The repository at HEAD, as `git archive` gives it (what a user's checkout holds)."""
    return subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", "HEAD"],
                          check=True, capture_output=True).stdout  # fmt: skip


def wheels(source: bytes) -> Path:
    """Wheels of everything `make install` needs that the guest lacks (its runtime
    dependencies and its build back-end), at requirements.lock's versions, built on the
    host with the guest's Python: the guest has no network to PyPI. Cached under CACHE by
    the hash of the files that name them."""
    lock, pyproject = REPO / "requirements.lock", REPO / "pyproject.toml"
    key = hashlib.sha256(lock.read_bytes() + pyproject.read_bytes()).hexdigest()[:16]
    done = CACHE / f"wheels-{key}"
    if done.is_dir():
        return done
    build_requires = tomllib.loads(pyproject.read_text())["build-system"]["requires"]
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        src, out = Path(tmp) / "src", Path(tmp) / "wheels"
        src.mkdir()
        with tarfile.open(fileobj=io.BytesIO(source)) as t:
            t.extractall(src, filter="data")
        env = {**os.environ, "PIP_CONSTRAINT": str(lock), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        subprocess.run([GUEST_PYTHON, "-m", "pip", "wheel", "-q", "--no-input", "-w", str(out),
                        str(src), *build_requires], check=True, env=env,
                       stdin=subprocess.DEVNULL)  # fmt: skip
        for own in out.glob("latencyd-*.whl"):
            own.unlink()  # `make install` builds latencyd itself, from the source
        for stale in CACHE.glob("wheels-*"):
            shutil.rmtree(stale)
        out.rename(done)
    return done


def tar_of(directory: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for path in sorted(directory.iterdir()):
            t.add(path, arcname=path.name)
    return buf.getvalue()


def install_latencyd(vm: Vm) -> None:
    """`make install` and `make install-system` in a copy of the repository at HEAD, pip
    finding the host's wheels (PIP_NO_INDEX: nothing is fetched)."""
    source = source_archive()
    vm.put_tree(source, "/root/latencyd")
    vm.put_tree(tar_of(wheels(source)), "/root/wheels")
    vm.ssh("cd /root/latencyd && export PIP_NO_INDEX=1 PIP_FIND_LINKS=/root/wheels "
           "&& make install && make install-system", timeout=BOOT_TIMEOUT)  # fmt: skip


# -- Debian's archive for a guest without a network ---------------------------------------
# The guest reaches no mirror. Its apt sources are pointed at a copy of Debian's index as
# the host's apt fetched it (each suite's signed InRelease and its Packages), under
# GUEST_MIRROR as file: sources: the guest's apt checks that copy against Debian's key
# itself (`apt-get update`), and each package file against the index. The package files an
# install needs are fetched on the host by `apt-get download` (cached under CACHE/debs)
# and copied to where the index says they are.
GUEST_MIRROR = "/srv/debian"
# The copy holds each index uncompressed only (the host's apt keeps them recompressed, as
# lz4, so the .xz and .gz that InRelease names are not at hand): apt is told every
# compression type's tool is missing ("false"), and so fetches the uncompressed one.
MIRROR_CONF = "/etc/apt/apt.conf.d/50latencyd-vm-mirror"
MIRROR_APT_CONF = (
    "".join(
        f'Acquire::CompressionTypes::{kind} "false";\n'
        for kind in ("xz", "bz2", "lzma", "gz", "lz4", "zst")
    )
    + 'Acquire::Languages "none";\n'
)  # the host fetched no Translation-* (apt's default here)
DEBS = CACHE / "debs"


@dataclass(frozen=True)
class PoolFile:
    """A package file apt would fetch: where (in the guest's mirror), its name and hash."""

    uri: str
    name: str
    algorithm: str  # hashlib's name of the hash apt printed (md5, sha256, ...)
    digest: str

    @property
    def guest_path(self) -> str:
        """The path its file: URI names, %-escapes undone as apt undoes them: a version's
        "+" is printed "%2b" (python3-gi_3.42.2-3%2bb1_amd64.deb) and read back as "+"."""
        return unquote(self.uri.removeprefix("file:"))


# apt's names of the hashes `--print-uris` prints -> hashlib's. Which one it prints is
# apt's choice: MD5Sum was seen for the guest's served Packages file.
APT_HASHES = {"MD5Sum": "md5", "SHA1": "sha1", "SHA256": "sha256", "SHA512": "sha512"}


def pool_file(line: str) -> PoolFile | None:
    """A line of `apt-get install --print-uris` as a PoolFile: 'URI' NAME SIZE HASH:DIGEST;
    None for a local file given to the install (./latencyd_*.deb), which has no hash."""
    if len(line.split()) < 4:
        return None
    uri, name, _size, checksum = line.split()
    kind, _, digest = checksum.partition(":")
    if kind not in APT_HASHES:
        raise ValueError(f"a hash apt names {kind!r}, not known here: {line}")
    return PoolFile(uri.strip("'"), name, APT_HASHES[kind], digest)


def _host_indexes() -> dict[str, tuple[Path, str]]:
    """The host apt's Packages indexes: each suite's base URI -> (the local file, its key
    in the suite's InRelease, e.g. main/binary-amd64/Packages)."""
    listing = subprocess.run(
        ["apt-get", "indextargets", "--format", "$(BASE_URI) $(FILENAME) $(METAKEY)",
         "Identifier: Packages"], check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    found: dict[str, tuple[Path, str]] = {}
    for line in listing.splitlines():
        base, filename, metakey = line.split()
        found.setdefault(base, (Path(filename), metakey))
    return found


def _in_mirror(uri: str) -> str:
    """Where a source's URI (http://deb.debian.org/debian/...) lies under GUEST_MIRROR."""
    return f"{GUEST_MIRROR}/{uri.split('://', 1)[1]}"


def serve_debian_index(vm: Vm) -> None:
    """The guest's apt sources served from the host's copy of Debian's index (see above),
    then `apt-get update` in the guest, which fails on anything it cannot verify."""
    # --no-release-info: without it apt lists only the suites whose Release it has, and
    # the image has none (its lists are empty), so nothing would be served.
    wanted = vm.ssh(
        "apt-get indextargets --no-release-info --format '$(BASE_URI)' 'Identifier: Packages'"
    )
    if not wanted.stdout.split():
        raise GuestCommandFailed(f"the guest's apt names no suite to serve: {wanted.stderr}")
    host = _host_indexes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for base in sorted(set(wanted.stdout.split())):
            if base not in host:
                raise NotBuilt(
                    f"the host's apt has no index of {base}, which the VM's apt uses: "
                    "add it to the host's sources and run apt-get update"
                )
            packages, metakey = host[base]
            lists = packages.parent
            release = lists / (base.split("://", 1)[1].replace("/", "_") + "InRelease")
            index = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", str(packages)],
                                   check=True, capture_output=True).stdout  # fmt: skip
            into = _in_mirror(base).lstrip("/")
            for name, data in (("InRelease", release.read_bytes()), (metakey, index)):
                info = tarfile.TarInfo(f"{into}{name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    vm.ssh("tar -xz -C /", stdin=buf.getvalue(), timeout=BOOT_TIMEOUT)
    vm.ssh(f"cat > {MIRROR_CONF} && sed -i 's#http://#file:{GUEST_MIRROR}/#' "
           "/etc/apt/sources.list", stdin=MIRROR_APT_CONF.encode())  # fmt: skip
    update = vm.ssh("apt-get update --error-on=any", check=False, timeout=BOOT_TIMEOUT)
    if update.returncode != 0:
        # What the guest's apt and its file method saw, and what lies where it looked.
        seen = vm.ssh(f"umask; ls -lR {GUEST_MIRROR} | head -40; id _apt; apt-get update "
                      "-o Debug::Acquire::file=1 -o Debug::pkgAcquire::Worker=1 2>&1 "
                      "| grep -v '^ ' | head -80", check=False, timeout=BOOT_TIMEOUT)  # fmt: skip
        raise GuestCommandFailed(
            f"the guest's apt-get update against the served index exited "
            f"{update.returncode}:\n{update.stdout[-2000:]}{update.stderr[-2000:]}\n"
            f"diagnosis:\n{seen.stdout[-6000:]}"
        )


def pool_files(vm: Vm, install: str) -> list[PoolFile]:
    """The package files `apt-get install <install>` would fetch in the guest."""
    out = vm.ssh(f"apt-get install --print-uris -qq -y {install}").stdout
    return [f for line in out.splitlines() if (f := pool_file(line)) is not None]


def serve_pool_files(vm: Vm, files: list[PoolFile]) -> None:
    """Each file fetched on the host (`apt-get download`, which checks it against the
    host's index; kept in DEBS) and put in the guest's mirror where its URI points."""
    DEBS.mkdir(exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for f in files:
            cached = DEBS / f.name
            if not cached.exists():
                package, version, _arch = f.name.removesuffix(".deb").split("_")
                subprocess.run(["apt-get", "download", "-q", f"{package}={unquote(version)}"],
                               cwd=DEBS, check=True, capture_output=True)  # fmt: skip
            digest = hashlib.new(f.algorithm, cached.read_bytes()).hexdigest()
            if digest != f.digest:
                raise AssertionError(
                    f"{cached}: {f.algorithm} {digest}, the guest's index says {f.digest}"
                )
            tar.add(cached, arcname=f.guest_path.lstrip("/"))
    vm.ssh("tar -x -C /", stdin=buf.getvalue(), timeout=BOOT_TIMEOUT)


def guest_profile(vm: Vm, name: str, text: str) -> None:
    """A profile into the guest's /etc/latencyd/profiles, re-read by its daemon."""
    vm.ssh(f"cat > /etc/latencyd/profiles/{name}.toml && latencyctl reload", stdin=text.encode())


def as_a_debian_machine(vm: Vm) -> str:
    """The boot configuration as on a user's Debian machine: grub.cfg update-grub's output
    (the image's first one is its recipe's, so any update-grub rewrites it), its default
    the generic kernel's entry by the id update-grub gives it here; returns that kernel's
    release. The kernel is named by its installed image, not by `uname -r`, so a set-up
    on a machine that already runs the RT kernel still makes the generic one the default
    (a title is no way out: grub-mkconfig rewrites a title default into a submenu path,
    which this flat menu lacks). The id is a menu entry's: grub.cfg's `set default="..."`
    names the stale one first."""
    generic = vm.ssh(
        "cd /boot && ls vmlinuz-*-amd64 | grep -v -- -rt- | head -1 | sed 's/^vmlinuz-//'"
    ).stdout.strip()
    assert generic, "no generic kernel in /boot"
    vm.ssh(
        "update-grub && "
        f"""id=$(sed -n "s/.*menuentry_id_option '\\(gnulinux-{generic}-advanced-"""
        r"""[^']*\)'.*/\1/p" /boot/grub/grub.cfg | head -1) && """
        '[ -n "$id" ] && sed -i "s|^GRUB_DEFAULT=.*|GRUB_DEFAULT=$id|" /etc/default/grub && '
        "update-grub",
        timeout=1200,
    )
    return generic


def main() -> None:
    parser = argparse.ArgumentParser(description="Boot the VM tier's machine until Ctrl-C.")
    parser.add_argument("--cpus", type=int, default=4)
    parser.add_argument("--numa-nodes", type=int, default=1)
    parser.add_argument("--memory-mb", type=int, default=2048)
    parser.add_argument("--install", action="store_true", help="make install + install-system")
    args = parser.parse_args()
    vm = Vm(Shape(args.cpus, args.numa_nodes, args.memory_mb))
    try:
        vm.boot()
        if args.install:
            install_latencyd(vm)
        print(f"up after {vm.boot_seconds[-1]:.0f} s; console: {vm.serial}")
        print(shlex.join(vm.ssh_argv("")[:-1]))
        print("Ctrl-C powers it off")
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        vm.stop()


if __name__ == "__main__":
    main()
