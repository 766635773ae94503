"""TuneD's [net] into latencyd's [[net.nic]] entries (ethtool settings and features)."""

from __future__ import annotations

import re
from typing import Any

from latencyd.kernel.ethtool import GROUPS
from latencyd.tools.tuned_import.context import Context
from latencyd.tools.tuned_import.convert_knobs import sysfs_item
from latencyd.tools.tuned_import.profiles import Unit
from latencyd.tools.tuned_import.values import tuned_bool

# ethtool's keys, as latencyd's [net] takes them (flags are booleans).
NET_KEYS = {name: tuple(k.name for k in group.keys) for name, group in GROUPS.items()}
NET_FLAGS = {name: tuple(k.name for k in group.keys if k.flag) for name, group in GROUPS.items()}


def net(ctx: Context, unit: Unit) -> None:
    """[net]: one [[net.nic]] entry for the NICs its `devices` names."""
    entry: dict[str, Any] = {}
    for option, raw in unit.options.items():
        if option in NET_KEYS or option == "features":
            table = net_table(ctx, unit, option, raw)
            if table:
                entry[option] = table
        elif option == "nf_conntrack_hashsize":
            text = ctx.value(unit, option, raw, "sysfs")
            if text is not None:
                path = "/sys/module/nf_conntrack/parameters/hashsize"
                sysfs_item(ctx, unit, option, path, text, f"[{unit.name}] {option}")
        elif option in ("wake_on_lan", "txqueuelen", "mtu"):
            ctx.lost(unit, option, f"{option} = {raw}: latencyd's [net] has no {option}", "net")
        elif option != "dynamic":
            ctx.unknown(unit, option)
    if tuned_bool(unit.options.get("dynamic", "1")) is not False:
        what = "changes NIC speed by traffic"
        ctx.lost(
            unit, "dynamic" if "dynamic" in unit.options else None, "dynamic", "net", what=what
        )
    if not entry:
        return
    if unit.devices_udev_regex:
        ctx.lost(unit, "devices_udev_regex", "udev-property matching has no equivalent", "net")
        return
    devices = ctx.variables.evaluate_raw(unit.devices).text or unit.devices
    rules = [r for r in re.split(r"\s|,\s*", devices) if r]
    match = [r for r in rules if not r.startswith("!")]
    exclude = ["lo", *(r[1:] for r in rules if r.startswith("!"))]
    head: dict[str, Any] = {"match": match} if match and match != ["*"] else {}
    if exclude != ["lo"]:
        head["exclude"] = exclude
    keys = [*entry, "devices"]
    ctx.tables[("net", "nic")].append(({**head, **entry}, frozenset((unit.name, k) for k in keys)))
    ctx.note(unit, None, "virtual_nics", "net")


def net_table(ctx: Context, unit: Unit, option: str, raw: str) -> dict[str, Any]:
    """An ethtool option ("rx-usecs 3 adaptive-rx on") as a table of latencyd's keys."""
    text = ctx.evaluated(unit, option, raw, "net")
    words = re.sub(r"(:\s*)|(\s+)|(\s*;\s*)|(\s*,\s*)", " ", text or "").split()
    if len(words) % 2:
        ctx.lost(unit, option, f"{option} = {raw}: not 'key value' pairs", "net")
        return {}
    table: dict[str, Any] = {}
    for key, word in zip(words[::2], words[1::2], strict=True):
        flag = option == "features" or key in NET_FLAGS.get(option, ())
        number = re.fullmatch(r"[0-9]{1,10}", word)  # ASCII digits, within 32 bits
        value = tuned_bool(word) if flag else int(word) if number else None
        if option != "features" and key not in NET_KEYS[option]:
            ctx.lost(unit, option, f"{option}: {key!r} is not a key latencyd knows", "net")
        elif value is None:
            want = "on or off" if flag else "a number"
            ctx.lost(unit, option, f"{option}: {key} {word!r} is not {want}", "net")
        else:
            table[key] = value
    return table
