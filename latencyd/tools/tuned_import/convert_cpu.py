"""TuneD's [cpu] into latencyd's [cpu] (governor, EPP, EPB, perf limits, boost) and
[cstate] (force_latency, the per-CPU PM QoS resume latency).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from latencyd.tools.tuned_import.context import MSG, Context
from latencyd.tools.tuned_import.host import IdleState
from latencyd.tools.tuned_import.profiles import Unit
from latencyd.tools.tuned_import.values import Func, Tr, parse_value, tuned_bool

# latencyd's names for EPB values: the kernel's, as latencyd.plugins.cpu.EPB_NAMES has
# them (not imported: latencyd's core does not import its plugins; a test keeps the two
# the same). TuneD also takes the aliases.
EPB_NAMES = ("performance", "balance-performance", "normal", "balance-power", "power")
EPB_ALIASES = {
    "powersave": "power",
    "default": "normal",
    "balance_performance": "balance-performance",
}
EPB_ALIASES |= {"balance_power": "balance-power"}


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
        if re.fullmatch(r"-?[0-9]{1,12}", alt):
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
        elif m := re.fullmatch(r"cstate\.id(_no_zero)?:([0-9]{1,6})", alt):
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


def devices_cpus(ctx: Context, unit: Unit) -> Tr:
    """TuneD's `devices` of a CPU unit ("cpu0 cpu2", "!cpu0", "${f:cpulist2devs:...}")
    as a CPU-list expression ("all" when it names every CPU)."""
    raw = unit.devices.strip()
    if raw in ("*", "cpu*", ""):
        return Tr("all")
    nodes = parse_value(raw)
    if len(nodes) == 1 and isinstance(nodes[0], Func) and nodes[0].name == "cpulist2devs":
        return ctx.variables.translate(nodes[0].args[0] if nodes[0].args else (), "cpus")
    text = ctx.variables.evaluate(nodes)
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


def cpu(ctx: Context, unit: Unit) -> None:
    """A [cpu] section: for every CPU (top-level options) or for the CPUs of its
    `devices` (a [[cpu.cpus]] entry)."""
    devices = devices_cpus(ctx, unit)
    if devices.text is None:
        ctx.lost(unit, "devices", f"devices = {unit.devices}: {devices.why}", "cpu")
        return
    if unit.devices_udev_regex:
        ctx.lost(unit, "devices_udev_regex", "udev-property matching has no equivalent", "cpu")
        return
    first, ctx.first_cpu = ctx.first_cpu, False
    whole = devices.text == "all"
    if ctx.cpu_all_taken:
        ctx.note(unit, None, "cpu_taken", "cpu")
        return
    per_cpu: dict[str, Any] = {}
    for option, raw in unit.options.items():
        if option == "force_latency":
            if first:
                force_latency(ctx, unit, raw)
            else:
                ctx.note(unit, option, "only TuneD's first [cpu] section sets it", "cstate")
        elif option in ("governor", "energy_performance_preference"):
            text = ctx.evaluated(unit, option, raw, "cpu")
            choices = [c.strip() for c in (text or "").split("|") if c.strip()]
            if choices:
                per_cpu[option] = choices[0]
                cpu_item(ctx, unit, option, choices[0], whole)
            if len(choices) > 1:
                rest = "|".join(choices[1:])
                fmt = {"opt": option, "value": text, "rest": rest, "first": choices[0]}
                ctx.lost(unit, option, "fallback", "cpu", **fmt)
        elif option == "energy_perf_bias":
            epb = epb_choice(ctx, unit, raw)
            if epb is not None:
                per_cpu[option] = epb
                cpu_item(ctx, unit, option, epb, whole)
        elif option in ("min_perf_pct", "max_perf_pct", "no_turbo", "boost"):
            text = ctx.evaluated(unit, option, raw, "cpu")
            if text is None:
                continue
            pct = option.endswith("_pct")
            ok = re.fullmatch(r"[0-9]{1,3}", text.strip()) is not None and int(text) <= 100
            value: int | bool | None = (int(text) if ok else None) if pct else tuned_bool(text)
            if value is None:
                what = "a percentage" if pct else "true or false"
                ctx.lost(unit, option, f"{option} = {raw}: not {what}", "cpu")
            else:
                ctx.item("cpu", option, value, unit, [option], f"[{unit.name}] {option} = {raw}")
        elif option == "pm_qos_resume_latency_us":
            resume_latency(ctx, unit, raw, str(devices.text))
        elif option in ("latency_low", "latency_high", "load_threshold"):
            what = "sets the PM QoS latency by CPU load"
            ctx.lost(
                unit, option, f"{option} = {raw}: " + MSG["dynamic"].format(what=what), "cstate"
            )
        elif option == "sampling_down_factor":
            ctx.lost(unit, option, "sampling_down", "cpu", raw=raw)
        else:
            ctx.unknown(unit, option)
    if first and not {"force_latency", "pm_qos_resume_latency_us"} & set(unit.options):
        ctx.lost(unit, None, "dynamic", "cstate", what=MSG["dynamic_pm_qos"])
    keys = [*per_cpu, "devices"]
    if whole:
        ctx.cpu_all_taken = True
    elif per_cpu:
        entry = {"cpus": devices.text, **per_cpu}
        ctx.tables[("cpu", "cpus")].append((entry, frozenset((unit.name, k) for k in keys)))
        ctx.report(unit, "devices", devices, "cpu")


def cpu_item(ctx: Context, unit: Unit, option: str, value: Any, whole: bool) -> None:
    """A per-CPU option of a [cpu] section for every CPU: top-level in latencyd."""
    if whole:
        ctx.item("cpu", option, value, unit, [option, "devices"], f"[{unit.name}] {option}")


def epb_choice(ctx: Context, unit: Unit, raw: str) -> int | str | None:
    """energy_perf_bias as latencyd's value: its first alternative (the rest reported)."""
    text = ctx.evaluated(unit, "energy_perf_bias", raw, "cpu")
    choices: list[int | str] = []
    for word in (w.strip() for w in (text or "").split("|")):
        name = EPB_ALIASES.get(word, word)
        if re.fullmatch(r"[0-9]{1,2}", word) and int(word) <= 15:
            choices.append(int(word))
        elif name in EPB_NAMES:
            choices.append(name)
        elif word:
            ctx.lost(unit, "energy_perf_bias", f"{word!r} is not an EPB value", "cpu")
    distinct = list(dict.fromkeys(choices))
    if len(distinct) > 1:
        rest = "|".join(map(str, distinct[1:]))
        fmt: dict[str, Any] = {"opt": "energy_perf_bias", "value": text, "rest": rest}
        fmt["first"] = distinct[0]
        ctx.lost(unit, "energy_perf_bias", "fallback", "cpu", **fmt)
    return distinct[0] if distinct else None


