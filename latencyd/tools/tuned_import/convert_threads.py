"""TuneD's [scheduler], [irqbalance] and [irq]: CPU isolation, kernel-thread rules and
IRQ affinity, into latencyd's [kthread], [shield] and [irq] (and the scheduler's knobs into
[sysctl] or [sysfs]).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from latencyd.core.tomlwrite import toml_line
from latencyd.tools.tuned_import.context import Context, int_or_text
from latencyd.tools.tuned_import.cpulists import cpulist_expr
from latencyd.tools.tuned_import.profiles import Unit
from latencyd.tools.tuned_import.results import Sources
from latencyd.tools.tuned_import.values import Tr, parse_value, tuned_bool

# The scheduler's tunables TuneD's [scheduler] sets.
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
# TuneD's group.* scheduling policies by latencyd's names for them (latencyd.kernel.system's
# POLICIES); the real-time ones take a priority (latencyd.plugins.kthread's RT_POLICIES,
# not imported: latencyd's core does not import its plugins; a test keeps them the same).
TUNED_POLICIES = {"f": "fifo", "r": "rr", "b": "batch", "i": "idle", "o": "other"}
RT_POLICIES = ("fifo", "rr")
# [scheduler] options read together by scheduler() rather than one by one.
SCHED_HANDLED = frozenset(
    {"isolated_cores", "ps_blacklist", "ps_whitelist", "irq_process", "kthread_process"}
    | {"default_irq_smp_affinity"}
)


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


def irqbalance(ctx: Context, unit: Unit) -> None:
    """[irqbalance] banned_cpus: CPUs to keep IRQs off ([irq] isolate)."""
    for option, raw in unit.options.items():
        if option != "banned_cpus":
            ctx.unknown(unit, option, "banned_cpus")
            continue
        text = ctx.value(unit, option, raw, "irq", "cpus")
        if text is not None:
            ctx.irq_isolate.append((text, frozenset({(unit.name, option)})))
            ctx.note(unit, option, "irqbalance", "irq")


def scheduler(ctx: Context, unit: Unit) -> None:
    """[scheduler]: isolated_cores (for user tasks, kernel threads and IRQs), the group.*
    kernel-thread rules, and the scheduler's tunables."""
    opts = unit.options

    def src(*keys: str) -> Sources:
        return frozenset((unit.name, k) for k in keys if k in opts)

    iso = None
    if "isolated_cores" in opts:
        iso = ctx.value(unit, "isolated_cores", opts["isolated_cores"], "kthread", "cpus")
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
            sched_knob(ctx, unit, option, raw)
        elif option in ("runtime", "perf_mmap_pages", "perf_process_fork"):
            ctx.note(unit, option, "perf_loop", "kthread", opt=option, raw=raw)
        elif option.startswith("cgroup"):
            ctx.lost(unit, option, "cgroup", "kthread", opt=option, raw=raw)
        else:
            ctx.unknown(unit, option)
    # group.NAME = rule_prio:policy:priority:affinity:regex, sorted by rule_prio (stable).
    groups = []
    for order, (option, raw) in enumerate(opts.items()):
        if not option.startswith("group."):
            continue
        fields = (ctx.evaluated(unit, option, raw, "kthread") or "").split(":", 4)
        if len(fields) != 5 or not re.fullmatch(r"-?[0-9]{1,9}", fields[0]):
            if raw.strip():  # "group.X =" switches an inherited rule off
                ctx.lost(
                    unit,
                    option,
                    f"{option} = {raw}: not prio:policy:priority:affinity:regex",
                    "kthread",
                )
            continue
        groups.append((int(fields[0]), order, option, raw, fields))
    rules = []
    for *_, option, raw, fields in sorted(groups, key=lambda g: (g[0], g[1])):
        rule = group_rule(ctx, unit, option, raw, fields, housekeeping, blacklist)
        if rule is not None:
            rules.append(
                (rule, frozenset({(unit.name, option)}) | src("isolated_cores", "ps_blacklist"))
            )
    # TuneD applies every matching rule in turn (the last match wins); latencyd's first
    # match wins: the same rules, in reverse.
    ctx.tables[("kthread", "rule")].extend(reversed(rules))
    irq_process = tuned_bool(opts.get("irq_process", "1")) is not False
    if iso is None or not irq_process:
        for option in ("default_irq_smp_affinity", "ps_blacklist", "ps_whitelist"):
            if option in opts and (iso is None or option == "default_irq_smp_affinity"):
                ctx.note(unit, option, f"{option} = {opts[option]}: does nothing here", "kthread")
    if iso is None:
        return
    if irq_process:
        ctx.irq_isolate.append((iso, src("isolated_cores", "irq_process")))
        default_irq(ctx, unit)
    if tuned_bool(opts.get("kthread_process", "1")) is not False:
        isolate_kthreads(ctx, unit, blacklist, whitelist, str(housekeeping), src)
    ctx.item(
        "shield",
        "cpus",
        iso,
        unit,
        ["isolated_cores"],
        f"[{unit.name}] isolated_cores",
    )
    ctx.note(unit, "isolated_cores", "taskset", "shield", iso=iso)
    allow = []
    for pattern in blacklist:
        if not pattern.startswith(("^\\[", "\\[")):  # those are kernel threads only
            glob_ = regex_to_glob(pattern)
            if glob_ is None:
                ctx.lost(unit, "ps_blacklist", "no_glob", "shield", pattern=pattern)
            else:
                allow.append(glob_)
    if allow:
        ctx.item("shield", "allow", allow, unit, ["ps_blacklist"], f"[{unit.name}] ps_blacklist")
    if whitelist:
        ctx.lost(unit, "ps_whitelist", "whitelist", "shield")


