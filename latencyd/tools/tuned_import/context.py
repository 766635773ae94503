"""What the plugin converters share while one merged TuneD profile is converted: the
`Context` they read from (this machine, the profile's variables) and record into
(latencyd items, findings, and what several TuneD settings build together), and `MSG`,
what the conversion says, in one place.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from latencyd.core.tomlwrite import INT64
from latencyd.tools.tuned_import.host import Host
from latencyd.tools.tuned_import.profiles import Unit
from latencyd.tools.tuned_import.results import TABLE_ARRAYS, Conversion, Finding, Item, Sources
from latencyd.tools.tuned_import.values import Tr
from latencyd.tools.tuned_import.variables import Variables

# What the conversion says, by key; `{...}` are filled in where it is said.
MSG = {
    "dynamic": "TuneD's dynamic tuning (with dynamic_tuning = 1 in tuned-main.conf) {what}; "
    "latencyd tunes statically",
    "dynamic_pm_qos": "sets the PM QoS latency by CPU load (latency_low 100 µs, latency_high "
    "1000 µs, load_threshold 0.2) when [cpu] has no force_latency",
    "condition_no": "TuneD applies this section only where {what} matches '{pattern}' ({attr}); "
    "this machine does not match, so it is not converted (latencyd profiles have no "
    "conditions)",
    "condition_yes": "TuneD applies this section only where {what} matches '{pattern}'; this "
    "machine matches, so it is converted unconditionally (latencyd profiles have no "
    "conditions)",
    "cpu_taken": "an earlier [cpu] section took every CPU (TuneD gives each CPU to one "
    "section): this one tunes none",
    "fallback": "{opt} = {value}: fallback '{rest}' not converted: latencyd sets '{first}' "
    "and reports it not applicable where the CPU does not offer it (TuneD tries the next one)",
    "sampling_down": "sampling_down_factor = {raw}: the ondemand governor's sampling_down_factor "
    'has no latencyd option; [sysfs] "/sys/devices/system/cpu/cpufreq/ondemand/'
    'sampling_down_factor" can set it by hand',
    "resume_us": "{value} is {us} µs on this machine; latencyd's resume_latency_us takes µs",
    "compare": "{key} = {raw}: TuneD sets it only if {value} is {cmp} than the current value; "
    "latencyd has no such condition: set it where it holds",
    "no_sysctl": "this kernel has no sysctl {key} (a module not loaded, or another kernel "
    "version): latencyd refuses unknown sysctls when it loads a profile (TuneD skipped it with "
    "an error); enable the line where it exists",
    "thp_cmdline": "TuneD leaves THP alone when the kernel command line has "
    "transparent_hugepage=; latencyd sets it anyway",
    "no_file": "{path} is not on this machine: latencyd reports it not applicable here (TuneD "
    "skipped it)",
    "irqbalance": "TuneD only banned these CPUs in irqbalance's config; latencyd's isolate also "
    "moves the IRQs off them itself (and bans them in irqbalance's config)",
    "perf_loop": "{opt} = {raw}: tunes TuneD's perf event loop; latencyd follows new threads "
    "from its own task events",
    "cgroup": "{opt} = {raw}: latencyd uses no cgroups (v1 cpusets) to confine tasks",
    "narrows": "TuneD narrows each thread's CPUs to the housekeeping ones it already had; "
    "latencyd's rule gives every matched kernel thread all housekeeping CPUs (per-CPU threads, "
    "which nobody may move, are reported not applicable)",
    "no_glob": "'{pattern}' cannot be written as a name glob: user tasks it matches are moved "
    "off the isolated CPUs",
    "taskset": "TuneD left the application to its start script (`taskset -c {iso} ./app`): "
    "latencyd's shield is a cpuset where the machine has one, and inside it the kernel "
    "refuses such an affinity (taskset: Invalid argument). Start the application with "
    "`latencyctl run -- ./app`, name its executable in [shield] apps, or keep the start "
    'scripts as they are with mechanism = "affinity" (the chase, as TuneD)',
    "whitelist": "latencyd moves every user task but the allowed ones off the isolated CPUs: a "
    "whitelist of user tasks to move has no equivalent (kernel threads are restricted to it)",
    "leave": "{opt}: affinity '*' (leave as it is) became all CPUs: a latencyd rule always "
    "sets the CPUs of the threads it matches",
    "user_only": "{opt} = {raw}: regex '{regex}': {remark}; latencyd's rules are for kernel "
    "threads",
    "calc": "calc: latencyd's default for default_affinity (all CPUs but isolate)",
    "ignore": "ignore: latencyd always sets /proc/irq/default_smp_affinity to all CPUs but isolate",
    "sched_knob": "{opt} = {raw}: this kernel has neither /proc/sys/{path} nor {debug} "
    "(Linux 5.13 moved these knobs to debugfs, 6.6 removed latency_ns and "
    "wakeup_granularity_ns)",
    "intersect": "intersect: latencyd sets the affinity; TuneD kept only the CPUs each IRQ "
    "already had (the configured ones where none were left)",
    "virtual_nics": "TuneD tunes physical NICs only; latencyd's entry also matches virtual ones "
    "(veth, bridges, tap) unless excluded",
    "script": "TuneD runs {raw} when it applies and unapplies the profile; latencyd runs no "
    "scripts: port what it does to latencyd settings or a systemd unit",
    "cpu_affinity": "cpu_affinity = {raw} ({value} here): TuneD sets CPUAffinity= in systemd's "
    "system.conf (effective after a reboot); latencyd does not edit systemd's configuration "
    "([shield] cpus moves user tasks at run time instead)",
    "covered": "every unbound workqueue's cpumask: covered by unbound_cpumask (the kernel "
    "confines each unbound workqueue to it)",
    "per_workqueue": "{key} = {raw}: per-workqueue cpumasks have no latencyd option; set "
    "[kthread] unbound_cpumask to the same CPUs",
    "superseded": "{old} is superseded by {new} (the kernel keeps one of the two)",
}


def int_or_text(text: str) -> int | str:
    """An integer where TOML can hold it, else the text."""
    text = text.strip()
    # ASCII digits, at most 19 (int() of thousands of digits costs quadratic time, and
    # refuses beyond 4,300): no TOML integer has more.
    if re.fullmatch(r"-?[0-9]{1,19}", text) and -INT64 <= int(text) < INT64:
        return int(text)
    return text


@dataclass
class Context:
    """One merged TuneD profile being converted: what the plugin converters consult and
    where they record what they make of it."""

    host: Host
    variables: Variables
    out: Conversion
    # What several TuneD settings build together, assembled by convert.finish():
    # CPUs to keep IRQs off ([irq] isolate), from [scheduler] and [irqbalance];
    irq_isolate: list[tuple[str, Sources]] = field(default_factory=list)
    # /proc/irq/default_smp_affinity as each section sets it (the last one holds);
    irq_default: list[tuple[str, Sources, str]] = field(default_factory=list)
    # the entries of latencyd's arrays of tables;
    tables: dict[tuple[str, str], list[tuple[dict[str, Any], Sources]]] = field(
        default_factory=lambda: {key: [] for key in TABLE_ARRAYS}
    )
    # the kernel-thread rules isolated_cores makes (after the group.* ones);
    isolation: list[tuple[dict[str, Any], Sources]] = field(default_factory=list)
    # vm.dirty_* in TuneD's order (the last of a ratio/bytes pair holds);
    writeback: list[tuple[str, Any, Sources, str]] = field(default_factory=list)
    # per-workqueue cpumasks (unbound_cpumask may cover them).
    per_workqueue: list[tuple[str, str, Unit]] = field(default_factory=list)
    # TuneD's [cpu] sections: the first one sets force_latency; one for every CPU takes
    # them all from the sections after it.
    first_cpu: bool = True
    cpu_all_taken: bool = False

    def item(
        self, section: str, option: str, value: Any, unit: Unit, keys: Iterable[str], note: str = ""
    ) -> None:
        """A latencyd option, from `unit`'s options `keys`; `note` is its line's comment."""
        sources = frozenset((unit.name, k) for k in keys)
        self.out.items[(section, option)] = Item(section, option, value, sources, note)

    def lost(
        self,
        unit: Unit,
        option: str | None,
        text: str,
        home: str | None = None,
        line: str | None = None,
        **fmt: Any,
    ) -> None:
        """A TuneD setting (or part of one) that is not converted. `text` is a MSG key or
        the message itself."""
        message = MSG[text].format(**fmt) if text in MSG else text
        self.out.findings.append(Finding(unit.name, option, message, True, home, line))

    def note(self, unit: Unit, option: str | None, text: str, home: str | None, **fmt: Any) -> None:
        """How a setting was converted, where that is worth knowing."""
        message = MSG[text].format(**fmt) if text in MSG else text
        self.out.findings.append(Finding(unit.name, option, message, False, home))

    def report(self, unit: Unit, option: str, result: Tr, home: str | None) -> None:
        """What a translation lost on the way, or is worth noting."""
        for text in result.approx:
            self.lost(unit, option, text, home)
        for text in result.notes:
            self.note(unit, option, text, home)

    def value(self, unit: Unit, option: str, raw: str, home: str, kind: str = "text") -> str | None:
        """A value as latencyd text (variables kept), or None (reported)."""
        return self._text(unit, option, raw, home, self.variables.translate_raw(raw, kind))

    def evaluated(self, unit: Unit, option: str, raw: str, home: str) -> str | None:
        """A value as text to take apart (variables resolved now), or None (reported)."""
        return self._text(unit, option, raw, home, self.variables.evaluate_raw(raw))

    def _text(self, unit: Unit, option: str, raw: str, home: str, tr: Tr) -> str | None:
        """The text of `option = raw` translated as `tr`; what that lost is reported."""
        if tr.text is None:
            self.lost(unit, option, f"{option} = {raw}: {tr.why}", home)
        else:
            self.report(unit, option, tr, home)
        return tr.text

    def unknown(self, unit: Unit, option: str, known: str = "") -> None:
        """An option the TuneD plugin does not have (`known`: the ones it has)."""
        hint = f" (it knows {known})" if known else ""
        self.lost(unit, option, f"{option!r} is not an option of TuneD's {unit.type} plugin{hint}")
