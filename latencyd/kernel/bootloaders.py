"""Where the next boot's kernel command line is kept, and how latencyd changes it there:
through the machine's own mechanism, found in this order.

- rpm-ostree (Fedora CoreOS, bootc images; /run/ostree-booted): `rpm-ostree kargs`;
- grubby (Fedora, RHEL): `grubby --update-kernel=ALL --args=... --remove-args=...`;
- kernel-install (systemd-boot, BLS entries, UKIs; /etc/kernel/cmdline or a loader entry
  directory): the command line in /etc/kernel/cmdline, entries rebuilt by `kernel-install
  add` for each installed kernel;
- Debian's GRUB (/etc/default/grub and update-grub): a drop-in of latencyd's own,
  /etc/default/grub.d/latencyd.cfg, then `update-grub`; a drop-in can add to the command
  line, not take a user's argument out of it;
- anything else: /var/lib/latencyd/bootcmdline, latencyd's arguments on one line for the
  machine's boot configuration to include (as TuneD's /etc/tuned/bootcmdline).

latencyd's record (latencyd.paths.BOOT_RECORD, on disk: the arguments outlast a reboot and
so does the record of them) says what latencyd's change to the boot configuration is, and
which change it is making. A write (`write_boot`) records its intent first, durably, then
has the mechanism make it (each file replaced atomically and fsync'd), then records it
done. A tool that fails is answered by putting back the change recorded done; a write
cut short (the tool failing again, kill -9, a power cut) leaves the intent recorded, and
the next write (a restart's apply, a switch, `off`) first undoes everything either change
may have put in, whatever part of it was made, then makes its own. So `latencyd off`
takes out exactly what latencyd put in and puts back what it took out, whatever happened
in between; a user's own arguments are left as they are unless the profile names them in
`remove`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from latencyd.errors import KernelRefused
from latencyd.kernel.cmdline import Change, find, parse_cmdline, rewritten
from latencyd.kernel.system import System
from latencyd.paths import BOOT_RECORD

RECORD = str(BOOT_RECORD).lstrip("/")  # under the System's root
GRUB_DROP_IN = "etc/default/grub.d/latencyd.cfg"
KERNEL_CMDLINE = "etc/kernel/cmdline"
_REMOVED, _ASKED, _WRITING, _WRITING_REMOVED = (
    "# removed:", "# remove:", "# writing:", "# writing removed:"
)  # fmt: skip


class Bootloader(Protocol):
    name: str
    removes: bool  # can take a user's argument out

    def current(self) -> str:
        """The command line as this mechanism keeps it, for `rewritten` (a file's text, a
        tool's answer; "" where latencyd's own file is rewritten whole)."""
        ...

    def put(self, old: str, new: str) -> None:
        """Make the mechanism hold `new` (it held `old` when read): durable when it
        returns, KernelRefused when it cannot. Run again with the same `new` it ends in
        the same state, however far an earlier run came."""
        ...


@dataclass(frozen=True)
class Record:
    """latencyd's record: its change to the boot configuration (`done`), the parameters
    the profile asked to remove (some may not have been there to remove), and the change
    being written (`writing`; None: none), which the configuration may hold in part."""

    done: Change = field(default_factory=Change)
    asked: tuple[str, ...] = ()
    writing: Change | None = None

    @property
    def empty(self) -> bool:
        return self.done == Change() and not self.asked and self.writing is None

    @property
    def to_undo(self) -> Change:
        """What the boot configuration may hold of latencyd's: both changes when a write
        was cut short."""
        return self.done if self.writing is None else self.done.merged(self.writing)


def read_record(system: System) -> Record:
    """latencyd's record as on disk (none: latencyd changed nothing)."""
    try:
        lines = system.read_file(RECORD).splitlines()
    except KernelRefused:
        return Record()

    def listed(prefix: str) -> tuple[str, ...]:
        return tuple(" ".join(ln[len(prefix) :] for ln in lines if ln.startswith(prefix)).split())

    added = tuple(lines[0].split()) if lines and not lines[0].startswith("#") else ()
    writing = None
    if any(ln.startswith(_WRITING) for ln in lines):
        writing = Change(listed(_WRITING), listed(_WRITING_REMOVED))
    return Record(Change(added, listed(_REMOVED)), listed(_ASKED), writing)


