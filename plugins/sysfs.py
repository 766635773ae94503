"""sysfs: any file under /sys, by path or glob, e.g.
``"/sys/kernel/mm/transparent_hugepage/enabled" = "never"`` or
``"/sys/devices/system/cpu/cpu*/power/energy_perf_bias" = 6``.

Keys outside /sys (after resolving ``..``) are refused when the profile loads. Globs are
expanded when the section is, and again when devices come and go (udev events, and a
cheap re-glob on the monitor tick), so a disk or NIC that appears later gets its files
set too; a glob that matches nothing is "not applicable", not an error. A file is known
by its real path (symlinks resolved), so two spellings of one file are one setting.

Bracketed-choice files (``always madvise [never]``, a block queue's scheduler) read as
the bracketed word: a write of "never" reads back "never" and verifies, and a value the
file does not list is refused with the choices it offers.

Any file under /sys can hand out root (/sys/kernel/uevent_helper names a program the
kernel runs as root on every uevent), so the section is for root only.
"""

from __future__ import annotations

import glob
import os
import posixpath
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from latencyd.core.capabilities import FollowsDevices
from latencyd.core.plugin import (
    CPU_ACTIONS,
    DeviceEvent,
    Expansion,
    FileTarget,
    Follows,
    Plugin,
    Settings,
    Target,
    Value,
)
from latencyd.core.schema import Int, OneOf, Schema, Str
from latencyd.errors import KernelRefused
from latencyd.kernel.owners import SYSFS, Claim
from latencyd.kernel.system import System

# Subsystems whose devices carry the files profiles set by glob: block queues, NICs, PCI
# and USB power control, SCSI hosts' link power management, NVMe; CPUs too (a CPU that
# comes online brings its cpuN files, and the daemon re-applies the profile then).
DEVICE_EVENTS = frozenset({"add", "remove", "bind", "unbind", "move"})
SUBSYSTEMS = ("block", "net", "pci", "usb", "scsi", "scsi_host", "nvme")
ROOT_ONLY = (
    "any file under /sys can hand out root (e.g. /sys/kernel/uevent_helper names a "
    "program the kernel runs as root)"
)
MAX_KEY = 4096


def normalize(value: int | str) -> str:
    """A value as compared: whitespace-separated words, single-spaced."""
    return " ".join(str(value).split())


def bracketed(text: str) -> tuple[tuple[str, ...], str] | None:
    """A bracketed-choice file's choices and the chosen one ("a [b] c" -> (a, b, c), b)."""
    words = text.split()
    chosen = [w[1:-1] for w in words if len(w) > 2 and w[0] == "[" and w[-1] == "]"]
    if len(words) < 2 or len(chosen) != 1:
        return None
    return tuple(w.strip("[]") for w in words), chosen[0]


def check_key(key: str) -> str | None:
    """Why `key` cannot name files under /sys, or None."""
    if len(key) > MAX_KEY:
        return f"sysfs key is {len(key)} characters long; no path under /sys is"
    if "\0" in key:
        return "sysfs key contains a NUL character"
    if not key.startswith("/"):
        return f"sysfs key {key!r} is not an absolute path (write /sys/...)"
    resolved = posixpath.normpath(key)
    if not resolved.startswith("/sys/"):
        return (
            f"sysfs key {key!r} is outside /sys (it resolves to {resolved!r}): "
            "only files under /sys can be set here"
        )
    return None


@dataclass(frozen=True)
class SysfsFile(FileTarget[str]):
    """One file, by its real path ("/sys/devices/..."). A refusal fails the profile: the
    profile named this file and value, and a file that cannot take it is a mistake to fix,
    not a capability to report. (Globs over devices that may lack a choice get that
    checked when the section is expanded: such a file is refused there, with its choices.)
    Its value is the text as the file shows it (so a restore writes back exactly that), or
    the chosen word of a bracketed-choice file; values compare word by word. A device's
    file goes with its device."""

    kind: ClassVar[str] = "sysfs_file"
    transient: ClassVar[bool] = True
    path: str

    def problem(self) -> str | None:
        return check_key(self.path)

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(SYSFS, self.path),)

    @property
    def rel(self) -> str:
        return self.path.lstrip("/")

    def parse(self, text: str) -> str:
        choices = bracketed(text)
        return choices[1] if choices is not None else text

    def same(self, system: System, wanted: str, actual: str) -> bool:
        return normalize(wanted) == normalize(actual)

    def describe(self, value: str) -> str:
        return f"{self.path} = {value}"


