"""irq: IRQ affinity by rule, isolation of CPUs from every movable IRQ, and IRQs that appear later.

Each IRQ's mask is one setting, so the engine journals and restores it like any
other; IRQs the kernel will not move (managed, per-queue) are reported as not
applicable with the kernel's reason. New IRQs are picked up by udev events and
a cheap /proc/irq listing on the monitor tick.
"""

from __future__ import annotations

import fnmatch
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.plugin import Plugin, Value
from latencyd.schema import Bool, Choice, Cpus, Option, Schema, Str, Table
from latencyd.system import System

PCI_ADDR = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")
DEFAULT = "default_affinity"
BANNED = "irqbalance/banned"
IRQBALANCE_FILES = ("etc/default/irqbalance", "etc/sysconfig/irqbalance")
BANNED_VAR = "IRQBALANCE_BANNED_CPULIST"


@dataclass(frozen=True)
class Irq:
    number: int
    actions: tuple[str, ...]
    chip: str
    counts: tuple[int, ...]  # per CPU, in /proc/interrupts column order
    devices: frozenset[str] = field(default_factory=frozenset)

    @property
    def label(self) -> str:
        return ",".join(self.actions) or self.chip


def parse_interrupts(text: str) -> tuple[list[int], list[Irq]]:
    """/proc/interrupts -> (CPU numbers of the columns, numbered IRQs with their actions)."""
    lines = text.splitlines()
    cpus = [int(c[3:]) for c in lines[0].split()] if lines else []
    irqs = []
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        if not label.strip().isdigit():
            continue
        fields = rest.split()
        counts = tuple(int(x) for x in fields[: len(cpus)])
        tail = fields[len(cpus) :]
        chip = tail[0] if tail else ""
        # Kernels with GENERIC_IRQ_SHOW_LEVEL (ARM) print Level/Edge before the actions.
        skip = 3 if tail[2:3] in (["Level"], ["Edge"]) else 2
        actions = " ".join(tail[skip:]) if len(tail) > skip else ""
        names = tuple(a.strip() for a in actions.split(",") if a.strip())
        devices = frozenset(PCI_ADDR.findall(chip))
        irqs.append(Irq(int(label), names, chip, counts, devices))
    return cpus, irqs


