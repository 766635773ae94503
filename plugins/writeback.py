"""writeback: dirty-page writeback thresholds (vm.dirty_*), sizes in bytes or % of RAM.

The kernel keeps either dirty_ratio or dirty_bytes (writing one zeroes the
other), and likewise for the background pair. Each pair is therefore one
setting whose value names its mode, so restore brings back the original mode
exactly, not just a number.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latencyd.plugin import Plugin, Value
from latencyd.schema import Int, Option, Schema, Size

VM = "proc/sys/vm"
PAIRS = {
    "dirty": ("dirty_ratio", "dirty_bytes"),
    "dirty_background": ("dirty_background_ratio", "dirty_background_bytes"),
}
PLAIN = ("dirty_expire_centisecs", "dirty_writeback_centisecs")


class WritebackPlugin(Plugin):
    name = "writeback"
    summary = "Dirty-page writeback thresholds and timing (vm.dirty_*)"
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

    def expand(self, options: Mapping[str, Any]) -> dict[str, Value]:
        wanted: dict[str, Value] = {}
        for key, (ratio, size) in PAIRS.items():
            if ratio in options:
                wanted[key] = {"ratio": options[ratio]}
            elif size in options:
                wanted[key] = {"bytes": options[size]}
        for key in PLAIN:
            if key in options:
                wanted[key] = options[key]
        return wanted

    def capture(self, key: str) -> Value:
        if key in PAIRS:
            ratio, size = PAIRS[key]
            nbytes = int(self.system.read(f"{VM}/{size}"))
            if nbytes:
                return {"bytes": nbytes}
            return {"ratio": int(self.system.read(f"{VM}/{ratio}"))}
        return int(self.system.read(f"{VM}/{key}"))

    def apply(self, key: str, value: Value) -> None:
        if key in PAIRS:
            ratio, size = PAIRS[key]
            ((mode, number),) = value.items()
            self.system.write(f"{VM}/{ratio if mode == 'ratio' else size}", str(number))
        else:
            self.system.write(f"{VM}/{key}", str(value))

    def describe(self, key: str, value: Value) -> str:
        if key in PAIRS:
            ((mode, number),) = value.items()
            ratio, size = PAIRS[key]
            return f"vm.{ratio} = {number}" if mode == "ratio" else f"vm.{size} = {number}"
        return f"vm.{key} = {value}"
