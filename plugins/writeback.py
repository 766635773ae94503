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

from latencyd.core.plugin import Expansion, Options, Plugin, Settings, Target, Value, plain_path
from latencyd.core.schema import Int, Option, Schema, Size

VM = "proc/sys/vm"
PAIRS = {
    "dirty": ("dirty_ratio", "dirty_bytes"),
    "dirty_background": ("dirty_background_ratio", "dirty_background_bytes"),
}
PLAIN = ("dirty_expire_centisecs", "dirty_writeback_centisecs")


@dataclass(frozen=True)
class DirtyLimit(Target):
    """One ratio/bytes pair ("dirty" or "dirty_background"): one setting whose value names
    its mode ({"ratio": 20} or {"bytes": 67108864})."""

    kind: ClassVar[str] = "dirty_limit"
    pair: str

    def problem(self) -> str | None:
        pairs = ("dirty", "dirty_background")
        return None if self.pair in pairs else f"no dirty limit {self.pair!r} ({pairs})"


@dataclass(frozen=True)
class VmKnob(Target):
    kind: ClassVar[str] = "vm"
    name: str

    def problem(self) -> str | None:
        return None if plain_path(self.name, 1) else f"no vm knob is called {self.name!r}"


class WritebackPlugin(Plugin[DirtyLimit | VmKnob, None]):
    name = "writeback"
    summary = "Dirty-page writeback thresholds and timing (vm.dirty_*)"
    targets = (DirtyLimit, VmKnob)
    example: ClassVar[dict[str, Any]] = {"dirty_bytes": "64M", "dirty_expire_centisecs": 500}
    schema = Schema(
        options=(
            Option(
                "dirty_ratio",
                Int(0, 100),
                "Dirty memory, as % of available memory, at which writers start writeback",
                unit="%",
            ),
            Option(
                "dirty_bytes",
                Size(),
                'Like dirty_ratio but absolute: bytes, "64M", or "3%" of RAM '
                "(finer than whole percents)",
                unit="bytes",
            ),
            Option(
                "dirty_background_ratio",
                Int(0, 100),
                "Dirty memory, as % of available memory, at which background flushing starts",
                unit="%",
            ),
            Option(
                "dirty_background_bytes",
                Size(),
                'Like dirty_background_ratio but absolute: bytes, "16M", or "1%" of RAM',
                unit="bytes",
            ),
            Option(
                "dirty_expire_centisecs",
                Int(0),
                "Age at which dirty data is old enough to be written out",
                unit="cs",
            ),
            Option(
                "dirty_writeback_centisecs",
                Int(0),
                "Interval between flusher wake-ups (0 disables periodic writeback)",
                unit="cs",
            ),
        ),
        exclusive=tuple(PAIRS.values()),
    )

    def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion[None]:
        settings: Settings = {}
        for pair, (ratio, size) in PAIRS.items():
            if ratio in options:
                settings[DirtyLimit(pair)] = {"ratio": options[ratio]}
            elif size in options:
                settings[DirtyLimit(pair)] = {"bytes": options[size]}
        for name in PLAIN:
            if name in options:
                settings[VmKnob(name)] = options[name]
        return Expansion(settings)

    def read(self, target: DirtyLimit | VmKnob) -> Value:
        if isinstance(target, DirtyLimit):
            ratio, size = PAIRS[target.pair]
            nbytes = int(self.system.read(f"{VM}/{size}"))
            if nbytes:
                return {"bytes": nbytes}
            return {"ratio": int(self.system.read(f"{VM}/{ratio}"))}
        return int(self.system.read(f"{VM}/{target.name}"))

    def write(self, target: DirtyLimit | VmKnob, value: Value) -> None:
        if isinstance(target, DirtyLimit):
            ratio, size = PAIRS[target.pair]
            ((mode, number),) = value.items()
            if mode == "ratio" and number == 0 and int(self.system.read(f"{VM}/{size}")):
                # The kernel zeroes the bytes only when the ratio changes, and in bytes mode
                # the ratio reads 0 already: a ratio of 1 first (what a machine left with
                # no limit at all shows, and so what restoring it writes).
                self.system.write(f"{VM}/{ratio}", "1")
            self.system.write(f"{VM}/{ratio if mode == 'ratio' else size}", str(number))
        else:
            self.system.write(f"{VM}/{target.name}", str(value))

    def describe(self, target: DirtyLimit | VmKnob, value: Value) -> str:
        if isinstance(target, DirtyLimit):
            ((mode, number),) = value.items()
            ratio, size = PAIRS[target.pair]
            return f"vm.{ratio} = {number}" if mode == "ratio" else f"vm.{size} = {number}"
        return f"vm.{target.name} = {value}"

    def watch_files(self, target: DirtyLimit | VmKnob) -> tuple[str, ...]:
        # Writing either file of a pair changes the pair (the kernel zeroes the other).
        names = PAIRS[target.pair] if isinstance(target, DirtyLimit) else (target.name,)
        return tuple(f"{VM}/{name}" for name in names)
