"""Option schemas: what a plugin's profile section may contain, and how each value is read.

Every kind of value parses to a canonical Python value or raises `ValueError`
with a message that completes the sentence "<file>:<line>: <option>: ...".
"""

from __future__ import annotations

import copy
import dataclasses
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import (
    Any,
    Generic,
    Literal,
    Protocol,
    TypedDict,
    TypeVar,
    Unpack,
    overload,
    runtime_checkable,
)

from latencyd.cpuset import CpuSet, CpuSetError
from latencyd.kernel.system import Machine

# The integers a profile may hold: TOML's, 64-bit signed (its spec: what a parser cannot
# hold losslessly is an error). Python's are unbounded, and str() of one of over 4,300
# digits raises ValueError: in an error message, in the status, in a write to the kernel.
INT64 = range(-(2**63), 2**63)
_INT64_DIGITS = len(str(INT64.stop))
# ASCII digits only: `\d` and int() also take other scripts' digits ("١٢" is 12 to int()).
_INTEGER = re.compile(r"-?[0-9]+")


K = TypeVar("K", covariant=True)  # what a kind parses to
X = TypeVar("X")
Y = TypeVar("Y")


class Kind(Protocol[K]):
    """A kind of value: its name in help and errors, and how a profile's value is read
    (ValueError: not of the kind)."""

    @property
    def label(self) -> str: ...

    def parse(self, raw: Any, machine: Machine) -> K: ...


@runtime_checkable
class Composes(Protocol[X]):
    """A kind whose values, from several holds, compose by a rule of its own (kernel
    arguments: latencyd.core.compose.rule_of's "kind"): the one value both make, or
    ValueError saying, to complete "it and hold 1 ...", why they cannot be one. X is
    what the kind parses to (a Kind[X] too)."""

    def composed(self, first: X, second: X) -> X: ...


@dataclass(frozen=True)
class Int:
    min: int | None = None
    max: int | None = None

    @property
    def label(self) -> str:
        return "integer"

    def parse(self, raw: Any, machine: Machine) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            if not isinstance(raw, str) or not _INTEGER.fullmatch(raw.strip()):
                raise ValueError(f"expected an integer, got {raw!r}")
            text = raw.strip()
            digits = text.lstrip("-").lstrip("0")
            if len(digits) > _INT64_DIGITS:  # checked before int(), whose cost is quadratic
                raise ValueError(f"{text[:24]}... is beyond the 64-bit integer range")
            raw = -int(digits or "0") if text.startswith("-") else int(digits or "0")
        if raw not in INT64:
            shown = raw if raw.bit_length() <= 128 else f"a {raw.bit_length()}-bit integer"
            raise ValueError(f"{shown} is beyond the 64-bit integer range")
        if self.min is not None and raw < self.min:
            raise ValueError(f"{raw} is below the minimum {self.min}")
        if self.max is not None and raw > self.max:
            raise ValueError(f"{raw} is above the maximum {self.max}")
        return int(raw)


@dataclass(frozen=True)
class Str:
    @property
    def label(self) -> str:
        return "string"

    def parse(self, raw: Any, machine: Machine) -> str:
        if not isinstance(raw, str):
            raise ValueError(f"expected a string, got {raw!r}")
        return raw


@dataclass(frozen=True)
class Bool:
    @property
    def label(self) -> str:
        return "boolean"

    def parse(self, raw: Any, machine: Machine) -> bool:
        if not isinstance(raw, bool):
            raise ValueError(f"expected true or false, got {raw!r}")
        return raw


@dataclass(frozen=True)
class Choice:
    values: tuple[str, ...]

    @property
    def label(self) -> str:
        return " | ".join(self.values)

    def parse(self, raw: Any, machine: Machine) -> str:
        if raw not in self.values:
            raise ValueError(f"expected one of {', '.join(self.values)}; got {raw!r}")
        return str(raw)