def isolate_kthreads(
    ctx: Context,
    unit: Unit,
    blacklist: list[str],
    whitelist: list[str],
    housekeeping: str,
    src: Callable[..., Sources],
) -> None:
    """Every kernel thread but the blacklisted (and, with a whitelist, only those) to the
    housekeeping CPUs: one rule, its regex built from TuneD's patterns."""
    excluded = [kthread_regex(p)[0] or p if p.startswith(("^\\[", "\\[")) else p for p in blacklist]
    match = ".*"
    if excluded or whitelist:
        match = "^" + "".join(f"(?=.*?(?:{w}))" for w in whitelist)
        if excluded:
            match += "(?!.*?(?:" + "|".join(f"(?:{e})" for e in excluded) + "))"
    try:
        re.compile(match)
    except re.error as exc:
        ctx.lost(
            unit,
            "ps_blacklist",
            f"the patterns do not combine into one regex: {exc}",
            "kthread",
        )
        return
    sources = src("isolated_cores", "ps_blacklist", "ps_whitelist", "kthread_process")
    ctx.isolation.append(({"match": match, "cpus": housekeeping}, sources))
    ctx.note(unit, "isolated_cores", "narrows", "kthread")


def group_rule(
    ctx: Context,
    unit: Unit,
    option: str,
    raw: str,
    fields: list[str],
    housekeeping: str | None,
    blacklist: list[str],
) -> dict[str, Any] | None:
    """A group.NAME option (prio:policy:priority:affinity:regex, split into `fields`) as a
    [[kthread.rule]] entry, or None (reported)."""
    _prio, policy, priority, affinity, regex = fields
    match, remark = kthread_regex(regex)
    if match is None:
        ctx.lost(
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
        ctx.lost(
            unit,
            option,
            f"{option}: {remark}; latencyd's rules are for kernel threads",
            "kthread",
        )
    rule: dict[str, Any] = {"match": match}
    kthreads = tuned_bool(unit.options.get("kthread_process", "1")) is not False
    if affinity == "*" and housekeeping and kthreads and regex not in blacklist:
        rule["cpus"] = housekeeping  # where isolated_cores put it, and the rule left it
    elif affinity == "*":
        rule["cpus"] = "all"
        ctx.lost(unit, option, "leave", "kthread", opt=option)
    elif affinity.startswith("cgroup."):
        ctx.lost(
            unit,
            option,
            f"{option}: affinity {affinity!r}: latencyd uses no cgroups",
            "kthread",
        )
        return None
    else:
        tr = ctx.variables.translate(parse_value(affinity), "mask")
        if tr.text is None and re.fullmatch(r"[\d,\-]+", affinity):
            tr = Tr(cpulist_expr(affinity), notes=(f"affinity {affinity!r} read as a CPU list",))
        if tr.text is None:
            ctx.lost(unit, option, f"{option}: affinity {affinity!r}: {tr.why}", "kthread")
            return None
        ctx.report(unit, option, tr, "kthread")
        rule["cpus"] = tr.text
    if policy == "*":
        return rule
    if policy not in TUNED_POLICIES:
        known = ", ".join(TUNED_POLICIES)
        ctx.lost(unit, option, f"{option}: policy {policy!r} is not {known} or *", "kthread")
        return None
    rule["policy"] = TUNED_POLICIES[policy]
    if TUNED_POLICIES[policy] in RT_POLICIES:
        if not re.fullmatch(r"[0-9]{1,2}", priority.strip()) or not 1 <= int(priority) <= 99:
            ctx.lost(unit, option, f"{option}: priority {priority!r} is not 1-99", "kthread")
            return None
        rule["priority"] = int(priority)
    return rule


def default_irq(ctx: Context, unit: Unit) -> None:
    """default_irq_smp_affinity of a [scheduler] section with isolated_cores."""
    option = "default_irq_smp_affinity"
    raw = unit.options.get(option, "calc")
    if raw in ("calc", "ignore"):
        if option in unit.options:
            (ctx.note if raw == "calc" else ctx.lost)(unit, option, raw, "irq")
        return
    text = ctx.value(unit, option, raw, "irq", "cpus")
    if text is not None:
        ctx.irq_default.append((text, frozenset({(unit.name, option)}), f"[{unit.name}] {option}"))


def sched_knob(ctx: Context, unit: Unit, option: str, raw: str) -> None:
    """A scheduler tunable: a sysctl on older kernels, a debugfs file on newer ones."""
    sysctl, debug = SCHED_KNOBS[option]
    text = ctx.value(unit, option, raw, "sysctl")
    path = f"/sys/kernel/debug/sched/{debug}"
    if text is None:
        return
    if ctx.host.has_sysctl(sysctl):
        ctx.item("sysctl", sysctl, int_or_text(text), unit, [option], f"[{unit.name}] {option}")
    elif ctx.host.exists(path):
        ctx.item(
            "sysfs", path, int_or_text(text), unit, [option], f"[{unit.name}] {option} (debugfs)"
        )
    else:
        line = toml_line(path, int_or_text(text))
        fmt = {"opt": option, "raw": raw, "path": sysctl.replace(".", "/"), "debug": path}
        ctx.lost(unit, option, "sched_knob", "sysfs", line, **fmt)


def irq(ctx: Context, unit: Unit) -> None:
    """[irq]: IRQ affinity rules, and the default affinity (devices DEFAULT or *)."""
    opts = unit.options
    for option in opts:
        if option not in ("affinity", "mode"):
            ctx.unknown(unit, option, "affinity, mode")
    if not opts.get("affinity", "").strip():
        return  # TuneD: an empty affinity switches the section off
    cpus = ctx.value(unit, "affinity", opts["affinity"], "irq", "cpus")
    if cpus is None:
        return
    if opts.get("mode", "set") == "intersect":
        ctx.lost(unit, "mode", "intersect", "irq")
    sources = frozenset({(unit.name, "affinity"), (unit.name, "mode"), (unit.name, "devices")})
    for rule in filter(None, re.split(r"\s|,\s*", unit.devices.strip() or "*")):
        m = re.fullmatch(r"irq(\d+)", rule)
        if rule in ("*", "DEFAULT"):
            ctx.irq_default.append((cpus, sources, f"[{unit.name}] affinity"))
        if rule == "DEFAULT":
            continue
        if rule.startswith("!") or not (m or rule in ("*", "irq*")):
            ctx.lost(unit, "devices", f"devices {rule!r}: not IRQs latencyd can name", "irq")
            continue
        rule_ = {"match": f"irq:{m.group(1)}" if m else "*", "cpus": cpus}
        ctx.tables[("irq", "rule")].append((rule_, sources))
