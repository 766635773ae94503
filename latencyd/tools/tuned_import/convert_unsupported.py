"""The TuneD plugins latencyd takes little or nothing from: the boot loader (its kernel
arguments only), scripts, systemd, and those it has no counterpart for. Each setting not
taken is reported with the reason.
"""

from __future__ import annotations

from latencyd.kernel.cmdline import CPU_LIST_PARAMETERS, unsafe
from latencyd.tools.tuned_import.context import Context
from latencyd.tools.tuned_import.profiles import Unit
from latencyd.tools.tuned_import.values import Evaluator, parse_value

# Why TuneD plugins latencyd has no counterpart for are not converted.
NO_PLUGIN = {
    "disk": "block devices (readahead, elevator, APM, spin-down, and TuneD's dynamic APM by "
    "load) have no latencyd plugin; fixed /sys/block/DEV/queue/* files can be set with "
    "[sysfs] by hand",
    "audio": "sound-card power saving (snd_hda_intel / snd_ac97_codec power_save) has no "
    "latencyd plugin",
    "usb": "USB autosuspend has no latencyd plugin",
    "video": "GPU power management (radeon_powersave, panel_power_savings) has no latencyd plugin",
    "mounts": "latencyd does not remount file systems (barrier)",
    "modules": "latencyd does not load kernel modules (modprobe, /etc/modprobe.d/tuned.conf)",
    "service": "latencyd does not start, stop or enable services",
    "rtentsk": "TuneD keeps a socket with SO_TIMESTAMP open so the kernel's timestamping static "
    "key stays on (no IPIs from flipping it on RT kernels); latencyd has no equivalent",
    "scsi_host": "SCSI host link power management (ALPM) has no latencyd plugin",
    "eeepc_she": "the Asus Eee PC Super Hybrid Engine has no latencyd plugin",
    "acpi": "the ACPI platform profile has no latencyd plugin; [sysfs] "
    '"/sys/firmware/acpi/platform_profile" can set it by hand',
    "uncore": "Intel uncore frequency limits have no latencyd plugin",
}


def bootloader(ctx: Context, unit: Unit) -> None:
    """[bootloader]: its cmdline* options into [bootloader] cmdline (arguments to add) and
    remove (a `-` value: parameters to take out), evaluated for this machine; written at
    the next boot only where the profile says write = true."""
    added: list[str] = []
    removed: list[str] = []
    keys: list[str] = []
    for option, raw in unit.options.items():
        if option.startswith("cmdline"):
            given = raw.strip()
            into = removed if given.startswith("-") else added
            for word in given.lstrip("+-").split():
                converted = _argument(ctx, word)
                if isinstance(converted, str):
                    into.append(converted)
                else:
                    ctx.lost(unit, option, f"{option}: {word}: {converted[0]}")
            keys.append(option)
        elif option.startswith("initrd"):
            ctx.lost(unit, option, f"{option} = {raw}: latencyd does not build or change initrds")
        else:
            ctx.unknown(unit, option, "cmdline*, initrd*")
    note = "written at the next boot only with write = true"
    if added:
        ctx.item("bootloader", "cmdline", added, unit, keys, note)
    if removed:
        names = list(dict.fromkeys(w.partition("=")[0] for w in removed))
        ctx.item("bootloader", "remove", names, unit, keys, note)


def _argument(ctx: Context, word: str) -> str | tuple[str]:
    """One kernel argument as latencyd text: its variables kept as latencyd's (the loader
    evaluates them on the machine it runs on), else evaluated here; or (why not)."""
    try:
        return _converted(ctx, word)
    except ValueError as exc:  # a number too long for int(), a NUL in a path, ...
        return (f"cannot be evaluated: {exc}",)


def _converted(ctx: Context, word: str) -> str | tuple[str]:
    # A CPU-list parameter keeps latencyd's variables (its value is a CPU expression the
    # loader evaluates where it runs); any other is evaluated here, as TuneD would.
    if word.partition("=")[0].replace("-", "_") in CPU_LIST_PARAMETERS:
        tr = ctx.variables.translate_raw(word, "text")
        if tr.text is not None and not tr.approx:
            return tr.text
    tr = Evaluator(ctx.variables.env, ctx.host, lenient=True).eval(parse_value(word))
    text = str(tr.text or "")
    if tr.approx:
        return (f"not evaluated: {'; '.join(tr.approx)}",)
    why = unsafe(text)
    return (why,) if why else text


def script(ctx: Context, unit: Unit) -> None:
    """[script]: the script TuneD would run."""
    for option, raw in unit.options.items():
        if option == "script":
            ctx.lost(unit, option, "script", raw=raw)
        else:
            ctx.unknown(unit, option)


def systemd(ctx: Context, unit: Unit) -> None:
    """[systemd]: the CPUAffinity= TuneD would set."""
    for option, raw in unit.options.items():
        if option == "cpu_affinity":
            value = ctx.variables.evaluate(parse_value(raw)).text or raw
            ctx.lost(unit, option, "cpu_affinity", raw=raw, value=value)
        else:
            ctx.unknown(unit, option)


def no_plugin(ctx: Context, unit: Unit) -> None:
    """A section of a TuneD plugin latencyd has no counterpart for: every option lost."""
    why = NO_PLUGIN.get(unit.type, f"TuneD plugin {unit.type!r} is unknown to this importer")
    if not unit.options:
        ctx.lost(unit, None, why)
    for option, raw in unit.options.items():
        ctx.lost(unit, option, f"{option} = {raw}: {why}")
