"""Who else sets what latencyd sets: the other owners of every setting, named.

Tuners fight other managers: systemd-sysctl re-applies sysctl.d at boot, whenever it is
restarted, and (through udev) for each network interface that appears; systemd gives
services CPUs (CPUAffinity=, AllowedCPUs=); the kubelet gives pods CPUs; irqbalance moves
IRQs; TuneD applies its profile. Each is read here from its configuration, with the file
and line, through the System (rooted at a path: unit tests use fake roots):

- `read_owners(system)` -> `OwnerIndex`: every owner found, asked by `Claim` (what a
  setting is to the others: a sysctl key, the IRQs' affinity, a unit's CPUs, ...).
  A latencyd target says which claims it makes (`Target.claims`); `owners_of` answers
  for a batch of targets (status, explain, and `plan`).
- `OwnerIndex.changed_by`: which owner's value a drifted setting now holds.
- `running_tuners(system)`: TuneD or another latencyd running now, what their profile
  claims, and `overlap` with what latencyd owns.

The parsers are pure (text in, lines out); only `read_owners` and `running_tuners` read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from latencyd.errors import LatencydError
from latencyd.paths import KUBELET_CONFIG

if TYPE_CHECKING:
    from latencyd.kernel.system import System

# What a setting is, to the other programs that may set it (Claim.kind).
SYSCTL = "sysctl"  # key: the sysctl as a path under /proc/sys ("vm/swappiness")
IRQS = "irq affinity"  # the IRQs' CPUs
CPUS = "cpus"  # key: a systemd unit, or "" for the machine's tasks at large
THREADS = "kernel thread affinity"
PM_QOS = "cpu latency (pm qos)"
CPUFREQ = "cpu frequency"
SYSFS = "sysfs"  # key: the file's path ("/sys/kernel/mm/transparent_hugepage/enabled")
NIC = "nic settings"
BOOT = "kernel arguments"

# systemd-sysctl's search path, first wins for a file name (sysctl.d(5), systemd 252).
SYSCTL_DIRS = (
    "etc/sysctl.d",
    "run/sysctl.d",
    "usr/local/lib/sysctl.d",
    "usr/lib/sysctl.d",
    "lib/sysctl.d",
)
SYSCTL_CONF = "etc/sysctl.conf"  # read last by procps's `sysctl --system`, not by systemd
UDEV_DIRS = (
    "etc/udev/rules.d",
    "run/udev/rules.d",
    "usr/local/lib/udev/rules.d",
    "usr/lib/udev/rules.d",
    "lib/udev/rules.d",
)
UNIT_DIRS = (
    "etc/systemd/system",
    "run/systemd/system",
    "usr/local/lib/systemd/system",
    "usr/lib/systemd/system",
    "lib/systemd/system",
)
SYSTEM_CONF = "etc/systemd/system.conf"
SYSTEM_CONF_DIRS = (
    "etc/systemd/system.conf.d",
    "run/systemd/system.conf.d",
    "usr/local/lib/systemd/system.conf.d",
    "usr/lib/systemd/system.conf.d",
)
IRQBALANCE_CONFS = ("etc/default/irqbalance", "etc/sysconfig/irqbalance")
TUNED_ACTIVE = "etc/tuned/active_profile"
TUNED_MAIN = "etc/tuned/tuned-main.conf"
TUNED_PROFILE_DIRS = ("etc/tuned", "usr/lib/tuned/profiles", "usr/lib/tuned")
TUNED_PID = "run/tuned/tuned.pid"
MAX_INCLUDES = 16  # TuneD profiles included from one another, at most (a cycle ends here)

SYSCTL_WHEN = "at boot (systemd-sysctl.service), and whenever that service is restarted"
IRQBALANCE_WHEN = "every 10 s while irqbalance runs"
TUNED_WHEN = "whenever tuned.service starts or switches profile"


@dataclass(frozen=True)
class Claim:
    """What a setting is to the other programs that may set it."""

    kind: str
    key: str = ""

    def __str__(self) -> str:
        if self.kind == SYSCTL:
            return f"sysctl {dotted(self.key)}"
        return f"{self.kind} of {self.key}" if self.key else self.kind


class Claimant(Protocol):
    """A latencyd setting (latencyd.core.plugin.Target): the claims it makes."""

    def claims(self) -> tuple[Claim, ...]: ...


@dataclass(frozen=True)
class Owner:
    """Another program that sets a setting: who, where it is told to, what, and when."""

    who: str  # "systemd-sysctl", "udev", "TuneD", "irqbalance", "systemd", "kubelet"
    where: str  # "/etc/sysctl.d/90-swap.conf:3", or the process ("pid 812")
    sets: str  # "vm.swappiness = 60"
    when: str  # "at boot (systemd-sysctl.service), and ..."
    value: str | None = None  # the value it writes, when it is one value
    overridden_by: str | None = None  # a later line wins over this one (its where)

    def as_json(self) -> dict[str, str | None]:
        return {
            "who": self.who,
            "where": self.where,
            "sets": self.sets,
            "when": self.when,
            "value": self.value,
            "overridden_by": self.overridden_by,
        }

    def __str__(self) -> str:
        over = f" (overridden by {self.overridden_by})" if self.overridden_by else ""
        return f"{self.who} {self.where}: {self.sets}{over}, {self.when}"


# -- sysctl.d ------------------------------------------------------------------------------
def sysctl_key(key: str) -> str:
    """A sysctl key as its path under /proc/sys, as systemd normalizes it: if the first
    separator is '/', slashes separate and dots are literal; else dots separate and
    slashes are literal dots ("net.ipv4.conf.eth0/100.rp_filter")."""
    key = key.strip().strip("/")
    first = re.search(r"[./]", key)
    if first is None or first.group() == "/":
        return key
    return key.translate(str.maketrans("./", "/."))


def dotted(path: str) -> str:
    """`vm/swappiness` -> `vm.swappiness` (a literal dot shown as '/', as sysctl(8) does)."""
    return path.translate(str.maketrans("./", "/."))


def same_value(a: object, b: object) -> bool:
    """Values alike as sysctl compares them: fields however spaced."""
    return str(a).split() == str(b).split()


@dataclass(frozen=True)
class SysctlLine:
    """One assignment in a sysctl.d fragment (or an exclusion: `-key` alone)."""

    where: str  # "/etc/sysctl.d/90-x.conf:3"
    key: str  # as a path under /proc/sys, possibly a glob
    value: str | None  # None: an exclusion from globs
    optional: bool = False  # "-key = value": a missing key is not an error

    @property
    def glob(self) -> bool:
        return any(c in self.key for c in "*?[")

    def matches(self, key: str) -> bool:
        if not self.glob:
            return self.key == key
        mine, theirs = self.key.split("/"), key.split("/")
        return len(mine) == len(theirs) and all(
            fnmatch.fnmatchcase(t, m) for m, t in zip(mine, theirs, strict=True)
        )


def parse_sysctl_d(where: str, text: str) -> list[SysctlLine]:
    """A sysctl.d fragment's assignments (sysctl.d(5), systemd 252): `key = value`, comments
    after '#' or ';', `-key = value` optional, `-key` alone an exclusion from globs. Lines
    that are none of these are skipped (systemd-sysctl warns of them itself)."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, eq, value = line.partition("=")
        optional = key.startswith("-")
        key = sysctl_key(key.removeprefix("-"))
        if not key:
            continue
        if not eq:
            if optional:
                out.append(SysctlLine(f"{where}:{n}", key, None))
            continue
        out.append(SysctlLine(f"{where}:{n}", key, value.strip(), optional))
    return out


