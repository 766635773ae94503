"""The converted chain as latencyd files, and writing them (`import_tuned`, the I/O edge).

Each output file is the conversion of TuneD's *merged* profile up to that file, minus
what the files it includes already give (latencyd merges option by option too). So
`latencyd` loading the converted chain gets exactly the conversion of what TuneD
merged: a `[[kthread.rule]]` list built from several TuneD `group.*` options is written
whole where any of them changes, TuneD's `drop`/`replace`/`enabled = false` become
latencyd's `drop`/`replace`/`enabled` for the options they take away.

`convert_chain` is pure (the parsed chain and a `Host` in, the files' text out);
`import_tuned` reads /etc/tuned and /usr/lib/tuned, gathers the host facts and writes.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencyd.core.tomlwrite import toml_line, toml_table
from latencyd.kernel.system import System
from latencyd.tools.tuned_import.convert import convert_merged
from latencyd.tools.tuned_import.host import Host, read_host
from latencyd.tools.tuned_import.profiles import (
    TUNED_DIRS,
    Chain,
    TunedProfile,
    load_chain,
    merge,
    unit_bool,
)
from latencyd.tools.tuned_import.results import (
    TABLE_ARRAYS,
    WRITEBACK_PAIRS,
    Conversion,
    Finding,
    ImportFailed,
    Item,
)

# The first line of every file import-tuned writes: it overwrites no file without it.
MARKER = "# latencyd profile converted from TuneD by `latencyctl import-tuned`"
# Exit codes: everything converted; some settings not (listed); nothing (ImportFailed).
COMPLETE, PARTIAL, IMPOSSIBLE = 0, 1, 2
# latencyd's sections in the order they are written.
SECTION_ORDER = (
    "cstate", "cpu", "irq", "kthread", "shield", "net", "sysctl", "writeback", "sysfs",
    "bootloader",
)  # fmt: skip


@dataclass
class OutputFile:
    """One latencyd profile to write: the conversion of one TuneD profile of the chain."""

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


def convert_chain(chain: Chain, host: Host) -> list[OutputFile]:
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
    replacing = {u for u, o in profile.sections.items() if unit_bool(o.get("replace"), False)}
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
            unit_bool(profile.sections.get(u, {}).get("enabled"), True) is False for u in units
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
    """A profile's file (`before`: the conversion of what its includes merge to, `after`:
    with it): its text, and the findings it lists."""
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
        out.append(toml_line("summary", summary))
    if includes:
        out.append(toml_line("include", [f"{n}.toml" for n in includes]))
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
                toml_line("drop", gone) + "  # taken away in TuneD (drop, replace or enabled)"
            )
        arrays = []
        for item in by_section.get(section, []):
            if (section, item.option) in TABLE_ARRAYS and isinstance(item.value, list):
                arrays.append(item)
                continue
            line = toml_line(item.option, item.value)
            note = " ".join(item.note.split())  # a comment ends at the line's end
            out.append(line + (f"  # {note}" if note else ""))
        for item in arrays:
            if item.note:
                out.extend(_comment(item.note))
            for entry in item.value:
                out.append("")
                out.extend(toml_table(section, item.option, entry))
        for f in placed.get(section, []):
            out.extend(_finding_lines(f))
    if homeless:
        out.append("")
        out.append("# -- TuneD settings latencyd does not take here " + "-" * 43)
        for f in homeless:
            out.extend(_finding_lines(f))
    return "\n".join(out).rstrip() + "\n", findings


def _comment(text: str, prefix: str = "# ") -> list[str]:
    """`text` as comment lines of at most 100 columns."""
    return textwrap.wrap(
        text,
        98,
        initial_indent=prefix,
        subsequent_indent=prefix + "  ",
        break_on_hyphens=False,
        break_long_words=False,
    ) or [prefix.rstrip()]


def _finding_lines(f: Finding) -> list[str]:
    """A finding as comment lines, with the TOML line it suggests (commented out)."""
    kind = "not converted" if f.counted else "note"
    out = _comment(f"{f.label}: {kind}: {f.text}")
    if f.line:
        out.append(f"# {f.line}")
    return out


@dataclass
class ImportResult:
    """What an import gives: each file (where it goes, what it holds), the exit code."""

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
    host = host if host is not None else read_host(System("/"))
    search = [*dirs, *reversed([Path(d) for d in extra_dirs])]  # extra dirs searched first
    chain = load_chain(target, search, host)
    files = convert_chain(chain, host)
    result = ImportResult([(out_dir / f"{f.name}.toml", f) for f in files], COMPLETE)
    from latencyd.paths import shipped_profiles_dir

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
