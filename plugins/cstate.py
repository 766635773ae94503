"""cstate: keep CPUs out of deep idle states — globally with a PM QoS request, per CPU set
with resume latency limits and cpuidle state disables — and show residency like turbostat.

`force_latency_us` is held on an open /dev/cpu_dma_latency fd for as long as the
profile is active; closing the fd is the restore (and a crash restores it too).
"""

from __future__ import annotations

import fnmatch
import os
import re
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.plugin import Plugin, Value
from latencyd.schema import Choice, Cpus, Int, ListOf, OneOf, Option, Pattern, Schema, Table
from latencyd.system import PmQosRequest, System

CPU = "sys/devices/system/cpu"
PM_QOS = "pm_qos"
SYMBOLIC = Pattern(r"poll|shallowest|state:.+", '"poll", "shallowest" or "state:NAME"')
STATE_SELECTOR = Pattern(r"deeper-than:\d+|[^:]+", 'a state name (glob) or "deeper-than:µs"')
# The kernel's resume-latency file inverts intuition: "0" means no constraint and
# "n/a" means zero tolerance. Profiles say what they mean in µs; we translate.
NO_CONSTRAINT, ZERO_TOLERANCE = "0", "n/a"


@dataclass(frozen=True)
class IdleState:
    index: int
    name: str
    latency_us: int

    @property
    def is_poll(self) -> bool:
        return self.name.upper() == "POLL"


def state_matches(state: IdleState, selector: str) -> bool:
    """By exact name, by glob, or by the name's first word ("haltpoll" for "haltpoll idle")."""
    name = state.name.lower()
    sel = selector.lower()
    if sel.startswith("deeper-than:"):
        return state.latency_us > int(sel.split(":", 1)[1])
    return name == sel or fnmatch.fnmatchcase(name, sel) or name.split()[0] == sel