def conf_files(
    system: System, dirs: Iterable[str], suffix: str, masks: bool = True
) -> list[tuple[str, str]]:
    """(name, path) of the configuration files in `dirs`, a name found first shadowing the
    same name later (how systemd finds sysctl.d, udev rules and units), sorted by name. A
    file that is a link to /dev/null masks the name (it is left out)."""
    found: dict[str, str] = {}
    for d in dirs:
        for name in system.listdir(d):
            if name.endswith(suffix) and name not in found:
                found[name] = f"{d}/{name}"
    return [(n, rel) for n, rel in sorted(found.items()) if not (masks and _masked(system, rel))]


def _masked(system: System, rel: str) -> bool:
    return os.path.islink(system.fspath(rel)) and system.realpath(rel) == "/dev/null"


def _shown(system: System, rel: str) -> str:
    """A file as people know it: where its links lead within the root (99-sysctl.conf ->
    /etc/sysctl.conf), else /rel."""
    root = os.path.realpath(system.fspath(""))
    inside = os.path.relpath(os.path.realpath(system.fspath(rel)), root)
    return "/" + (rel if inside.startswith("..") else inside)


# Texts read, by file and its (inode, mtime, size): status asks for the owners of every
# setting each time, and hundreds of unit files and udev rules rarely change; a stat each
# is what a status costs then. Bounded: cleared past MAX_CACHED files.
_TEXTS: dict[str, tuple[tuple[int, int, int], str | None]] = {}
MAX_CACHED = 4096


