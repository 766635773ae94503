"""tuned_import: convert TuneD profiles (tuned.conf, INI) into latencyd profiles (TOML).

`latencyctl import-tuned NAME|DIR|FILE [-o DIR]` writes one latencyd profile per TuneD
profile in the include chain, and lists everything it could not convert, with the
reason, as comments in the files and on stderr.

How TuneD's semantics are kept:

- **Includes** are resolved the way TuneD resolves them (tuned/profiles/locator.py): the
  highest-priority directory first (/etc/tuned/profiles, /etc/tuned, /usr/lib/tuned/
  profiles, /usr/lib/tuned), a file already loaded is skipped (so /etc/tuned/X may
  include X to extend /usr/lib/tuned/X), `-NAME` is optional. A profile that includes
  itself through others is an include cycle (TuneD skips it silently; we refuse).
- **Merging** is TuneD's (tuned/profiles/merger.py): sections merge by name, option by
  option; `replace`, `drop`, `enabled`, `devices` and `type` are unit keys.
- Each output file is the conversion of TuneD's *merged* profile up to that file, minus
  what the files it includes already give (latencyd merges option by option too). So
  `latencyd` loading the converted chain gets exactly the conversion of what TuneD
  merged: a `[[kthread.rule]]` list built from several TuneD `group.*` options is
  written whole where any of them changes, TuneD's `drop`/`replace`/`enabled = false`
  become latencyd's `drop`/`replace`/`enabled` for the options they take away.
- **Variables** stay variables where latencyd has the same thing (`${isolated_cores}`
  is late-bound in both), CPU-list functions become CPU-list expressions
  (`cpulist_invert` -> `all - (...)`), and functions that depend on the machine
  (`calc_isolated_cores`, `virt_check`, `cpuinfo_check`) are evaluated on this machine
  and reported, since latencyd profiles have no conditions. Commands (`exec`) are
  never run.

The conversion is pure: `convert()` takes the parsed profiles and a `Host` (the facts of
this machine it may consult) and returns the files' text; `import_tuned()` is the I/O
edge that reads /etc/tuned and /usr/lib/tuned, gathers the host facts and writes files.
"""

from __future__ import annotations

import configparser
import glob
import math
import os
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencyd.ethtool import GROUPS

# TuneD's profile directories, lowest priority first (as TuneD lists them): the classic
# layout and the newer profiles/ sub-directory one (TuneD >= 2.24).
TUNED_DIRS = (
    Path("/usr/lib/tuned"),
    Path("/usr/lib/tuned/profiles"),
    Path("/etc/tuned"),
    Path("/etc/tuned/profiles"),
)
PROFILE_FILE = "tuned.conf"
MARKER = "# latencyd profile converted from TuneD by `latencyctl import-tuned`"
COMPLETE, PARTIAL, IMPOSSIBLE = 0, 1, 2
MAX_FILE_BYTES = 1 << 20
INT64 = 1 << 63

# latencyd's sections in the order they are written.
SECTION_ORDER = ("cstate", "cpu", "irq", "kthread", "net", "sysctl", "writeback", "sysfs")
# Options of latencyd sections that are arrays of tables.
TABLE_ARRAYS = {("cstate", "cpus"), ("cpu", "cpus"), ("irq", "rule"), ("kthread", "rule")}
TABLE_ARRAYS |= {("net", "nic")}
# The writeback pairs the kernel keeps one of; latencyd drops the other mode by itself.
WRITEBACK_PAIRS = (
    ("dirty_ratio", "dirty_bytes"),
    ("dirty_background_ratio", "dirty_background_bytes"),
)


class ImportFailed(Exception):
    """The profile cannot be converted at all (exit 2): not a TuneD profile, unreadable,
    not found, an include cycle."""


# == facts of this machine =====================================================================


@dataclass(frozen=True)
class IdleState:
    index: int
    name: str
    latency_us: int


@dataclass(frozen=True)
class Host:
    """What the conversion may know about the machine it runs on. Everything TuneD would
    evaluate on the machine (and latencyd cannot express) is evaluated from these facts,
    and reported as such."""

    online: tuple[int, ...] = ()
    present: tuple[int, ...] = ()
    packages: Mapping[int, str] = field(default_factory=dict)  # CPU -> physical package id
    cpuinfo: str = ""
    uname: str = ""
    virtualized: str | None = None  # how we know it is virtual ("" = we know it is not)
    idle_states: tuple[IdleState, ...] = ()
    exists: Callable[[str], bool] = lambda path: True  # an absolute path, or a glob

    def has_sysctl(self, key: str) -> bool:
        rel = key.strip("/") if "/" in key else key.replace(".", "/")
        return self.exists(f"/proc/sys/{rel}")


def read_host(root: str = "/") -> Host:
    """This machine's facts (the I/O edge of `Host`)."""

    def read(rel: str) -> str:
        try:
            with open(os.path.join(root, rel)) as f:
                return f.read()
        except OSError:
            return ""

    def exists(path: str) -> bool:
        full = os.path.join(root, path.lstrip("/"))
        return bool(glob.glob(full)) if glob.has_magic(path) else os.path.exists(full)

    cpu_dir = "sys/devices/system/cpu"
    packages: dict[int, str] = {}
    for entry in sorted(glob.glob(os.path.join(root, cpu_dir, "cpu[0-9]*"))):
        cpu = os.path.basename(entry)[3:]
        if cpu.isdecimal():
            packages[int(cpu)] = read(f"{cpu_dir}/cpu{cpu}/topology/physical_package_id").strip()
    states = []
    idle = f"{cpu_dir}/cpu0/cpuidle"
    for entry in sorted(glob.glob(os.path.join(root, idle, "state[0-9]*"))):
        index = os.path.basename(entry)[5:]
        latency = read(f"{idle}/state{index}/latency").strip()
        if index.isdecimal() and latency.isdecimal():
            name = read(f"{idle}/state{index}/name").strip()
            states.append(IdleState(int(index), name, int(latency)))
    cpuinfo = read("proc/cpuinfo")
    flags = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    hypervisor = read("sys/hypervisor/type").strip()
    if flags and " hypervisor" in f" {flags.group(1)} ".replace("\t", " "):
        virtual: str | None = "the CPU flag 'hypervisor' is set"
    elif hypervisor:
        virtual = f"/sys/hypervisor/type is {hypervisor!r}"
    elif flags:
        virtual = ""
    else:
        virtual = None
    return Host(
        online=tuple(_unpack(read(f"{cpu_dir}/online")) or ()),
        present=tuple(_unpack(read(f"{cpu_dir}/present")) or ()),
        packages=packages,
        cpuinfo=cpuinfo,
        uname=" ".join(os.uname()),
        virtualized=virtual,
        idle_states=tuple(states),
        exists=exists,
    )


# == TuneD profile files =======================================================================


@dataclass(frozen=True)
class TunedProfile:
    """One tuned.conf as TuneD reads it: sections in order, options raw (with
    ${i:PROFILE_DIR} expanded, as TuneD's loader does)."""

    name: str
    path: Path
    sections: dict[str, dict[str, str]]
    lines: dict[tuple[str, str | None], int] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return str(self.path)

    @property
    def main(self) -> dict[str, str]:
        return self.sections.get("main", {})


KNOWN_PLUGINS = frozenset(
    {"acpi", "audio", "bootloader", "cpu", "disk", "eeepc_she", "irq", "irqbalance", "modules"}
    | {"mounts", "net", "rtentsk", "scheduler", "script", "scsi_host", "selinux", "service"}
    | {"sysctl", "sysfs", "systemd", "uncore", "usb", "video", "vm", "variables"}
)