@dataclass(frozen=True)
class Cpus:
    """A CPU-list expression (``0-3,8``, ``all - ${isolated_cores}``), parsed to a cpulist."""

    allow_empty: bool = False

    @property
    def label(self) -> str:
        return "CPU list"

    def parse(self, raw: Any, machine: Machine) -> CpuSet:
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        if not isinstance(raw, str):
            raise ValueError(f'expected a CPU list like "0-3,8", got {raw!r}')
        try:
            cpus = CpuSet.parse(raw, machine.all_cpus)
        except CpuSetError as exc:
            raise ValueError(str(exc)) from exc
        missing = cpus - machine.all_cpus
        if missing:
            raise ValueError(
                f"CPU list {raw!r} names CPUs {missing} that are not online "
                f"(online: {machine.all_cpus})"
            )
        if not cpus and not self.allow_empty:
            raise ValueError(f"CPU list {raw!r} is empty")
        return cpus


_SIZE = re.compile(r"^\s*([0-9]+)(\.[0-9]+)?\s*([kKmMgGtT]?)(i?[bB])?\s*$")
_PERCENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*%\s*$")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class Size:
    """Bytes: an integer, ``"64M"``-style (binary units), or ``"3%"`` of RAM."""

    @property
    def label(self) -> str:
        return 'size (bytes, "64M", or "3%" of RAM)'

    def parse(self, raw: Any, machine: Machine) -> int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            if raw < 0:
                raise ValueError(f"a size cannot be negative ({raw})")
            return raw
        if not isinstance(raw, str):
            raise ValueError(f'expected a size like 65536, "64M" or "3%", got {raw!r}')
        if m := _PERCENT.match(raw):
            pct = float(m.group(1))
            if pct > 100:
                raise ValueError(f"{raw!r} is more than all of RAM")
            return int(machine.mem_total_bytes * pct / 100)
        if m := _SIZE.match(raw):
            whole, fraction, unit = m.group(1), m.group(2) or "", m.group(3).lower()
            # Checked before float(), which turns a long number into infinity (and int()
            # of infinity raises OverflowError).
            if len(whole.lstrip("0")) <= _INT64_DIGITS:
                size = int(float(whole + fraction) * _UNITS[unit])
                if size in INT64:
                    return size
            raise ValueError(f"{raw.strip()[:24]!r} is more than {INT64.stop - 1} bytes")
        raise ValueError(f'expected a size like 65536, "64M" or "3%", got {raw!r}')


@dataclass(frozen=True)
class ListOf(Generic[X]):
    item: Kind[X]

    @property
    def label(self) -> str:
        return f"list of {self.item.label}"

    def parse(self, raw: Any, machine: Machine) -> list[X]:
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list):
            raise ValueError(f"expected a list, got {raw!r}")
        return [self.item.parse(x, machine) for x in raw]


@dataclass(frozen=True)
class OneOf(Generic[X, Y]):
    """The first of two kinds that accepts the value wins (e.g. µs or a symbolic name)."""

    kinds: tuple[Kind[X], Kind[Y]]

    @property
    def label(self) -> str:
        return " or ".join(k.label for k in self.kinds)

    def parse(self, raw: Any, machine: Machine) -> X | Y:
        errors = []
        kinds: tuple[Kind[X | Y], ...] = self.kinds
        for kind in kinds:
            try:
                return kind.parse(raw, machine)
            except ValueError as exc:
                errors.append(str(exc))
        raise ValueError("; ".join(errors))


@dataclass(frozen=True)
class Pattern:
    """A string matching a regex (e.g. ``state:NAME``); `example` shows the form in errors."""

    regex: str
    example: str

    @property
    def label(self) -> str:
        return self.example

    def parse(self, raw: Any, machine: Machine) -> str:
        if not isinstance(raw, str) or not re.fullmatch(self.regex, raw):
            raise ValueError(f"expected {self.example}, got {raw!r}")
        return raw


