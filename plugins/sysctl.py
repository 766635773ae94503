"""sysctl: any /proc/sys key, e.g. ``"net.core.busy_read" = 50``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from latencyd.plugin import Plugin, Value
from latencyd.schema import Int, OneOf, Schema, Str
from latencyd.system import System


def sysctl_path(key: str) -> str:
    """``net.ipv4.conf.all.rp_filter`` -> ``proc/sys/net/ipv4/conf/all/rp_filter``.

    As in sysctl(8): a key containing '/' is already a path (so dots stay literal,
    as in ``net/ipv4/conf/eth0.100/rp_filter``).
    """
    rel = key.strip("/") if "/" in key else key.replace(".", "/")
    return f"proc/sys/{rel}"


def normalize(value: Any) -> str:
    """Multi-field sysctls read back tab-separated; compare them field by field."""
    return " ".join(str(value).split())


class SysctlPlugin(Plugin):
    name = "sysctl"
    summary = "Any kernel sysctl under /proc/sys"

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self.schema = self.schema_for(system)

    @classmethod
    def schema_for(cls, system: System) -> Schema:
        def check_key(key: str) -> str | None:
            path = system.path(sysctl_path(key))
            if ".." in key.split("/") or ".." in key.split("."):
                return f"sysctl key {key!r} is not a plain key"
            if not path.exists():
                return f"unknown sysctl {key!r}: /{sysctl_path(key)} does not exist on this kernel"
            if path.is_dir():
                return f"sysctl {key!r} is a directory, not a setting"
            return None

        return Schema(free_keys=check_key, free_kind=OneOf((Int(), Str())))

    def expand(self, options: Mapping[str, Any]) -> dict[str, Value]:
        return {key: normalize(value) for key, value in options.items()}

    def capture(self, key: str) -> Value:
        return normalize(self.system.read(sysctl_path(key)))

    def apply(self, key: str, value: Value) -> None:
        self.system.write(sysctl_path(key), str(value))

    def same(self, key: str, wanted: Value, actual: Value) -> bool:
        return normalize(wanted) == normalize(actual)

    def describe(self, key: str, value: Value) -> str:
        return f"sysctl {key} = {value}"
