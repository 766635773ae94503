"""TuneD's [sysctl], [vm], [sysfs] and [selinux]: values for files under /proc/sys and
/sys, into latencyd's [sysctl], [writeback], [sysfs] and [kthread] (workqueue masks).
"""

from __future__ import annotations

import os
import re

from latencyd.core.profile import _references as refs
from latencyd.core.tomlwrite import toml_line
from latencyd.tools.tuned_import.context import Context, int_or_text
from latencyd.tools.tuned_import.profiles import Unit

# The vm sysctls latencyd's [writeback] takes (latencyd.plugins.writeback's PAIRS and
# PLAIN; not imported, as latencyd's core does not import its plugins: a test keeps them
# the same).
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
# The workqueue cpumask files TuneD profiles write, as [kthread] options.
WORKQUEUE_MASKS = {
    "/sys/bus/workqueue/devices/writeback/cpumask": "writeback_cpumask",
    "/sys/devices/virtual/workqueue/writeback/cpumask": "writeback_cpumask",
    "/sys/devices/virtual/workqueue/cpumask": "unbound_cpumask",
}
PER_WORKQUEUE_MASKS = (
    "/sys/devices/virtual/workqueue/*/cpumask",
    "/sys/bus/workqueue/devices/*/cpumask",
)


def sysctl(ctx: Context, unit: Unit) -> None:
    """[sysctl]: into [sysctl], the writeback ones into [writeback]."""
    for key, raw in unit.options.items():
        given = re.sub(r'^"(.*)"$', r"\1", raw)
        if len(given) > 1 and given[0] in "<>":
            cmp = "greater" if given[0] == ">" else "smaller"
            line = toml_line(key, int_or_text(given[1:]))
            ctx.lost(
                unit, key, "compare", "sysctl", line, key=key, raw=raw, value=given[1:], cmp=cmp
            )
            continue
        text = ctx.value(unit, key, given, "sysctl")
        if text is None:
            continue
        if key in WRITEBACK_SYSCTLS:
            sources = frozenset({(unit.name, key)})
            ctx.writeback.append((WRITEBACK_SYSCTLS[key], int_or_text(text), sources, key))
        elif not ctx.host.has_sysctl(key):
            line = toml_line(key, int_or_text(text))
            ctx.lost(unit, key, "no_sysctl", "sysctl", line, key=key)
        else:
            ctx.item("sysctl", key, int_or_text(text), unit, [key])


def vm(ctx: Context, unit: Unit) -> None:
    """[vm]: transparent hugepages into [sysfs], the dirty limits into [writeback]."""
    for option, raw in unit.options.items():
        if option in ("transparent_hugepages", "transparent_hugepage"):
            text = ctx.value(unit, option, raw, "sysfs")
            if text is not None and text not in ("always", "madvise", "never") and not refs(text):
                ctx.lost(unit, option, f"{raw!r} is not always, madvise or never", "sysfs")
            elif text is not None:
                sysfs_item(ctx, unit, option, f"{THP}/enabled", text, f"[{unit.name}] {option}")
                ctx.note(unit, option, "thp_cmdline", "sysfs")
        elif option == "transparent_hugepage.defrag":
            text = ctx.value(unit, option, raw, "sysfs")
            if text is not None:
                sysfs_item(ctx, unit, option, f"{THP}/defrag", text, f"[{unit.name}] {option}")
        elif option in (
            "dirty_bytes",
            "dirty_ratio",
            "dirty_background_bytes",
            "dirty_background_ratio",
        ):
            text = ctx.value(unit, option, raw, "writeback")
            if text is None:
                continue
            target, value = option, int_or_text(text)
            if option.endswith("_bytes") and text.strip().endswith("%"):
                target = option.replace("_bytes", "_ratio")  # what TuneD writes for "10%"
                value = int_or_text(text.strip()[:-1])
            sources = frozenset({(unit.name, option)})
            ctx.writeback.append((target, value, sources, f"[{unit.name}] {option}"))
        else:
            ctx.unknown(unit, option)


def sysfs_item(ctx: Context, unit: Unit, option: str, path: str, text: str, note: str = "") -> None:
    """A [sysfs] file (noted where this machine has no such file)."""
    if not ctx.host.exists(path):
        ctx.note(unit, option, "no_file", "sysfs", path=path)
    ctx.item("sysfs", path, int_or_text(text), unit, [option], note)


def sysfs(ctx: Context, unit: Unit) -> None:
    """[sysfs]: into [sysfs], the workqueue cpumasks into [kthread]."""
    for key, raw in unit.options.items():
        path = ctx.variables.evaluate_raw(key).text or key
        norm = os.path.normpath(path)
        if norm in WORKQUEUE_MASKS:
            text = ctx.value(unit, key, raw, "kthread", "mask")
            if text is not None:
                ctx.item(
                    "kthread", WORKQUEUE_MASKS[norm], text, unit, [key], f"[{unit.name}] {key}"
                )
        elif norm in PER_WORKQUEUE_MASKS:
            ctx.per_workqueue.append((key, raw, unit))
        elif not norm.startswith("/sys/"):
            ctx.lost(unit, key, f"{key} is not under /sys", "sysfs")
        else:
            text = ctx.value(unit, key, raw, "sysfs")
            if text is not None:
                sysfs_item(ctx, unit, key, path, text)


def selinux(ctx: Context, unit: Unit) -> None:
    """[selinux]: the AVC cache threshold into [sysfs]."""
    for option, raw in unit.options.items():
        text = ctx.value(unit, option, raw, "sysfs") if option == "avc_cache_threshold" else None
        if option != "avc_cache_threshold":
            ctx.unknown(unit, option, "avc_cache_threshold")
        elif text is not None:
            path = "/sys/fs/selinux/avc/cache_threshold"
            sysfs_item(ctx, unit, option, path, text, f"[{unit.name}] {option}")
