"""writeback: dirty-page writeback thresholds (vm.dirty_*), sizes in bytes or % of RAM.

The kernel keeps either dirty_ratio or dirty_bytes (writing one zeroes the
other), and likewise for the background pair. Each pair is therefore one
setting whose value names its mode, so restore brings back the original mode
exactly, not just a number.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from latencyd.core.plugin import (
    Expansion,
    FileTarget,
    Plugin,
    Settings,
    Target,
    Value,
    plain_path,
)
from latencyd.core.schema import Int, Schema, Size, option
from latencyd.kernel.owners import SYSCTL, Claim
from latencyd.kernel.system import System

VM = "proc/sys/vm"
PAIRS = {
    "dirty": ("dirty_ratio", "dirty_bytes"),
    "dirty_background": ("dirty_background_ratio", "dirty_background_bytes"),
}
PLAIN = ("dirty_expire_centisecs", "dirty_writeback_centisecs")


@dataclass(frozen=True)
class DirtyLimit(Target[dict[str, int]]):
    """One ratio/bytes pair ("dirty" or "dirty_background"): one setting whose value names
    its mode ({"ratio": 20} or {"bytes": 67108864}), kept in two files."""

    kind: ClassVar[str] = "dirty_limit"
    pair: str

    def problem(self) -> str | None:
        pairs = ("dirty", "dirty_background")
        return None if self.pair in pairs else f"no dirty limit {self.pair!r} ({pairs})"

    def read(self, system: System) -> dict[str, int]:
        ratio, size = PAIRS[self.pair]
        nbytes = int(system.read(f"{VM}/{size}"))
        if nbytes:
            return {"bytes": nbytes}
        return {"ratio": int(system.read(f"{VM}/{ratio}"))}

    def write(self, system: System, value: dict[str, int]) -> None:
        ratio, size = PAIRS[self.pair]
        ((mode, number),) = value.items()
        if mode == "ratio" and number == 0 and int(system.read(f"{VM}/{size}")):
            # The kernel zeroes the bytes only when the ratio changes, and in bytes mode
            # the ratio reads 0 already: a ratio of 1 first (what a machine left with
            # no limit at all shows, and so what restoring it writes).
            system.write(f"{VM}/{ratio}", "1")
        system.write(f"{VM}/{ratio if mode == 'ratio' else size}", str(number))

    def describe(self, value: dict[str, int]) -> str:
        ((mode, number),) = value.items()
        ratio, size = PAIRS[self.pair]
        return f"vm.{ratio} = {number}" if mode == "ratio" else f"vm.{size} = {number}"

    def claims(self) -> tuple[Claim, ...]:
        return tuple(Claim(SYSCTL, f"vm/{name}") for name in PAIRS[self.pair])

    def watch_files(self, system: System) -> tuple[str, ...]:
        # Writing either file of the pair changes it (the kernel zeroes the other).
        return tuple(f"{VM}/{name}" for name in PAIRS[self.pair])


@dataclass(frozen=True)
class VmKnob(FileTarget[int]):
    """A plain number in /proc/sys/vm."""

    kind: ClassVar[str] = "vm"
    name: str

    def problem(self) -> str | None:
        return None if plain_path(self.name, 1) else f"no vm knob is called {self.name!r}"

    @property
    def rel(self) -> str:
        return f"{VM}/{self.name}"

    def parse(self, text: str) -> int:
        return int(text)

    def describe(self, value: int) -> str:
        return f"vm.{self.name} = {value}"

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(SYSCTL, f"vm/{self.name}"),)


@dataclass(frozen=True)
class WritebackOptions:
    dirty_ratio: int | None = option(
        Int(0, 100),
        "Dirty memory, as % of available memory, at which writers start writeback",
        unit="%",
    )
    dirty_bytes: int | None = option(
        Size(),
        'Like dirty_ratio but absolute: bytes, "64M", or "3%" of RAM (finer than whole percents)',
        unit="bytes",
    )
    dirty_background_ratio: int | None = option(
        Int(0, 100),
        "Dirty memory, as % of available memory, at which background flushing starts",
        unit="%",
    )
    dirty_background_bytes: int | None = option(
        Size(),
        'Like dirty_background_ratio but absolute: bytes, "16M", or "1%" of RAM',
        unit="bytes",
    )
    dirty_expire_centisecs: int | None = option(
        Int(0), "Age at which dirty data is old enough to be written out", unit="cs"
    )
    dirty_writeback_centisecs: int | None = option(
        Int(0), "Interval between flusher wake-ups (0 disables periodic writeback)", unit="cs"
    )

    def pairs(self) -> dict[str, tuple[int | None, int | None]]:
        """Each ratio/bytes pair (PAIRS) as the section sets it: (ratio, bytes)."""
        return {
            "dirty": (self.dirty_ratio, self.dirty_bytes),
            "dirty_background": (self.dirty_background_ratio, self.dirty_background_bytes),
        }

    def plain(self) -> dict[str, int | None]:
        """The plain knobs (PLAIN) as the section sets them."""
        return {
            "dirty_expire_centisecs": self.dirty_expire_centisecs,
            "dirty_writeback_centisecs": self.dirty_writeback_centisecs,
        }


class WritebackPlugin(Plugin[DirtyLimit | VmKnob, None, WritebackOptions]):
    name = "writeback"
    summary = "Dirty-page writeback thresholds and timing (vm.dirty_*)"
    targets = (DirtyLimit, VmKnob)
    example: ClassVar[dict[str, Any]] = {"dirty_bytes": "64M", "dirty_expire_centisecs": 500}
    schema = Schema(section=WritebackOptions, exclusive=tuple(PAIRS.values()))

    def expand(self, options: WritebackOptions, owned: Mapping[Target, Value]) -> Expansion[None]:
        settings: Settings = {}
        for pair, (ratio, size) in options.pairs().items():
            if ratio is not None:
                settings[DirtyLimit(pair)] = {"ratio": ratio}
            elif size is not None:
                settings[DirtyLimit(pair)] = {"bytes": size}
        for name, value in options.plain().items():
            if value is not None:
                settings[VmKnob(name)] = value
        return Expansion(settings)