def parse_tuned(text: str, name: str, path: Path) -> TunedProfile:
    """Parse a tuned.conf like TuneD's loader (ConfigParser: '=' only, '#' comments)."""
    parser = configparser.ConfigParser(
        delimiters=("=",), inline_comment_prefixes=("#",), strict=False, interpolation=None
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(text, str(path))
    except configparser.Error as exc:
        first = str(exc).splitlines()[0]
        raise ImportFailed(f"{path}: not a TuneD profile (INI): {first}") from exc
    directory = str(path.parent)
    sections: dict[str, dict[str, str]] = {}
    for section in parser.sections():
        sections[section] = {
            option: re.sub(r"(?<!\\)\$\{i:PROFILE_DIR\}", directory, raw)
            for option, raw in parser.items(section, raw=True)
        }
    if not sections:
        raise ImportFailed(f"{path}: not a TuneD profile: it has no [sections]")
    types = {s.get("type", n).split(".")[0] for n, s in sections.items() if n != "main"}
    if "main" not in sections and not types & KNOWN_PLUGINS:
        raise ImportFailed(
            f"{path}: not a TuneD profile: no [main] and no section TuneD knows "
            f"({', '.join(sorted(sections))})"
        )
    return TunedProfile(name, path, sections, _option_lines(text))


def _option_lines(text: str) -> dict[tuple[str, str | None], int]:
    """Where each section and option is (for comments that point back to tuned.conf)."""
    lines: dict[tuple[str, str | None], int] = {}
    section = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;" or line[0].isspace():
            continue
        m = re.fullmatch(r"\[([^\]]+)\]", stripped)
        if m:
            section = m.group(1)
            lines.setdefault((section, None), number)
        elif "=" in stripped:
            lines[(section, stripped.split("=", 1)[0].strip())] = number
    return lines


def parse_variables_file(text: str) -> list[tuple[str, str]]:
    """A variables file (`include=` in [variables]): options without a section header."""
    parser = configparser.ConfigParser(
        delimiters=("=",),
        inline_comment_prefixes=("#",),
        allow_no_value=True,
        strict=False,
        interpolation=None,
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string("[variables_file]\n" + text)
    out = []
    for section in parser.sections():
        for option, value in parser.items(section, raw=True):
            if value is not None:
                out.append((option, value))
    return out


# == resolving includes (TuneD's locator) ======================================================


def locate(name: str, dirs: Sequence[Path], skip: Sequence[str] = ()) -> str | None:
    """TuneD's Locator.get_config: the profile's tuned.conf, highest-priority directory
    first; "" if every existing candidate was already loaded (or `-NAME` is missing);
    None if there is no such profile."""
    found: str | None = None
    conditional = name.startswith("-")
    if conditional:
        name = name[1:]
    for directory in reversed(dirs):
        candidate = os.path.normpath(os.path.join(directory, os.path.basename(name), PROFILE_FILE))
        if candidate in skip:
            found = ""
            continue
        if os.path.isfile(candidate):
            return candidate
    if conditional and found is None:
        found = ""
    return found


def split_includes(value: str) -> list[str]:
    return [n for n in re.split(r"\s*[,;]\s*", value.strip()) if n]


@dataclass
class Chain:
    """Every profile one import reads, by tuned.conf path, and what it needs."""

    top: str  # the path of the profile asked for
    profiles: dict[str, TunedProfile] = field(default_factory=dict)
    # A profile's own load order (TuneD's, as if it were loaded alone): its includes
    # depth-first, then itself.
    orders: dict[str, list[str]] = field(default_factory=dict)
    includes: dict[str, list[str]] = field(default_factory=dict)  # direct, resolved
    include_notes: dict[str, list[Finding]] = field(default_factory=dict)
    variable_files: dict[str, str | None] = field(default_factory=dict)  # path -> text


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ImportFailed(f"{path}: cannot read: {exc.strerror}") from exc
    if len(raw) > MAX_FILE_BYTES:
        raise ImportFailed(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB: not a TuneD profile")
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise ImportFailed(f"{path}: not a TuneD profile: not UTF-8 text") from exc


def find_profile(target: str, dirs: Sequence[Path]) -> tuple[str, str]:
    """NAME (on TuneD's search path), DIR (holding tuned.conf) or FILE: (name, path)."""
    path = Path(target)
    if target.endswith(".toml"):
        raise ImportFailed(f"{target}: a TOML file is a latencyd profile, not a TuneD one")
    if "/" in target or path.exists():
        if path.is_dir():
            conf = path / PROFILE_FILE
            if not conf.is_file():
                raise ImportFailed(f"{target}: not a TuneD profile directory (no {PROFILE_FILE})")
            return path.resolve().name, os.path.normpath(conf.absolute())
        if path.is_file():
            name = path.parent.resolve().name if path.name == PROFILE_FILE else path.stem
            return name, os.path.normpath(path.absolute())
        raise ImportFailed(f"{target}: no such file or directory")
    found = locate(target, dirs)
    if not found:
        searched = ", ".join(str(d) for d in reversed(dirs))
        raise ImportFailed(f"no TuneD profile named {target!r} (searched {searched})")
    return target, found


def load_chain(target: str, dirs: Sequence[Path], host: Host) -> Chain:
    """Read the profile asked for and every profile its includes reach, as TuneD would."""
    name, top = find_profile(target, dirs)
    chain = Chain(top)

    def read(path: str, as_name: str) -> TunedProfile:
        if path not in chain.profiles:
            chain.profiles[path] = parse_tuned(_read_text(path), as_name, Path(path))
        return chain.profiles[path]

    def load(path: str, as_name: str) -> None:
        """One profile's own TuneD load (Loader._load_profile), recording its order."""
        order: list[str] = []
        direct: list[str] = []
        notes: list[Finding] = []

        def walk(path: str, as_name: str, stack: tuple[str, ...]) -> None:
            order_seen.append(path)
            profile = read(path, as_name)
            raw = profile.main.get("include")
            if raw:
                names, why = _include_names(raw, host)
                if why:
                    notes.append(Finding("main", "include", why, path=path))
                for inc in names:
                    found = locate(inc, dirs, order_seen)
                    if found == "":
                        looped = [c for c in _candidates(inc, dirs) if c in (*stack, path)]
                        if looped:
                            cycle = " -> ".join(chain.profiles[p].name for p in (*stack, path))
                            raise ImportFailed(
                                f"{path}: include cycle: {cycle} -> {inc.lstrip('-')}"
                            )
                        if inc.startswith("-") and not any(
                            c in order_seen for c in _candidates(inc, dirs)
                        ):
                            notes.append(
                                Finding("main", "include", f"optional {inc!r} not found", path=path)
                            )
                        continue
                    if found is None:
                        searched = ", ".join(str(d) for d in reversed(dirs))
                        raise ImportFailed(
                            f"{path}: included profile {inc!r} not found (searched {searched})"
                        )
                    if path == root:
                        direct.append(found)
                    walk(found, os.path.basename(inc.lstrip("-")), (*stack, path))
            order.append(path)

        root = path
        order_seen: list[str] = []
        walk(path, as_name, ())
        chain.orders[path] = order
        chain.includes[path] = direct
        chain.include_notes[path] = notes

    load(top, name)
    pending = [p for p in chain.orders[top] if p != top]
    while pending:
        path = pending.pop(0)
        if path not in chain.orders:
            load(path, chain.profiles[path].name)
            pending.extend(p for p in chain.orders[path] if p not in chain.orders)
    for profile in chain.profiles.values():
        inc = profile.sections.get("variables", {}).get("include")
        if inc is not None:
            vpath = os.path.normpath(inc)
            if vpath not in chain.variable_files:
                try:
                    chain.variable_files[vpath] = _read_text(vpath)
                except ImportFailed:
                    chain.variable_files[vpath] = None
    return chain


def _candidates(name: str, dirs: Sequence[Path]) -> list[str]:
    base = os.path.basename(name.lstrip("-"))
    return [os.path.normpath(os.path.join(d, base, PROFILE_FILE)) for d in reversed(dirs)]


def _include_names(raw: str, host: Host) -> tuple[list[str], str]:
    """TuneD expands functions (not variables: they are not loaded yet) in `include`."""
    nodes = parse_value(raw)
    if not any(isinstance(n, Func) for n in nodes):
        return split_includes(raw), ""
    result = Evaluator({}, host).eval(nodes)
    if result.text is None:
        raise ImportFailed(f"include = {raw}: cannot be evaluated: {result.why}")
    why = "; ".join(result.approx)
    return split_includes(result.text), f"include = {raw} is {result.text!r} here: {why}"


# == TuneD's merge =============================================================================


@dataclass
class Unit:
    """A TuneD section after Unit(): its unit keys taken out of the options."""

    name: str
    type: str
    enabled: bool
    replace: bool
    drop: list[str] | None
    devices: str
    devices_udev_regex: str | None
    cpuinfo_regex: str | None
    uname_regex: str | None
    script_pre: str | None
    script_post: str | None
    priority: int
    options: dict[str, str]
    origin: dict[str, str]  # option -> path of the profile that set it
    profile: str  # path of the profile that defined (or last merged into) this unit


def _truthy(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value in ("True", "true", "1")


def make_unit(name: str, config: Mapping[str, str], profile: str) -> Unit:
    options = dict(config)
    drop = options.pop("drop", None)
    try:
        priority = int(options.pop("priority", "0") or 0)
    except ValueError:
        priority = 0
    return Unit(
        name=name,
        type=options.pop("type", name),
        enabled=_truthy(options.pop("enabled", None), True),
        replace=_truthy(options.pop("replace", None), False),
        drop=re.split(r"\b\s*[,;]\s*", drop) if drop is not None else None,
        devices=options.pop("devices", "*"),
        devices_udev_regex=options.pop("devices_udev_regex", None),
        cpuinfo_regex=options.pop("cpuinfo_regex", None),
        uname_regex=options.pop("uname_regex", None),
        script_pre=options.pop("script_pre", None),
        script_post=options.pop("script_post", None),
        priority=priority,
        options=options,
        origin=dict.fromkeys(options, profile),
        profile=profile,
    )


@dataclass
class Merged:
    main: dict[str, str]
    units: dict[str, Unit]


def merge(profiles: Sequence[TunedProfile]) -> Merged:
    """TuneD's Merger: units merge by name; a later unit's options win, `replace` drops
    the earlier unit, `drop` removes named options; type/enabled/devices come from the
    later unit."""
    main: dict[str, str] = {}
    units: dict[str, Unit] = {}
    for profile in profiles:
        main.update({k: v for k, v in profile.main.items() if k != "include"})
        for name, config in profile.sections.items():
            if name == "main":
                continue
            unit = make_unit(name, config, profile.key)
            old = units.get(name)
            if unit.replace or old is None:
                units[name] = unit
                continue
            old.type, old.enabled, old.devices = unit.type, unit.enabled, unit.devices
            for attr in (
                "devices_udev_regex",
                "cpuinfo_regex",
                "uname_regex",
                "script_pre",
                "script_post",
            ):
                if getattr(unit, attr) is not None:
                    setattr(old, attr, getattr(unit, attr))
            old.priority = unit.priority if "priority" in config else old.priority
            for option in unit.drop or ():
                old.options.pop(option, None)
                old.origin.pop(option, None)
            old.options.update(unit.options)
            old.origin.update(unit.origin)
            old.profile = profile.key
    return Merged(main, units)


# == ${...} values: TuneD's variables and functions ============================================


@dataclass(frozen=True)
class Text:
    text: str
    escaped: bool = False  # \${...}: TuneD's literal "${...}" (latencyd has no such escape)


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Func:
    name: str
    args: tuple[tuple[Node, ...], ...]
    raw: str


Node = Text | Var | Func


def parse_value(value: str) -> tuple[Node, ...]:
    """A TuneD option value as text, ${variable} and ${f:function:arg:...} nodes."""
    nodes: list[Node] = []
    buf: list[str] = []
    i = 0
    while i < len(value):
        if value.startswith("${", i):
            end = _closing(value, i)
            if end < 0:  # TuneD logs "non pair '{'" and keeps the text
                buf.append(value[i:])
                break
            inner = value[i + 2 : end]
            escaped = bool(buf) and buf[-1].endswith("\\")
            if escaped:
                buf[-1] = buf[-1][:-1]
                if buf:
                    nodes.append(Text("".join(buf)))
                    buf = []
                nodes.append(Text(value[i : end + 1], escaped=True))
            elif inner.startswith("f:"):
                if buf:
                    nodes.append(Text("".join(buf)))
                    buf = []
                parts = _split_args(inner)
                args = tuple(parse_value(a.replace("\\:", ":")) for a in parts[2:])
                nodes.append(Func(parts[1] if len(parts) > 1 else "", args, value[i : end + 1]))
            elif re.fullmatch(r"\w+", inner):
                if buf:
                    nodes.append(Text("".join(buf)))
                    buf = []
                nodes.append(Var(inner))
            else:
                buf.append(value[i : end + 1])
            i = end + 1
            continue
        buf.append(value[i])
        i += 1
    if buf:
        nodes.append(Text("".join(buf)))
    return tuple(_join_text(nodes))


def _join_text(nodes: list[Node]) -> list[Node]:
    out: list[Node] = []
    for n in nodes:
        last = out[-1] if out else None
        if isinstance(n, Text) and not n.escaped and isinstance(last, Text) and not last.escaped:
            out[-1] = Text(last.text + n.text)
        elif not (isinstance(n, Text) and not n.text):
            out.append(n)
    return out


def _closing(value: str, start: int) -> int:
    depth = 0
    i = start
    while i < len(value):
        if value.startswith("${", i):
            depth += 1
            i += 2
            continue
        if value[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _split_args(inner: str) -> list[str]:
    """`f:name:a:b` split on ':' not escaped and not inside a nested ${...}."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    i = 0
    while i < len(inner):
        if inner.startswith("${", i):
            depth += 1
            current.append("${")
            i += 2
            continue
        ch = inner[i]
        if ch == "}" and depth:
            depth -= 1
        if ch == ":" and depth == 0 and not (current and current[-1] == "\\"):
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def refs(value: Any) -> set[str]:
    """Variable names a latencyd value refers to."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.update(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", item))
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found


@dataclass(frozen=True)
class Tr:
    """A value translated (or evaluated): `text`, or None with `why`. `approx` are
    evaluations on this machine latencyd cannot express (they make the import partial);
    `notes` explain exact translations."""

    text: str | None
    why: str = ""
    approx: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def __add__(self, other: Tr) -> Tr:
        if self.text is None or other.text is None:
            why = "; ".join(w for w in (self.why, other.why) if w)
            return Tr(None, why, self.approx + other.approx, self.notes + other.notes)
        return Tr(self.text + other.text, "", self.approx + other.approx, self.notes + other.notes)

    def but(self, text: str | None, why: str = "") -> Tr:
        return Tr(text, why or self.why, self.approx, self.notes)

    def plus(self, approx: Iterable[str] = (), notes: Iterable[str] = ()) -> Tr:
        return Tr(self.text, self.why, self.approx + tuple(approx), self.notes + tuple(notes))


def _concat(parts: Iterable[Tr]) -> Tr:
    out = Tr("")
    for p in parts:
        out = out + p
    return out


# -- TuneD's CPU-list functions, for evaluation -------------------------------------------------


def _unpack(text: str) -> list[int] | None:
    """TuneD's cpulist_unpack: "0-3,^2", "0x3" masks (commas inside, ",," ends one);
    None where TuneD gives an empty list for a parse error."""
    items = str(text).strip("'\"").split(",")
    plain: list[str] = []
    neg: list[int] = []
    mask = ""
    in_mask = False
    for item in items:
        if in_mask:
            if not item:
                plain.append(mask)
                mask, in_mask = "", False
            else:
                mask += item
            continue
        if item[:2].lower() == "0x":
            mask, in_mask = item, True
        elif item and item[0] in "^!":
            lo, _, hi = item[1:].partition("-")
            if not lo.strip().isdigit() or (hi and not hi.strip().isdigit()):
                return None
            neg.extend(range(int(lo), int(hi or lo) + 1))
        elif item.strip():
            plain.append(item.strip())
    if mask:
        plain.append(mask)
    cpus: set[int] = set()
    for item in plain:
        if item[:2].lower() == "0x":
            try:
                value = int(item[2:].replace(",", ""), 16)
            except ValueError:
                return None
            cpus.update(i for i in range(value.bit_length()) if value >> i & 1)
            continue
        lo, _, hi = item.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or int(hi or lo) > 8191:
            return None
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus - set(neg))


def _pack(cpus: Iterable[int]) -> str:
    out: list[str] = []
    for c in sorted(set(cpus)):
        if out and "-" not in out[-1].split(",")[-1] and int(out[-1]) == c - 1:
            out[-1] = f"{out[-1]}-{c}"
        elif out and "-" in out[-1] and int(out[-1].split("-")[1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def _hex(cpus: Iterable[int]) -> str:
    value = sum(1 << c for c in set(cpus))
    digits = f"{value:x}"
    digits = digits.zfill(-(-len(digits) // 8) * 8)
    return ",".join(digits[i : i + 8] for i in range(0, len(digits), 8))


class Evaluator:
    """TuneD's own expansion (eager, as on this machine), for what must be known as text:
    conditions, include names, the kernel command line a profile wanted."""

    def __init__(self, env: Mapping[str, str | None], host: Host, lenient: bool = False) -> None:
        self.env = env
        self.host = host
        self.lenient = lenient  # show what cannot be evaluated as written, and go on

    def eval(self, nodes: Sequence[Node]) -> Tr:
        if not self.lenient:
            return _concat(self.node(n) for n in nodes)
        parts = []
        strict = Evaluator(self.env, self.host)
        for n in nodes:
            got = strict.node(n)
            raw = (
                n.text
                if isinstance(n, Text)
                else n.raw
                if isinstance(n, Func)
                else f"${{{n.name}}}"
            )
            parts.append(got if got.text is not None else Tr(raw, approx=(got.why,)))
        return _concat(parts)

    def node(self, node: Node) -> Tr:
        if isinstance(node, Text):
            return Tr(node.text)
        if isinstance(node, Var):
            if node.name not in self.env:
                return Tr("${" + node.name + "}")  # TuneD leaves it as it is
            value = self.env[node.name]
            if value is None:
                return Tr(None, f"${{{node.name}}} cannot be evaluated")
            return Tr(value)
        args = [self.eval(a) for a in node.args]
        missing = [a for a in args if a.text is None]
        if missing:
            return missing[0].but(None)
        texts = [a.text or "" for a in args]
        base = _concat(a.but("") for a in args)
        return base + self.call(node.name, texts, node.raw)

    def call(self, name: str, args: list[str], raw: str) -> Tr:
        host = self.host
        joined = ",,".join(args)
        if name in ("cpulist_unpack", "cpulist_pack", "cpulist_online", "cpulist_present"):
            cpus = _unpack(",".join(args) if name == "cpulist_online" else joined) or []
            if name == "cpulist_online":
                cpus = [c for c in cpus if c in host.online]
            if name == "cpulist_present":
                cpus = [c for c in cpus if c in host.present]
            return Tr(_pack(cpus) if name == "cpulist_pack" else ",".join(map(str, cpus)))
        if name in ("cpulist_invert", "cpulist2hex_invert"):
            given = set(_unpack(joined) or [])
            rest = [c for c in host.online if c not in given]
            return Tr(_hex(rest) if name == "cpulist2hex_invert" else ",".join(map(str, rest)))
        if name == "cpulist2hex":
            return Tr(_hex(_unpack(joined) or []))
        if name == "hex2cpulist":
            mask = _unpack("0x" + args[0].replace(",", "")) if args else []
            return Tr(",".join(map(str, mask or [])))
        if name == "cpulist2devs":
            return Tr(",".join(f"cpu{c}" for c in _unpack(",".join(args)) or []))
        if name == "strip":
            return Tr("".join(args).strip())
        if name in ("kb2s", "s2kb"):
            if len(args) != 1 or not re.fullmatch(r"-?\d+", args[0]):
                return Tr(None, f"{raw}: not a number")
            n = int(args[0])
            return Tr(str(n * 2 if name == "kb2s" else round(n / 2)))
        if name == "regex_search_ternary":
            if len(args) != 4:
                return Tr(None, f"{raw}: takes 4 arguments")
            try:
                hit = re.search(args[1], args[0]) is not None
            except re.error as exc:
                return Tr(None, f"{raw}: bad regular expression: {exc}")
            return Tr(args[2] if hit else args[3])
        if name in ("assertion", "assertion_non_equal"):
            return Tr("")
        if name == "calc_isolated_cores":
            return calc_isolated_cores(args, host)
        if name == "virt_check":
            return virt_check(args, host)
        if name == "cpuinfo_check":
            return cpuinfo_check(args, host)
        if name == "check_net_queue_count":
            if args and args[0].isdigit():
                return Tr(args[0])
            return Tr(
                None,
                "netdev_queue_count is not set: TuneD would use the CPU count (nproc) "
                "when applying; latencyd needs a number",
            )
        if name == "exec":
            return Tr(None, f"{raw} runs a command: latencyd profiles run no commands")
        return Tr(None, f"{raw}: TuneD function {name!r} is unknown to this importer")


def calc_isolated_cores(args: Sequence[str], host: Host) -> Tr:
    reserve = 1
    if args and args[0]:
        if not args[0].isdecimal():
            return Tr(None, f"calc_isolated_cores:{args[0]}: not a number")
        reserve = int(args[0])
    sockets: dict[str, list[int]] = {}
    for cpu, package in sorted(host.packages.items()):
        if package.isdecimal():
            sockets.setdefault(package, []).append(cpu)
    isolated = sorted(c for cpus in sockets.values() for c in cpus[reserve:])
    what = f"calc_isolated_cores:{reserve} (all CPUs but the first {reserve} of each socket)"
    if not isolated:
        return Tr(None, f"{what} leaves no CPU to isolate on this machine")
    text = ",".join(map(str, isolated))
    return Tr(
        text,
        approx=(
            f"{what} is {text!r} on this machine; latencyd's CPU lists know no sockets: set "
            "it for the machine the profile is for",
        ),
    )


def virt_check(args: Sequence[str], host: Host) -> Tr:
    if len(args) != 2:
        return Tr(None, "virt_check takes 2 arguments")
    virtual = bool(host.virtualized)
    how = host.virtualized or (
        "no sign of a hypervisor" if host.virtualized == "" else "no sign either way"
    )
    chosen = args[0] if virtual else args[1]
    return Tr(
        chosen,
        approx=(
            f"virt_check chose {chosen!r} because this machine is "
            f"{'virtual' if virtual else 'not virtual'} ({how}); on a "
            f"{'physical' if virtual else 'virtual'} machine TuneD uses "
            f"{args[1] if virtual else args[0]!r}",
        ),
    )


def cpuinfo_check(args: Sequence[str], host: Host) -> Tr:
    chosen = args[-1] if len(args) % 2 else ""
    for i in range(0, len(args) - 1, 2):
        try:
            if re.search(args[i], host.cpuinfo, re.MULTILINE):
                chosen = args[i + 1]
                break
        except re.error as exc:
            return Tr(None, f"cpuinfo_check: bad regular expression {args[i]!r}: {exc}")
    return Tr(
        chosen,
        approx=(f"cpuinfo_check gives {chosen!r} for this machine's CPUs (/proc/cpuinfo)",),
    )


# -- translating to latencyd ---------------------------------------------------------------------

CPU_IDENTITY = frozenset(
    {"cpulist_unpack", "cpulist_pack", "cpulist_online", "cpulist_present", "cpulist2hex"}
    | {"hex2cpulist", "cpulist2devs"}
)
CPU_INVERT = frozenset({"cpulist_invert", "cpulist2hex_invert"})
# Evaluated on this machine: what they give depends on it, or on values known only here.
EVALUATED = frozenset(
    {"calc_isolated_cores", "virt_check", "cpuinfo_check", "regex_search_ternary", "strip"}
    | {"kb2s", "s2kb", "check_net_queue_count"}
)


def cpulist_expr(text: str, mask: bool = False) -> str | None:
    """A TuneD CPU list ("0-3,^2", "0xf,,5") as a latencyd CPU-list expression; with
    `mask`, a bare hex mask ("fffffffd", "ff,ffffffff") as TuneD's masks are written."""
    text = text.strip().strip("'\"").strip()
    if not text:
        return "none"
    if mask:
        if re.fullmatch(r"(0[xX])?[0-9a-fA-F]+(,[0-9a-fA-F]+)*", text):
            return "0x" + re.sub(r"^0[xX]", "", text).lower()
        return None
    items = text.split(",")
    plus: list[str] = []
    minus: list[str] = []
    i = 0
    while i < len(items):
        item = items[i].strip()
        i += 1
        if item[:2].lower() == "0x":
            words = [item[2:]]
            while i < len(items) and items[i].strip():
                words.append(items[i].strip())
                i += 1
            if not all(re.fullmatch(r"[0-9a-fA-F]+", w) for w in words):
                return None
            plus.append("0x" + ",".join(words).lower())
        elif item[:1] in ("^", "!"):
            if not re.fullmatch(r"\d+(-\d+)?", item[1:]):
                return None
            minus.append(item[1:])
        elif item:
            if not re.fullmatch(r"\d+(-\d+)?", item):
                return None
            plus.append(item)
    lists = [p for p in plus if not p.startswith("0x")]
    terms = ([",".join(lists)] if lists else []) + [p for p in plus if p.startswith("0x")]
    expr = " | ".join(terms) or "none"
    if minus:
        expr = (
            f"({expr}) - ({','.join(minus)})" if len(terms) > 1 else f"{expr} - {','.join(minus)}"
        )
    return expr


class Variables:
    """A merged profile's [variables]: TuneD's eager values (for what must be evaluated)
    and their latencyd translations (late-bound, like TuneD's own use in settings)."""

    def __init__(
        self,
        unit: Unit | None,
        files: Mapping[str, str | None],
        host: Host,
    ) -> None:
        self.host = host
        # (name, raw value, nodes, source key in [variables], profile path)
        self.defs: list[tuple[str, str, tuple[Node, ...], str, str]] = []
        self.problems: list[Finding] = []
        if unit is not None:
            for key, raw in unit.options.items():
                origin = unit.origin.get(key, unit.profile)
                if key == "include":
                    path = os.path.normpath(raw)
                    text = files.get(path)
                    if text is None:
                        self.problems.append(
                            Finding(
                                "variables",
                                "include",
                                f"variables file {path} cannot be read: its variables "
                                "are missing (TuneD logs an error and goes on)",
                                path=origin,
                            )
                        )
                        continue
                    for name, value in parse_variables_file(text):
                        self.defs.append((name, value, parse_value(value), "include", origin))
                elif re.fullmatch(r"\w+", key):
                    self.defs.append((key, raw, parse_value(raw), key, origin))
        self.env: dict[str, str | None] = {}
        for name, _raw, nodes, _key, _origin in self.defs:
            self.env[name] = Evaluator(self.env, host).eval(nodes).text
        self.final: dict[str, tuple[str, tuple[Node, ...], str, str]] = {}
        for name, raw, nodes, key, origin in self.defs:
            if nodes == (Var(name),):
                continue  # TuneD's "x = ${x}" idiom keeps x's place; latencyd binds late anyway
            self.final[name] = (raw, nodes, key, origin)
        self._memo: dict[str, Tr] = {}
        self._busy: set[str] = set()

    def evaluate(self, nodes: Sequence[Node]) -> Tr:
        return Evaluator(self.env, self.host).eval(nodes)

    def evaluate_raw(self, raw: str) -> Tr:
        nodes = parse_value(raw)
        result = self.evaluate(nodes)
        used = sorted({n.name for n in nodes if isinstance(n, Var)})
        if used and result.text is not None:
            result = result.plus(
                notes=(f"{raw} resolved with this profile's variables when converted",)
            )
        return result

    def var(self, name: str) -> Tr:
        """A variable's latencyd value."""
        if name in self._memo:
            return self._memo[name]
        if name not in self.final:
            return Tr(None, f"variable ${{{name}}} is not defined (TuneD keeps the text)")
        if name in self._busy:
            return Tr(None, f"variable ${{{name}}} refers to itself")
        self._busy.add(name)
        try:
            raw, nodes, _key, _origin = self.final[name]
            result = self.translate(nodes, "text")
            literal = all(isinstance(n, Text) and not n.escaped for n in nodes)
            if literal and re.fullmatch(r"[\s\d,\-^!]*[\^!][\s\d,\-^!]*", raw):
                # TuneD's CPU-list negation ("2-7,^4"), which latencyd writes as "2-7 - 4".
                expr = cpulist_expr(raw)
                if expr:
                    result = Tr(expr, notes=(f"{raw}: TuneD's CPU-list syntax, as latencyd's",))
            if result.text is None:
                result = result.but(None, f"${{{name}}} = {raw}: {result.why}")
        finally:
            self._busy.discard(name)
        self._memo[name] = result
        return result

    def names(self) -> list[str]:
        """Every variable with a definition, in TuneD's order."""
        return [n for n in dict.fromkeys(d[0] for d in self.defs) if n in self.final]

    def definition(self, name: str) -> tuple[str, str, str] | None:
        """(raw value, key in [variables], profile path) of a variable's definition."""
        if name not in self.final:
            return None
        raw, _nodes, key, origin = self.final[name]
        return raw, key, origin

    def translate_raw(self, raw: str, kind: str = "text") -> Tr:
        return self.translate(parse_value(raw), kind)

    def translate(self, nodes: Sequence[Node], kind: str = "text") -> Tr:
        """Into latencyd text. `kind` "cpus" (a CPU-list expression) or "mask" (a hex mask
        where TuneD wrote one) converts literal CPU lists too."""
        if kind != "text" and len(nodes) > 1 and any(isinstance(n, Text) for n in nodes):
            return self._cpu_items(nodes, kind)
        parts = []
        for node in nodes:
            if isinstance(node, Text):
                if node.escaped:
                    parts.append(
                        Tr(None, f"{node.text!r} is TuneD's escaped literal; latencyd has none")
                    )
                elif kind == "text":
                    parts.append(Tr(node.text))
                else:
                    expr = cpulist_expr(node.text, mask=kind == "mask")
                    what = "hex CPU mask" if kind == "mask" else "CPU list"
                    parts.append(Tr(expr) if expr else Tr(None, f"{node.text!r} is not a {what}"))
            elif isinstance(node, Var):
                parts.append(self._ref(node.name, kind))
            else:
                parts.append(self._func(node, kind))
        return _concat(parts)

    def _ref(self, name: str, kind: str) -> Tr:
        value = self.var(name)
        if value.text is None:
            return value.but(None)
        if kind == "mask" and self.final.get(name) is not None:
            raw, nodes, _key, _origin = self.final[name]
            if all(isinstance(n, Text) for n in nodes):  # a literal mask: latencyd needs 0x
                expr = cpulist_expr(raw, mask=True)
                if expr:
                    return Tr(
                        expr, notes=(f"${{{name}}} = {raw} is a hex mask: written as {expr}",)
                    )
        return Tr("${" + name + "}")

    def _cpu_items(self, nodes: Sequence[Node], kind: str) -> Tr:
        """A CPU list mixing text and references ("1,${x}"): a union of its items."""
        items: list[list[Node]] = [[]]
        for node in nodes:
            if isinstance(node, Text) and not node.escaped:
                pieces = node.text.split(",")
                for j, piece in enumerate(pieces):
                    if j:
                        items.append([])
                    if piece.strip():
                        items[-1].append(Text(piece))
            else:
                items[-1].append(node)
        terms: list[Tr] = []
        negative: list[str] = []
        for item in (i for i in items if i):
            if len(item) == 1 and isinstance(item[0], Text):
                text = item[0].text.strip()
                if text[:1] in "^!":
                    negative.append(text[1:])
                    continue
                expr = cpulist_expr(text, mask=kind == "mask")
                terms.append(Tr(expr) if expr else Tr(None, f"{text!r} is not a CPU list"))
            elif len(item) == 1:
                t = self.translate(item, kind)
                terms.append(t.but(f"({t.text})") if t.text is not None else t)
            else:
                return Tr(None, "a CPU list mixing text and variables inside one item")
        out = terms[0] if terms else Tr("none")
        for t in terms[1:]:
            out = out + Tr(" | ") + t
        if negative and out.text is not None:
            if not all(re.fullmatch(r"\d+(-\d+)?", n) for n in negative):
                return Tr(None, "negated CPUs must be numbers or ranges")
            out = out.but(f"({out.text}) - ({','.join(negative)})")
        return out

    def _func(self, node: Func, kind: str) -> Tr:
        name = node.name
        if name in CPU_IDENTITY or name in CPU_INVERT:
            arg_kind = "mask" if name == "hex2cpulist" else "cpus"
            args = [self.translate(a, arg_kind) for a in node.args]
            bad = [a for a in args if a.text is None]
            if bad:
                return bad[0]
            texts = [a.text for a in args if a.text]
            inner = texts[0] if len(texts) == 1 else " | ".join(f"({t})" for t in texts)
            merged = _concat(a.but("") for a in args)
            if name in CPU_INVERT:
                return merged + Tr(f"all - ({inner or 'none'})")
            return merged + Tr(inner or "none")
        if name in EVALUATED:
            result = self.evaluate((node,))
            used = sorted(_vars_in(node))
            if result.text is not None and used and name not in ("strip",):
                result = result.plus(
                    notes=(
                        f"{node.raw} evaluated when converted (from "
                        f"{', '.join('${' + u + '}' for u in used)})",
                    )
                )
            if result.text is not None and name == "strip" and used:
                args = [self.translate(a, kind) for a in node.args]
                return _concat(args)
            if result.text is not None and kind != "text":
                expr = cpulist_expr(result.text, mask=kind == "mask")
                return (
                    result.but(expr, f"{result.text!r} is not a CPU list")
                    if expr
                    else result.but(None)
                )
            return result
        return self.evaluate((node,))


def _vars_in(node: Node) -> set[str]:
    if isinstance(node, Var):
        return {node.name}
    if isinstance(node, Func):
        return {v for arg in node.args for n in arg for v in _vars_in(n)}
    return set()


# == the conversion ============================================================================


@dataclass(frozen=True)
class Finding:
    """Something not converted (`counted`), or a note on how something was converted."""

    unit: str  # TuneD section
    option: str | None  # TuneD option; None: the section as a whole
    text: str
    counted: bool = True
    home: str | None = None  # the latencyd section it sits next to
    line: str | None = None  # a TOML line the user may enable where it applies
    path: str = ""  # the TuneD profile it is about (set for include/variables findings)

    @property
    def label(self) -> str:
        return f"[{self.unit}] {self.option}" if self.option else f"[{self.unit}]"

    @property
    def key(self) -> tuple[str, str | None, str]:
        return (self.unit, self.option, self.text)


@dataclass(frozen=True)
class Item:
    """One latencyd option (or one variable, in section "variables")."""

    section: str
    option: str
    value: Any
    sources: frozenset[tuple[str, str]]
    note: str = ""


@dataclass
class Conversion:
    items: dict[tuple[str, str], Item] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


SCHED_KNOBS = {
    # TuneD option: (sysctl on kernels < 5.13, file under /sys/kernel/debug/sched)
    "sched_min_granularity_ns": ("kernel.sched_min_granularity_ns", "base_slice_ns"),
    "sched_base_slice_ns": ("kernel.sched_base_slice_ns", "base_slice_ns"),
    "sched_latency_ns": ("kernel.sched_latency_ns", "latency_ns"),
    "sched_wakeup_granularity_ns": ("kernel.sched_wakeup_granularity_ns", "wakeup_granularity_ns"),
    "sched_tunable_scaling": ("kernel.sched_tunable_scaling", "tunable_scaling"),
    "sched_migration_cost_ns": ("kernel.sched_migration_cost_ns", "migration_cost_ns"),
    "sched_nr_migrate": ("kernel.sched_nr_migrate", "nr_migrate"),
    "numa_balancing_scan_delay_ms": (
        "kernel.numa_balancing_scan_delay_ms",
        "numa_balancing/scan_delay_ms",
    ),
    "numa_balancing_scan_period_min_ms": (
        "kernel.numa_balancing_scan_period_min_ms",
        "numa_balancing/scan_period_min_ms",
    ),
    "numa_balancing_scan_period_max_ms": (
        "kernel.numa_balancing_scan_period_max_ms",
        "numa_balancing/scan_period_max_ms",
    ),
    "numa_balancing_scan_size_mb": (
        "kernel.numa_balancing_scan_size_mb",
        "numa_balancing/scan_size_mb",
    ),
}
WRITEBACK_SYSCTLS = {
    f"vm.{k}": k
    for k in (
        "dirty_ratio",
        "dirty_bytes",
        "dirty_background_ratio",
        "dirty_background_bytes",
        "dirty_expire_centisecs",
        "dirty_writeback_centisecs",
    )
}
THP = "/sys/kernel/mm/transparent_hugepage"
WORKQUEUE_MASKS = {
    "/sys/bus/workqueue/devices/writeback/cpumask": "writeback_cpumask",
    "/sys/devices/virtual/workqueue/writeback/cpumask": "writeback_cpumask",
    "/sys/devices/virtual/workqueue/cpumask": "unbound_cpumask",
}
PER_WORKQUEUE_MASKS = (
    "/sys/devices/virtual/workqueue/*/cpumask",
    "/sys/bus/workqueue/devices/*/cpumask",
)
POLICIES = {"f": "fifo", "r": "rr", "b": "batch", "i": "idle", "o": "other"}
EPB_NAMES = ("performance", "balance-performance", "normal", "balance-power", "power")
EPB_ALIASES = {
    "powersave": "power",
    "default": "normal",
    "balance_performance": "balance-performance",
}
EPB_ALIASES |= {"balance_power": "balance-power"}
TRUE_WORDS = ("1", "y", "yes", "t", "true", "on")
FALSE_WORDS = ("0", "n", "no", "f", "false", "off")
# ethtool's keys, as latencyd's [net] takes them (flags are booleans).
NET_KEYS = {name: tuple(k.name for k in group.keys) for name, group in GROUPS.items()}
NET_FLAGS = {name: tuple(k.name for k in group.keys if k.flag) for name, group in GROUPS.items()}

# Why TuneD plugins latencyd has no counterpart for are not converted.
NO_PLUGIN = {
    "disk": "block devices (readahead, elevator, APM, spin-down, and TuneD's dynamic APM by "
    "load) have no latencyd plugin; fixed /sys/block/DEV/queue/* files can be set with "
    "[sysfs] by hand",
    "audio": "sound-card power saving (snd_hda_intel / snd_ac97_codec power_save) has no "
    "latencyd plugin",
    "usb": "USB autosuspend has no latencyd plugin",
    "video": "GPU power management (radeon_powersave, panel_power_savings) has no latencyd plugin",
    "mounts": "latencyd does not remount file systems (barrier)",
    "modules": "latencyd does not load kernel modules (modprobe, /etc/modprobe.d/tuned.conf)",
    "service": "latencyd does not start, stop or enable services",
    "rtentsk": "TuneD keeps a socket with SO_TIMESTAMP open so the kernel's timestamping static "
    "key stays on (no IPIs from flipping it on RT kernels); latencyd has no equivalent",
    "scsi_host": "SCSI host link power management (ALPM) has no latencyd plugin",
    "eeepc_she": "the Asus Eee PC Super Hybrid Engine has no latencyd plugin",
    "acpi": "the ACPI platform profile has no latencyd plugin; [sysfs] "
    '"/sys/firmware/acpi/platform_profile" can set it by hand',
    "uncore": "Intel uncore frequency limits have no latencyd plugin",
}
# What the conversion says, by key; `{...}` are filled in where it is said.
MSG = {
    "dynamic": "TuneD's dynamic tuning (with dynamic_tuning = 1 in tuned-main.conf) {what}; "
    "latencyd tunes statically",
    "dynamic_pm_qos": "sets the PM QoS latency by CPU load (latency_low 100 µs, latency_high "
    "1000 µs, load_threshold 0.2) when [cpu] has no force_latency",
    "condition_no": "TuneD applies this section only where {what} matches '{pattern}' ({attr}); "
    "this machine does not match, so it is not converted (latencyd profiles have no "
    "conditions)",
    "condition_yes": "TuneD applies this section only where {what} matches '{pattern}'; this "
    "machine matches, so it is converted unconditionally (latencyd profiles have no "
    "conditions)",
    "cpu_taken": "an earlier [cpu] section took every CPU (TuneD gives each CPU to one "
    "section): this one tunes none",
    "fallback": "{opt} = {value}: fallback '{rest}' not converted: latencyd sets '{first}' "
    "and reports it not applicable where the CPU does not offer it (TuneD tries the next one)",
    "sampling_down": "sampling_down_factor = {raw}: the ondemand governor's sampling_down_factor "
    'has no latencyd option; [sysfs] "/sys/devices/system/cpu/cpufreq/ondemand/'
    'sampling_down_factor" can set it by hand',
    "resume_us": "{value} is {us} µs on this machine; latencyd's resume_latency_us takes µs",
    "compare": "{key} = {raw}: TuneD sets it only if {value} is {cmp} than the current value; "
    "latencyd has no such condition: set it where it holds",
    "no_sysctl": "this kernel has no sysctl {key} (a module not loaded, or another kernel "
    "version): latencyd refuses unknown sysctls when it loads a profile (TuneD skipped it with "
    "an error); enable the line where it exists",
    "thp_cmdline": "TuneD leaves THP alone when the kernel command line has "
    "transparent_hugepage=; latencyd sets it anyway",
    "no_file": "{path} is not on this machine: latencyd reports it not applicable here (TuneD "
    "skipped it)",
    "irqbalance": "TuneD only banned these CPUs in irqbalance's config; latencyd's isolate also "
    "moves the IRQs off them itself (and bans them in irqbalance's config)",
    "perf_loop": "{opt} = {raw}: tunes TuneD's perf event loop; latencyd follows new threads "
    "from its own task events",
    "cgroup": "{opt} = {raw}: latencyd uses no cgroups (v1 cpusets) to confine tasks",
    "narrows": "TuneD narrows each thread's CPUs to the housekeeping ones it already had; "
    "latencyd's rule gives every matched kernel thread all housekeeping CPUs (per-CPU threads, "
    "which nobody may move, are reported not applicable)",
    "no_glob": "'{pattern}' cannot be written as a name glob: user tasks it matches are moved "
    "off the isolated CPUs",
    "whitelist": "latencyd moves every user task but the allowed ones off the isolated CPUs: a "
    "whitelist of user tasks to move has no equivalent (kernel threads are restricted to it)",
    "leave": "{opt}: affinity '*' (leave as it is) became all CPUs: a latencyd rule always "
    "sets the CPUs of the threads it matches",
    "user_only": "{opt} = {raw}: regex '{regex}': {remark}; latencyd's rules are for kernel "
    "threads",
    "calc": "calc: latencyd's default for default_affinity (all CPUs but isolate)",
    "ignore": "ignore: latencyd always sets /proc/irq/default_smp_affinity to all CPUs but isolate",
    "sched_knob": "{opt} = {raw}: this kernel has neither /proc/sys/{path} nor {debug} "
    "(Linux 5.13 moved these knobs to debugfs, 6.6 removed latency_ns and "
    "wakeup_granularity_ns)",
    "intersect": "intersect: latencyd sets the affinity; TuneD kept only the CPUs each IRQ "
    "already had (the configured ones where none were left)",
    "virtual_nics": "TuneD tunes physical NICs only; latencyd's entry also matches virtual ones "
    "(veth, bridges, tap) unless excluded",
    "cmdline": "{want} -- latencyd does not edit the kernel command line: add them to the boot "
    "loader yourself (values as on this machine)",
    "script": "TuneD runs {raw} when it applies and unapplies the profile; latencyd runs no "
    "scripts: port what it does to latencyd settings or a systemd unit",
    "cpu_affinity": "cpu_affinity = {raw} ({value} here): TuneD sets CPUAffinity= in systemd's "
    "system.conf (effective after a reboot); latencyd does not edit systemd's configuration "
    "([kthread] isolate_tasks moves user tasks at run time instead)",
    "covered": "every unbound workqueue's cpumask: covered by unbound_cpumask (the kernel "
    "confines each unbound workqueue to it)",
    "per_workqueue": "{key} = {raw}: per-workqueue cpumasks have no latencyd option; set "
    "[kthread] unbound_cpumask to the same CPUs",
    "superseded": "{old} is superseded by {new} (the kernel keeps one of the two)",
}
SCHED_HANDLED = frozenset(
    {"isolated_cores", "ps_blacklist", "ps_whitelist", "irq_process", "kthread_process"}
    | {"default_irq_smp_affinity"}
)


def _bool(raw: str) -> bool | None:
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None


def _number(text: str) -> int | str:
    """An integer where TOML can hold it, else the text."""
    text = text.strip()
    if re.fullmatch(r"-?\d+", text) and -INT64 <= int(text) < INT64:
        return int(text)
    return text


def convert_force_latency(
    value: str, states: Sequence[IdleState], allow_na: bool = False
) -> tuple[int | str | None, list[str], list[str]]:
    """TuneD's force_latency (or pm_qos_resume_latency_us with `allow_na`) as latencyd's
    force_latency_us: (value or None, not-converted reasons, notes). Alternatives after
    "|" are fallbacks TuneD tries in turn; latencyd has no fallbacks, so the first
    alternative latencyd can express is kept and the rest reported."""
    lost: list[str] = []
    notes: list[str] = []
    alternatives = [a.strip() for a in str(value).split("|")]
    by_index = {s.index: s for s in states}
    for i, alt in enumerate(alternatives):
        rest = alternatives[i + 1 :]
        chosen: int | str | None = None
        exact = False  # the same on every machine: nothing after it can ever be used
        no_zero = False
        if re.fullmatch(r"-?\d+", alt):
            if int(alt) < 0:
                lost.append(f"{alt!r} is not a latency")
                continue
            chosen, exact = int(alt), True
        elif alt in ("none", "None"):
            if i == 0:
                notes.append("'None' first: TuneD sets no latency")
            return None, lost, notes
        elif allow_na and alt == "n/a":
            chosen, exact = "n/a", True
        elif m := re.fullmatch(r"cstate\.id(_no_zero)?:(\d+)", alt):
            no_zero, index = bool(m.group(1)), int(m.group(2))
            if index == 0 and not no_zero:
                chosen = "poll"
                notes.append(f"{alt}: state0 is POLL (0 µs): latencyd's 'poll'")
            elif index == 0:
                continue  # POLL's latency is 0: TuneD always skips it
            elif index == 1:
                chosen = "shallowest"
                notes.append(f"{alt}: state1, the shallowest idle state after POLL: 'shallowest'")
            else:
                state = by_index.get(index)
                if state is None or (no_zero and state.latency_us == 0):
                    how = "has 0 µs latency" if state else "does not exist"
                    lost.append(
                        f"{alt}: this machine's idle state {index} {how}, and latencyd names "
                        "idle states, not their numbers"
                    )
                    continue
                chosen = f"state:{state.name}"
                lost.append(
                    f"{alt} is state {index} on this machine, {state.name!r} ({state.latency_us} "
                    "µs): written by name, as latencyd names idle states, not their numbers"
                )
        elif m := re.fullmatch(r"cstate\.name(_no_zero)?:(.+)", alt):
            no_zero, chosen = bool(m.group(1)), f"state:{m.group(2)}"
        else:
            lost.append(f"{alt!r} is not a latency TuneD knows")
            continue
        if exact:
            return chosen, lost, notes
        state_name = f"idle state {str(chosen)[6:]!r}" if str(chosen).startswith("state:") else ""
        where = {
            "poll": "where there are no idle states latencyd still asks for 0 µs",
            "shallowest": "where there are no idle states latencyd makes no request",
        }.get(str(chosen), f"where there is no {state_name} latencyd makes no request")
        if no_zero and chosen != "poll":
            where += ", and where its latency is 0 µs latencyd asks for 0 µs (polling only)"
        if rest and rest[0] not in ("none", "None"):
            lost.append(
                f"fallback '{'|'.join(rest)}' not converted (latencyd has no fallbacks): {where}; "
                "TuneD used the next alternative there"
            )
        elif no_zero:
            lost.append(f"{alt}: {where.split(', and ')[-1]}; TuneD sets no latency there")
        return chosen, lost, notes
    return None, lost, notes


def kthread_regex(regex: str) -> tuple[str | None, str]:
    """A TuneD process regex (matched against `ps -eo cmd`, where kernel threads read
    "[name]") as a regex on the kernel thread's name: (regex or None, remark)."""
    r = regex
    remark = ""
    if r.startswith("^\\["):
        r = "^" + r[3:]
    elif r.startswith("\\["):
        r = "^" + r[2:]
    elif r.startswith("^") and not r.startswith(("^.", "^(")):
        return None, "anchored at the start without '\\[': it matches only user processes"
    else:
        remark = "TuneD also applied it to user processes whose command line matches"
    if r.endswith("\\]$"):
        r = r[:-3] + "$"
    elif r.endswith("\\]"):
        r = r[:-2] + "$"
    try:
        re.compile(r)
    except re.error as exc:
        return None, f"bad regular expression: {exc}"
    return r, remark


def regex_to_glob(regex: str) -> str | None:
    """A simple TuneD name regex as a glob on the task name (latencyd's `allow`)."""
    r = regex
    start = r.startswith("^")
    end = r.endswith("$") and not r.endswith("\\$")
    r = r[1 if start else 0 : len(r) - 1 if end else len(r)]
    out: list[str] = []
    i = 0
    while i < len(r):
        ch = r[i]
        if r.startswith(".*", i):
            out.append("*")
            i += 2
            continue
        if ch == "\\" and i + 1 < len(r):
            lit = r[i + 1]
            if lit.isalnum():
                return None  # \d, \w, \b...
            out.append(f"[{lit}]" if lit in "[]*?" else lit)
            i += 2
            continue
        if ch in "+?{}()|[]^$":
            return None
        out.append("?" if ch == "." else ch)
        i += 1
    glob_ = ("" if start else "*") + "".join(out) + ("" if end else "*")
    return re.sub(r"\*+", "*", glob_)


Sources = frozenset[tuple[str, str]]


class Converter:
    """One merged TuneD profile into latencyd items and findings."""

    def __init__(self, merged: Merged, files: Mapping[str, str | None], host: Host) -> None:
        self.host = host
        self.merged = merged
        self.vars = Variables(merged.units.get("variables"), files, host)
        self.out = Conversion(findings=list(self.vars.problems))
        # What several TuneD settings build together, written by finish().
        self.irq_isolate: list[tuple[str, Sources]] = []
        self.irq_default: list[tuple[str, Sources, str]] = []
        self.tables: dict[tuple[str, str], list[tuple[dict[str, Any], Sources]]] = {
            key: [] for key in TABLE_ARRAYS
        }
        self.isolation: list[tuple[dict[str, Any], Sources]] = []
        self.writeback: list[tuple[str, Any, Sources, str]] = []
        self.per_workqueue: list[tuple[str, str, Unit]] = []
        self.cpu_all_taken = False
        self.first_cpu = True

    # -- output ---------------------------------------------------------------------------------
    def item(
        self, section: str, option: str, value: Any, unit: Unit, keys: Iterable[str], note: str = ""
    ) -> None:
        sources = frozenset((unit.name, k) for k in keys)
        self.out.items[(section, option)] = Item(section, option, value, sources, note)

    def lost(
        self,
        unit: Unit,
        option: str | None,
        text: str,
        home: str | None = None,
        line: str | None = None,
        **fmt: Any,
    ) -> None:
        """A TuneD setting (or part of one) that is not converted. `text` is a MSG key or
        the message itself."""
        message = MSG[text].format(**fmt) if text in MSG else text
        self.out.findings.append(Finding(unit.name, option, message, True, home, line))

    def note(self, unit: Unit, option: str | None, text: str, home: str | None, **fmt: Any) -> None:
        """How a setting was converted, where that is worth knowing."""
        message = MSG[text].format(**fmt) if text in MSG else text
        self.out.findings.append(Finding(unit.name, option, message, False, home))

    def report(self, unit: Unit, option: str, result: Tr, home: str | None) -> None:
        for text in result.approx:
            self.lost(unit, option, text, home)
        for text in result.notes:
            self.note(unit, option, text, home)

    def value(self, unit: Unit, option: str, raw: str, home: str, kind: str = "text") -> str | None:
        """A value as latencyd text (variables kept), or None (reported)."""
        tr = self.vars.translate_raw(raw, kind)
        if tr.text is None:
            self.lost(unit, option, f"{option} = {raw}: {tr.why}", home)
        else:
            self.report(unit, option, tr, home)
        return tr.text

    def evaluated(self, unit: Unit, option: str, raw: str, home: str) -> str | None:
        """A value as text to take apart (variables resolved now), or None (reported)."""
        tr = self.vars.evaluate_raw(raw)
        if tr.text is None:
            self.lost(unit, option, f"{option} = {raw}: {tr.why}", home)
        else:
            self.report(unit, option, tr, home)
        return tr.text

    # -- driver ---------------------------------------------------------------------------------
    def run(self) -> Conversion:
        units = [u for n, u in self.merged.units.items() if n != "variables"]
        units.sort(key=lambda u: u.priority)  # TuneD's instance order (a stable sort)
        handlers: dict[str, Callable[[Unit], None]] = {
            "cpu": self.cpu,
            "sysctl": self.sysctl,
            "vm": self.vm,
            "sysfs": self.sysfs,
            "selinux": self.selinux,
            "irqbalance": self.irqbalance,
            "scheduler": self.scheduler,
            "irq": self.irq,
            "net": self.net,
            "bootloader": self.bootloader,
            "script": self.script,
            "systemd": self.systemd,
        }
        for unit in units:
            if not unit.enabled or not self.applies(unit):
                continue
            for key in ("script_pre", "script_post"):
                if getattr(unit, key):
                    self.lost(unit, key, f"runs {getattr(unit, key)}: latencyd runs no scripts")
            handler = handlers.get(unit.type)
            if handler is not None:
                handler(unit)
                continue
            why = NO_PLUGIN.get(
                unit.type, f"TuneD plugin {unit.type!r} is unknown to this importer"
            )
            if not unit.options:
                self.lost(unit, None, why)
            for option, raw in unit.options.items():
                self.lost(unit, option, f"{option} = {raw}: {why}")
        self.finish()
        return self.out

    def applies(self, unit: Unit) -> bool:
        """TuneD's unit conditions (cpuinfo_regex, uname_regex), against this machine."""
        for attr, text, what in (
            ("cpuinfo_regex", self.host.cpuinfo, "/proc/cpuinfo"),
            ("uname_regex", self.host.uname, "uname"),
        ):
            raw = getattr(unit, attr)
            if raw is None:
                continue
            pattern = self.vars.evaluate(parse_value(raw)).text or raw
            try:
                hit = re.search(pattern, text, re.MULTILINE) is not None
            except re.error as exc:
                self.lost(unit, attr, f"bad regular expression: {exc}")
                return False
            fmt = {"what": what, "pattern": pattern, "attr": attr}
            self.lost(
                unit, None if not hit else attr, "condition_yes" if hit else "condition_no", **fmt
            )
            if not hit:
                return False
        return True

    def unknown(self, unit: Unit, option: str, known: str = "") -> None:
        hint = f" (it knows {known})" if known else ""
        self.lost(unit, option, f"{option!r} is not an option of TuneD's {unit.type} plugin{hint}")

    # -- [cpu] ------------------------------------------------------------------------------------
    def devices_cpus(self, unit: Unit) -> Tr:
        """TuneD's `devices` of a CPU unit ("cpu0 cpu2", "!cpu0", "${f:cpulist2devs:...}")
        as a CPU-list expression ("all" when it names every CPU)."""
        raw = unit.devices.strip()
        if raw in ("*", "cpu*", ""):
            return Tr("all")
        nodes = parse_value(raw)
        if len(nodes) == 1 and isinstance(nodes[0], Func) and nodes[0].name == "cpulist2devs":
            return self.vars.translate(nodes[0].args[0] if nodes[0].args else (), "cpus")
        text = self.vars.evaluate(nodes)
        if text.text is None:
            return text
        plus: list[str] = []
        minus: list[str] = []
        for rule in filter(None, re.split(r"\s|,\s*", text.text)):
            name = rule.lstrip("!")
            m = re.fullmatch(r"cpu(\d+)", name)
            if name not in ("*", "cpu*") and not m:
                return Tr(None, f"devices {raw!r}: {rule!r} is not a CPU latencyd can name")
            (minus if rule.startswith("!") else plus).append(m.group(1) if m else "all")
        expr = "all" if not plus or "all" in plus else ",".join(plus)
        if minus:
            expr = "none" if "all" in minus else f"{expr} - ({','.join(minus)})"
        return text.but(expr)

    def cpu(self, unit: Unit) -> None:
        devices = self.devices_cpus(unit)
        if devices.text is None:
            self.lost(unit, "devices", f"devices = {unit.devices}: {devices.why}", "cpu")
            return
        if unit.devices_udev_regex:
            self.lost(unit, "devices_udev_regex", "udev-property matching has no equivalent", "cpu")
            return
        first, self.first_cpu = self.first_cpu, False
        whole = devices.text == "all"
        if self.cpu_all_taken:
            self.note(unit, None, "cpu_taken", "cpu")
            return
        per_cpu: dict[str, Any] = {}
        for option, raw in unit.options.items():
            if option == "force_latency":
                if first:
                    self.force_latency(unit, raw)
                else:
                    self.note(unit, option, "only TuneD's first [cpu] section sets it", "cstate")
            elif option in ("governor", "energy_performance_preference"):
                text = self.evaluated(unit, option, raw, "cpu")
                choices = [c.strip() for c in (text or "").split("|") if c.strip()]
                if choices:
                    per_cpu[option] = choices[0]
                    self.cpu_item(unit, option, choices[0], whole)
                if len(choices) > 1:
                    rest = "|".join(choices[1:])
                    fmt = {"opt": option, "value": text, "rest": rest, "first": choices[0]}
                    self.lost(unit, option, "fallback", "cpu", **fmt)
            elif option == "energy_perf_bias":
                epb = self.epb(unit, raw)
                if epb is not None:
                    per_cpu[option] = epb
                    self.cpu_item(unit, option, epb, whole)
            elif option in ("min_perf_pct", "max_perf_pct", "no_turbo", "boost"):
                text = self.evaluated(unit, option, raw, "cpu")
                if text is None:
                    continue
                pct = option.endswith("_pct")
                ok = text.strip().isdigit() and int(text) <= 100
                value: int | bool | None = (int(text) if ok else None) if pct else _bool(text)
                if value is None:
                    what = "a percentage" if pct else "true or false"
                    self.lost(unit, option, f"{option} = {raw}: not {what}", "cpu")
                else:
                    self.item(
                        "cpu", option, value, unit, [option], f"[{unit.name}] {option} = {raw}"
                    )
            elif option == "pm_qos_resume_latency_us":
                self.resume_latency(unit, raw, str(devices.text))
            elif option in ("latency_low", "latency_high", "load_threshold"):
                what = "sets the PM QoS latency by CPU load"
                self.lost(
                    unit, option, f"{option} = {raw}: " + MSG["dynamic"].format(what=what), "cstate"
                )
            elif option == "sampling_down_factor":
                self.lost(unit, option, "sampling_down", "cpu", raw=raw)
            else:
                self.unknown(unit, option)
        if first and not {"force_latency", "pm_qos_resume_latency_us"} & set(unit.options):
            self.lost(unit, None, "dynamic", "cstate", what=MSG["dynamic_pm_qos"])
        keys = [*per_cpu, "devices"]
        if whole:
            self.cpu_all_taken = True
        elif per_cpu:
            entry = {"cpus": devices.text, **per_cpu}
            self.tables[("cpu", "cpus")].append((entry, frozenset((unit.name, k) for k in keys)))
            self.report(unit, "devices", devices, "cpu")

    def cpu_item(self, unit: Unit, option: str, value: Any, whole: bool) -> None:
        """A per-CPU option of a [cpu] section for every CPU: top-level in latencyd."""
        if whole:
            self.item("cpu", option, value, unit, [option, "devices"], f"[{unit.name}] {option}")

    def epb(self, unit: Unit, raw: str) -> int | str | None:
        text = self.evaluated(unit, "energy_perf_bias", raw, "cpu")
        choices: list[int | str] = []
        for word in (w.strip() for w in (text or "").split("|")):
            name = EPB_ALIASES.get(word, word)
            if word.isdigit() and int(word) <= 15:
                choices.append(int(word))
            elif name in EPB_NAMES:
                choices.append(name)
            elif word:
                self.lost(unit, "energy_perf_bias", f"{word!r} is not an EPB value", "cpu")
        distinct = list(dict.fromkeys(choices))
        if len(distinct) > 1:
            rest = "|".join(map(str, distinct[1:]))
            fmt: dict[str, Any] = {"opt": "energy_perf_bias", "value": text, "rest": rest}
            fmt["first"] = distinct[0]
            self.lost(unit, "energy_perf_bias", "fallback", "cpu", **fmt)
        return distinct[0] if distinct else None

    def force_latency(self, unit: Unit, raw: str) -> None:
        text = self.evaluated(unit, "force_latency", raw, "cstate")
        if text is None:
            return
        chosen, lost, notes = convert_force_latency(text, self.host.idle_states)
        for message in lost:
            self.lost(unit, "force_latency", message, "cstate")
        for message in notes:
            self.note(unit, "force_latency", message, "cstate")
        if chosen is not None:
            note = f"[{unit.name}] force_latency = {text}"
            self.item("cstate", "force_latency_us", chosen, unit, ["force_latency"], note)

    def resume_latency(self, unit: Unit, raw: str, cpus: str) -> None:
        option = "pm_qos_resume_latency_us"
        text = self.evaluated(unit, option, raw, "cstate")
        if text is None:
            return
        chosen, lost, notes = convert_force_latency(text, self.host.idle_states, allow_na=True)
        for message in lost:
            self.lost(unit, option, message, "cstate")
        for message in notes:
            self.note(unit, option, message, "cstate")
        states = self.host.idle_states
        if isinstance(chosen, str) and chosen.startswith("state:"):
            state = next((s for s in states if s.name == chosen[6:]), None)
            if state is None:
                self.lost(unit, option, f"{text}: no idle state {chosen[6:]!r} here", "cstate")
                return
            chosen = state.latency_us
            self.lost(unit, option, "resume_us", "cstate", value=text, us=chosen)
        elif chosen == "shallowest":
            real = [s.latency_us for s in states if s.name.upper() != "POLL"]
            if not real:
                self.lost(unit, option, f"{text}: this machine has no idle states", "cstate")
                return
            chosen = min(real)
            self.lost(unit, option, "resume_us", "cstate", value=text, us=chosen)
        if chosen is None:
            return
        # The kernel's file: "n/a" = polling only (latencyd: 0), "0" = no limit ("any").
        us = 0 if chosen in ("n/a", "poll") else "any" if chosen == 0 else chosen
        entry = {"cpus": cpus, "resume_latency_us": us}
        sources = frozenset({(unit.name, option), (unit.name, "devices")})
        self.tables[("cstate", "cpus")].append((entry, sources))

    # -- [sysctl], [vm], [sysfs], [selinux] -------------------------------------------------------
    def sysctl(self, unit: Unit) -> None:
        for key, raw in unit.options.items():
            given = re.sub(r'^"(.*)"$', r"\1", raw)
            if len(given) > 1 and given[0] in "<>":
                cmp = "greater" if given[0] == ">" else "smaller"
                line = f"{toml_key(key)} = {toml_value(_number(given[1:]))}"
                self.lost(
                    unit, key, "compare", "sysctl", line, key=key, raw=raw, value=given[1:], cmp=cmp
                )
                continue
            text = self.value(unit, key, given, "sysctl")
            if text is None:
                continue
            if key in WRITEBACK_SYSCTLS:
                sources = frozenset({(unit.name, key)})
                self.writeback.append((WRITEBACK_SYSCTLS[key], _number(text), sources, key))
            elif not self.host.has_sysctl(key):
                line = f"{toml_key(key)} = {toml_value(_number(text))}"
                self.lost(unit, key, "no_sysctl", "sysctl", line, key=key)
            else:
                self.item("sysctl", key, _number(text), unit, [key])

    def vm(self, unit: Unit) -> None:
        for option, raw in unit.options.items():
            if option in ("transparent_hugepages", "transparent_hugepage"):
                text = self.value(unit, option, raw, "sysfs")
                if (
                    text is not None
                    and text not in ("always", "madvise", "never")
                    and not refs(text)
                ):
                    self.lost(unit, option, f"{raw!r} is not always, madvise or never", "sysfs")
                elif text is not None:
                    self.sysfs_item(unit, option, f"{THP}/enabled", text, f"[{unit.name}] {option}")
                    self.note(unit, option, "thp_cmdline", "sysfs")
            elif option == "transparent_hugepage.defrag":
                text = self.value(unit, option, raw, "sysfs")
                if text is not None:
                    self.sysfs_item(unit, option, f"{THP}/defrag", text, f"[{unit.name}] {option}")
            elif option in (
                "dirty_bytes",
                "dirty_ratio",
                "dirty_background_bytes",
                "dirty_background_ratio",
            ):
                text = self.value(unit, option, raw, "writeback")
                if text is None:
                    continue
                target, value = option, _number(text)
                if option.endswith("_bytes") and text.strip().endswith("%"):
                    target = option.replace("_bytes", "_ratio")  # what TuneD writes for "10%"
                    value = _number(text.strip()[:-1])
                sources = frozenset({(unit.name, option)})
                self.writeback.append((target, value, sources, f"[{unit.name}] {option}"))
            else:
                self.unknown(unit, option)

    def sysfs_item(self, unit: Unit, option: str, path: str, text: str, note: str = "") -> None:
        if not self.host.exists(path):
            self.note(unit, option, "no_file", "sysfs", path=path)
        self.item("sysfs", path, _number(text), unit, [option], note)

    def sysfs(self, unit: Unit) -> None:
        for key, raw in unit.options.items():
            path = self.vars.evaluate_raw(key).text or key
            norm = os.path.normpath(path)
            if norm in WORKQUEUE_MASKS:
                text = self.value(unit, key, raw, "kthread", "mask")
                if text is not None:
                    self.item(
                        "kthread", WORKQUEUE_MASKS[norm], text, unit, [key], f"[{unit.name}] {key}"
                    )
            elif norm in PER_WORKQUEUE_MASKS:
                self.per_workqueue.append((key, raw, unit))
            elif not norm.startswith("/sys/"):
                self.lost(unit, key, f"{key} is not under /sys", "sysfs")
            else:
                text = self.value(unit, key, raw, "sysfs")
                if text is not None:
                    self.sysfs_item(unit, key, path, text)

    def selinux(self, unit: Unit) -> None:
        for option, raw in unit.options.items():
            text = (
                self.value(unit, option, raw, "sysfs") if option == "avc_cache_threshold" else None
            )
            if option != "avc_cache_threshold":
                self.unknown(unit, option, "avc_cache_threshold")
            elif text is not None:
                path = "/sys/fs/selinux/avc/cache_threshold"
                self.sysfs_item(unit, option, path, text, f"[{unit.name}] {option}")

    # -- IRQs and threads ------------------------------------------------------------------------
    def irqbalance(self, unit: Unit) -> None:
        for option, raw in unit.options.items():
            if option != "banned_cpus":
                self.unknown(unit, option, "banned_cpus")
                continue
            text = self.value(unit, option, raw, "irq", "cpus")
            if text is not None:
                self.irq_isolate.append((text, frozenset({(unit.name, option)})))
                self.note(unit, option, "irqbalance", "irq")

    def scheduler(self, unit: Unit) -> None:
        opts = unit.options

        def src(*keys: str) -> Sources:
            return frozenset((unit.name, k) for k in keys if k in opts)

        iso = None
        if "isolated_cores" in opts:
            iso = self.value(unit, "isolated_cores", opts["isolated_cores"], "kthread", "cpus")
            iso = None if iso == "none" else iso
        housekeeping = f"all - ({iso})" if iso else None
        blacklist = [p for p in re.split(r"(?<!\\);", opts.get("ps_blacklist", "")) if p]
        whitelist = [
            p for p in re.split(r"(?<!\\);", opts.get("ps_whitelist", "")) if p not in ("", ".*")
        ]
        for option, raw in opts.items():
            if option.startswith("group.") or option in SCHED_HANDLED:
                continue
            if option in SCHED_KNOBS:
                self.sched_knob(unit, option, raw)
            elif option in ("runtime", "perf_mmap_pages", "perf_process_fork"):
                self.note(unit, option, "perf_loop", "kthread", opt=option, raw=raw)
            elif option.startswith("cgroup"):
                self.lost(unit, option, "cgroup", "kthread", opt=option, raw=raw)
            else:
                self.unknown(unit, option)
        # group.NAME = rule_prio:policy:priority:affinity:regex, sorted by rule_prio (stable).
        groups = []
        for order, (option, raw) in enumerate(opts.items()):
            if not option.startswith("group."):
                continue
            fields = (self.evaluated(unit, option, raw, "kthread") or "").split(":", 4)
            if len(fields) != 5 or not re.fullmatch(r"-?\d+", fields[0]):
                if raw.strip():  # "group.X =" switches an inherited rule off
                    self.lost(
                        unit,
                        option,
                        f"{option} = {raw}: not prio:policy:priority:affinity:regex",
                        "kthread",
                    )
                continue
            groups.append((int(fields[0]), order, option, raw, fields))
        rules = []
        for *_, option, raw, fields in sorted(groups, key=lambda g: (g[0], g[1])):
            rule = self.group_rule(unit, option, raw, fields, housekeeping, blacklist)
            if rule is not None:
                rules.append(
                    (rule, frozenset({(unit.name, option)}) | src("isolated_cores", "ps_blacklist"))
                )
        # TuneD applies every matching rule in turn (the last match wins); latencyd's first
        # match wins: the same rules, in reverse.
        self.tables[("kthread", "rule")].extend(reversed(rules))
        irq_process = _bool(opts.get("irq_process", "1")) is not False
        if iso is None or not irq_process:
            for option in ("default_irq_smp_affinity", "ps_blacklist", "ps_whitelist"):
                if option in opts and (iso is None or option == "default_irq_smp_affinity"):
                    self.note(
                        unit, option, f"{option} = {opts[option]}: does nothing here", "kthread"
                    )
        if iso is None:
            return
        if irq_process:
            self.irq_isolate.append((iso, src("isolated_cores", "irq_process")))
            self.default_irq(unit)
        if _bool(opts.get("kthread_process", "1")) is not False:
            self.isolate_kthreads(unit, blacklist, whitelist, str(housekeeping), src)
        self.item(
            "kthread",
            "isolate_tasks",
            iso,
            unit,
            ["isolated_cores"],
            f"[{unit.name}] isolated_cores",
        )
        allow = []
        for pattern in blacklist:
            if not pattern.startswith(("^\\[", "\\[")):  # those are kernel threads only
                glob_ = regex_to_glob(pattern)
                if glob_ is None:
                    self.lost(unit, "ps_blacklist", "no_glob", "kthread", pattern=pattern)
                else:
                    allow.append(glob_)
        if allow:
            self.item(
                "kthread", "allow", allow, unit, ["ps_blacklist"], f"[{unit.name}] ps_blacklist"
            )
        if whitelist:
            self.lost(unit, "ps_whitelist", "whitelist", "kthread")

    def isolate_kthreads(
        self,
        unit: Unit,
        blacklist: list[str],
        whitelist: list[str],
        housekeeping: str,
        src: Callable[..., Sources],
    ) -> None:
        """Every kernel thread but the blacklisted (and, with a whitelist, only those) to the
        housekeeping CPUs: one rule, its regex built from TuneD's patterns."""
        excluded = [
            kthread_regex(p)[0] or p if p.startswith(("^\\[", "\\[")) else p for p in blacklist
        ]
        match = ".*"
        if excluded or whitelist:
            match = "^" + "".join(f"(?=.*?(?:{w}))" for w in whitelist)
            if excluded:
                match += "(?!.*?(?:" + "|".join(f"(?:{e})" for e in excluded) + "))"
        try:
            re.compile(match)
        except re.error as exc:
            self.lost(
                unit,
                "ps_blacklist",
                f"the patterns do not combine into one regex: {exc}",
                "kthread",
            )
            return
        sources = src("isolated_cores", "ps_blacklist", "ps_whitelist", "kthread_process")
        self.isolation.append(({"match": match, "cpus": housekeeping}, sources))
        self.note(unit, "isolated_cores", "narrows", "kthread")

    def group_rule(
        self,
        unit: Unit,
        option: str,
        raw: str,
        fields: list[str],
        housekeeping: str | None,
        blacklist: list[str],
    ) -> dict[str, Any] | None:
        _prio, policy, priority, affinity, regex = fields
        match, remark = kthread_regex(regex)
        if match is None:
            self.lost(
                unit,
                option,
                "user_only",
                "kthread",
                opt=option,
                raw=raw,
                regex=regex,
                remark=remark,
            )
            return None
        if remark:
            self.lost(
                unit,
                option,
                f"{option}: {remark}; latencyd's rules are for kernel threads",
                "kthread",
            )
        rule: dict[str, Any] = {"match": match}
        kthreads = _bool(unit.options.get("kthread_process", "1")) is not False
        if affinity == "*" and housekeeping and kthreads and regex not in blacklist:
            rule["cpus"] = housekeeping  # where isolated_cores put it, and the rule left it
        elif affinity == "*":
            rule["cpus"] = "all"
            self.lost(unit, option, "leave", "kthread", opt=option)
        elif affinity.startswith("cgroup."):
            self.lost(
                unit,
                option,
                f"{option}: affinity {affinity!r}: latencyd uses no cgroups",
                "kthread",
            )
            return None
        else:
            tr = self.vars.translate(parse_value(affinity), "mask")
            if tr.text is None and re.fullmatch(r"[\d,\-]+", affinity):
                tr = Tr(
                    cpulist_expr(affinity), notes=(f"affinity {affinity!r} read as a CPU list",)
                )
            if tr.text is None:
                self.lost(unit, option, f"{option}: affinity {affinity!r}: {tr.why}", "kthread")
                return None
            self.report(unit, option, tr, "kthread")
            rule["cpus"] = tr.text
        if policy == "*":
            return rule
        if policy not in POLICIES:
            self.lost(
                unit, option, f"{option}: policy {policy!r} is not f, r, b, i, o or *", "kthread"
            )
            return None
        rule["policy"] = POLICIES[policy]
        if POLICIES[policy] in ("fifo", "rr"):
            if not priority.strip().isdigit() or not 1 <= int(priority) <= 99:
                self.lost(unit, option, f"{option}: priority {priority!r} is not 1-99", "kthread")
                return None
            rule["priority"] = int(priority)
        return rule

    def default_irq(self, unit: Unit) -> None:
        option = "default_irq_smp_affinity"
        raw = unit.options.get(option, "calc")
        if raw in ("calc", "ignore"):
            if option in unit.options:
                (self.note if raw == "calc" else self.lost)(unit, option, raw, "irq")
            return
        text = self.value(unit, option, raw, "irq", "cpus")
        if text is not None:
            self.irq_default.append(
                (text, frozenset({(unit.name, option)}), f"[{unit.name}] {option}")
            )

    def sched_knob(self, unit: Unit, option: str, raw: str) -> None:
        sysctl, debug = SCHED_KNOBS[option]
        text = self.value(unit, option, raw, "sysctl")
        path = f"/sys/kernel/debug/sched/{debug}"
        if text is None:
            return
        if self.host.has_sysctl(sysctl):
            self.item("sysctl", sysctl, _number(text), unit, [option], f"[{unit.name}] {option}")
        elif self.host.exists(path):
            self.item(
                "sysfs", path, _number(text), unit, [option], f"[{unit.name}] {option} (debugfs)"
            )
        else:
            line = f"{toml_key(path)} = {toml_value(_number(text))}"
            fmt = {"opt": option, "raw": raw, "path": sysctl.replace(".", "/"), "debug": path}
            self.lost(unit, option, "sched_knob", "sysfs", line, **fmt)

    def irq(self, unit: Unit) -> None:
        opts = unit.options
        for option in opts:
            if option not in ("affinity", "mode"):
                self.unknown(unit, option, "affinity, mode")
        if not opts.get("affinity", "").strip():
            return  # TuneD: an empty affinity switches the section off
        cpus = self.value(unit, "affinity", opts["affinity"], "irq", "cpus")
        if cpus is None:
            return
        if opts.get("mode", "set") == "intersect":
            self.lost(unit, "mode", "intersect", "irq")
        sources = frozenset({(unit.name, "affinity"), (unit.name, "mode"), (unit.name, "devices")})
        for rule in filter(None, re.split(r"\s|,\s*", unit.devices.strip() or "*")):
            m = re.fullmatch(r"irq(\d+)", rule)
            if rule in ("*", "DEFAULT"):
                self.irq_default.append((cpus, sources, f"[{unit.name}] affinity"))
            if rule == "DEFAULT":
                continue
            if rule.startswith("!") or not (m or rule in ("*", "irq*")):
                self.lost(unit, "devices", f"devices {rule!r}: not IRQs latencyd can name", "irq")
                continue
            rule_ = {"match": f"irq:{m.group(1)}" if m else "*", "cpus": cpus}
            self.tables[("irq", "rule")].append((rule_, sources))

    # -- [net] -----------------------------------------------------------------------------------
    def net(self, unit: Unit) -> None:
        entry: dict[str, Any] = {}
        for option, raw in unit.options.items():
            if option in NET_KEYS or option == "features":
                table = self.net_table(unit, option, raw)
                if table:
                    entry[option] = table
            elif option == "nf_conntrack_hashsize":
                text = self.value(unit, option, raw, "sysfs")
                if text is not None:
                    path = "/sys/module/nf_conntrack/parameters/hashsize"
                    self.sysfs_item(unit, option, path, text, f"[{unit.name}] {option}")
            elif option in ("wake_on_lan", "txqueuelen", "mtu"):
                self.lost(
                    unit, option, f"{option} = {raw}: latencyd's [net] has no {option}", "net"
                )
            elif option != "dynamic":
                self.unknown(unit, option)
        if _bool(unit.options.get("dynamic", "1")) is not False:
            what = "changes NIC speed by traffic"
            self.lost(
                unit, "dynamic" if "dynamic" in unit.options else None, "dynamic", "net", what=what
            )
        if not entry:
            return
        if unit.devices_udev_regex:
            self.lost(unit, "devices_udev_regex", "udev-property matching has no equivalent", "net")
            return
        devices = self.vars.evaluate_raw(unit.devices).text or unit.devices
        rules = [r for r in re.split(r"\s|,\s*", devices) if r]
        match = [r for r in rules if not r.startswith("!")]
        exclude = ["lo", *(r[1:] for r in rules if r.startswith("!"))]
        head: dict[str, Any] = {"match": match} if match and match != ["*"] else {}
        if exclude != ["lo"]:
            head["exclude"] = exclude
        keys = [*entry, "devices"]
        self.tables[("net", "nic")].append(
            ({**head, **entry}, frozenset((unit.name, k) for k in keys))
        )
        self.note(unit, None, "virtual_nics", "net")

    def net_table(self, unit: Unit, option: str, raw: str) -> dict[str, Any]:
        text = self.evaluated(unit, option, raw, "net")
        words = re.sub(r"(:\s*)|(\s+)|(\s*;\s*)|(\s*,\s*)", " ", text or "").split()
        if len(words) % 2:
            self.lost(unit, option, f"{option} = {raw}: not 'key value' pairs", "net")
            return {}
        table: dict[str, Any] = {}
        for key, word in zip(words[::2], words[1::2], strict=True):
            flag = option == "features" or key in NET_FLAGS.get(option, ())
            value = _bool(word) if flag else int(word) if word.isdigit() else None
            if option != "features" and key not in NET_KEYS[option]:
                self.lost(unit, option, f"{option}: {key!r} is not a key latencyd knows", "net")
            elif value is None:
                want = "on or off" if flag else "a number"
                self.lost(unit, option, f"{option}: {key} {word!r} is not {want}", "net")
            else:
                table[key] = value
        return table

    # -- what latencyd does not do ---------------------------------------------------------------
    def bootloader(self, unit: Unit) -> None:
        for option, raw in unit.options.items():
            if option.startswith("cmdline"):
                tr = Evaluator(self.vars.env, self.host, lenient=True).eval(parse_value(raw))
                text = str(tr.text)
                removes = text.startswith("-")
                want = f"wants these kernel arguments{' removed' if removes else ''}: "
                want += text.lstrip("+-").strip()
                if tr.approx:
                    want += f" (not evaluated: {'; '.join(tr.approx)})"
                self.lost(unit, option, "cmdline", want=want)
            elif option.startswith("initrd"):
                self.lost(
                    unit, option, f"{option} = {raw}: latencyd does not build or change initrds"
                )
            else:
                self.lost(
                    unit, option, f"{option} = {raw}: latencyd does not configure the boot loader"
                )

    def script(self, unit: Unit) -> None:
        for option, raw in unit.options.items():
            if option == "script":
                self.lost(unit, option, "script", raw=raw)
            else:
                self.unknown(unit, option)

    def systemd(self, unit: Unit) -> None:
        for option, raw in unit.options.items():
            if option == "cpu_affinity":
                value = self.vars.evaluate(parse_value(raw)).text or raw
                self.lost(unit, option, "cpu_affinity", raw=raw, value=value)
            else:
                self.unknown(unit, option)

    # -- what several TuneD settings build ---------------------------------------------------------
    def finish(self) -> None:
        items = self.out.items
        if self.irq_isolate:
            exprs = list(dict.fromkeys(e for e, _s in self.irq_isolate))
            value = exprs[0] if len(exprs) == 1 else " | ".join(f"({e})" for e in exprs)
            sources = frozenset().union(*(s for _e, s in self.irq_isolate))
            items[("irq", "isolate")] = Item("irq", "isolate", value, sources)
        if self.irq_default:
            value, sources, note = self.irq_default[-1]
            items[("irq", "default_affinity")] = Item(
                "irq", "default_affinity", value, sources, note
            )
        self.tables[("kthread", "rule")].extend(self.isolation)
        # TuneD gives each CPU to the first [cpu] section that names it; latencyd's later
        # entries win where CPU sets overlap.
        self.tables[("cpu", "cpus")].reverse()
        self.tables[("cstate", "cpus")].reverse()
        for (section, option), entries in self.tables.items():
            if entries:
                sources = frozenset().union(*(s for _e, s in entries))
                items[(section, option)] = Item(section, option, [e for e, _s in entries], sources)
        unbound = items.get(("kthread", "unbound_cpumask"))
        for key, raw, unit in self.per_workqueue:
            if unbound is not None and self.vars.translate_raw(raw, "mask").text == unbound.value:
                self.note(unit, key, "covered", "kthread")
            else:
                self.lost(unit, key, "per_workqueue", "kthread", key=key, raw=raw)
        # vm.dirty_*: the kernel keeps a ratio or a byte count; TuneD writes them in order,
        # so the last written of a pair holds.
        last: dict[str, tuple[Any, Sources, str]] = {}
        for option, value, sources, label in self.writeback:
            for pair in WRITEBACK_PAIRS:
                other = pair[1 - pair.index(option)] if option in pair else None
                if other in last:
                    _v, old_sources, old_label = last.pop(str(other))
                    unit_name, key = next(iter(old_sources))
                    text = MSG["superseded"].format(old=old_label, new=label)
                    self.out.findings.append(Finding(unit_name, key, text, False, "writeback"))
            last[option] = (value, sources, label)
        for option, (value, sources, label) in last.items():
            items[("writeback", option)] = Item("writeback", option, value, sources, label)
        self.add_variables()

    def add_variables(self) -> None:
        """The variables the converted settings refer to (and those they refer to), in
        TuneD's order."""
        wanted: set[str] = set()
        todo = sorted({r for item in self.out.items.values() for r in refs(item.value)})
        while todo:
            name = todo.pop()
            if name not in wanted:
                wanted.add(name)
                todo.extend(refs(self.vars.var(name).text or ""))
        for name in self.vars.names():
            value, definition = self.vars.var(name), self.vars.definition(name)
            if name not in wanted or value.text is None or definition is None:
                continue  # the settings referring to it were not converted
            raw, key, origin = definition
            note = "" if value.text == raw else f"{name} = {raw}"
            sources = frozenset({("variables", key), ("variables", name)})
            self.out.items[("variables", name)] = Item("variables", name, value.text, sources, note)
            for text in value.approx:
                self.out.findings.append(
                    Finding("variables", name, text, True, "variables", path=origin)
                )
            for text in value.notes:
                self.out.findings.append(
                    Finding("variables", name, text, False, "variables", path=origin)
                )


def convert_merged(merged: Merged, files: Mapping[str, str | None], host: Host) -> Conversion:
    return Converter(merged, files, host).run()


# == writing the files ==========================================================================


@dataclass
class OutputFile:
    name: str  # file name without .toml
    source: str  # the tuned.conf it comes from
    text: str
    findings: list[Finding]

    @property
    def complete(self) -> bool:
        return not any(f.counted for f in self.findings)


def output_names(paths: Sequence[str], profiles: Mapping[str, TunedProfile]) -> dict[str, str]:
    """A file name per profile: its TuneD name; a profile that shadows another of the
    same name (/etc/tuned/X including /usr/lib/tuned/X) gets its directory added."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for path in paths:
        base = profiles[path].name
        name = base
        if name in taken:
            slug = re.sub(r"[^A-Za-z0-9_.+-]+", "-", str(Path(path).parent.parent)).strip("-")
            name = f"{base}@{slug}"
        taken.add(name)
        names[path] = name
    return names


def touched(profile: TunedProfile) -> set[tuple[str, str | None]]:
    """The (unit, option) pairs a profile sets itself (and (unit, None) for its units)."""
    out: set[tuple[str, str | None]] = set()
    for unit, options in profile.sections.items():
        if unit == "main":
            continue
        out.add((unit, None))
        out.update((unit, opt) for opt in options)
    return out


def convert(chain: Chain, host: Host) -> list[OutputFile]:
    """Every profile of the chain as a latencyd file (pure: reads nothing)."""
    top_order = chain.orders[chain.top]
    paths = list(dict.fromkeys([chain.top, *reversed(top_order), *chain.orders]))
    names = output_names(paths, chain.profiles)
    files = []
    for path in paths:
        order = chain.orders[path]
        profiles = [chain.profiles[p] for p in order]
        before = (
            convert_merged(merge(profiles[:-1]), chain.variable_files, host)
            if len(profiles) > 1
            else Conversion()
        )
        after = convert_merged(merge(profiles), chain.variable_files, host)
        own = chain.profiles[path]
        files.append(
            OutputFile(
                names[path],
                path,
                *render_file(
                    own,
                    [names[p] for p in chain.includes[path]],
                    before,
                    after,
                    chain.include_notes.get(path, []),
                ),
            )
        )
    return files


def file_items(
    profile: TunedProfile, before: Conversion, after: Conversion
) -> tuple[list[Item], dict[str, list[str]], dict[str, str]]:
    """What a profile's file holds: the items of the merged conversion it sets itself or
    that differ from what its includes give, and what it takes away from them."""
    mine = touched(profile)
    items = [
        item
        for key, item in after.items.items()
        if key not in before.items
        or before.items[key].value != item.value
        or any((u, o) in mine for u, o in item.sources)
    ]
    removed: dict[str, list[str]] = {}
    for key in before.items:
        section, option = key
        if key in after.items or section == "variables":
            continue
        pair = next((p for p in WRITEBACK_PAIRS if option in p), None)
        if section == "writeback" and pair and any((section, o) in after.items for o in pair):
            continue  # latencyd drops the other mode of a pair by itself
        removed.setdefault(section, []).append(option)
    # TuneD's explicit keys map onto latencyd's where the effect is the same.
    how: dict[str, str] = {}
    replacing = {u for u, o in profile.sections.items() if _truthy(o.get("replace"), False)}
    fed = {
        it.section
        for it in [*before.items.values(), *after.items.values()]
        if any(u in replacing for u, _k in it.sources)
    }
    emitted = {(i.section, i.option) for i in items}
    for section in sorted((set(removed) | fed) - {"variables"}):
        options = removed.get(section, [])
        inherited = [o for (s, o) in before.items if s == section]
        units = {u for (s, _o), it in before.items.items() if s == section for u, _k in it.sources}
        disabled = any(
            _truthy(profile.sections.get(u, {}).get("enabled"), True) is False for u in units
        )
        if disabled and inherited and not any(s == section for s, _o in after.items):
            how[section] = "enabled"
        elif (
            (units & replacing or section in fed)
            and inherited
            and all(o in options or (section, o) in emitted for o in inherited)
        ):
            how[section] = "replace"
    return items, removed, how


def render_file(
    profile: TunedProfile,
    includes: list[str],
    before: Conversion,
    after: Conversion,
    include_notes: list[Finding],
) -> tuple[str, list[Finding]]:
    items, removed, how = file_items(profile, before, after)
    seen = {f.key for f in before.findings}
    mine = touched(profile)
    findings = [
        f
        for f in after.findings
        if (f.path == profile.key if f.path else (f.unit, f.option) in mine or f.key not in seen)
    ]
    findings = list(dict.fromkeys([*include_notes, *findings]))
    by_section: dict[str, list[Item]] = {}
    for item in items:
        by_section.setdefault(item.section, []).append(item)
    out = [
        MARKER,
        " ".join(f"# TuneD profile {profile.name!r}: {profile.path}".split()),
        "# Settings TuneD had that latencyd does not take are listed as 'not converted'",
        "# comments where they belong; 'note' comments say how something was converted.",
        "",
        "[main]",
    ]
    summary = profile.main.get("summary")
    if summary:
        out.append(f"summary = {toml_value(summary)}")
    if includes:
        out.append(f"include = {toml_value([f'{n}.toml' for n in includes])}")
    if profile.main.get("description"):
        out.extend(_comment(f"description: {profile.main['description']}"))
    for f in findings:
        if f.unit == "main":
            out.extend(_comment(f"note: {f.text}" if not f.counted else f"not converted: {f.text}"))
    homeless: list[Finding] = []
    placed: dict[str, list[Finding]] = {}
    for f in findings:
        if f.unit == "main":
            continue
        if f.home and (f.home in by_section or f.home in removed):
            placed.setdefault(f.home, []).append(f)
        else:
            homeless.append(f)
    sections = ["variables", *SECTION_ORDER]
    sections += sorted((set(by_section) | set(removed)) - set(sections))
    for section in sections:
        if section not in by_section and section not in removed:
            continue
        out.append("")
        out.append(f"[{section}]")
        gone = removed.get(section, [])
        if how.get(section) == "enabled":
            out.append("enabled = false  # TuneD: enabled = false")
        elif how.get(section) == "replace":
            out.append("replace = true  # TuneD: replace = true")
        elif gone:
            out.append(
                f"drop = {toml_value(gone)}  # taken away in TuneD (drop, replace or enabled)"
            )
        arrays = []
        for item in by_section.get(section, []):
            if (section, item.option) in TABLE_ARRAYS and isinstance(item.value, list):
                arrays.append(item)
                continue
            line = f"{toml_key(item.option)} = {toml_value(item.value)}"
            note = " ".join(item.note.split())  # a comment ends at the line's end
            out.append(line + (f"  # {note}" if note else ""))
        for item in arrays:
            if item.note:
                out.extend(_comment(item.note))
            for entry in item.value:
                out.append("")
                out.append(f"[[{section}.{item.option}]]")
                out.extend(f"{toml_key(k)} = {toml_value(v)}" for k, v in entry.items())
        for f in placed.get(section, []):
            out.extend(_finding_lines(f))
    if homeless:
        out.append("")
        out.append("# -- TuneD settings latencyd does not take here " + "-" * 43)
        for f in homeless:
            out.extend(_finding_lines(f))
    return "\n".join(out).rstrip() + "\n", findings


def _comment(text: str, prefix: str = "# ") -> list[str]:
    return textwrap.wrap(
        text,
        98,
        initial_indent=prefix,
        subsequent_indent=prefix + "  ",
        break_on_hyphens=False,
        break_long_words=False,
    ) or [prefix.rstrip()]


def _finding_lines(f: Finding) -> list[str]:
    kind = "not converted" if f.counted else "note"
    out = _comment(f"{f.label}: {kind}: {f.text}")
    if f.line:
        out.append(f"# {f.line}")
    return out


# == TOML ======================================================================================


def toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_string(key)


def toml_string(text: str) -> str:
    out = ['"']
    for ch in text:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch in "\b\t\n\f\r":
            out.append({"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def toml_value(value: Any) -> str:
    """A value as TOML: strings, integers, floats, booleans, arrays, inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if not -INT64 <= value < INT64:
            raise ValueError(f"{value} does not fit a TOML integer")
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return (
            "{ "
            + ", ".join(f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items())
            + " }"
        )
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


# == the I/O edge ================================================================================


@dataclass
class ImportResult:
    files: list[tuple[Path, OutputFile]]
    code: int
    shadows: list[str] = field(default_factory=list)  # names latencyd ships a profile under

    SHADOW_NOTE = (
        "has the name of a profile latencyd ships: in a profile directory searched before "
        "the shipped ones it takes that profile's place, also where latencyd's own profiles "
        "include it (the converted files include each other by file name, not by search)"
    )

    def as_json(self) -> dict[str, Any]:
        return {
            "exit_code": self.code,
            "complete": self.code == COMPLETE,
            "shadows_shipped_profiles": self.shadows,
            "files": [
                {
                    "path": str(path),
                    "from": f.source,
                    "complete": f.complete,
                    "not_converted": [
                        {"setting": x.label, "reason": x.text} for x in f.findings if x.counted
                    ],
                    "notes": [
                        {"setting": x.label, "note": x.text} for x in f.findings if not x.counted
                    ],
                }
                for path, f in self.files
            ],
        }


def import_tuned(
    target: str,
    out_dir: Path,
    extra_dirs: Sequence[Path] = (),
    dirs: Sequence[Path] = TUNED_DIRS,
    host: Host | None = None,
    write: bool = True,
) -> ImportResult:
    """Convert `target` (NAME, DIR or FILE) and its include chain into `out_dir`."""
    host = host if host is not None else read_host()
    search = [*dirs, *reversed([Path(d) for d in extra_dirs])]  # extra dirs searched first
    chain = load_chain(target, search, host)
    files = convert(chain, host)
    result = ImportResult([(out_dir / f"{f.name}.toml", f) for f in files], COMPLETE)
    from latencyd.config import shipped_profiles_dir

    shipped = {p.stem for p in shipped_profiles_dir().glob("*.toml")}
    result.shadows = [f.name for f in files if f.name in shipped]
    if any(not f.complete for f in files):
        result.code = PARTIAL
    if write:
        for path, _f in result.files:
            _check_ours(path)  # before anything is written
        for path, f in result.files:
            _write(path, f.text)
    return result


def _check_ours(path: Path) -> None:
    """Refuse to overwrite a file import-tuned did not write."""
    try:
        with open(path) as f:
            first = f.readline().rstrip("\n")
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as exc:
        raise ImportFailed(f"cannot check {path}: {exc}") from exc
    if first != MARKER:
        raise ImportFailed(
            f"{path} exists and was not written by import-tuned: remove it or choose another "
            "directory (-o)"
        )


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.import-tuned")
        tmp.write_text(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        raise ImportFailed(f"cannot write {path}: {exc.strerror}") from exc