def force_latency(ctx: Context, unit: Unit, raw: str) -> None:
    """force_latency as [cstate] force_latency_us."""
    text = ctx.evaluated(unit, "force_latency", raw, "cstate")
    if text is None:
        return
    chosen, lost, notes = convert_force_latency(text, ctx.host.idle_states)
    for message in lost:
        ctx.lost(unit, "force_latency", message, "cstate")
    for message in notes:
        ctx.note(unit, "force_latency", message, "cstate")
    if chosen is not None:
        note = f"[{unit.name}] force_latency = {text}"
        ctx.item("cstate", "force_latency_us", chosen, unit, ["force_latency"], note)


def resume_latency(ctx: Context, unit: Unit, raw: str, cpus: str) -> None:
    """pm_qos_resume_latency_us as a [[cstate.cpus]] entry's resume_latency_us (in µs:
    idle states are resolved to their latency on this machine)."""
    option = "pm_qos_resume_latency_us"
    text = ctx.evaluated(unit, option, raw, "cstate")
    if text is None:
        return
    chosen, lost, notes = convert_force_latency(text, ctx.host.idle_states, allow_na=True)
    for message in lost:
        ctx.lost(unit, option, message, "cstate")
    for message in notes:
        ctx.note(unit, option, message, "cstate")
    states = ctx.host.idle_states
    if isinstance(chosen, str) and chosen.startswith("state:"):
        state = next((s for s in states if s.name == chosen[6:]), None)
        if state is None:
            ctx.lost(unit, option, f"{text}: no idle state {chosen[6:]!r} here", "cstate")
            return
        chosen = state.latency_us
        ctx.lost(unit, option, "resume_us", "cstate", value=text, us=chosen)
    elif chosen == "shallowest":
        real = [s.latency_us for s in states if s.name.upper() != "POLL"]
        if not real:
            ctx.lost(unit, option, f"{text}: this machine has no idle states", "cstate")
            return
        chosen = min(real)
        ctx.lost(unit, option, "resume_us", "cstate", value=text, us=chosen)
    if chosen is None:
        return
    # The kernel's file: "n/a" = polling only (latencyd: 0), "0" = no limit ("any").
    us = 0 if chosen in ("n/a", "poll") else "any" if chosen == 0 else chosen
    entry = {"cpus": cpus, "resume_latency_us": us}
    sources = frozenset({(unit.name, option), (unit.name, "devices")})
    ctx.tables[("cstate", "cpus")].append((entry, sources))