@dataclass(frozen=True)
class Regex:
    @property
    def label(self) -> str:
        return "regular expression"

    def parse(self, raw: Any, machine: Machine) -> str:
        if not isinstance(raw, str):
            raise ValueError(f"expected a regular expression string, got {raw!r}")
        try:
            # Python warns (once, on stderr, with no file or line) of a pattern whose
            # meaning a later release changes, e.g. "[[:digit:]]", which is no POSIX class
            # here: refused as what it is, every time.
            with warnings.catch_warnings():
                warnings.simplefilter("error", FutureWarning)
                re.compile(raw)
        except re.error as exc:
            raise ValueError(f"bad regular expression {raw!r}: {exc}") from exc
        except FutureWarning as exc:
            raise ValueError(
                f"ambiguous regular expression {raw!r}: {exc} (a '[' inside a set is "
                "written '\\[', and POSIX classes such as [:digit:] are not supported)"
            ) from exc
        return raw


@dataclass(frozen=True)
class Fields(Generic[X]):
    """An inline table of named values (``{ rx-usecs = 0, adaptive-rx = false }``): the
    names come from `fields` (name -> kind), or any name `check` accepts (it returns an
    error message or None) with values of `kind`; each value an X."""

    fields: tuple[tuple[str, Kind[X]], ...] = ()
    check: Callable[[str], str | None] | None = None
    kind: Kind[X] | None = None
    what: str = "key"

    @property
    def label(self) -> str:
        names = f": {', '.join(n for n, _ in self.fields)}" if self.fields else ""
        return f"table of {self.what}s{names}"

    def parse(self, raw: Any, machine: Machine) -> dict[str, X]:
        if not isinstance(raw, dict):
            raise ValueError(f"expected a table like {{ name = value }}, got {raw!r}")
        known = dict(self.fields)
        out: dict[str, X] = {}
        for name, value in raw.items():
            kind = known.get(name)
            if kind is None and self.check is not None and self.kind is not None:
                problem = self.check(name)
                if problem:
                    raise ValueError(problem)
                kind = self.kind
            if kind is None:
                names = ", ".join(known)
                raise ValueError(f"unknown {self.what} {name!r} (known: {names})")
            try:
                out[name] = kind.parse(value, machine)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from exc
        return out


@dataclass(frozen=True)
class Option:
    name: str
    kind: Kind[Any]
    doc: str
    default: Any = None  # None: the setting is left untouched unless the profile names it
    unit: str = ""
    # The CPUs it names are kept for the application (the shield): what the booted
    # isolation (nohz_full, rcu_nocbs, isolcpus) is compared with.
    shields: bool = False
    # How the values several holds give it compose (latencyd.core.compose.rule_of):
    # "union", "intersection" or "same"; "" derives it (shields: union, other CPU
    # lists: intersection, a kind that Composes: by its own rule, the rest: same).
    compose: str = ""


@dataclass(frozen=True)
class ArrayOfTables:
    """An array of tables (``[[irq.rule]]``): each entry validated against `schema`."""

    name: str
    schema: Schema
    doc: str
    # The options that choose what an entry applies to, where the first entry that
    # matches a thing is the one it gets (rules, NIC entries); none: every entry applies
    # to its CPUs, later ones winning where they overlap (per-CPU entries). How several
    # holds' entries merge (latencyd.core.compose) depends on it.
    selectors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Moved:
    """An option that once was another section's (`[kthread] isolate_tasks` is now
    `[shield] cpus`), declared by the section that took it over: a profile that still
    says it the old way loads as if it said the new way, with a warning naming its line
    (latencyd.core.respell), so no profile written for an older version silently loses
    it. `only_with` (key, value): of an array of tables, just the entries holding that
    value moved, without the key; entries where it is false stay, without it too."""

    section: str
    option: str
    to: str  # its name in the declaring section
    only_with: tuple[str, Any] | None = None


