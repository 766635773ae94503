"""One merged TuneD profile into latencyd items and findings (`convert_merged`): each
enabled section that applies on this machine goes to its plugin's converter, in TuneD's
order; then what several TuneD settings build together is assembled (`finish`), and the
variables the converted settings refer to are added. Pure: it reads nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from latencyd.core.profile import _references as refs
from latencyd.tools.tuned_import import (
    convert_cpu,
    convert_knobs,
    convert_net,
    convert_threads,
    convert_unsupported,
)
from latencyd.tools.tuned_import.context import MSG, Context
from latencyd.tools.tuned_import.host import Host
from latencyd.tools.tuned_import.profiles import Merged, Unit
from latencyd.tools.tuned_import.results import WRITEBACK_PAIRS, Conversion, Finding, Item, Sources
from latencyd.tools.tuned_import.values import parse_value
from latencyd.tools.tuned_import.variables import Variables

# TuneD plugin -> its converter; the others are reported by convert_unsupported.no_plugin.
CONVERTERS: dict[str, Callable[[Context, Unit], None]] = {
    "cpu": convert_cpu.cpu,
    "sysctl": convert_knobs.sysctl,
    "vm": convert_knobs.vm,
    "sysfs": convert_knobs.sysfs,
    "selinux": convert_knobs.selinux,
    "irqbalance": convert_threads.irqbalance,
    "scheduler": convert_threads.scheduler,
    "irq": convert_threads.irq,
    "net": convert_net.net,
    "bootloader": convert_unsupported.bootloader,
    "script": convert_unsupported.script,
    "systemd": convert_unsupported.systemd,
}


def convert_merged(merged: Merged, files: Mapping[str, str | None], host: Host) -> Conversion:
    """TuneD's merged profile as latencyd items and findings; `files` are the variables
    files its [variables] may include (path -> text, None if unreadable)."""
    variables = Variables(merged.units.get("variables"), files, host)
    ctx = Context(host, variables, Conversion(findings=list(variables.problems)))
    units = [u for n, u in merged.units.items() if n != "variables"]
    units.sort(key=lambda u: u.priority)  # TuneD's instance order (a stable sort)
    for unit in units:
        if not unit.enabled or not applies(ctx, unit):
            continue
        for key in ("script_pre", "script_post"):
            if getattr(unit, key):
                ctx.lost(unit, key, f"runs {getattr(unit, key)}: latencyd runs no scripts")
        CONVERTERS.get(unit.type, convert_unsupported.no_plugin)(ctx, unit)
    finish(ctx)
    return ctx.out


def applies(ctx: Context, unit: Unit) -> bool:
    """TuneD's unit conditions (cpuinfo_regex, uname_regex), against this machine."""
    for attr, text, what in (
        ("cpuinfo_regex", ctx.host.cpuinfo, "/proc/cpuinfo"),
        ("uname_regex", ctx.host.uname, "uname"),
    ):
        raw = getattr(unit, attr)
        if raw is None:
            continue
        pattern = ctx.variables.evaluate(parse_value(raw)).text or raw
        try:
            hit = re.search(pattern, text, re.MULTILINE) is not None
        except re.error as exc:
            ctx.lost(unit, attr, f"bad regular expression: {exc}")
            return False
        fmt = {"what": what, "pattern": pattern, "attr": attr}
        ctx.lost(unit, None if not hit else attr, "condition_yes" if hit else "condition_no", **fmt)
        if not hit:
            return False
    return True


def finish(ctx: Context) -> None:
    """What several TuneD settings build together, as latencyd items; then the variables."""
    items = ctx.out.items
    if ctx.irq_isolate:
        exprs = list(dict.fromkeys(e for e, _s in ctx.irq_isolate))
        value = exprs[0] if len(exprs) == 1 else " | ".join(f"({e})" for e in exprs)
        sources = frozenset().union(*(s for _e, s in ctx.irq_isolate))
        items[("irq", "isolate")] = Item("irq", "isolate", value, sources)
    if ctx.irq_default:
        value, sources, note = ctx.irq_default[-1]
        items[("irq", "default_affinity")] = Item("irq", "default_affinity", value, sources, note)
    ctx.tables[("kthread", "rule")].extend(ctx.isolation)
    # TuneD gives each CPU to the first [cpu] section that names it; latencyd's later
    # entries win where CPU sets overlap.
    ctx.tables[("cpu", "cpus")].reverse()
    ctx.tables[("cstate", "cpus")].reverse()
    for (section, option), entries in ctx.tables.items():
        if entries:
            sources = frozenset().union(*(s for _e, s in entries))
            items[(section, option)] = Item(section, option, [e for e, _s in entries], sources)
    unbound = items.get(("kthread", "unbound_cpumask"))
    for key, raw, unit in ctx.per_workqueue:
        if unbound is not None and ctx.variables.translate_raw(raw, "mask").text == unbound.value:
            ctx.note(unit, key, "covered", "kthread")
        else:
            ctx.lost(unit, key, "per_workqueue", "kthread", key=key, raw=raw)
    # vm.dirty_*: the kernel keeps a ratio or a byte count; TuneD writes them in order,
    # so the last written of a pair holds.
    last: dict[str, tuple[Any, Sources, str]] = {}
    for option, value, sources, label in ctx.writeback:
        for pair in WRITEBACK_PAIRS:
            other = pair[1 - pair.index(option)] if option in pair else None
            if other in last:
                _v, old_sources, old_label = last.pop(str(other))
                unit_name, key = next(iter(old_sources))
                text = MSG["superseded"].format(old=old_label, new=label)
                ctx.out.findings.append(Finding(unit_name, key, text, False, "writeback"))
        last[option] = (value, sources, label)
    for option, (value, sources, label) in last.items():
        items[("writeback", option)] = Item("writeback", option, value, sources, label)
    add_variables(ctx)


def add_variables(ctx: Context) -> None:
    """The variables the converted settings refer to (and those they refer to), in
    TuneD's order."""
    wanted: set[str] = set()
    todo = sorted({r for item in ctx.out.items.values() for r in refs(item.value)})
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(refs(ctx.variables.var(name).text or ""))
    for name in ctx.variables.names():
        value, definition = ctx.variables.var(name), ctx.variables.definition(name)
        if name not in wanted or value.text is None or definition is None:
            continue  # the settings referring to it were not converted
        raw, key, origin = definition
        note = "" if value.text == raw else f"{name} = {raw}"
        sources = frozenset({("variables", key), ("variables", name)})
        ctx.out.items[("variables", name)] = Item("variables", name, value.text, sources, note)
        for text in value.approx:
            ctx.out.findings.append(
                Finding("variables", name, text, True, "variables", path=origin)
            )
        for text in value.notes:
            ctx.out.findings.append(
                Finding("variables", name, text, False, "variables", path=origin)
            )
