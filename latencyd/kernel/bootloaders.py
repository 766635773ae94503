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

Each backend undoes latencyd's earlier change (`Change`, kept in latencyd's record
/var/lib/latencyd/bootcmdline, which lasts across reboots as the change does) before
making the new one, so `latencyd off` takes out exactly what latencyd put in and puts
back what it took out; a user's own arguments are left as they are unless the profile
names them in `remove`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from latencyd.errors import KernelRefused
from latencyd.kernel.cmdline import Change, find, parse_cmdline, rewritten
from latencyd.kernel.system import System

RECORD = "var/lib/latencyd/bootcmdline"
GRUB_DROP_IN = "etc/default/grub.d/latencyd.cfg"
KERNEL_CMDLINE = "etc/kernel/cmdline"


class Bootloader(Protocol):
    name: str
    removes: bool  # can take a user's argument out

    def apply(self, before: Change, added: Sequence[str], remove: Sequence[str]) -> Change:
        """Undo `before`, then add and remove: the change made."""
        ...


def read_record(system: System) -> tuple[Change, tuple[str, ...]]:
    """latencyd's change to the boot configuration as its record keeps it, and the
    parameters the profile asked to remove (some may not have been there to remove)."""
    try:
        lines = system.read_file(RECORD).splitlines()
    except KernelRefused:
        return Change(), ()

    def listed(prefix: str) -> tuple[str, ...]:
        return tuple(" ".join(ln[len(prefix) :] for ln in lines if ln.startswith(prefix)).split())

    added = tuple(lines[0].split()) if lines and not lines[0].startswith("#") else ()
    return Change(added, listed("# removed:")), listed("# remove:")


def write_record(system: System, change: Change, asked: Sequence[str]) -> None:
    """The record of `change` (none: no file); its first line is the added arguments, for
    a boot configuration to include where no mechanism was found."""
    if not change.added and not change.removed and not asked:
        system.remove_file(RECORD)
        return
    text = " ".join(change.added) + "\n"
    if change.removed:
        text += "# removed: " + " ".join(change.removed) + "\n"
    if asked:
        text += "# remove: " + " ".join(asked) + "\n"
    system.replace_file(RECORD, text)


@dataclass
class PlainFile:
    """No mechanism found: the record is the file the boot configuration includes."""

    system: System
    name: str = "/var/lib/latencyd/bootcmdline (include it in your boot configuration)"
    removes: bool = False

    def apply(self, before: Change, added: Sequence[str], remove: Sequence[str]) -> Change:
        _no_removal(self, remove)
        return Change(tuple(added))


@dataclass
class DebianGrub:
    system: System
    tool: str  # update-grub
    name: str = "GRUB (/etc/default/grub.d/latencyd.cfg, update-grub)"
    removes: bool = False

    def apply(self, before: Change, added: Sequence[str], remove: Sequence[str]) -> Change:
        _no_removal(self, remove)
        if added:
            self.system.replace_file(GRUB_DROP_IN, (
                "# Written by latencyd (its [bootloader] section); `latencyd off` removes it.\n"
                f'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {" ".join(added)}"\n'
            ))  # fmt: skip
        else:
            self.system.remove_file(GRUB_DROP_IN)
        self.system.run_tool([self.tool])
        return Change(tuple(added))


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

    def apply(self, before: Change, added: Sequence[str], remove: Sequence[str]) -> Change:
        try:
            text = self.system.read_file(KERNEL_CMDLINE)
        except KernelRefused:  # kernel-install falls back to the running kernel's
            text = self.system.read("proc/cmdline").split(" -- ")[0] + "\n"
        new, change = _rewrite(text, before, added, remove)
        self.system.replace_file(KERNEL_CMDLINE, new)
        for version, image in self.kernels():
            self.system.run_tool([self.tool, "add", version, image], self.env)
        return change

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

    def apply(self, before: Change, added: Sequence[str], remove: Sequence[str]) -> Change:
        info = self.system.run_tool([self.tool, "--info=DEFAULT"])
        args = next((ln.split("=", 1)[1].strip().strip('"') for ln in info.splitlines()
                     if ln.startswith("args=")), "")  # fmt: skip
        new, change = _rewrite(args + "\n", before, added, remove)
        drop, put = _delta(args, new)
        options = [f"--args={' '.join(put)}"] * bool(put)
        options += [f"--remove-args={' '.join(drop)}"] * bool(drop)
        if options:
            self.system.run_tool([self.tool, "--update-kernel=ALL", *options])
        return change


@dataclass
class RpmOstree:
    system: System
    tool: str
    name: str = "rpm-ostree kargs"
    removes: bool = True

    def apply(self, before: Change, added: Sequence[str], remove: Sequence[str]) -> Change:
        args = self.system.run_tool([self.tool, "kargs"]).strip()
        new, change = _rewrite(args + "\n", before, added, remove)
        drop, put = _delta(args, new)
        options = [f"--delete={w}" for w in drop] + [f"--append={w}" for w in put]
        if options:
            self.system.run_tool([self.tool, "kargs", *options])
        return change


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


def _no_removal(loader: Bootloader, remove: Sequence[str]) -> None:
    if remove:
        raise KernelRefused(
            f"removing {', '.join(remove)} from the kernel command line",
            f"{loader.name} can only add arguments",
        )


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