def _text(system: System, rel: str) -> str | None:
    """A configuration file's text (None if it cannot be read), read again only once the
    file has changed."""
    path = system.fspath(rel)
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _TEXTS.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    text: str | None = None
    with contextlib.suppress(LatencydError):  # not a file to read (a link, a FIFO): None
        text = system.read_file(rel)
    if len(_TEXTS) >= MAX_CACHED:
        _TEXTS.clear()
    _TEXTS[path] = (stamp, text)
    return text


def read_sysctl_d(system: System) -> list[SysctlLine]:
    """Every sysctl.d assignment in the order systemd-sysctl applies them, then
    /etc/sysctl.conf's (procps `sysctl --system`), unless a fragment already is it."""
    lines: list[SysctlLine] = []
    seen: set[str] = set()
    for _, rel in conf_files(system, SYSCTL_DIRS, ".conf"):
        text = _text(system, rel)
        if text is not None:
            shown = _shown(system, rel)
            seen.add(shown)
            lines += parse_sysctl_d(shown, text)
    if "/" + SYSCTL_CONF not in seen:
        text = _text(system, SYSCTL_CONF)
        if text is not None:
            lines += parse_sysctl_d("/" + SYSCTL_CONF, text)
    return lines


# -- udev rules ---------------------------------------------------------------------------
@dataclass(frozen=True)
class UdevSysctl:
    """A udev rule that runs systemd-sysctl (or sysctl) as devices come."""

    where: str
    prefixes: tuple[str, ...]  # systemd-sysctl --prefix=, as key globs ("net/ipv4/conf/*")
    event: str  # "when a network interface appears"
    assigns: tuple[tuple[str, str], ...] = ()  # sysctl -w key=value


RUN = re.compile(r"RUN\{?[a-z]*\}?\+?=\s*\"([^\"]*)\"")


