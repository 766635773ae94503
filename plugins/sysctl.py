"""sysctl: any /proc/sys key, e.g. ``"net.core.busy_read" = 50``.

A key the kernel lacks is an error when the profile loads (a typo must not pass as a
setting), unless it starts with "-", as in sysctl.d(5): ``"-kernel.numa_balancing" = 0``
is for kernels built with it and *not applicable* on the others, which is what a profile
shipped for many kernels needs.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from latencyd.core.plugin import Expansion, FileTarget, Plugin, Target, Value
from latencyd.core.schema import Int, OneOf, Schema, Str
from latencyd.kernel.owners import SYSCTL, Claim
from latencyd.kernel.system import System

# Sysctls that hand out root: each names a program the kernel runs as root, or
# switches off a protection against privilege escalation. A profile setting one is
# applied only for root callers (not for members of admin_group). See docs/guarantees.md.
ROOT_ONLY_SYSCTLS = (
    # programs the kernel executes as root
    "kernel.core_pattern",  # "|/path" pipes core dumps to a program
    "kernel.modprobe",  # run on every module request
    "kernel.hotplug",  # the uevent helper
    "kernel.poweroff_cmd",
    "kernel.usermodehelper.*",  # capabilities of every kernel-spawned helper
    "fs.binfmt_misc.*",  # registers interpreters for executables
    # protections whose loss turns a local user into root
    "kernel.kptr_restrict",
    "kernel.dmesg_restrict",
    "kernel.perf_event_paranoid",
    "kernel.unprivileged_bpf_disabled",
    "kernel.yama.ptrace_scope",
    "kernel.kexec_load_disabled",
    "kernel.modules_disabled",
    "kernel.randomize_va_space",
    "kernel.unprivileged_userns_clone",
    "kernel.sysrq",
    "vm.mmap_min_addr",
    "fs.protected_*",
    "fs.suid_dumpable",
    "user.*",
)


def sysctl_path(key: str) -> str:
    """``net.ipv4.conf.all.rp_filter`` -> ``proc/sys/net/ipv4/conf/all/rp_filter``.

    As in sysctl(8): a key containing '/' is already a path (so dots stay literal,
    as in ``net/ipv4/conf/eth0.100/rp_filter``).
    """
    rel = key.strip("/") if "/" in key else key.replace(".", "/")
    return f"proc/sys/{rel}"


OPTIONAL = "-"  # sysctl.d(5)'s prefix: the key may be missing from this kernel


def key_parts(key: str) -> list[str] | None:
    """The path components a key names, or None if it is not a plain key: every part
    non-empty and not "." or ".." (so no spelling reaches a file another key names)."""
    parts = key.strip("/").split("/") if "/" in key else key.split(".")
    if any(p in ("", ".", "..") or "\0" in p for p in parts):
        return None
    return parts


def root_only_reason(key: str) -> str | None:
    parts = key_parts(key)
    if parts is None:
        return f"sysctl key {key!r} is not a plain key"
    name = ".".join(parts)
    for pattern in ROOT_ONLY_SYSCTLS:
        if fnmatch.fnmatchcase(name, pattern):
            return f"sysctl {key!r} can hand out root (matches {pattern!r})"
    return None


def normalize(value: int | str) -> str:
    """Multi-field sysctls read back tab-separated; compare them field by field."""
    return " ".join(str(value).split())


@dataclass(frozen=True)
class Sysctl(FileTarget[str]):
    """One /proc/sys file; multi-field values compare field by field."""

    kind: ClassVar[str] = "sysctl"
    key: str

    def problem(self) -> str | None:
        return root_only_reason(self.key)

    @property
    def rel(self) -> str:
        return sysctl_path(self.key)

    def parse(self, text: str) -> str:
        return normalize(text)

    def same(self, system: System, wanted: str, actual: str) -> bool:
        return normalize(wanted) == normalize(actual)

    def describe(self, value: str) -> str:
        return f"sysctl {self.key} = {value}"

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(SYSCTL, sysctl_path(self.key).removeprefix("proc/sys/")),)


# A section of free keys (Schema.free_keys) is read as the mapping it is: key -> value.
SysctlOptions = Mapping[str, int | str]


class SysctlPlugin(Plugin[Sysctl, None, SysctlOptions]):
    name = "sysctl"
    summary = "Any kernel sysctl under /proc/sys"
    targets = (Sysctl,)
    example: ClassVar[dict[str, Any]] = {"vm.swappiness": 5}

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.schema = self.schema_for(system)

    @classmethod
    def schema_for(cls, system: System) -> Schema:
        def check_key(key: str) -> str | None:
            optional, key = key.startswith(OPTIONAL), key.removeprefix(OPTIONAL)
            if key_parts(key) is None:
                return f"sysctl key {key!r} is not a plain key"
            if len(key) > 255:
                return f"sysctl key is {len(key)} characters long; no sysctl is"
            path = system.path(sysctl_path(key))
            try:
                if not path.exists():
                    if optional:
                        return None
                    return (
                        f"unknown sysctl {key!r}: /{sysctl_path(key)} does not exist on this kernel"
                    )
                if path.is_dir():
                    return f"sysctl {key!r} is a directory, not a setting"
            except OSError as exc:
                return f"sysctl key {key!r} is not usable: {exc.strerror}"
            return None

        # Socket busy polling acts on its own (network-latency), apart from the VM sysctls.
        busy_poll = ("busy_poll", ("net.core.busy_read", "net.core.busy_poll"))
        return Schema(free_keys=check_key, free_kind=OneOf((Int(), Str())), groups=(busy_poll,))

    def expand(self, options: SysctlOptions, owned: Mapping[Target, Value]) -> Expansion[None]:
        wanted: dict[Target, Value] = {}
        refused: dict[str, str] = {}
        for given, value in options.items():
            key = given.removeprefix(OPTIONAL)
            if given.startswith(OPTIONAL) and not self.system.exists(sysctl_path(key)):
                refused[key] = f"this kernel has no /{sysctl_path(key)}"
            else:
                wanted[Sysctl(key)] = normalize(value)
        return Expansion(wanted, refused=refused)

    def root_only(self, options: SysctlOptions) -> str | None:
        keys = (key.removeprefix(OPTIONAL) for key in options)
        return next(filter(None, map(root_only_reason, keys)), None)
