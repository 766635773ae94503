"""irq: IRQ affinity by rule, isolation of CPUs from every movable IRQ, and IRQs that appear later.

Each IRQ's mask is one setting, so the engine journals and restores it like any
other; IRQs the kernel will not move (managed, per-queue) are reported as not
applicable with the kernel's reason. New IRQs are picked up by udev events and
a cheap /proc/irq listing on the monitor tick.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from latencyd.core.capabilities import FollowsDevices, FollowsTasks, HoldsResources
from latencyd.core.plugin import (
    CPU_ACTIONS,
    DEVICE_ACTIONS,
    CpuListFile,
    CpuMaskFile,
    DeviceEvent,
    Expansion,
    Follows,
    Json,
    Monitor,
    Plugin,
    Row,
    Settings,
    Table,
    Target,
    TaskEvent,
    Value,
)
from latencyd.core.schema import Bool, Cpus, Schema, Str, option, table
from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.kernel.owners import IRQS, Claim
from latencyd.kernel.procstat import PCI_ADDR, Irq, parse_interrupts
from latencyd.kernel.system import System

IRQBALANCE_FILES = ("etc/default/irqbalance", "etc/sysconfig/irqbalance")
BANNED_VAR = "IRQBALANCE_BANNED_CPULIST"


@dataclass(frozen=True)
class IrqAffinity(CpuListFile):
    """One IRQ's CPUs. Kernel-managed and per-queue IRQs refuse: not applicable."""

    kind: ClassVar[str] = "irq"
    refusal_means: ClassVar[str | None] = (
        "the kernel will not move this IRQ (kernel-managed or per-queue interrupt)"
    )
    transient: ClassVar[bool] = True
    irq: int

    @property
    def rel(self) -> str:
        return f"proc/irq/{self.irq}/smp_affinity_list"

    def lacking(self, system: System) -> str | None:
        """An IRQ user space may not move (kernel-managed, or its chip cannot) has its
        affinity files made read-only by the kernel (kernel/irq/proc.c, register_irq_proc):
        not applicable before any write is tried, so a plan says so as the switch does."""
        if system.read_only(self.rel):
            return f"{self.refusal_means}: the kernel made {self.rel} read-only"
        return None

    def watch_files(self, system: System) -> tuple[str, ...]:
        # The mask can be written in either form.
        return (self.rel, f"proc/irq/{self.irq}/smp_affinity")

    def describe(self, value: str) -> str:
        return f"IRQ {self.irq} affinity = {value}"

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(IRQS),)


@dataclass(frozen=True)
class DefaultAffinity(CpuMaskFile):
    kind: ClassVar[str] = "default_affinity"

    @property
    def rel(self) -> str:
        return "proc/irq/default_smp_affinity"

    def describe(self, value: str) -> str:
        return f"default IRQ affinity = {value}"

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(IRQS),)


def irqbalance_file(system: System) -> str:
    return next((f for f in IRQBALANCE_FILES if system.exists(f)), IRQBALANCE_FILES[0])


def read_banned(system: System) -> str | None:
    path = irqbalance_file(system)
    if not system.exists(path):
        return None
    for line in system.read(path).splitlines():
        # A trailing comment is allowed (the line write_banned writes has one).
        m = re.fullmatch(rf"\s*{BANNED_VAR}\s*=\s*\"?([^\"#]*?)\"?\s*(#.*)?", line)
        if m:
            return m.group(1)
    return None


@dataclass(frozen=True)
class IrqbalanceBan(Target[str | None]):
    """IRQBALANCE_BANNED_CPULIST in irqbalance's config (None: the line is absent). Written
    by the plugin (IrqPlugin.write_banned), which tells the running irqbalance."""

    kind: ClassVar[str] = "irqbalance_banned"

    def read(self, system: System) -> str | None:
        return read_banned(system)

    def watch_files(self, system: System) -> tuple[str, ...]:
        return (irqbalance_file(system),)

    def describe(self, value: str | None) -> str:
        return f"irqbalance banned CPUs = {value}"


IrqTarget = IrqAffinity | DefaultAffinity | IrqbalanceBan


@dataclass(frozen=True)
class IrqRules:
    rules: tuple[tuple[str, CpuSet], ...]  # (match, cpus), first match wins
    isolate: CpuSet
    # The IRQs there were when last looked at (expanded, or a device event): others mean
    # the section must be expanded again.
    known_irqs: set[int]
    coordinate: bool = False  # ban `isolate` in an irqbalance that starts later


@dataclass(frozen=True)
class IrqRule:
    """One [[irq.rule]] entry."""

    match: str = option(
        Str(),
        'IRQ number ("41", "40-43"), action-name glob '
        '("virtio3-*"), or device: net/block device name or PCI address '
        '("eth0", "vda", "0000:00:04.0"); prefix irq:, name: or dev: '
        "to force one kind",
        required=True,
    )
    cpus: CpuSet = option(Cpus(), "CPUs the matched IRQs may run on", required=True)


