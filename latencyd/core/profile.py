"""Profiles: TOML files with includes, variables and CPU expressions, validated per plugin.

Loading is pure apart from reading files: a profile either loads completely and
validly or raises `ProfileError` naming the file and line, so nothing of a bad
profile can ever reach the engine. Whatever a file contains, loading it is
bounded in time and memory (see LIMITS), and its cost grows linearly with the file:
hostile input gets the same clear `file:line: what is wrong` as a typo, never a
traceback. Any other exception while loading is a bug, and still that profile's error:
it never stops a listing of the others or the daemon.

A profile file is read only if it is a regular file on a real file system, not a
symbolic link, FIFO or kernel interface that could block (system.read_guarded).
Where profiles come from is checked like sudo and OpenSSH check their files: when the
daemon runs as root, a profile file and every directory above it must be owned by root
and not writable by group or others, or a local user could plant settings.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from latencyd.core.respell import respell
from latencyd.core.schema import INT64, Schema, SchemaError, validate
from latencyd.core.tomlpos import KeyPath, key_lines, max_nesting, nearest_line
from latencyd.errors import FileRefused, Location, ProfileError, ProfileNotFound
from latencyd.kernel.system import FileId, Machine, file_id, read_guarded

SUFFIX = ".toml"
MAIN_KEYS = {  # key: what it holds (latencyd.profile(5))
    "summary": "one-line description",
    "include": "profiles this one builds on, by name (on the search path) or by path (from "
    "this file's directory); later ones win, option by option; a profile reached twice is "
    "merged once; a cycle is an error",
    "booted_isolation": '"show" (the default): the booted isolation of the CPUs the profile '
    'shields is shown in status; "require": the profile is refused (nothing applied, the '
    "active profile stays) unless every boot-time feature for those CPUs is booted (none "
    '"not booted", none booted for other CPUs); a feature this kernel cannot have after any '
    "reboot (not applicable) does not refuse it",
}
BOOTED_ISOLATION = ("show", "require")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+@-]*")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    """Bounds on what one profile may contain; far beyond any real profile."""

    file_bytes: int = 256 * 1024
    name_chars: int = 128  # a profile name
    path_chars: int = 4096  # an include given as a path
    include_depth: int = 16
    files: int = 64  # files in one profile, includes included
    # All of one profile's files together: 64 files of file_bytes each cost ~20 s to load.
    profile_bytes: int = 1024 * 1024
    nesting: int = 16  # arrays and tables inside each other
    variables: int = 256
    value_chars: int = 4096  # a string after variables are substituted
    items: int = 1024  # entries in one array (rules, CPU entries, list values)
    # Text that variables add to one profile's values, all together: what is validated is
    # then at most the files plus this, however often a long variable is used.
    substituted_chars: int = 256 * 1024


LIMITS = Limits()


@dataclass(frozen=True)
class SourceFile:
    """One parsed profile file, before includes are merged."""

    name: str
    path: Path
    data: dict[str, Any]
    lines: dict[KeyPath, int]
    size: int = 0  # characters of TOML

    def at(self, *path: str | int) -> Location:
        return Location(self.path, nearest_line(self.lines, tuple(path)))

    @property
    def summary(self) -> str:
        main = self.data.get("main", {})
        return str(main.get("summary", "")) if isinstance(main, dict) else ""


@dataclass(frozen=True)
class Fixed:
    """An option the daemon's config fixes for a plugin's section in every profile
    (latencyd.conf's [plugin.NAME]), as written there, and where."""

    value: Any
    where: Location


@dataclass(frozen=True)
class Profile:
    name: str
    path: Path
    summary: str
    sections: dict[str, dict[str, Any]]  # plugin name -> validated options
    origins: dict[str, dict[str, Location]]  # plugin name -> option -> where it was set
    variables: dict[str, Any] = field(default_factory=dict)
    files: tuple[Path, ...] = ()
    removed: dict[str, list[Removal]] = field(default_factory=dict)  # by section
    # The options as the files wrote them, variables substituted, not yet validated:
    # what a profile derived from this one (measure --attribute) writes back out.
    written: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Options the daemon's config fixed, by section: where the config says so (also
    # their origins: explain and status name the config's line, not the profile's).
    fixed: dict[str, dict[str, Location]] = field(default_factory=dict)
    # [main] booted_isolation (BOOTED_ISOLATION), and where it was set (None: the default)
    booted_isolation: str = "show"
    booted_isolation_at: Location | None = None
    # A file of it came from the cluster's directory (ProfileLibrary.cluster_dir): the
    # daemon holds such a profile to the admin group's limits, whoever asks for it.
    from_cluster: bool = False


@dataclass(frozen=True)
class Removal:
    """Inherited settings a file took away: `option` (None: the whole section), and how."""

    option: str | None
    how: str  # "enabled = false", "replace = true" or "drop"
    where: Location


# Keys valid in any section that shape inheritance, with what they do; the loader consumes
# them, plugins never see them. TuneD's `enabled`, `replace` and `drop` map onto these.
INHERITANCE_KEYS = {
    "enabled": "false: switch off the section inherited from included profiles",
    "replace": "true: drop every inherited option of the section; keep only this file's",
    "drop": "[names]: drop these inherited options",
}


@dataclass(frozen=True)
class ProfileInfo:
    name: str
    path: Path
    summary: str
    error: str | None = None


@dataclass(frozen=True)
class _Listed:
    """A profile as ProfileLibrary.all() listed it, and the files its loading read."""

    info: ProfileInfo
    files: tuple[tuple[Path, FileId | None], ...]  # each as it was before it was read

    def holds(self) -> bool:
        """Whether each file is as it was (the rest that the answer depends on is the
        library's: its names and machine)."""
        return all(file_id(path) == was for path, was in self.files)


def _toml_error(path: Path, text: str, exc: tomllib.TOMLDecodeError) -> ProfileError:
    # tomllib says "... (at line L, column C)" or "... (at end of document)".
    msg = str(exc)
    m = re.search(r"\s*\((?:at line (\d+), column \d+|at end of document)\)$", msg)
    if m and m.group(1):
        line = int(m.group(1))
    else:  # the end of the document is its last line
        line = max(1, text.count("\n") + (0 if text.endswith("\n") else 1))
    reason = msg[: m.start()] if m else msg
    return ProfileError(Location(path, line), f"TOML syntax error: {reason}")


def _value_error(path: Path, text: str, exc: ValueError) -> ProfileError:
    """tomllib converts integers with int(), which refuses more than
    sys.get_int_max_str_digits() decimal digits with a ValueError that says not where."""
    limit = sys.get_int_max_str_digits()
    for run in re.finditer(r"[0-9][0-9_]*", text):  # maximal runs: linear in the text
        if len(run.group()) - run.group().count("_") > limit:
            line = text.count("\n", 0, run.start()) + 1
            message = f"an integer of more than {limit} digits (TOML's are 64-bit)"
            return ProfileError(Location(path, line), message)
    return ProfileError(Location(path), f"TOML syntax error: {exc}")


def parse_source(name: str, path: Path, text: str) -> SourceFile:
    """One file's TOML, checked against LIMITS before and after parsing."""
    deep = max_nesting(text, LIMITS.nesting)
    if deep is not None:
        raise ProfileError(
            Location(path, deep), f"arrays or tables nested more than {LIMITS.nesting} deep"
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(path, text, exc) from exc
    except ValueError as exc:  # int() of a decimal integer with too many digits
        raise _value_error(path, text, exc) from exc
    lines = key_lines(text)
    source = SourceFile(name, path, data, lines, len(text))
    problem = _oversized(data)
    if problem is not None:
        where, what = problem
        raise ProfileError(source.at(*where), what)
    return source


def _oversized(data: Any) -> tuple[KeyPath, str] | None:
    """The first place that breaks LIMITS (nesting by dotted keys, array lengths) or holds
    an integer TOML does not (beyond 64 bits), if any. Iterative, so no content can
    exhaust the stack."""
    stack: list[tuple[KeyPath, Any]] = [((), data)]
    while stack:
        where, value = stack.pop()
        if len(where) > LIMITS.nesting:
            return where, f"keys and tables nested more than {LIMITS.nesting} deep"
        if isinstance(value, dict):
            stack.extend(((*where, k), v) for k, v in value.items())
        elif isinstance(value, list):
            if len(value) > LIMITS.items:
                return where, f"{len(value)} entries; at most {LIMITS.items} are allowed"
            stack.extend(((*where, i), v) for i, v in enumerate(value))
        elif isinstance(value, int) and value not in INT64:
            return where, "integer beyond the 64-bit range of TOML"
    return None


def read_source(name: str, path: Path, trusted: bool = False) -> SourceFile:
    """A profile file, read by system.read_guarded (`trusted`: root's alone) and parsed."""
    try:
        raw = read_guarded(path, LIMITS.file_bytes, trusted, "profile")
    except FileRefused as exc:
        raise ProfileError(Location(path), exc.reason) from exc
    try:
        text = raw.decode()
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ProfileError(
            Location(path, line), f"cannot read profile: not UTF-8 text ({exc.reason})"
        ) from exc
    return parse_source(name, path, text)


def check_name(name: str, by_path: bool) -> None:
    """A profile reference a caller may use: a plain name, or (root only) a file path."""
    is_path = name.endswith(SUFFIX) or "/" in name
    limit = LIMITS.path_chars if is_path else LIMITS.name_chars
    if len(name) > limit:
        raise ProfileNotFound(
            Location(None), f"profile name is {len(name)} characters long (at most {limit})"
        )
    if "\0" in name or not name:
        raise ProfileNotFound(Location(None), "profile name is empty or holds a NUL byte")
    if is_path and not by_path:
        raise ProfileNotFound(
            Location(None),
            f"{name[:80]!r} is a path: only root may apply profile files; name a profile "
            "from the search path instead",
        )
    if not is_path and not _NAME.fullmatch(name):
        raise ProfileNotFound(
            Location(None),
            f"{name[:80]!r} is not a profile name (letters, digits and _ . + @ -)",
        )


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a name too long for the file system, a loop of symlinks
        return False


def profile_files(search_path: Sequence[Path]) -> dict[str, Path]:
    """Every profile name on the search path -> its file; earlier directories win."""
    found: dict[str, Path] = {}
    for directory in search_path:
        if directory.is_dir():
            for path in sorted(directory.glob(f"*{SUFFIX}")):
                found.setdefault(path.name[: -len(SUFFIX)], path)
    return dict(sorted(found.items()))


class ProfileLibrary:
    """The profile search path, and loading profiles from it against the known plugins."""

    def __init__(
        self,
        search_path: Sequence[Path],
        schemas: Mapping[str, Schema],
        machine: Machine,
        trusted_only: bool = False,
        fixed: Mapping[str, Mapping[str, Fixed]] | None = None,
        cluster_dir: Path | None = None,
    ) -> None:
        # The cluster's directory (where a node agent installs what a cluster says) is
        # searched last, so a cluster profile never shadows one of the host's of the same
        # name, and it is searched wherever else the path named it too.
        self.cluster_dir = cluster_dir.resolve() if cluster_dir is not None else None
        self.search_path = [
            Path(p) for p in search_path if Path(p).resolve() != self.cluster_dir
        ] + ([self.cluster_dir] if self.cluster_dir is not None else [])
        self.schemas = schemas
        self.machine = machine
        self.fixed = fixed or {}  # by section: options over every profile (the config's)
        self.trusted_only = trusted_only  # the daemon as root: see system.read_guarded
        self._files_read: dict[Path, FileId | None] = {}  # by the last load(), as they were
        # all()'s last answers by name, for these profiles (name -> file) and machine
        self._listed: dict[str, _Listed] = {}
        self._listed_for: tuple[tuple[tuple[str, Path], ...], Machine] | None = None

    def _in_cluster_dir(self, path: Path) -> bool:
        return self.cluster_dir is not None and path.resolve().parent == self.cluster_dir

    # -- finding -------------------------------------------------------------
    def find(self, name: str, near: Path | None = None, by_path: bool = True) -> Path:
        check_name(name, by_path)
        if name.endswith(SUFFIX) or "/" in name:
            candidate = Path(name)
            if not candidate.is_absolute() and near is not None:
                candidate = near.parent / candidate
            if _is_file(candidate):
                return candidate
            raise ProfileNotFound(Location(candidate), "no such profile file")
        for directory in self.search_path:
            candidate = directory / f"{name}{SUFFIX}"
            if _is_file(candidate):
                return candidate
        searched = ", ".join(str(d) for d in self.search_path) or "(empty search path)"
        raise ProfileNotFound(Location(None), f"no profile named {name!r} (searched {searched})")

    def names(self) -> dict[str, Path]:
        return profile_files(self.search_path)

    def all(self) -> list[ProfileInfo]:
        """All profiles with their summaries; invalid ones carry their error instead.

        ListProfiles asks this at every `latencyctl list` (and Tab), in the main loop,
        and loading a profile takes milliseconds, more for a large one: a profile is
        loaded again only if a file it read changed (system.FileId), the profiles on the
        search path did (one added, removed or renamed: an include by name may now find
        another file), or the machine did. Not watched: an include by path, outside the
        search path, that was missing and now exists, and the directories above a file
        (load() checks them every time).
        """
        names = tuple(self.names().items())
        if (names, self.machine) != self._listed_for:
            self._listed, self._listed_for = {}, (names, self.machine)
        listed: dict[str, _Listed] = {}
        for name, path in names:
            before = self._listed.get(name)
            if before is not None and before.holds():
                listed[name] = before
                continue
            try:
                info = ProfileInfo(name, path, self.load(name).summary)
            except ProfileError as exc:
                info = ProfileInfo(name, path, "", str(exc))
            listed[name] = _Listed(info, tuple(self._files_read.items()))
        self._listed = listed
        return [entry.info for entry in listed.values()]

    # -- loading -------------------------------------------------------------
    def load(
        self, name_or_path: str, by_path: bool = True, given: Mapping[str, str] | None = None
    ) -> Profile:
        """Load and validate a profile; `by_path` allows file paths (root only). `given`
        sets variables the profile defines (a hold's CPUs: isolated_cores) over its own."""
        self._files_read = {}
        path = self.find(name_or_path, by_path=by_path)
        name = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else path.name
        try:
            return self._merge(name, path, self._include_chain(name, path), given or {})
        except ProfileError:
            raise
        except Exception as exc:
            # A bug (in the loader, or in a plugin's schema) that this profile's content
            # found: still this profile's error, so the caller lists the other profiles,
            # and a bad default profile leaves the daemon running. The log has the rest.
            log.exception("loading profile %s", path)
            raise ProfileError(
                Location(path),
                f"cannot load profile: {type(exc).__name__} inside latencyd (a bug; "
                "its log has the details)",
            ) from exc

    def _source(self, name: str, path: Path) -> SourceFile:
        # Its FileId before it is read: a change while it is read shows as one later.
        self._files_read[path] = file_id(path)
        return read_source(name, path, self.trusted_only)

    def _include_chain(self, name: str, path: Path) -> list[SourceFile]:
        """Files in merge order: includes depth-first (in listed order), then the file itself.

        A file included along several paths (a diamond) is merged once, at its first
        place: merging it again would silently undo what files after it changed.
        Walked with an explicit stack, so a long chain is an error, not a RecursionError.
        """
        chain: list[SourceFile] = []
        merged: set[Path] = set()
        # Each frame: (source, its include paths still to visit, the resolved stack).
        root = self._source(name, path)
        frames: list[tuple[SourceFile, list[Path], tuple[Path, ...]]] = [
            (root, self._includes(root), (path.resolve(),))
        ]
        files, size = 1, root.size
        while frames:
            source, pending, stack = frames[-1]
            if not pending:
                frames.pop()
                if source.path.resolve() not in merged:
                    merged.add(source.path.resolve())
                    chain.append(source)
                continue
            inc_path = pending.pop(0)
            resolved = inc_path.resolve()
            if resolved in stack:
                cycle = " -> ".join(p.name for p in (*stack, resolved))
                raise ProfileError(source.at("main", "include"), f"include cycle: {cycle}")
            if resolved in merged:
                continue
            if len(stack) >= LIMITS.include_depth:
                raise ProfileError(
                    source.at("main", "include"),
                    f"includes nested more than {LIMITS.include_depth} deep",
                )
            files += 1
            if files > LIMITS.files:
                raise ProfileError(
                    source.at("main", "include"), f"more than {LIMITS.files} files included"
                )
            inc_name = inc_path.name[: -len(SUFFIX)] if inc_path.suffix == SUFFIX else inc_path.name
            try:
                included = self._source(inc_name, inc_path)
            except ProfileError as exc:
                if exc.location.line is not None:
                    raise  # an error inside the included file: its own file and line
                # The file as a whole cannot be used: say which include named it, and where.
                raise ProfileError(
                    source.at("main", "include"), f"included profile {inc_path}: {exc.message}"
                ) from exc
            size += included.size
            if size > LIMITS.profile_bytes:
                raise ProfileError(
                    source.at("main", "include"),
                    f"the profile's files, includes included, exceed {LIMITS.profile_bytes} "
                    "bytes together",
                )
            frames.append((included, self._includes(included), (*stack, resolved)))
        return chain

    def _includes(self, source: SourceFile) -> list[Path]:
        main = source.data.get("main", {})
        if not isinstance(main, dict):
            raise ProfileError(source.at("main"), "[main] must be a table")
        for key in main:
            if key not in MAIN_KEYS:
                known = ", ".join(MAIN_KEYS)
                raise ProfileError(
                    source.at("main", key), f"unknown key {key!r} in [main] (known: {known})"
                )
        if not isinstance(main.get("summary", ""), str):
            raise ProfileError(source.at("main", "summary"), "summary must be a string")
        if main.get("booted_isolation", "show") not in BOOTED_ISOLATION:
            raise ProfileError(
                source.at("main", "booted_isolation"),
                f'booted_isolation must be "show" or "require" (got {main["booted_isolation"]!r})',
            )
        includes = main.get("include", [])
        if isinstance(includes, str):
            includes = [includes]
        if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
            raise ProfileError(
                source.at("main", "include"), "include must be a list of profile names"
            )
        paths = []
        for inc in includes:
            if self._in_cluster_dir(source.path) and (inc.endswith(SUFFIX) or "/" in inc):
                # By path, a cluster profile could take in a file it was not checked with
                # (or one of the host's that only root may name): by name only.
                raise ProfileError(
                    source.at("main", "include"),
                    f"a profile from the cluster includes by name only, not a path ({inc[:80]!r})",
                )
            try:
                paths.append(self.find(inc, near=source.path))
            except ProfileNotFound as exc:
                raise ProfileError(
                    source.at("main", "include"),
                    f"included profile {inc[:80]!r} not found: {exc.message}",
                ) from exc
        return paths

    @staticmethod
    def _inherit(
        section: str,
        value: dict[str, Any],
        source: SourceFile,
        raw: dict[str, dict[str, tuple[Any, SourceFile]]],
        removed: dict[str, list[Removal]],
    ) -> dict[str, Any] | None:
        """Apply a file's inheritance keys to what earlier files merged into `section`;
        the file's own options, or None when it switches the section off."""
        own = {k: v for k, v in value.items() if k not in INHERITANCE_KEYS}
        enabled, replace, drop = (
            value.get("enabled", True),
            value.get("replace", False),
            (value.get("drop", [])),
        )
        for key, given, ok in (
            ("enabled", enabled, isinstance(enabled, bool)),
            ("replace", replace, isinstance(replace, bool)),
            ("drop", drop, isinstance(drop, list) and all(isinstance(d, str) for d in drop)),
        ):
            if not ok:
                want = "a list of option names" if key == "drop" else "true or false"
                raise ProfileError(
                    source.at(section, key), f"{key}: expected {want}, got {given!r}"
                )
        merged = raw.get(section, {})
        log = removed.setdefault(section, [])
        if enabled is False:
            log.append(Removal(None, "enabled = false", source.at(section, "enabled")))
            raw.pop(section, None)
            return None
        if replace and merged:
            log.extend(Removal(o, "replace = true", source.at(section, "replace")) for o in merged)
            merged.clear()
        for option in drop:
            if option in merged:
                del merged[option]
                log.append(Removal(option, "drop", source.at(section, "drop")))
        if not log:
            del removed[section]
        return own

    def _respelled(self, source: SourceFile) -> SourceFile:
        """The file as if it spelled moved options the new way (latencyd.core.respell)."""
        moved = respell(source.path, source.data, source.lines, self.schemas)
        if moved is None:
            return source
        return dataclasses.replace(source, data=moved[0], lines=moved[1])

    def _merge(
        self, name: str, path: Path, chain: list[SourceFile], given: Mapping[str, str]
    ) -> Profile:
        variables: dict[str, tuple[Any, SourceFile]] = {}
        raw: dict[str, dict[str, tuple[Any, SourceFile]]] = {}
        section_file: dict[str, SourceFile] = {}
        removed: dict[str, list[Removal]] = {}
        for source in map(self._respelled, chain):
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
                value = self._inherit(key, value, source, raw, removed)
                if value is None:  # enabled = false: the section is off
                    continue
                merged = raw.setdefault(key, {})
                for opt, val in value.items():
                    for group in self.schemas[key].exclusive:
                        if opt in group:  # a later file's choice replaces the other mode
                            for other in group:
                                if (
                                    other != opt
                                    and other in merged
                                    and merged[other][1] is not source
                                ):
                                    del merged[other]
                    merged[opt] = (val, source)  # later files win, option by option

        for var, val in given.items():
            if var not in variables:
                raise ProfileError(
                    Location(path),
                    f"profile {name} has no variable {var} to set (it names its CPUs otherwise)",
                )
            variables[var] = (val, variables[var][1])
        if len(variables) > LIMITS.variables:
            source = next(iter(variables.values()))[1]
            raise ProfileError(
                source.at("variables"),
                f"{len(variables)} variables; at most {LIMITS.variables} are allowed",
            )
        resolved_vars = _resolve_variables(variables)
        budget = _Budget(LIMITS.substituted_chars)
        sections: dict[str, dict[str, Any]] = {}
        origins: dict[str, dict[str, Location]] = {}
        written: dict[str, dict[str, Any]] = {}
        fixed_in: dict[str, dict[str, Location]] = {}
        for section, options in raw.items():
            substituted: dict[str, Any] = {}
            for opt, (val, source) in options.items():
                substituted[opt] = _substitute(val, resolved_vars, source, (section, opt), budget)
                _check_size(substituted[opt], source, (section, opt))
            written[section] = substituted  # the files' own, without the config's
            # Fixed options only where the profile has the section: the config limits what
            # profiles do, it adds no tuning (write = false fixed must not give every
            # profile a [bootloader], nor a fixed governor a [cpu]).
            fixed = self.fixed.get(section, {})
            checked = _with_fixed(substituted, fixed, self.schemas[section])
            try:
                sections[section] = validate(self.schemas[section], checked, self.machine)
            except SchemaError as exc:
                head = exc.path[0] if exc.path else None
                if head in fixed:  # the config's value, with this profile's other options
                    where = fixed[str(head)].where
                    raise ProfileError(where, f"[plugin.{section}] {exc.message}") from exc
                source = options[str(head)][1] if head in options else section_file[section]
                raise ProfileError(source.at(section, *exc.path), exc.message) from exc
            origins[section] = {opt: src.at(section, opt) for opt, (_, src) in options.items()}
            origins[section] |= {opt: f.where for opt, f in fixed.items()}
            if fixed:
                fixed_in[section] = {opt: f.where for opt, f in fixed.items()}
        required = _booted_isolation(chain)
        return Profile(
            name=name,
            path=path,
            summary=chain[-1].summary
            or next((s.summary for s in reversed(chain) if s.summary), ""),
            booted_isolation=required[0],
            booted_isolation_at=required[1],
            sections=sections,
            origins=origins,
            variables=resolved_vars,
            files=tuple(dict.fromkeys(s.path for s in chain)),
            from_cluster=any(self._in_cluster_dir(s.path) for s in chain),
            removed=removed,
            written=written,
            fixed=fixed_in,
        )


def _booted_isolation(chain: list[SourceFile]) -> tuple[str, Location | None]:
    """[main] booted_isolation of the last file that sets it (later files win), and where."""
    for source in reversed(chain):
        main = source.data.get("main", {})
        if "booted_isolation" in main:
            return str(main["booted_isolation"]), source.at("main", "booted_isolation")
    return "show", None


def _with_fixed(
    options: Mapping[str, Any], fixed: Mapping[str, Fixed], schema: Schema
) -> dict[str, Any]:
    """A section's options with the fixed ones over them; a fixed option replaces the
    profile's choice of another in its exclusive group, as a later file's would."""
    out = dict(options)
    for opt in fixed:
        for group in schema.exclusive:
            if opt in group:
                for other in group:
                    if other != opt:
                        out.pop(other, None)
    return out | {opt: f.value for opt, f in fixed.items()}


def _weight(value: Any, cap: int) -> int:
    """A value's size, its strings' characters plus its entries, counted up to just past
    `cap` (so the count costs no more than the cap)."""
    weight = 0
    stack = [value]
    while stack and weight <= cap:
        item = stack.pop()
        weight += len(item) if isinstance(item, str) else 1
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return weight


@dataclass
class _Budget:
    """What variables may still add to a profile's values (LIMITS.substituted_chars)."""

    left: int

    def spend(self, value: Any, source: SourceFile, where: KeyPath) -> None:
        self.left -= _weight(value, self.left)
        if self.left < 0:
            raise ProfileError(
                source.at(*where),
                f"variables add more than {LIMITS.substituted_chars} characters to this "
                "profile's values (a long variable used too often)",
            )


def _check_size(value: Any, source: SourceFile, where: KeyPath) -> None:
    """A value built from variables (lists of lists of ...) stays within LIMITS. Counting
    stops at the limit, so the check itself is bounded."""
    count = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > LIMITS.items * 4 or depth > LIMITS.nesting:
            raise ProfileError(
                source.at(*where),
                f"value is too large once variables are substituted (more than "
                f"{LIMITS.items * 4} items or {LIMITS.nesting} levels)",
            )
        if isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())


def _references(value: Any) -> set[str]:
    """Variable names a value refers to (strings anywhere inside it)."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.update(_VAR.findall(item))
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return found


def _resolve_variables(variables: dict[str, tuple[Any, SourceFile]]) -> dict[str, Any]:
    """Expand variables that refer to other variables, in dependency order; a cycle or an
    undefined name is an error. Iterative: a long chain cannot exhaust the stack."""
    done: dict[str, Any] = {}
    for start in variables:
        stack: list[tuple[str, bool]] = [(start, False)]
        visiting: list[str] = []
        while stack:
            var, expanded = stack.pop()
            if var in done:
                continue
            value, source = variables[var]
            if expanded:
                visiting.remove(var)
                done[var] = _substitute(value, done, source, ("variables", var))
                _check_size(done[var], source, ("variables", var))
                continue
            if var in visiting:
                cycle = " -> ".join((*visiting[visiting.index(var) :], var))
                raise ProfileError(source.at("variables", var), f"variable cycle: {cycle}")
            visiting.append(var)
            stack.append((var, True))
            for ref in sorted(_references(value)):
                if ref not in variables:
                    known = ", ".join(sorted(variables)) or "none defined"
                    raise ProfileError(
                        source.at("variables", var),
                        f"undefined variable ${{{ref}}} (variables: {known})",
                    )
                if ref in visiting:  # reported where the cycle starts
                    cycle = " -> ".join((*visiting[visiting.index(ref) :], ref))
                    at = variables[ref][1].at("variables", ref)
                    raise ProfileError(at, f"variable cycle: {cycle}")
                if ref not in done:
                    stack.append((ref, False))
    return done


def _substitute(
    value: Any,
    variables: Mapping[str, Any],
    source: SourceFile,
    where: KeyPath,
    budget: _Budget | None = None,
) -> Any:
    """Replace ${name} in strings (recursively); a value that is exactly ${name} keeps its type.
    What the variables add is taken from `budget`, if given.

    Recursion follows the value's nesting, which parse_source has bounded.
    """
    if isinstance(value, list):
        return [_substitute(v, variables, source, (*where, i), budget) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _substitute(v, variables, source, (*where, k), budget) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    if len(value) > LIMITS.value_chars:
        raise ProfileError(
            source.at(*where), f"value is longer than {LIMITS.value_chars} characters"
        )

    def lookup(var: str) -> Any:
        if var not in variables:
            known = ", ".join(sorted(variables)) or "none defined"
            raise ProfileError(
                source.at(*where), f"undefined variable ${{{var}}} (variables: {known})"
            )
        if budget is not None:
            budget.spend(variables[var], source, where)
        return variables[var]

    def text(var: str) -> str:
        found = lookup(var)
        if not isinstance(found, str) and _weight(found, LIMITS.value_chars) > LIMITS.value_chars:
            too_long()  # before str() writes out a list of thousands of strings
        return str(found)

    def too_long() -> NoReturn:
        raise ProfileError(
            source.at(*where),
            f"value is longer than {LIMITS.value_chars} characters once variables are substituted",
        )

    whole = _VAR.fullmatch(value)
    if whole:
        return lookup(whole.group(1))  # its size was checked when it was resolved
    # Sum the pieces' lengths before joining them: doubling variables must not build a
    # gigabyte string just to find out it is too long.
    pieces: list[str] = []
    size = 0
    last = 0
    for m in _VAR.finditer(value):
        for piece in (value[last : m.start()], text(m.group(1))):
            size += len(piece)
            if size > LIMITS.value_chars:
                too_long()
            pieces.append(piece)
        last = m.end()
    pieces.append(value[last:])
    if size + len(pieces[-1]) > LIMITS.value_chars:
        too_long()
    return "".join(pieces)