class IrqPlugin(Plugin):
    name = "irq"
    summary = "IRQ affinity: rules by number, name or device; isolate CPUs from movable IRQs"
    events = frozenset({"irq", "pci", "net", "block"})
    schema = Schema(
        options=(
            Option(
                "default_affinity",
                Cpus(),
                "Affinity given to IRQs the kernel creates later "
                "(/proc/irq/default_smp_affinity); defaults to all CPUs but `isolate`",
            ),
            Option("isolate", Cpus(), "Move every movable IRQ off these CPUs (rules still win)"),
            Option(
                "on_drift",
                Choice(("reapply", "report")),
                "When something else rewrites a mask this profile owns",
                default="reapply",
            ),
            Option(
                "coordinate_irqbalance",
                Bool(),
                "If irqbalance runs, ban the isolated CPUs in its config instead of fighting "
                "it (IRQBALANCE_BANNED_CPULIST)",
                default=True,
            ),
        ),
        tables=(
            Table(
                "rule",
                Schema(
                    options=(
                        Option(
                            "match",
                            Str(),
                            'IRQ number ("41", "40-43"), action-name glob '
                            '("virtio3-*"), or device: net/block device name or PCI address '
                            '("eth0", "vda", "0000:00:04.0"); prefix irq:, name: or dev: '
                            "to force one kind",
                        ),
                        Option("cpus", Cpus(), "CPUs the matched IRQs may run on"),
                    ),
                    required=("match", "cpus"),
                ),
                "Affinity rules; the first rule that matches an IRQ wins",
            ),
        ),
    )

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.known_irqs: frozenset[int] = frozenset()
        self.isolated = CpuSet()
        self.baseline: dict[int, tuple[int, ...]] = {}
        self.columns: list[int] = []
        self.baseline_at = 0.0
        self.restarted_irqbalance = False
        self.counters: dict[int, int] = {}  # cpu -> perf counter fd (irq:irq_handler_entry)
        self.counter_base: dict[int, int] = {}
        self.counter_note = "unavailable: no profile applied"

    # -- the machine's IRQs ----------------------------------------------------------
    def inventory(self) -> list[Irq]:
        self.columns, irqs = parse_interrupts(self.system.read("proc/interrupts"))
        return [i for i in irqs if self.system.exists(f"proc/irq/{i.number}/smp_affinity_list")]

    def device_address(self, name: str) -> str | None:
        """PCI address behind a net or block device name (walks up its sysfs device link)."""
        for cls in ("sys/class/net", "sys/block"):
            link = self.system.path(f"{cls}/{name}/device")
            if link.exists():
                found = PCI_ADDR.findall(os.path.realpath(link))
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
    def expand(self, options: Mapping[str, Any]) -> dict[str, Value]:
        online = self.system.online_cpus()
        isolate: CpuSet = options.get("isolate", CpuSet())
        self.isolated = isolate
        housekeeping = online - isolate
        if isolate and not housekeeping:
            raise NotApplicable(f"isolate = {isolate} leaves no CPU for interrupts")
        wanted: dict[str, Value] = {}
        if "default_affinity" in options:
            wanted[DEFAULT] = options["default_affinity"].to_list()
        elif isolate:
            wanted[DEFAULT] = housekeeping.to_list()
        irqs = self.inventory()
        self.known_irqs = frozenset(i.number for i in irqs)
        for irq in irqs:
            rule = next((r for r in options.get("rule", []) if self.matches(irq, r["match"])), None)
            if rule is not None:
                wanted[f"irq/{irq.number}"] = rule["cpus"].to_list()
            elif isolate:
                wanted[f"irq/{irq.number}"] = housekeeping.to_list()
        if isolate and options.get("coordinate_irqbalance", True) and self.irqbalance_pid():
            wanted[BANNED] = isolate.to_list()
        return wanted

    def _path(self, key: str) -> str:
        if key == DEFAULT:
            return "proc/irq/default_smp_affinity"
        return f"proc/irq/{key.split('/')[1]}/smp_affinity_list"

    def capture(self, key: str) -> Value:
        if key == BANNED:
            return self.read_banned()
        raw = self.system.read(self._path(key))
        cpus = CpuSet.from_mask(raw) if key == DEFAULT else CpuSet.from_list(raw)
        return cpus.to_list()

    def apply(self, key: str, value: Value) -> None:
        if key == BANNED:
            self.write_banned(value)
            return
        if key == DEFAULT:
            nr = len(self.columns) or max(self.system.online_cpus()) + 1
            self.system.write(self._path(key), CpuSet.from_list(value).to_mask(nr))
            return
        try:
            self.system.write(self._path(key), value)
        except KernelRefused as exc:
            raise NotApplicable(
                f"the kernel will not move IRQ {key.split('/')[1]} (kernel-managed or per-queue "
                f"interrupt): {exc.reason}"
            ) from exc

    def same(self, key: str, wanted: Value, actual: Value) -> bool:
        if key == BANNED:
            return bool(wanted == actual)
        return CpuSet.from_list(str(wanted)) == CpuSet.from_list(str(actual))

    def optional(self, key: str) -> bool:
        return key.startswith("irq/")

    def exists(self, key: str) -> bool:
        return key in (DEFAULT, BANNED) or self.system.exists(self._path(key))

    def changed(self) -> bool:
        """New or vanished IRQs since the last expand (same filter as inventory())."""
        return frozenset(i.number for i in self.inventory()) != self.known_irqs

    def describe(self, key: str, value: Value) -> str:
        if key == DEFAULT:
            return f"default IRQ affinity = {value}"
        if key == BANNED:
            return f"irqbalance banned CPUs = {value}"
        return f"IRQ {key.split('/')[1]} affinity = {value}"

    # -- irqbalance coordination ----------------------------------------------------------
    def irqbalance_pid(self) -> int | None:
        for pid in self.system.listdir("proc"):
            if pid.isdigit():
                try:
                    if self.system.read(f"proc/{pid}/comm") == "irqbalance":
                        return int(pid)
                except KernelRefused:
                    continue
        return None

    def irqbalance_file(self) -> str:
        return next((f for f in IRQBALANCE_FILES if self.system.exists(f)), IRQBALANCE_FILES[0])

    def read_banned(self) -> str | None:
        path = self.irqbalance_file()
        if not self.system.exists(path):
            return None
        for line in self.system.read(path).splitlines():
            # A trailing comment is allowed (the line write_banned writes has one).
            m = re.fullmatch(rf"\s*{BANNED_VAR}\s*=\s*\"?([^\"#]*?)\"?\s*(#.*)?", line)
            if m:
                return m.group(1)
        return None

    def write_banned(self, value: str | None) -> None:
        path = self.irqbalance_file()
        lines = self.system.read(path).splitlines() if self.system.exists(path) else []
        kept = [ln for ln in lines if not re.match(rf"\s*{BANNED_VAR}\s*=", ln)]
        if value is not None:
            kept.append(f'{BANNED_VAR}="{value}"  # set by latencyd; restored when it stops')
        self.system.replace_file(path, "\n".join(kept) + "\n" if kept else "")
        # irqbalance reads IRQBALANCE_BANNED_CPULIST only when it starts.
        self.restarted_irqbalance = self.system.restart_service("irqbalance.service")

    # -- monitoring -------------------------------------------------------------------------
    def on_profile_applied(self) -> None:
        self.baseline = {i.number: i.counts for i in self.inventory()}
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
        for fd in self.counters.values():
            os.close(fd)
        self.counters = {}

    def status(self) -> dict[str, Any]:
        irqs = self.inventory()
        rows = []
        per_cpu = [0] * len(self.columns)
        on_isolated = 0
        for irq in irqs:
            base = self.baseline.get(irq.number, tuple(0 for _ in irq.counts))
            delta = [c - b for c, b in zip(irq.counts, base, strict=False)]
            for i, d in enumerate(delta):
                per_cpu[i] += d
                if self.columns[i] in self.isolated:
                    on_isolated += d
            affinity = self.system.read(f"proc/irq/{irq.number}/smp_affinity_list")
            rows.append([irq.number, irq.label, affinity, *delta])
        rows.append(["all", "", "", *per_cpu])
        info: dict[str, Any] = {
            "tables": [
                {
                    "title": f"interrupts per CPU since the profile was applied "
                    f"({time.monotonic() - self.baseline_at:.1f} s)",
                    "columns": ["IRQ", "name", "affinity", *(f"CPU{c}" for c in self.columns)],
                    "rows": rows,
                }
            ],
        }
        if self.isolated:
            info["isolated_cpus"] = self.isolated.to_list()
            info["irqs_on_isolated_cpus_since_apply"] = on_isolated
        if self.counters:
            counts = self.handler_counts()
            info["perf_irq_handler_entry_per_cpu_since_apply"] = {
                f"CPU{c}": n for c, n in sorted(counts.items())
            }
            if self.isolated:
                info["perf_irq_handlers_on_isolated_cpus_since_apply"] = sum(
                    n for c, n in counts.items() if c in self.isolated
                )
        else:
            info["perf_irq_handler_counts"] = self.counter_note
        pid = self.irqbalance_pid()
        if pid:
            banned = self.read_banned()
            info["irqbalance"] = (
                f"running (pid {pid}); banned CPUs in /{self.irqbalance_file()}: {banned or 'none'}"
            )
            if banned and not self.restarted_irqbalance:
                info["irqbalance"] += (
                    " (it reads this only at start and systemd could not "
                    "restart it here: restart irqbalance to apply)"
                )
        else:
            info["irqbalance"] = "not running"
        return info