@dataclass(frozen=True)
class IrqOptions:
    default_affinity: CpuSet | None = option(
        Cpus(),
        "Affinity given to IRQs the kernel creates later "
        "(/proc/irq/default_smp_affinity); defaults to all CPUs but `isolate`",
    )
    isolate: CpuSet | None = option(
        Cpus(), "Move every movable IRQ off these CPUs (rules still win)", shields=True
    )
    coordinate_irqbalance: bool = option(
        Bool(),
        "If irqbalance runs, ban the isolated CPUs in its config instead of fighting "
        "it (IRQBALANCE_BANNED_CPULIST)",
        default=True,
    )
    rule: tuple[IrqRule, ...] = table(
        IrqRule, "Affinity rules; the first rule that matches an IRQ wins", selectors=("match",)
    )


class IrqPlugin(
    Plugin[IrqTarget, IrqRules, IrqOptions],
    FollowsTasks[IrqRules, IrqOptions],
    FollowsDevices[IrqRules],
    HoldsResources,
):
    name = "irq"
    summary = "IRQ affinity: rules by number, name or device; isolate CPUs from movable IRQs"
    targets = (IrqAffinity, DefaultAffinity, IrqbalanceBan)
    example: ClassVar[dict[str, Any]] = {"isolate": "1"}
    # A device added, removed, bound or unbound allocates or frees IRQs; an irqbalance
    # that starts after the profile is banned from the isolated CPUs at its exec.
    follows = Follows(
        udev={
            "pci": DEVICE_ACTIONS,
            "virtio": DEVICE_ACTIONS,
            "net": DEVICE_ACTIONS,
            "block": DEVICE_ACTIONS,
            "cpu": CPU_ACTIONS,
        },
    )
    schema = Schema(
        section=IrqOptions,
        groups=(
            ("isolate", ("isolate", "default_affinity", "coordinate_irqbalance")),
            ("rules", ("rule",)),
        ),
    )

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.baseline: dict[int, tuple[int, ...]] = {}
        self.columns: list[int] = []
        self.baseline_at = 0.0
        self.told_irqbalance = False
        self.counters: dict[int, int] = {}  # cpu -> perf counter fd (irq:irq_handler_entry)
        self.counter_base: dict[int, int] = {}
        self.counter_note = "unavailable: no profile applied"

    # -- the machine's IRQs ----------------------------------------------------------
    def inventory(self, with_counts: bool = False) -> tuple[list[int], list[Irq]]:
        """(CPU columns of /proc/interrupts, the IRQs whose affinity can be read)."""
        columns, irqs = parse_interrupts(self.system.read("proc/interrupts"), with_counts)
        # Those with a /proc/irq/N: one listing, not a stat per IRQ (4,096 on a server,
        # for each device event). Each has smp_affinity_list unless the kernel is built
        # without SMP, where none has.
        listed = {n for n in self.system.listdir("proc/irq") if n.isdigit()}
        if listed and not self.system.exists(f"proc/irq/{min(listed)}/smp_affinity_list"):
            listed = set()
        movable = [i for i in irqs if str(i.number) in listed]
        return columns, movable

    def device_address(self, name: str) -> str | None:
        """PCI address behind a net or block device name (walks up its sysfs device link)."""
        for cls in ("sys/class/net", "sys/block"):
            if self.system.exists(f"{cls}/{name}/device"):
                found = PCI_ADDR.findall(self.system.realpath(f"{cls}/{name}/device"))
                return found[-1] if found else None
        return None

    def matches(self, irq: Irq, match: str) -> bool:
        kind, _, value = (
            match.partition(":")
            if match.split(":")[0] in ("irq", "name", "dev")
            else ("", "", match)
        )
        if kind == "irq" or (not kind and re.fullmatch(r"\d+(-\d+)?", value)):
            lo, _, hi = value.partition("-")
            return int(lo) <= irq.number <= int(hi or lo)
        if kind in ("dev", "") and (PCI_ADDR.fullmatch(value) or self.device_address(value)):
            addr = value if PCI_ADDR.fullmatch(value) else self.device_address(value)
            return addr in irq.devices
        if kind == "dev":
            return False
        return any(fnmatch.fnmatchcase(a, value) for a in irq.actions)

    # -- plugin verbs --------------------------------------------------------------------
    def expand(self, options: IrqOptions, owned: Mapping[Target, Value]) -> Expansion[IrqRules]:
        online = self.system.online_cpus()
        isolate = options.isolate if options.isolate is not None else CpuSet()
        housekeeping = online - isolate
        if isolate and not housekeeping:
            raise NotApplicable(f"isolate = {isolate} leaves no CPU for interrupts")
        settings: Settings = {}
        if options.default_affinity is not None:
            settings[DefaultAffinity()] = options.default_affinity.to_list()
        elif isolate:
            settings[DefaultAffinity()] = housekeeping.to_list()
        _, irqs = self.inventory()
        coordinate = bool(isolate) and self.follows_user_tasks(options)
        rules = IrqRules(
            tuple((r.match, r.cpus) for r in options.rule),
            isolate,
            {i.number for i in irqs},
            coordinate,
        )
        settings.update(self.irq_settings(rules, irqs))
        if coordinate and self.irqbalance_pid():
            settings[IrqbalanceBan()] = isolate.to_list()
        return Expansion(settings, rules)

    def follows_user_tasks(self, options: IrqOptions) -> bool:
        return bool(options.isolate) and options.coordinate_irqbalance

    def on_task(
        self, rules: IrqRules | None, event: TaskEvent, owned: Mapping[Target, Value]
    ) -> Settings:
        """irqbalance started after the profile: banned from the isolated CPUs now, not
        at the next switch (until then it and the drift repair would rewrite the same IRQ
        masks back and forth). Only an exec of root's irqbalance counts."""
        if event.kind != "comm" or rules is None or not rules.coordinate:
            return {}
        if not self.system.is_root_process(event.pid, "irqbalance"):
            return {}
        return {IrqbalanceBan(): rules.isolate.to_list()}

    def irq_settings(self, rules: IrqRules, irqs: list[Irq]) -> Settings:
        """Each IRQ's affinity: the first rule matching it, else off the isolated CPUs."""
        settings: Settings = {}
        housekeeping = self.system.online_cpus() - rules.isolate
        for irq in irqs:
            cpus = next((c for m, c in rules.rules if self.matches(irq, m)), None)
            if cpus is not None:
                settings[IrqAffinity(irq.number)] = cpus.to_list()
            elif rules.isolate:
                settings[IrqAffinity(irq.number)] = housekeeping.to_list()
        return settings

    def on_device(
        self, rules: IrqRules | None, event: DeviceEvent, owned: Mapping[Target, Value]
    ) -> tuple[Settings, set[Target]] | None:
        """A device came, went or was (un)bound: just the IRQs that appeared get their
        affinity, those that vanished are dropped, and the device's own are read back;
        the rest is left alone."""
        if rules is None or event.subsystem == "cpu":
            return None
        _, irqs = self.inventory()
        now = {i.number for i in irqs}
        appeared = [i for i in irqs if i.number not in rules.known_irqs]
        vanished = {IrqAffinity(n) for n in rules.known_irqs - now}
        rules.known_irqs.clear()
        rules.known_irqs.update(now)
        # An unbind and a bind handled together find the device's IRQs under the same
        # numbers, freed and requested again meanwhile with the default mask: they are
        # wanted again too, so the engine reads them back (and puts the rule's CPUs
        # back) instead of trusting what it wrote before.
        addresses = set(PCI_ADDR.findall(event.devpath)) | set(PCI_ADDR.findall(event.name))
        own = [i for i in irqs if i.devices & addresses]
        settings = self.irq_settings(rules, [*appeared, *own])
        return settings, {t for t in vanished if t in owned} | set(settings)

    def original(
        self,
        target: IrqTarget,
        current: Value,
        owned: Callable[[Target], tuple[Value, Value] | None],
    ) -> Value:
        # An IRQ created while the profile's default affinity is in force was born with
        # it: without the profile it would have had the machine's own default.
        default = owned(DefaultAffinity())
        if isinstance(target, IrqAffinity) and default and self.same(target, default[1], current):
            return default[0]
        return current

    def write(self, target: IrqTarget, value: Value) -> None:
        """The irqbalance ban is the plugin's to write: whether the running irqbalance
        could be told is what its status shows."""
        if isinstance(target, IrqbalanceBan):
            self.write_banned(None if value is None else str(value))  # its kind's: str | None
        else:
            super().write(target, value)

    def changed(self, rules: IrqRules | None) -> bool:
        """New or vanished IRQs since the section was expanded (same filter as inventory)."""
        if rules is None:  # the section was refused: nothing to follow
            return False
        return {i.number for i in self.inventory()[1]} != rules.known_irqs

    # -- irqbalance coordination ----------------------------------------------------------
    def irqbalance_pid(self) -> int | None:
        return self.system.root_process("irqbalance")

    def irqbalance_file(self) -> str:
        return irqbalance_file(self.system)

    def read_banned(self) -> str | None:
        return read_banned(self.system)

    def write_banned(self, value: str | None) -> None:
        path = self.irqbalance_file()
        lines = self.system.read(path).splitlines() if self.system.exists(path) else []
        kept = [ln for ln in lines if not re.match(rf"\s*{BANNED_VAR}\s*=", ln)]
        if value is not None:
            kept.append(f'{BANNED_VAR}="{value}"  # set by latencyd; restored when it stops')
        if kept:
            self.system.replace_file(path, "\n".join(kept) + "\n")
        else:  # only our line was there: the file was ours, so it goes
            self.system.remove_file(path)
        self.told_irqbalance = self.tell_irqbalance(value)

    def tell_irqbalance(self, value: str | None) -> bool:
        """Make the running irqbalance ban `value` (None: ban nothing of ours): through its
        socket where it has one (irqbalance >= 1.2 takes "settings cpus LIST" from root),
        else by a restart, as it reads IRQBALANCE_BANNED_CPULIST only when it starts.
        Whether it was told."""
        pid = self.irqbalance_pid()
        if pid is None:
            return False
        command = f"settings cpus {value or 'NULL'}"
        if self.system.unix_request(f"run/irqbalance/irqbalance{pid}.sock", command):
            return True
        return self.system.restart_service("irqbalance.service")

    # -- monitoring -------------------------------------------------------------------------
    def on_applied(self, rules: IrqRules | None) -> None:
        self.columns, irqs = self.inventory(with_counts=True)
        self.baseline = {i.number: i.counts for i in irqs}
        self.baseline_at = time.monotonic()
        self._open_handler_counters()

    def _open_handler_counters(self) -> None:
        """irq:irq_handler_entry counted per CPU by perf, where tracefs is mounted: it
        catches every handler run, including shared and short-lived IRQs."""
        self.close()
        self.counter_note = "unavailable: tracefs is not mounted"
        tp = self.system.tracepoint_id("irq", "irq_handler_entry")
        if tp is None:
            return
        try:
            self.counters = self.system.open_tracepoint_counters(tp, self.system.online_cpus())
        except KernelRefused as exc:
            self.counter_note = f"unavailable: {exc.reason}"
            return
        self.counter_base = {c: self.system.read_counter(fd) for c, fd in self.counters.items()}
        self.counter_note = ""

    def handler_counts(self) -> dict[int, int]:
        """irq_handler_entry events per CPU since the profile was applied (perf)."""
        return {
            c: self.system.read_counter(fd) - self.counter_base.get(c, 0)
            for c, fd in self.counters.items()
        }

    def close(self) -> None:
        self.system.close_counters(self.counters.values())
        self.counters = {}

    def monitor(self, rules: IrqRules | None) -> Monitor:
        isolated = rules.isolate if rules is not None else CpuSet()
        self.columns, irqs = self.inventory(with_counts=True)
        rows: list[Row] = []
        per_cpu = [0] * len(self.columns)
        on_isolated = 0
        for irq in irqs:
            base = self.baseline.get(irq.number, tuple(0 for _ in irq.counts))
            delta = [c - b for c, b in zip(irq.counts, base, strict=False)]
            for i, d in enumerate(delta):
                per_cpu[i] += d
                if self.columns[i] in isolated:
                    on_isolated += d
            affinity = self.system.read(f"proc/irq/{irq.number}/smp_affinity_list")
            rows.append((irq.number, irq.label, affinity, *delta))
        rows.append(("all", "", "", *per_cpu))
        table = Table(
            "interrupts per CPU since the profile was applied "
            f"({time.monotonic() - self.baseline_at:.1f} s)",
            ("IRQ", "name", "affinity", *(f"CPU{c}" for c in self.columns)),
            tuple(rows),
        )
        facts: dict[str, Json] = {}
        if isolated:
            facts["isolated_cpus"] = isolated.to_list()
            facts["irqs_on_isolated_cpus_since_apply"] = on_isolated
        if self.counters:
            counts = self.handler_counts()
            facts["perf_irq_handler_entry_per_cpu_since_apply"] = {
                f"CPU{c}": n for c, n in sorted(counts.items())
            }
            if isolated:
                facts["perf_irq_handlers_on_isolated_cpus_since_apply"] = sum(
                    n for c, n in counts.items() if c in isolated
                )
        else:
            facts["perf_irq_handler_counts"] = self.counter_note
        pid = self.irqbalance_pid()
        if pid:
            banned = self.read_banned()
            said = (
                f"running (pid {pid}); banned CPUs in /{self.irqbalance_file()}: {banned or 'none'}"
            )
            if banned and not self.told_irqbalance:
                said += (
                    " (it reads this only at start, it has no socket to be told through, "
                    "and systemd could not restart it here: restart irqbalance to apply)"
                )
            facts["irqbalance"] = said
        else:
            facts["irqbalance"] = "not running"
        return Monitor((table,), facts)