@dataclass(frozen=True)
class SysfsRules:
    """What the section matched when expanded, to notice devices that came or went."""

    keys: tuple[str, ...]
    found: frozenset[tuple[str, str]]  # (key, real path under root) pairs


# A section of free keys (Schema.free_keys) is read as the mapping it is: path -> value.
SysfsOptions = Mapping[str, int | str]


class SysfsPlugin(Plugin[SysfsFile, SysfsRules, SysfsOptions], FollowsDevices[SysfsRules]):
    name = "sysfs"
    summary = "Any file under /sys, by absolute path or glob"
    targets = (SysfsFile,)
    schema = Schema(free_keys=check_key, free_kind=OneOf((Int(), Str())))
    follows = Follows(udev={s: DEVICE_EVENTS for s in SUBSYSTEMS} | {"cpu": CPU_ACTIONS})
    example: ClassVar[dict[str, Any]] = {"/sys/kernel/mm/transparent_hugepage/enabled": "never"}

    # -- the files a key names --------------------------------------------------------------
    def matches(self, key: str) -> list[str]:
        """Real paths (under the System root, no leading "/") of what `key` names under /sys,
        sorted; directories and anything a link leads out of /sys to are left out."""
        root = os.path.realpath(self.system.root)
        pattern = posixpath.normpath(key).lstrip("/")
        found = set()
        for rel in glob.glob(pattern, root_dir=root):
            real = os.path.relpath(os.path.realpath(os.path.join(root, rel)), root)
            if real.startswith("sys/") and os.path.isfile(os.path.join(root, real)):
                found.add(real)
        return sorted(found)

    def problem(self, rel: str, value: str) -> str | None:
        """Why this file cannot be set to `value` and given back, or None."""
        try:
            mode = os.stat(self.system.path(rel)).st_mode
        except OSError as exc:
            return f"cannot be examined: {exc.strerror}"
        if not mode & (stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH):
            return "write-only (an action, not a setting): there is nothing to read back or restore"
        if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
            return "read-only"
        try:
            choices = bracketed(self.system.read(rel))
        except KernelRefused as exc:
            return f"cannot be read, so its original could not be restored: {exc.reason}"
        if choices is not None and value not in choices[0]:
            return f"not one of its choices: {', '.join(choices[0])}"
        return None

    # -- what a section wants ---------------------------------------------------------------
    def expand(self, options: SysfsOptions, owned: Mapping[Target, Value]) -> Expansion[SysfsRules]:
        settings: Settings = {}
        notes: dict[Target, str] = {}
        refused: dict[str, str] = {}
        keys = tuple(k for k in options if k.startswith("/"))
        found: set[tuple[str, str]] = set()
        for key in keys:
            value = normalize(options[key])
            files = self.matches(key)
            found.update((key, rel) for rel in files)
            if not files:
                magic = glob.has_magic(key)
                refused[f"{key} = {value}"] = (
                    "matches no file on this machine" if magic else "no such file on this machine"
                )
                continue
            for rel in files:
                target = SysfsFile(f"/{rel}")
                problem = self.problem(rel, value)
                if problem:
                    refused[f"{target.path} = {value} (from {key})"] = problem
                    continue
                # Later keys win where two name the same file.
                settings.pop(target, None)
                notes.pop(target, None)
                settings[target] = value
                if target.path != posixpath.normpath(key):
                    notes[target] = f"from {key}"
        rules = SysfsRules(keys, frozenset(found))
        return Expansion(settings, rules, notes, refused)

    def root_only(self, options: SysfsOptions) -> str | None:
        return ROOT_ONLY if any(k.startswith("/") for k in options) else None

    def on_device(
        self, rules: SysfsRules | None, event: DeviceEvent, owned: Mapping[Target, Value]
    ) -> tuple[Settings, set[Target]] | None:
        """Globs may match the device's files now (or no longer): expand the section again."""
        return None

    def changed(self, rules: SysfsRules | None) -> bool:
        """Files the section's keys match now differ from those matched when expanded."""
        if rules is None:  # the section was refused: nothing to follow
            return False
        now = frozenset((key, rel) for key in rules.keys for rel in self.matches(key))
        return now != rules.found