def parse_udev_rules(where: str, text: str) -> list[UdevSysctl]:
    """Rules whose RUN names systemd-sysctl or sysctl: the keys they re-apply."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if "sysctl" not in line or line.lstrip().startswith("#"):
            continue
        for run in RUN.findall(line):
            words = run.split()
            if not words or "sysctl" not in os.path.basename(words[0]):
                continue
            prefixes = tuple(
                re.sub(r"\$name|\$kernel|%k", "*", sysctl_key(w.split("=", 1)[1]))
                for w in words[1:]
                if w.startswith("--prefix=")
            )
            assigns = tuple(
                (sysctl_key(k), v)
                for k, _, v in (w.partition("=") for w in words[1:] if not w.startswith("-"))
                if _
            )
            if "systemd-sysctl" in words[0] and not prefixes:
                prefixes = ("*",)
            net = re.search(r"SUBSYSTEM==\"net\"", line) is not None
            event = "when a network interface appears" if net else "on a device event"
            out.append(UdevSysctl(f"{where}:{n}", prefixes, event, assigns))
    return out


def _under(key: str, prefix: str) -> bool:
    """Whether `key` (a path, maybe a glob) lies under `prefix` (a glob of a path)."""
    if prefix == "*":
        return True
    mine, theirs = prefix.split("/"), key.split("/")
    return len(theirs) >= len(mine) and all(
        fnmatch.fnmatchcase(t, m) or t == m for m, t in zip(mine, theirs, strict=False)
    )


# -- simple KEY=value configuration -------------------------------------------------------
def assignments(where: str, text: str, keys: Iterable[str]) -> Iterator[tuple[str, str, str]]:
    """(where:line, key, value) of `KEY=value` lines (shell or INI, quotes dropped) whose key
    is one of `keys`."""
    wanted = set(keys)
    for n, line in enumerate(text.splitlines(), 1):
        m = re.fullmatch(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*[=:]\s*\"?([^\"#]*?)\"?\s*(#.*)?", line)
        if m and m.group(1) in wanted:
            yield f"{where}:{n}", m.group(1), m.group(2).strip()


# -- TuneD --------------------------------------------------------------------------------
@dataclass(frozen=True)
class TunedKey:
    where: str
    section: str  # the plugin the section is for ("sysctl", "cpu", ...)
    key: str
    value: str


def parse_tuned_conf(where: str, text: str) -> tuple[list[str], list[TunedKey]]:
    """A TuneD profile's includes and its keys, section by section (its `type=` names
    the plugin, else the section's name does)."""
    includes: list[str] = []
    keys: list[TunedKey] = []
    section, kind = "", ""
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = kind = line[1:-1].strip()
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq:
            continue
        if section == "main":
            if key == "include":
                includes += [p for p in re.split(r"[,;\s]+", value) if p and "$" not in p]
            continue
        if key == "type":
            kind = value
            keys = [
                k if k.section != section else TunedKey(k.where, value, k.key, k.value)
                for k in keys
            ]
            continue
        keys.append(TunedKey(f"{where}:{n}", kind, key, value))
    return includes, keys


TUNED_PLUGIN_CLAIMS: dict[str, tuple[str, ...]] = {
    "cpu": (PM_QOS, CPUFREQ),
    "scheduler": (IRQS, THREADS, CPUS),
    "irqbalance": (IRQS,),
    "irq": (IRQS,),
    "net": (NIC,),
    "bootloader": (BOOT,),
}
TUNED_VM_SYSCTLS = (
    "dirty_bytes",
    "dirty_ratio",
    "dirty_background_bytes",
    "dirty_background_ratio",
)
THP = "/sys/kernel/mm/transparent_hugepage/enabled"


def tuned_claims(key: TunedKey) -> tuple[Claim, ...]:
    """What a TuneD profile's key sets, as latencyd's settings claim it."""
    if key.section == "sysctl":
        return (Claim(SYSCTL, sysctl_key(key.key)),)
    if key.section == "vm":
        if key.key in TUNED_VM_SYSCTLS:
            return (Claim(SYSCTL, f"vm/{key.key}"),)
        return (Claim(SYSFS, THP),) if key.key == "transparent_hugepages" else ()
    if key.section == "sysfs":
        return (Claim(SYSFS, key.key),)
    return tuple(Claim(kind) for kind in TUNED_PLUGIN_CLAIMS.get(key.section, ()))


