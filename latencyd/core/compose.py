"""Holds compose: the profile in force while several applications each hold one.

Pure: given the profiles the holds asked for (oldest first) and the plugins' schemas, the
one profile the engine applies, or HoldConflict naming the two holds, the section, the
option, both values and where each was set. Option by option (Option.compose):

- "union": CPUs kept for an application (the shield's, the isolated IRQs', the watched
  ones; every option with `shields`, and per-entry "applies to" lists): each hold's
  CPUs are kept, so the shield is the union of what the holds need;
- "intersection": CPUs other work may use (housekeeping masks, xps, a rule's CPUs): only
  the CPUs every hold leaves to it; none left is a conflict;
- by its kind's own rule, for a kind that Composes: kernel arguments (`[bootloader]
  cmdline`: latencyd.kernel.cmdline.composed_arguments), every hold's, a CPU-list
  parameter's CPUs as above, any other parameter given two ways a conflict;
- "same" (everything else, sysctls included): every hold that sets the option sets it to
  one value, else the newer hold is refused. An option a profile leaves at its schema's
  default is not set by it: the value another hold sets wins.

Arrays of tables ([[net.nic]]) are equal, or merged entry by entry when they have as many
entries (each entry by its own schema), or, where the first entry that matches wins
(rules, NIC entries: ArrayOfTables.selectors, which must be alike), as far as the
shorter goes and then the longer's own (cpu-partitioning's one [[kthread.rule]] and
realtime's four), else a conflict. The base profile is not part of it: it is in force
only while nothing is held (latencyd.service.daemon).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from latencyd.core.profile import Profile
from latencyd.core.schema import ArrayOfTables, Composes, Cpus, Option, Schema
from latencyd.cpuset import CpuSet
from latencyd.errors import HoldConflict, Location


@dataclass(frozen=True)
class Held:
    """One hold's profile, and how a refusal names the hold ("hold 3 (cpu-partitioning)")."""

    name: str
    profile: Profile


@dataclass(frozen=True)
class _Value:
    """An option's value so far, whose it is and where it was set (None: a default)."""

    value: Any
    by: str
    at: Location | None


def rule_of(option: Option | None) -> str:
    """How an option's values from several holds compose: union, intersection, same, or
    by its kind's own rule ("kind": Composes)."""
    if option is None:
        return "same"
    if option.compose:
        return option.compose
    if isinstance(option.kind, Composes):
        return "kind"
    if option.shields:
        return "union"
    return "intersection" if isinstance(option.kind, Cpus) else "same"


def compose(held: Sequence[Held], schemas: Mapping[str, Schema]) -> Profile:
    """The profile in force under `held` (oldest first; at least one). One hold's profile
    is returned as it is."""
    if not held:
        raise ValueError("compose needs at least one hold")
    if len(held) == 1:
        return held[0].profile
    merged: dict[str, dict[str, _Value]] = {}
    for one in held:
        profile = one.profile
        for section, options in profile.sections.items():
            origins = profile.origins.get(section, {})
            into = merged.setdefault(section, {})
            schema = schemas[section]
            for key, value in options.items():
                new = _Value(value, one.name, origins.get(key))
                into[key] = _merge(schema, section, (key,), into.get(key), new)
            _check_exclusive(schema, section, into)
    first = held[0].profile
    sections = {s: {k: v.value for k, v in opts.items()} for s, opts in merged.items()}
    where = {
        s: {k: v.at for k, v in opts.items() if v.at is not None} for s, opts in merged.items()
    }
    profiles = [h.profile for h in held]
    required = next((p for p in profiles if p.booted_isolation == "require"), None)
    return dataclasses.replace(
        first,
        name="+".join(dict.fromkeys(p.name for p in profiles)),
        summary="; ".join(dict.fromkeys(p.summary for p in profiles if p.summary)),
        sections=sections,
        origins=where,
        files=tuple(dict.fromkeys(f for p in profiles for f in p.files)),
        variables={},
        removed={},
        written={},
        fixed=_union_maps(p.fixed for p in profiles),
        booted_isolation=required.booted_isolation if required else "show",
        booted_isolation_at=required.booted_isolation_at if required else None,
        from_cluster=any(p.from_cluster for p in profiles),
    )


def _union_maps(
    maps: Iterable[Mapping[str, Mapping[str, Location]]],
) -> dict[str, dict[str, Location]]:
    out: dict[str, dict[str, Location]] = {}
    for one in maps:
        for section, options in one.items():
            out.setdefault(section, {}).update(options)
    return out


