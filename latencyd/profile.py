"""Profiles: TOML files with includes, variables and CPU expressions, validated per plugin.

Loading is pure apart from reading files: a profile either loads completely and
validly or raises `ProfileError` naming the file and line, so nothing of a bad
profile can ever reach the engine.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencyd.errors import Location, ProfileError, ProfileNotFound
from latencyd.schema import Machine, Schema, SchemaError, validate
from latencyd.tomlpos import KeyPath, key_lines, nearest_line

SUFFIX = ".toml"
MAIN_KEYS = {"summary": "one-line description", "include": "profiles this one builds on"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class SourceFile:
    """One parsed profile file, before includes are merged."""

    name: str
    path: Path
    data: dict[str, Any]
    lines: dict[KeyPath, int]

    def at(self, *path: str | int) -> Location:
        return Location(self.path, nearest_line(self.lines, tuple(path)))

    @property
    def summary(self) -> str:
        return str(self.data.get("main", {}).get("summary", ""))


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    summary: str
    sections: dict[str, dict[str, Any]]  # plugin name -> validated options
    origins: dict[str, dict[str, Location]]  # plugin name -> option -> where it was set
    variables: dict[str, Any] = field(default_factory=dict)
    files: tuple[Path, ...] = ()


@dataclass(frozen=True)
class ProfileInfo:
    name: str
    path: Path
    summary: str
    error: str | None = None


def read_source(name: str, path: Path) -> SourceFile:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(Location(path), f"cannot read profile: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ProfileError(
            Location(path, line), f"cannot read profile: not UTF-8 text ({exc.reason})"
        ) from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib says "... (at line L, column C)"; move the position to the front.
        msg = str(exc)
        m = re.search(r"\(at line (\d+), column \d+\)$", msg)
        at = int(m.group(1)) if m else None
        reason = msg[: m.start()].strip() if m else msg
        raise ProfileError(Location(path, at), f"TOML syntax error: {reason}") from exc
    return SourceFile(name, path, data, key_lines(text))


class ProfileLibrary:
    """The profile search path, and loading profiles from it against the known plugins."""

    def __init__(
        self,
        search_path: Sequence[Path],
        schemas: Mapping[str, Schema],
        machine: Machine,
    ) -> None:
        self.search_path = [Path(p) for p in search_path]
        self.schemas = schemas
        self.machine = machine

    # -- finding -------------------------------------------------------------
    def find(self, name: str, near: Path | None = None) -> Path:
        if name.endswith(SUFFIX) or "/" in name:
            candidate = Path(name)
            if not candidate.is_absolute() and near is not None:
                candidate = near.parent / candidate
            if candidate.is_file():
                return candidate
            raise ProfileNotFound(Location(candidate), "no such profile file")
        for directory in self.search_path:
            candidate = directory / f"{name}{SUFFIX}"
            if candidate.is_file():
                return candidate
        searched = ", ".join(str(d) for d in self.search_path) or "(empty search path)"
        raise ProfileNotFound(Location(None), f"no profile named {name!r} (searched {searched})")

    def names(self) -> dict[str, Path]:
        """Every profile name on the search path; earlier directories win."""
        found: dict[str, Path] = {}
        for directory in self.search_path:
            if not directory.is_dir():
                continue
            for path in sorted(directory.glob(f"*{SUFFIX}")):
                found.setdefault(path.name[: -len(SUFFIX)], path)
        return dict(sorted(found.items()))

    def all(self) -> list[ProfileInfo]:
        """All profiles with their summaries; invalid ones carry their error instead."""
        infos = []
        for name, path in self.names().items():
            try:
                profile = self.load(name)
                infos.append(ProfileInfo(name, path, profile.summary))
            except ProfileError as exc:
                infos.append(ProfileInfo(name, path, "", str(exc)))
        return infos

    # -- loading -------------------------------------------------------------
    def load(self, name_or_path: str) -> Profile:
        path = self.find(name_or_path)
        name = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
        chain = self._include_chain(name, path, stack=())
        # A file included along several paths (a diamond) is merged once, at its first
        # place: merging it again would silently undo what files after it changed.
        seen: set[Path] = set()
        unique = []
        for source in chain:
            if source.path.resolve() not in seen:
                seen.add(source.path.resolve())
                unique.append(source)
        return self._merge(name, path, unique)

    def _include_chain(self, name: str, path: Path, stack: tuple[Path, ...]) -> list[SourceFile]:
        """Files in merge order: includes depth-first (in listed order), then the file itself."""
        resolved = path.resolve()
        source = read_source(name, path)
        main = source.data.get("main", {})
        if not isinstance(main, dict):
            raise ProfileError(source.at("main"), "[main] must be a table")
        for key in main:
            if key not in MAIN_KEYS:
                known = ", ".join(MAIN_KEYS)
                raise ProfileError(
                    source.at("main", key), f"unknown key {key!r} in [main] (known: {known})"
                )
        includes = main.get("include", [])
        if isinstance(includes, str):
            includes = [includes]
        if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
            raise ProfileError(
                source.at("main", "include"), "include must be a list of profile names"
            )
        chain: list[SourceFile] = []
        for inc in includes:
            try:
                inc_path = self.find(inc, near=path)
            except ProfileNotFound as exc:
                raise ProfileError(
                    source.at("main", "include"),
                    f"included profile {inc!r} not found: {exc.message}",
                ) from exc
            if inc_path.resolve() in (*stack, resolved):
                cycle = " -> ".join(p.name for p in (*stack, resolved, inc_path.resolve()))
                raise ProfileError(source.at("main", "include"), f"include cycle: {cycle}")
            inc_name = inc_path.name[: -len(SUFFIX)]
            chain.extend(self._include_chain(inc_name, inc_path, (*stack, resolved)))
        chain.append(source)
        return chain

    def _merge(self, name: str, path: Path, chain: list[SourceFile]) -> Profile:
        variables: dict[str, tuple[Any, SourceFile]] = {}
        raw: dict[str, dict[str, tuple[Any, SourceFile]]] = {}
        section_file: dict[str, SourceFile] = {}
        for source in chain:
            for key, value in source.data.items():
                if key == "main":
                    continue
                if not isinstance(value, dict):
                    raise ProfileError(
                        source.at(key), f"{key!r} must be a table like [{key}], not a value"
                    )
                if key == "variables":
                    for var, val in value.items():
                        variables[var] = (val, source)
                    continue
                if key not in self.schemas:
                    known = ", ".join(sorted(self.schemas)) or "none installed"
                    raise ProfileError(
                        source.at(key), f"unknown plugin section [{key}] (plugins: {known})"
                    )
                section_file.setdefault(key, source)
                merged = raw.setdefault(key, {})
                for opt, val in value.items():
                    for group in self.schemas[key].exclusive:
                        if opt in group:  # a later file's choice replaces the other mode
                            for other in group:
                                if other != opt and other in merged and merged[other][1] != source:
                                    del merged[other]
                    merged[opt] = (val, source)  # later files win, option by option

        resolved_vars = _resolve_variables(variables)
        sections: dict[str, dict[str, Any]] = {}
        origins: dict[str, dict[str, Location]] = {}
        for section, options in raw.items():
            substituted: dict[str, Any] = {}
            for opt, (val, source) in options.items():
                substituted[opt] = _substitute(val, resolved_vars, source, (section, opt))
            try:
                sections[section] = validate(self.schemas[section], substituted, self.machine)
            except SchemaError as exc:
                head = exc.path[0] if exc.path else None
                source = options[str(head)][1] if head in options else section_file[section]
                raise ProfileError(source.at(section, *exc.path), exc.message) from exc
            origins[section] = {opt: src.at(section, opt) for opt, (_, src) in options.items()}
        return Profile(
            name=name,
            path=path,
            summary=chain[-1].summary
            or next((s.summary for s in reversed(chain) if s.summary), ""),
            sections=sections,
            origins=origins,
            variables=resolved_vars,
            files=tuple(dict.fromkeys(s.path for s in chain)),
        )


def _resolve_variables(variables: dict[str, tuple[Any, SourceFile]]) -> dict[str, Any]:
    """Expand variables that refer to other variables; a cycle is an error."""
    done: dict[str, Any] = {}

    def resolve(var: str, stack: tuple[str, ...]) -> Any:
        if var in done:
            return done[var]
        value, source = variables[var]
        if var in stack:
            cycle = " -> ".join((*stack, var))
            raise ProfileError(source.at("variables", var), f"variable cycle: {cycle}")
        lookup = {v: _Lazy(lambda v=v: resolve(v, (*stack, var))) for v in variables}
        done[var] = _substitute(value, lookup, source, ("variables", var))
        return done[var]

    for var in variables:
        resolve(var, ())
    return done


@dataclass
class _Lazy:
    get: Any


def _substitute(
    value: Any, variables: Mapping[str, Any], source: SourceFile, where: KeyPath
) -> Any:
    """Replace ${name} in strings (recursively); a value that is exactly ${name} keeps its type."""
    if isinstance(value, list):
        return [_substitute(v, variables, source, (*where, i)) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _substitute(v, variables, source, (*where, k)) for k, v in value.items()}
    if not isinstance(value, str):
        return value

    def lookup(var: str) -> Any:
        if var not in variables:
            known = ", ".join(sorted(variables)) or "none defined"
            raise ProfileError(
                source.at(*where), f"undefined variable ${{{var}}} (variables: {known})"
            )
        got = variables[var]
        return got.get() if isinstance(got, _Lazy) else got

    whole = _VAR.fullmatch(value)
    if whole:
        return lookup(whole.group(1))
    return _VAR.sub(lambda m: str(lookup(m.group(1))), value)