def read_tuned_profile(system: System, names: list[str]) -> list[TunedKey]:
    """The keys of TuneD's profiles `names`, includes first (later ones win, as in TuneD)."""
    out: list[TunedKey] = []
    done: set[str] = set()

    def load(name: str, depth: int) -> None:
        if name in done or depth > MAX_INCLUDES:
            return
        done.add(name)
        for d in TUNED_PROFILE_DIRS:
            rel = f"{d}/{name}/tuned.conf"
            text = _text(system, rel) if system.exists(rel) else None
            if text is not None:
                includes, keys = parse_tuned_conf("/" + rel, text)
                for inc in includes:
                    load(inc, depth + 1)
                out.extend(keys)
                return

    for name in names:
        load(name, 0)
    return out


def tuned_active(system: System) -> list[str]:
    """The profiles named in TuneD's active_profile (none: TuneD has none set)."""
    text = _text(system, TUNED_ACTIVE) if system.exists(TUNED_ACTIVE) else None
    return [n for n in (text or "").split() if "/" not in n and n not in (".", "..")]


# -- the index ------------------------------------------------------------------------------
@dataclass(frozen=True)
class OwnerIndex:
    """Every other owner found on the machine, by claim."""

    sysctl: tuple[SysctlLine, ...] = ()
    sysctl_when: str = SYSCTL_WHEN
    udev: tuple[UdevSysctl, ...] = ()
    others: tuple[tuple[Claim, Owner], ...] = ()  # TuneD, irqbalance, systemd, kubelet
    _by_key: dict[str, list[SysctlLine]] = field(default_factory=dict, compare=False)
    _globs: list[SysctlLine] = field(default_factory=list, compare=False)

    def __post_init__(self) -> None:
        for line in self.sysctl:
            if not line.glob:
                self._by_key.setdefault(line.key, []).append(line)
            elif line.value is not None:
                self._globs.append(line)

    def of(self, claims: Iterable[Claim]) -> list[Owner]:
        """The owners of a setting making `claims`, in the order they act."""
        out: list[Owner] = []
        for claim in claims:
            if claim.kind == SYSCTL:
                out += self._sysctl(claim.key)
            out += [o for c, o in self.others if _covers(c, claim)]
        return list(dict.fromkeys(out))

    def _sysctl(self, key: str) -> list[Owner]:
        explicit = self._by_key.get(key, [])
        # systemd-sysctl: the last explicit assignment wins; a glob sets only a key no
        # line names explicitly, and not one excluded from globs ("-key" alone).
        excluded = any(line.value is None for line in explicit)
        globs = [] if excluded else [g for g in self._globs if g.matches(key)]
        assigned = [line for line in explicit if line.value is not None]
        lines = sorted(assigned + globs, key=self.sysctl.index)
        winners = assigned or globs
        winner = winners[-1] if winners else None
        out = []
        for line in lines:
            when = self.sysctl_when + "".join(
                f"; {u.event} ({u.where})"
                for u in self.udev
                if any(_under(line.key, p) for p in u.prefixes)
            )
            out.append(
                Owner(
                    "systemd-sysctl",
                    line.where,
                    f"{dotted(line.key)} = {line.value}",  # as the line says it
                    when,
                    line.value,
                    None if winner is None or line is winner else winner.where,
                )
            )
        for u in self.udev:
            out += [
                Owner("udev", u.where, f"{dotted(key)} = {v}", u.event, v)
                for k, v in u.assigns
                if k == key
            ]
        return out

    def changed_by(self, claims: Iterable[Claim], value: object) -> Owner | None:
        """The owner whose value a setting now holds (the one that wins first), if one
        does: the likely writer of a drift."""
        found = [o for o in self.of(claims) if o.value is not None and same_value(o.value, value)]
        found.sort(key=lambda o: o.overridden_by is not None)
        return found[0] if found else None


def _covers(theirs: Claim, ours: Claim) -> bool:
    if theirs.kind != ours.kind:
        return False
    if theirs.kind == SYSFS:
        return fnmatch.fnmatchcase(ours.key, theirs.key)
    # A machine-wide owner ("") covers every key; a unit's owner covers its unit, and
    # the machine's tasks at large.
    return not theirs.key or not ours.key or theirs.key == ours.key


