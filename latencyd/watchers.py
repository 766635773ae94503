"""Watchers: kernel events that mean "re-expand some plugins now".

Each watcher exposes a file descriptor for the main loop and a non-blocking
`read()` returning event kinds. The periodic tick in the daemon is the safety
net behind all of them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

# udev subsystems we listen to, and the event kinds they raise. A new PCI/net/block
# device can bring new IRQs, so those also raise "irq".
SUBSYSTEM_EVENTS = {
    "cpu": ("cpu",),
    "net": ("net", "irq"),
    "block": ("block", "irq"),
    "pci": ("pci", "irq"),
    "virtio": ("irq",),
}
DEVICE_EVENT_KINDS = frozenset(SUBSYSTEM_EVENTS) | {
    kind for kinds in SUBSYSTEM_EVENTS.values() for kind in kinds
}

# A driver bind/unbind (a device reset, a rebind) allocates or frees its IRQs.
ACTIONS = frozenset({"add", "remove", "bind", "unbind", "online", "offline", "change"})


@dataclass(frozen=True)
class DeviceEvent:
    kinds: tuple[str, ...]
    action: str
    subsystem: str
    name: str


class UdevWatcher:
    """Device add/remove/online events; from udevd when it runs, else straight from the kernel."""

    def __init__(self) -> None:
        import pyudev

        self.source = "udev" if os.path.exists("/run/udev/control") else "kernel"
        context = pyudev.Context()
        self.monitor: Any = pyudev.Monitor.from_netlink(context, source=self.source)
        for subsystem in SUBSYSTEM_EVENTS:
            self.monitor.filter_by(subsystem)
        self.monitor.start()
        log.info("watching device events from %s (%s)", self.source, ", ".join(SUBSYSTEM_EVENTS))

    def fileno(self) -> int:
        return int(self.monitor.fileno())

    def read(self) -> list[DeviceEvent]:
        events: list[DeviceEvent] = []
        while True:
            device = self.monitor.poll(timeout=0)
            if device is None:
                return events
            kinds = SUBSYSTEM_EVENTS.get(device.subsystem or "", ())
            if device.action in ACTIONS and kinds:
                events.append(DeviceEvent(kinds, device.action, device.subsystem, device.sys_name))

    def close(self) -> None:
        self.monitor.stop()