@dataclass(frozen=True)
class Schema:
    options: tuple[Option, ...] = ()
    tables: tuple[ArrayOfTables, ...] = ()
    # Sections like [sysctl] take arbitrary keys; `free_keys` checks each key name
    # (returns an error message or None) and `free_kind` parses its value.
    free_keys: Callable[[str], str | None] | None = None
    free_kind: Kind[Any] | None = None
    required: tuple[str, ...] = field(default=())
    # Options the kernel keeps only one of (dirty_ratio / dirty_bytes): within one
    # file both is an error; across includes, the later file's choice wins.
    exclusive: tuple[tuple[str, ...], ...] = ()
    # Settings that act independently of the rest of the section, for `measure
    # --attribute`: (group, patterns), each pattern an option name or TABLE.KEY (a key
    # inside every entry of an array of tables), globs allowed. What no group names
    # forms a group named after the section.
    groups: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # A section that sets nothing and only watches ([monitor]): `measure --attribute`
    # leaves it out of every scenario, as it has no effect to attribute and its tracing
    # must not run during the measurement.
    watches_only: bool = False
    # A rule across options that no single option's kind can state: given the parsed
    # values, the key at fault and what is wrong, or None.
    consistent: Callable[[Mapping[str, Any]], tuple[str, str] | None] | None = None
    # Options other sections had before this one took them over (see Moved).
    moved: tuple[Moved, ...] = ()
    # The plugin's options class (a frozen dataclass whose fields are declared by
    # `option` and `table`): the options, tables and required names are derived from it,
    # and `typed` builds it from a validated section. None: the section is read as the
    # mapping it is (free keys, [sysctl]).
    section: type[Any] | None = None

    def __post_init__(self) -> None:
        if self.section is not None and not self.options and not self.tables:
            options, tables, required = _declared(self.section)
            object.__setattr__(self, "options", options)
            object.__setattr__(self, "tables", tables)
            object.__setattr__(self, "required", (*required, *self.required))

    def typed(self, values: Mapping[str, Any]) -> Any:
        """A validated section as the plugin reads it: its options class (`section`), the
        entries of its tables each their own, made from `values` (of which what is not
        the class's, the engine's own options, is left out); `values` itself where there
        is no class."""
        if self.section is None:
            return values
        names = _field_names(self.section)
        given = {k: v for k, v in values.items() if k in names}
        for table in self.tables:
            if table.name in given:
                given[table.name] = tuple(table.schema.typed(e) for e in given[table.name])
        return self.section(**given)

    def extended(self, options: tuple[Option, ...]) -> Schema:
        """This schema with more options (the engine's `on_drift` in every section)."""
        return dataclasses.replace(self, options=self.options + options)

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)

    def table(self, name: str) -> ArrayOfTables | None:
        return next((t for t in self.tables if t.name == name), None)

    def names(self) -> Sequence[str]:
        return [o.name for o in self.options] + [t.name for t in self.tables]


class SchemaError(ValueError):
    """A validation failure at `path` (keys from the section down)."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


def validate(
    schema: Schema, values: Mapping[str, Any], machine: Machine, path: tuple[str | int, ...] = ()
) -> dict[str, Any]:
    """Check a section against its schema; return canonical values with defaults filled in."""
    out: dict[str, Any] = {}
    for key, raw in values.items():
        here = (*path, key)
        option = schema.option(key)
        table = schema.table(key)
        if option is not None:
            try:
                out[key] = option.kind.parse(raw, machine)
            except ValueError as exc:
                raise SchemaError(here, f"{key}: {exc}") from exc
        elif table is not None:
            if isinstance(raw, dict):
                raw = [raw]
            if not isinstance(raw, list) or not all(isinstance(x, dict) for x in raw):
                raise SchemaError(here, f"{key}: expected tables ([[...{key}]]), got {raw!r}")
            out[key] = [
                validate(table.schema, item, machine, (*here, i)) for i, item in enumerate(raw)
            ]
        elif schema.free_keys is not None and schema.free_kind is not None:
            problem = schema.free_keys(key)
            if problem:
                raise SchemaError(here, problem)
            try:
                out[key] = schema.free_kind.parse(raw, machine)
            except ValueError as exc:
                raise SchemaError(here, f"{key}: {exc}") from exc
        else:
            known = ", ".join(schema.names()) or "none"
            raise SchemaError(here, f"unknown option {key!r} (known options: {known})")
    for group in schema.exclusive:
        present = [name for name in group if name in values]
        if len(present) > 1:
            raise SchemaError(
                (*path, present[-1]),
                f"{' and '.join(present)} are exclusive (the kernel keeps only "
                "one of them): set just one",
            )
    for name in schema.required:
        if name not in out:
            raise SchemaError(path, f"missing required option {name!r}")
    if schema.consistent is not None and (fault := schema.consistent(out)) is not None:
        raise SchemaError((*path, fault[0]), fault[1])
    for option in schema.options:
        if option.name not in out and option.default is not None:
            out[option.name] = option.default
    return out


def shielded_cpus(schema: Schema, options: Mapping[str, Any]) -> CpuSet:
    """The CPUs a section's options keep for the application (Option.shields)."""
    found = CpuSet()
    for option in schema.options:
        value = options.get(option.name)
        if option.shields and isinstance(value, CpuSet):
            found = found | value
    return found