def read_owners(system: System) -> OwnerIndex:
    """Every other owner the machine's configuration names (under the System's root),
    and whether TuneD runs now (by its pid file)."""
    udev: list[UdevSysctl] = []
    for _, rel in conf_files(system, UDEV_DIRS, ".rules"):
        text = _text(system, rel)
        if text is not None and "sysctl" in text:
            udev += parse_udev_rules("/" + rel, text)
    others: list[tuple[Claim, Owner]] = []
    others += _systemd_cpus(system)
    others += _kubelet(system)
    others += _irqbalance(system)
    others += _tuned(system, system.root_process_by_pidfile(TUNED_PID, "tuned"))
    when = SYSCTL_WHEN
    if system.exists(TUNED_MAIN) and any(
        v.strip() in ("1", "true", "yes")
        for _, _, v in assignments("", _text(system, TUNED_MAIN) or "", ["reapply_sysctl"])
    ):
        when += "; by TuneD after each profile it applies (reapply_sysctl)"
    return OwnerIndex(tuple(read_sysctl_d(system)), when, tuple(udev), tuple(others))


def _systemd_cpus(system: System) -> list[tuple[Claim, Owner]]:
    out = []
    confs = [SYSTEM_CONF] + [rel for _, rel in conf_files(system, SYSTEM_CONF_DIRS, ".conf")]
    for rel in confs:
        for where, key, value in assignments("/" + rel, _text(system, rel) or "", ["CPUAffinity"]):
            when = "at boot: PID 1 and every service it starts without CPUAffinity= of its own"
            out.append((Claim(CPUS), Owner("systemd", where, f"{key}={value}", when, value)))
    # A masked unit (a link to /dev/null) has no text to read: no need to look for masks.
    for _, rel in conf_files(system, UNIT_DIRS, "", masks=False):
        unit = rel.rsplit("/", 1)[1]
        if unit.endswith(".d"):
            files = [f"{rel}/{n}" for n in system.listdir(rel) if n.endswith(".conf")]
            unit = unit[:-2]
        elif unit.endswith((".service", ".slice", ".scope", ".socket")):
            files = [rel]
        else:
            continue
        for f in files:
            text = _text(system, f) or ""
            if "CPU" not in text:
                continue
            for where, key, value in assignments("/" + f, text, ["AllowedCPUs", "CPUAffinity"]):
                when = f"whenever {unit} starts" + (
                    " (a cgroup setting, kept while it runs)" if key == "AllowedCPUs" else ""
                )
                owner = Owner("systemd", where, f"{key}={value}", when, value)
                out.append((Claim(CPUS, unit), owner))
    return out


def _kubelet(system: System) -> list[tuple[Claim, Owner]]:
    rel = str(KUBELET_CONFIG).lstrip("/")
    if not system.exists(rel):
        return []
    keys = ["reservedSystemCPUs", "cpuManagerPolicy"]
    when = "whenever the kubelet starts a pod's containers"
    found = assignments("/" + rel, _text(system, rel) or "", keys)
    return [
        (Claim(CPUS), Owner("kubelet", where, f"{key}: {value}", when, value))
        for where, key, value in found
    ]


def _irqbalance(system: System) -> list[tuple[Claim, Owner]]:
    running = system.root_process_by_pidfile("run/irqbalance.pid", "irqbalance")
    installed = system.exists("usr/sbin/irqbalance") or running is not None
    if not installed:
        return []
    when = IRQBALANCE_WHEN + (f" (running: pid {running})" if running else " (not running now)")
    rel = next((f for f in IRQBALANCE_CONFS if system.exists(f)), IRQBALANCE_CONFS[0])
    bans = list(
        assignments(
            "/" + rel,
            _text(system, rel) or "",
            ["IRQBALANCE_BANNED_CPULIST", "IRQBALANCE_BANNED_CPUS"],
        )
    )
    if not bans:
        return [(Claim(IRQS), Owner("irqbalance", "/" + rel, "IRQs onto every CPU", when))]
    return [
        (Claim(IRQS), Owner("irqbalance", where, f"IRQs onto every CPU but {key}={value}", when))
        for where, key, value in bans
    ]