def write_record(system: System, record: Record) -> None:
    """The record, durably (System.replace_file; none: no file); its first line is the
    arguments latencyd's configuration holds for sure, for a boot configuration to include
    where no mechanism was found."""
    if record.empty:
        system.remove_file(RECORD)
        return
    text = " ".join(record.done.added) + "\n"
    for prefix, words in ((_REMOVED, record.done.removed), (_ASKED, record.asked)):
        if words:
            text += f"{prefix} {' '.join(words)}\n"
    if record.writing is not None:
        text += f"{_WRITING} {' '.join(record.writing.added)}".rstrip() + "\n"
        if record.writing.removed:
            text += f"{_WRITING_REMOVED} {' '.join(record.writing.removed)}\n"
    system.replace_file(RECORD, text)


def write_boot(
    system: System, loader: Bootloader, added: Sequence[str], remove: Sequence[str]
) -> Change:
    """Make latencyd's change to the boot configuration `added` and `remove` (none of
    either: take latencyd's change out), whatever a write cut short left: record the
    intent, have the mechanism make it, record it done. A mechanism that fails gets the
    change recorded done put back; if that fails too, the intent stays recorded for the
    next write to settle. The change made; KernelRefused when it was not made."""
    if remove and not loader.removes:
        raise KernelRefused(
            f"removing {', '.join(remove)} from the kernel command line",
            f"{loader.name} can only add arguments",
        )
    record = read_record(system)
    old = loader.current()
    new, change = _rewrite(old, record.to_undo, added, remove)
    write_record(system, Record(record.done, record.asked, change))
    try:
        loader.put(old, new)
    except KernelRefused as exc:
        _put_back(system, loader, record, change, old, exc)
        raise
    write_record(system, Record(change, tuple(remove)))
    return change


def _put_back(
    system: System,
    loader: Bootloader,
    record: Record,
    change: Change,
    before: str,
    exc: KernelRefused,
) -> None:
    """After `change` failed: the boot configuration as `record` vouches for (as it was,
    `before`, when no earlier write was left unfinished; else without that write); said
    in `exc` when even that fails, the intent left recorded."""
    undo = record.to_undo.merged(change)
    try:
        now = loader.current()
        if record.writing is None:
            back = before
        else:
            back, _ = _rewrite(now, undo, record.done.added, record.done.removed_keys)
        loader.put(now, back)
        write_record(system, Record(record.done, record.asked))
    except KernelRefused as again:
        exc.reason += (
            f"; putting the boot configuration back failed too ({again.reason}): latencyd's "
            f"record /{RECORD} keeps the unfinished change, which the next switch or off "
            "takes out"
        )


@dataclass
class PlainFile:
    """No mechanism found: the record is the file the boot configuration includes."""

    system: System
    name: str = "/var/lib/latencyd/bootcmdline (include it in your boot configuration)"
    removes: bool = False

    def current(self) -> str:
        return ""

    def put(self, old: str, new: str) -> None:
        """The record written next is the change."""


@dataclass
class DebianGrub:
    """A drop-in of latencyd's own, rewritten whole (the user's command line is in
    /etc/default/grub, never touched), then update-grub."""

    system: System
    tool: str  # update-grub
    name: str = "GRUB (/etc/default/grub.d/latencyd.cfg, update-grub)"
    removes: bool = False

    def current(self) -> str:
        return ""

    def put(self, old: str, new: str) -> None:
        if new.strip():
            self.system.replace_file(GRUB_DROP_IN, (
                "# Written by latencyd (its [bootloader] section); `latencyd off` removes it.\n"
                f'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {new.strip()}"\n'
            ))  # fmt: skip
        else:
            self.system.remove_file(GRUB_DROP_IN)
        self.system.run_tool([self.tool])


