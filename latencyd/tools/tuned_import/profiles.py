"""TuneD profiles as TuneD reads them: tuned.conf parsing, the profile search path,
include chains, variables files, and TuneD's merge of a chain into one profile.

- **Includes** are resolved the way TuneD resolves them (tuned/profiles/locator.py): the
  highest-priority directory first (/etc/tuned/profiles, /etc/tuned, /usr/lib/tuned/
  profiles, /usr/lib/tuned), a file already loaded is skipped (so /etc/tuned/X may
  include X to extend /usr/lib/tuned/X), `-NAME` is optional. A profile that includes
  itself through others is an include cycle (TuneD skips it silently; we refuse).
- **Merging** is TuneD's (tuned/profiles/merger.py): sections merge by name, option by
  option; `replace`, `drop`, `enabled`, `devices` and `type` are unit keys.

Finding and reading the files is `find_profile`, `locate` and `load_chain`; parsing and
merging are pure.
"""

from __future__ import annotations

import configparser
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from latencyd.tools.tuned_import.host import Host
from latencyd.tools.tuned_import.results import Finding, ImportFailed
from latencyd.tools.tuned_import.values import Evaluator, Func, parse_value

# TuneD's profile directories, lowest priority first (as TuneD lists them): the classic
# layout and the newer profiles/ sub-directory one (TuneD >= 2.24).
TUNED_DIRS = (
    Path("/usr/lib/tuned"),
    Path("/usr/lib/tuned/profiles"),
    Path("/etc/tuned"),
    Path("/etc/tuned/profiles"),
)
PROFILE_FILE = "tuned.conf"
MAX_FILE_BYTES = 1 << 20  # a larger file is not a TuneD profile (nor a variables file)


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
    """The profile names of an `include` value (TuneD splits on commas and semicolons)."""
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


def unit_bool(value: str | None, default: bool) -> bool:
    """A unit's `enabled` or `replace` as TuneD reads it: only True, true and 1 are true."""
    if value is None:
        return default
    return value in ("True", "true", "1")


def make_unit(name: str, config: Mapping[str, str], profile: str) -> Unit:
    """TuneD's Unit(): a section of `profile` (its path) with its unit keys taken out."""
    options = dict(config)
    drop = options.pop("drop", None)
    try:
        priority = int(options.pop("priority", "0") or 0)
    except ValueError:
        priority = 0
    return Unit(
        name=name,
        type=options.pop("type", name),
        enabled=unit_bool(options.pop("enabled", None), True),
        replace=unit_bool(options.pop("replace", None), False),
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
    """TuneD's merge of a chain of profiles: [main] and the units by name."""

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