# A section's options class declares each option as a field (`option`, `table`): its
# name is the option's, its type what the option's kind parses to. What the field's
# metadata keeps under this key makes the Option (or ArrayOfTables) of the field's name.
_DECLARES = "latencyd.schema"


class _Said(TypedDict, total=False):
    """What else an option may say (Option's fields of the same names)."""

    unit: str
    shields: bool
    compose: str


@overload
def option(kind: Kind[X], doc: str, *, default: X, **said: Unpack[_Said]) -> X: ...
@overload
def option(kind: Kind[X], doc: str, *, required: Literal[True], **said: Unpack[_Said]) -> X: ...
@overload
def option(kind: Kind[X], doc: str, **said: Unpack[_Said]) -> X | None: ...
def option(
    kind: Kind[Any],
    doc: str,
    *,
    default: Any = None,
    required: bool = False,
    **said: Unpack[_Said],
) -> Any:
    """One option of a section's options class (Schema.section), as a field typed as its
    kind parses it: `X | None` (None: the profile does not set it) unless it has a default
    or is required. The arguments are Option's."""

    def declared(name: str) -> Option:
        return Option(name, kind, doc, default, **said)

    metadata = {_DECLARES: (declared, required)}
    if isinstance(default, list | dict):  # each instance its own copy
        return field(default_factory=lambda: copy.copy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


S = TypeVar("S")


def table(
    entry: type[S],
    doc: str,
    consistent: Callable[[Mapping[str, Any]], tuple[str, str] | None] | None = None,
    *,
    selectors: tuple[str, ...] = (),
) -> tuple[S, ...]:
    """An array of tables (``[[cpu.cpus]]``) of a section's options class: a field whose
    entries are each of the options class `entry` (its schema: Schema(section=entry), and
    `consistent`, the rule across an entry's options, Schema's). `selectors`, fields of
    `entry`, are ArrayOfTables': what chooses the things an entry applies to, where the
    first entry that matches wins (rules, NIC entries)."""
    unknown = [s for s in selectors if s not in _field_names(entry)]
    if unknown:
        raise TypeError(f"{entry.__name__} has no field {', '.join(unknown)} to select by")

    def declared(name: str) -> ArrayOfTables:
        schema = Schema(section=entry, consistent=consistent)
        return ArrayOfTables(name, schema, doc, selectors=selectors)

    empty: tuple[S, ...] = ()
    return field(default=empty, metadata={_DECLARES: (declared, False)})


def _field_names(section: type[Any]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(section))


def _declared(
    section: type[Any],
) -> tuple[tuple[Option, ...], tuple[ArrayOfTables, ...], tuple[str, ...]]:
    """The options, tables and required names an options class declares, in its order."""
    options: list[Option] = []
    tables: list[ArrayOfTables] = []
    required: list[str] = []
    for f in dataclasses.fields(section):
        if _DECLARES not in f.metadata:
            raise TypeError(f"{section.__name__}.{f.name} is not declared by option() or table()")
        declared, needed = f.metadata[_DECLARES]
        made = declared(f.name)
        (options if isinstance(made, Option) else tables).append(made)
        if needed:
            required.append(f.name)
    return tuple(options), tuple(tables), tuple(required)