def _tuned(system: System, running: int | None) -> list[tuple[Claim, Owner]]:
    names = tuned_active(system)
    if not names:
        return []
    when = TUNED_WHEN + (f" (running: pid {running})" if running else " (not running now)")
    profile = " ".join(names)
    out = []
    for key in read_tuned_profile(system, names):
        sets = f"[{key.section}] {key.key} = {key.value} (profile {profile})"
        value = key.value if key.section in ("sysctl", "vm", "sysfs") else None
        out += [(c, Owner("TuneD", key.where, sets, when, value)) for c in tuned_claims(key)]
    return out


def owners_of(system: System, targets: Iterable[Claimant]) -> dict[Claimant, list[Owner]]:
    """The other owners of each of `targets` that has some: what status, explain and
    `plan` show beside a setting (one read of the machine's configuration)."""
    index = read_owners(system)
    found = {t: index.of(t.claims()) for t in targets}
    return {t: owners for t, owners in found.items() if owners}


# -- other tuners running now -------------------------------------------------------------
@dataclass(frozen=True)
class Tuner:
    """Another tuning daemon running now."""

    name: str  # "TuneD", "another latencyd"
    pid: int
    profile: str  # what it says it applies ("" unknown)
    claims: tuple[tuple[Claim, str], ...]  # what it sets, and where it is told to
    unit: str | None = None  # the systemd unit it runs in ("tuned.service"), if any

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "profile": self.profile, "unit": self.unit}


TUNER_COMMS = {"tuned": "TuneD", "latencyd": "another latencyd"}


def running_tuners(system: System, own_pid: int) -> list[Tuner]:
    """TuneD or another latencyd running as root now (one scan of /proc, at start), and
    TuneD by its pid file; each with the systemd unit it runs in (tuned.service), if any."""
    pids: dict[int, str] = {}
    pid = system.root_process_by_pidfile(TUNED_PID, "tuned")
    if pid is not None:
        pids[pid] = "tuned"
    for comm in TUNER_COMMS:
        for found in system.root_processes(comm):
            if found != own_pid and found not in system.ancestors(own_pid):
                pids.setdefault(found, comm)
    out = []
    for pid, comm in sorted(pids.items()):
        if comm == "tuned":
            names = tuned_active(system)
            claims = tuple(
                (c, f"{k.where} [{k.section}] {k.key}")
                for k in read_tuned_profile(system, names)
                for c in tuned_claims(k)
            )
            tuner = Tuner(TUNER_COMMS[comm], pid, " ".join(names), claims)
        else:
            tuner = Tuner(TUNER_COMMS[comm], pid, "", ())
        out.append(dataclasses.replace(tuner, unit=system.task_unit(pid)))
    return out


def overlap(tuner: Tuner, ours: Iterable[Claim]) -> list[str]:
    """What `tuner` and latencyd would both set, in words ("sysctl vm.swappiness
    (/usr/lib/tuned/x/tuned.conf:12 [sysctl] vm.swappiness)"); for a tuner whose settings
    are not known, everything latencyd sets."""
    mine = set(ours)
    if not tuner.claims:
        return ["every setting latencyd applies"] if mine else []
    out = []
    for claim, where in tuner.claims:
        if any(_covers(claim, c) for c in mine):
            what = f"sysctl {dotted(claim.key)}" if claim.kind == SYSCTL else claim.kind
            what += f" {claim.key}" if claim.kind in (SYSFS,) else ""
            out.append(f"{what} ({where})")
    return list(dict.fromkeys(out))