@dataclass
class KernelInstall:
    """/etc/kernel/cmdline, then `kernel-install add` for every installed kernel (the
    entries and UKIs it builds take their command line from that file)."""

    system: System
    tool: str  # kernel-install
    name: str = "kernel-install (/etc/kernel/cmdline)"
    removes: bool = True

    @property
    def env(self) -> dict[str, str] | None:
        """Below a root other than / (a staged image): its configuration and boot
        directory, which kernel-install takes from the environment."""
        if self.system.fspath("") in ("", "/"):
            return None
        return {"KERNEL_INSTALL_CONF_ROOT": self.system.fspath("etc/kernel"),
                "BOOT_ROOT": self.system.fspath("boot")}  # fmt: skip

    def current(self) -> str:
        try:
            return self.system.read_file(KERNEL_CMDLINE)
        except KernelRefused:  # kernel-install falls back to the running kernel's
            return self.system.read("proc/cmdline").split(" -- ")[0] + "\n"

    def put(self, old: str, new: str) -> None:
        """The file replaced atomically (never empty: an empty one would have the next
        kernel-install build entries without root=), then every kernel's entry rebuilt,
        also when the file held `new` already (a write cut short before the rebuild)."""
        if new != old or not self.system.exists(KERNEL_CMDLINE):
            self.system.replace_file(KERNEL_CMDLINE, new)
        for version, image in self.kernels():
            self.system.run_tool([self.tool, "add", version, image], self.env)

    def kernels(self) -> list[tuple[str, str]]:
        """(version, image) of each kernel installed under /usr/lib/modules."""
        found = []
        for version in sorted(self.system.listdir("usr/lib/modules")):
            for image in (f"usr/lib/modules/{version}/vmlinuz", f"boot/vmlinuz-{version}"):
                if self.system.exists(image):
                    found.append((version, self.system.fspath(image)))
                    break
        return found


@dataclass
class Grubby:
    system: System
    tool: str
    name: str = "grubby"
    removes: bool = True

    def current(self) -> str:
        info = self.system.run_tool([self.tool, "--info=DEFAULT"])
        return next((ln.split("=", 1)[1].strip().strip('"') for ln in info.splitlines()
                     if ln.startswith("args=")), "") + "\n"  # fmt: skip

    def put(self, old: str, new: str) -> None:
        drop, add = _delta(old, new)
        options = [f"--args={' '.join(add)}"] * bool(add)
        options += [f"--remove-args={' '.join(drop)}"] * bool(drop)
        if options:
            self.system.run_tool([self.tool, "--update-kernel=ALL", *options])


@dataclass
class RpmOstree:
    system: System
    tool: str
    name: str = "rpm-ostree kargs"
    removes: bool = True

    def current(self) -> str:
        return self.system.run_tool([self.tool, "kargs"]).strip() + "\n"

    def put(self, old: str, new: str) -> None:
        drop, add = _delta(old, new)
        options = [f"--delete={w}" for w in drop] + [f"--append={w}" for w in add]
        if options:
            self.system.run_tool([self.tool, "kargs", *options])


def _rewrite(
    text: str, before: Change, added: Sequence[str], remove: Sequence[str]
) -> tuple[str, Change]:
    try:
        return rewritten(text, before, added, remove)
    except ValueError as exc:
        raise KernelRefused("changing the kernel command line", str(exc)) from exc


def _delta(current: str, new: str) -> tuple[list[str], list[str]]:
    """The words to take out of `current` and to put in, to make `new`."""
    old, wanted = current.split(), new.split()
    return [w for w in old if w not in wanted], [w for w in wanted if w not in old]


def detect(system: System) -> Bootloader:
    """The machine's own mechanism (see the module's docstring for the order). In a staged
    root only its own tools count, but for kernel-install, which is told the root."""
    if system.exists("run/ostree-booted") and (tool := system.which("rpm-ostree")):
        return RpmOstree(system, tool)
    if tool := system.which("grubby"):
        return Grubby(system, tool)
    entries = ("etc/kernel/cmdline", "boot/loader/entries", "efi/loader/entries")
    if any(system.exists(e) for e in entries) and (tool := _kernel_install(system)):
        return KernelInstall(system, tool)
    if system.exists("etc/default/grub") and (tool := system.which("update-grub")):
        return DebianGrub(system, tool)
    return PlainFile(system)


def _kernel_install(system: System) -> str | None:
    import shutil

    return system.which("kernel-install") or (None if system.is_real else
                                              shutil.which("kernel-install"))  # fmt: skip


def in_effect(change: Change, cmdline: str) -> list[str]:
    """What of latencyd's change the running kernel did not boot with (empty: all in
    effect): arguments not booted, removed ones still booted."""
    booted = parse_cmdline(cmdline)
    missing = [a for a in change.added if str(find(booted, parse_cmdline(a)[0].key)) != a]
    still = [r for r in change.removed if str(find(booted, parse_cmdline(r)[0].key)) == r]
    return [*missing, *(f"-{r}" for r in still)]