class CstatePlugin(Plugin):
    name = "cstate"
    summary = "C-states: PM QoS latency request, per-CPU resume latency, cpuidle state disables"
    events = frozenset({"cpu"})
    schema = Schema(
        options=(
            Option(
                "force_latency_us",
                OneOf((Int(0, 2_000_000_000), SYMBOLIC)),
                "CPU wake-up latency limit for the whole machine, held via /dev/cpu_dma_latency: "
                'µs, or "poll" (only the polling state), "shallowest" (the shallowest real idle '
                'state), "state:NAME" (no state deeper than NAME)',
                unit="µs",
            ),
        ),
        tables=(
            Table(
                "cpus",
                Schema(
                    options=(
                        Option("cpus", Cpus(), "CPUs this entry applies to"),
                        Option(
                            "resume_latency_us",
                            OneOf((Int(0), Choice(("any",)))),
                            'Per-CPU wake-up latency limit (0 = polling only; "any" = none)',
                            unit="µs",
                        ),
                        Option(
                            "disable_states",
                            ListOf(STATE_SELECTOR),
                            'cpuidle states to disable: names (globs) or "deeper-than:µs"',
                        ),
                    ),
                    required=("cpus",),
                ),
                "Per-CPU-set settings; later entries win where CPU sets overlap",
            ),
        ),
    )

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.request: PmQosRequest | None = None
        self.resolved_from: str | None = None
        self.baseline: dict[int, dict[int, tuple[int, int]]] = {}
        self.baseline_at = 0.0

    # -- the machine's idle states ---------------------------------------------------
    def states(self, cpu: int) -> list[IdleState]:
        base = f"{CPU}/cpu{cpu}/cpuidle"
        out = []
        for entry in self.system.listdir(base):
            m = re.fullmatch(r"state(\d+)", entry)
            if m:
                out.append(
                    IdleState(
                        int(m.group(1)),
                        self.system.read(f"{base}/{entry}/name"),
                        int(self.system.read(f"{base}/{entry}/latency")),
                    )
                )
        return sorted(out, key=lambda s: s.index)

    def resolve_latency(self, value: int | str) -> int:
        """Symbolic targets from this machine's own cpuidle table."""
        if isinstance(value, int):
            return value
        if value == "poll":
            return 0
        cpu = min(self.system.online_cpus())
        states = self.states(cpu)
        if not states:
            raise NotApplicable(f"force_latency_us = {value!r}: no cpuidle states on this machine")
        if value == "shallowest":
            real = [s for s in states if not s.is_poll]
            if not real:
                raise NotApplicable("force_latency_us = 'shallowest': only a polling state exists")
            return min(s.latency_us for s in real)
        wanted = value.split(":", 1)[1]
        for s in states:
            if state_matches(s, wanted):
                return s.latency_us
        names = ", ".join(s.name for s in states)
        raise NotApplicable(
            f"force_latency_us = {value!r}: no idle state {wanted!r} (have: {names})"
        )

    # -- plugin verbs -----------------------------------------------------------------
    def expand(self, options: Mapping[str, Any]) -> dict[str, Value]:
        wanted: dict[str, Value] = {}
        if "force_latency_us" in options:
            raw = options["force_latency_us"]
            wanted[PM_QOS] = self.resolve_latency(raw)
            self.resolved_from = raw if isinstance(raw, str) else None
        for entry in options.get("cpus", []):
            cpus: CpuSet = entry["cpus"]
            for cpu in cpus:
                if "resume_latency_us" in entry:
                    lat = entry["resume_latency_us"]
                    value = (
                        NO_CONSTRAINT
                        if lat == "any"
                        else (ZERO_TOLERANCE if lat == 0 else str(lat))
                    )
                    wanted[f"cpu{cpu}/resume_latency"] = value
                if "disable_states" not in entry:
                    continue
                # Later entries win: this entry's list replaces an earlier one's for this CPU.
                for key in [k for k in wanted if k.startswith(f"cpu{cpu}/state")]:
                    del wanted[key]
                for state in self.states(cpu):
                    if any(state_matches(state, sel) for sel in entry["disable_states"]):
                        wanted[f"cpu{cpu}/state{state.index}/disable"] = "1"
        return wanted

    def _path(self, key: str) -> str:
        cpu, _, rest = key.partition("/")
        if rest == "resume_latency":
            return f"{CPU}/{cpu}/power/pm_qos_resume_latency_us"
        return f"{CPU}/{cpu}/cpuidle/{rest}"

    def capture(self, key: str) -> Value:
        if key == PM_QOS:
            return self.request.value_us if self.request else None
        return self.system.read(self._path(key))

    def apply(self, key: str, value: Value) -> None:
        if key == PM_QOS:
            old = self.request
            # Make before break: the new request is in force before the old one goes.
            self.request = self.system.hold_pm_qos(int(value)) if value is not None else None
            if old is not None:
                old.close()
            return
        self.system.write(self._path(key), str(value))

    def exists(self, key: str) -> bool:
        return key == PM_QOS or self.system.exists(self._path(key))

    def describe(self, key: str, value: Value) -> str:
        if key == PM_QOS:
            if value is None:
                return "no PM QoS request held"
            via = f" (resolved from {self.resolved_from!r})" if self.resolved_from else ""
            return f"PM QoS CPU latency request held at {value} µs{via}"
        cpu, _, rest = key.partition("/")
        if rest == "resume_latency":
            meaning = {ZERO_TOLERANCE: "0 µs: polling only", NO_CONSTRAINT: "no limit"}
            return f"{cpu} resume latency = {meaning.get(str(value), f'{value} µs')}"
        return f"{cpu} {rest} = {value}"

    def close(self) -> None:
        if self.request is not None:
            self.request.close()
            self.request = None

    # -- monitoring ---------------------------------------------------------------------
    def counters(self) -> dict[int, dict[int, tuple[int, int]]]:
        """cpu -> state index -> (time µs, usage)."""
        out: dict[int, dict[int, tuple[int, int]]] = {}
        for cpu in self.system.online_cpus():
            base = f"{CPU}/cpu{cpu}/cpuidle"
            out[cpu] = {}
            for state in self.states(cpu):
                d = f"{base}/state{state.index}"
                out[cpu][state.index] = (
                    int(self.system.read(f"{d}/time")),
                    int(self.system.read(f"{d}/usage")),
                )
        return out

    def on_profile_applied(self) -> None:
        self.baseline = self.counters()
        self.baseline_at = time.monotonic()

    def effective_latency_us(self) -> int | None:
        """The kernel's aggregate CPU latency target (the minimum of all requests)."""
        try:
            fd = os.open(self.system.path("dev/cpu_dma_latency"), os.O_RDONLY)
        except OSError:
            return None
        try:
            data = os.read(fd, 4)
        finally:
            os.close(fd)
        return int(struct.unpack("=i", data)[0]) if len(data) == 4 else None

    def residency(self) -> dict[str, Any]:
        now = self.counters()
        elapsed_us = max((time.monotonic() - self.baseline_at) * 1e6, 1.0)
        cpu0 = min(now) if now else 0
        names = {s.index: s.name for s in self.states(cpu0)}
        columns = ["CPU", "busy%"]
        for idx in sorted(names):
            columns += [f"{names[idx]} %", f"{names[idx]} usage"]
        rows = []
        for cpu, states in sorted(now.items()):
            base = self.baseline.get(cpu, {})
            row: list[Any] = [cpu]
            cells: list[Any] = []
            idle = 0.0
            for idx in sorted(names):
                t, u = states.get(idx, (0, 0))
                t0, u0 = base.get(idx, (t, u))
                share = 100.0 * (t - t0) / elapsed_us
                idle += share
                cells += [round(share, 2), u - u0]
            row.append(round(max(0.0, 100.0 - idle), 2))
            rows.append(row + cells)
        return {
            "title": f"C-state residency since the profile was applied ({elapsed_us / 1e6:.1f} s)",
            "columns": columns,
            "rows": rows,
        }

    def status(self) -> dict[str, Any]:
        info: dict[str, Any] = {}
        if self.request is not None:
            info["pm_qos_requested_us"] = self.request.value_us
            if self.resolved_from:
                info["pm_qos_resolved_from"] = self.resolved_from
        effective = self.effective_latency_us()
        if effective is not None:
            info["pm_qos_effective_us"] = effective
        try:
            info["tables"] = [self.residency()]
        except KernelRefused as exc:
            info["residency_error"] = str(exc)
        return info