def _merge(
    schema: Schema, section: str, path: tuple[str | int, ...], old: _Value | None, new: _Value
) -> _Value:
    """Two holds' values of one option (`old` None: the first to name it)."""
    if old is None:
        return new
    if new.at is None and old.at is not None:  # a default: the value set elsewhere wins
        return old
    if old.at is None and new.at is not None:
        return new
    key = str(path[-1])
    table = schema.table(key) if isinstance(path[-1], str) else None
    if table is not None:
        return _merge_tables(table, section, path, old, new)
    option = schema.option(key)
    rule = rule_of(option)
    if rule == "kind" and option is not None and isinstance(option.kind, Composes):
        try:
            return _Value(option.kind.composed(old.value, new.value), old.by, old.at)
        except ValueError as exc:
            raise _conflict(section, path, old, new, str(exc)) from exc
    if isinstance(old.value, CpuSet) and isinstance(new.value, CpuSet) and rule != "same":
        if rule == "union":
            return _Value(old.value | new.value, old.by, old.at)
        both = old.value & new.value
        if both or not (old.value or new.value):
            return _Value(both, old.by, old.at)
        raise _conflict(
            section, path, old, new, "leave no CPU in common (these CPUs are other work's)"
        )
    if old.value == new.value:
        return old
    raise _conflict(section, path, old, new, "ask for different values")


def _merge_tables(
    table: ArrayOfTables, section: str, path: tuple[str | int, ...], old: _Value, new: _Value
) -> _Value:
    """Arrays of tables: equal, or entry by entry when the holds have as many entries; or,
    where the first entry that matches wins (the table has selectors), entry by entry as
    far as the shorter goes, then the longer's own: those match only what none of the
    other hold's entries match, which it asked nothing of. Entries merged there choose
    alike (each selector the same, or named by neither): one naming a driver the other
    does not would apply to fewer things than the other hold's asked."""
    if old.value == new.value:
        return old
    olds, news = list(old.value), list(new.value)
    if len(olds) != len(news) and not table.selectors:
        raise _conflict(
            section, path, old, new, f"have {len(olds)} and {len(news)} entries (not one list)"
        )
    schema = table.schema
    entries = []
    for i, (a, b) in enumerate(zip(olds, news, strict=False)):
        for key in table.selectors:
            if a.get(key) != b.get(key):
                raise _conflict(
                    section, (*path, i, key), _Value(a.get(key), old.by, old.at),
                    _Value(b.get(key), new.by, new.at), "select other things in one entry",
                )  # fmt: skip
        entry: dict[str, _Value] = {k: _Value(v, old.by, old.at) for k, v in a.items()}
        for k, v in b.items():
            entry[k] = _merge(
                schema, section, (*path, i, k), entry.get(k), _Value(v, new.by, new.at)
            )
        entries.append({k: v.value for k, v in entry.items()})
    entries += (olds if len(olds) > len(news) else news)[len(entries) :]
    return _Value(entries, old.by, old.at)


def _check_exclusive(schema: Schema, section: str, options: Mapping[str, _Value]) -> None:
    """Options the kernel keeps only one of (dirty_ratio / dirty_bytes), one from each hold."""
    for group in schema.exclusive:
        present = [options[name] for name in group if name in options]
        bys = {v.by for v in present}
        if len(bys) > 1:
            names = [name for name in group if name in options]
            a, b = present[0], present[1]
            raise HoldConflict(
                f"{b.by} is refused: it sets [{section}] {names[1]}{_at(b)}, and {a.by} "
                f"sets {names[0]}{_at(a)}; the kernel keeps only one of them, and one hold "
                "does not override another's"
            )


def _shown(value: Any) -> str:
    if value is None:
        return "(not named)"
    return str(value) if isinstance(value, CpuSet) else repr(value)


def _at(v: _Value) -> str:
    return f" ({v.at})" if v.at is not None else " (its default)"


def _conflict(
    section: str, path: tuple[str | int, ...], old: _Value, new: _Value, what: str
) -> HoldConflict:
    option = ".".join(str(p) for p in path)
    return HoldConflict(
        f"{new.by} is refused: it and {old.by} {what} for [{section}] {option}: "
        f"{_shown(new.value)}{_at(new)} against {_shown(old.value)}{_at(old)}; one hold "
        "does not override another's machine-wide setting (nothing was changed)"
    )
