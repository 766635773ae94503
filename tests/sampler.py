"""A sampler that reads a profile's settings in a tight loop (well over 1 kHz) and counts
every sample that shows an original value: "a restart is not a revert" is checked with
it, by the restart tests and by the boot test under systemd."""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from latencyd.kernel.idle import read_driver
from latencyd.kernel.system import System

PROFILE = """
[sysctl]
"vm.swappiness" = 11
"kernel.timer_migration" = 0

[writeback]
dirty_bytes = "64M"
dirty_expire_centisecs = 1500

[cstate]
force_latency_us = 50

[[cstate.cpus]]
cpus = "1"
resume_latency_us = 20

[kthread]
writeback_cpumask = "0"

[irq]
default_affinity = "0"
"""


# Per setting, the profile's line and the value the kernel then shows, and an alternative
# for a machine whose original already is that value (a sample could not tell them apart).
ALTERNATIVES = {
    "vm.swappiness": (('"vm.swappiness" = 11', "11"), ('"vm.swappiness" = 12', "12")),
    "kernel.timer_migration": (
        ('"kernel.timer_migration" = 0', "0"),
        ('"kernel.timer_migration" = 1', "1"),
    ),
    "vm.dirty limit": (
        ('dirty_bytes = "64M"', f"0 {64 << 20}"),
        ('dirty_bytes = "65M"', f"0 {65 << 20}"),
    ),
    "vm.dirty_expire_centisecs": (
        ("dirty_expire_centisecs = 1500", "1500"),
        ("dirty_expire_centisecs = 1600", "1600"),
    ),
    "cpu1 resume latency": (("resume_latency_us = 20", "20"), ("resume_latency_us = 30", "30")),
    "writeback cpumask": (('writeback_cpumask = "0"', "1"), ('writeback_cpumask = "1"', "2")),
    "default IRQ affinity": (('default_affinity = "0"', "1"), ('default_affinity = "1"', "2")),
}


def profile_for(originals: dict[str, object]) -> str:
    """PROFILE, with each value the machine already has replaced by its alternative, so
    that every setting the sampler reads is changed by the profile."""
    text = PROFILE
    for name, ((line, shown), (other, _)) in ALTERNATIVES.items():
        if originals.get(name) == shown:  # (not read: an idle setting that cannot act)
            text = text.replace(line, other)
    return text


def read(path: str) -> str:
    return Path(path).read_text().strip()


def pm_qos_us() -> int:
    """The kernel's aggregate CPU latency target (2000000000 when nobody holds one)."""
    fd = os.open("/dev/cpu_dma_latency", os.O_RDONLY)
    try:
        return int(struct.unpack("=i", os.read(fd, 4))[0])
    finally:
        os.close(fd)


SETTINGS: dict[str, Callable[[], object]] = {
    "vm.swappiness": lambda: read("/proc/sys/vm/swappiness"),
    "kernel.timer_migration": lambda: read("/proc/sys/kernel/timer_migration"),
    # One setting: the kernel keeps either the ratio or the bytes (the other reads 0), so
    # on a machine whose limit is in bytes the ratio reads 0 tuned or not.
    "vm.dirty limit": lambda: " ".join(
        (read("/proc/sys/vm/dirty_ratio"), read("/proc/sys/vm/dirty_bytes"))
    ),
    "vm.dirty_expire_centisecs": lambda: read("/proc/sys/vm/dirty_expire_centisecs"),
    "cpu1 resume latency": lambda: read(
        "/sys/devices/system/cpu/cpu1/power/pm_qos_resume_latency_us"
    ),
    "writeback cpumask": lambda: read("/sys/devices/virtual/workqueue/writeback/cpumask"),
    "default IRQ affinity": lambda: read("/proc/irq/default_smp_affinity"),
    "PM QoS": pm_qos_us,
}
# The idle settings act only where a cpuidle driver is; elsewhere the daemon refuses them
# (not applicable), so they are not the profile's to keep and the sampler leaves them out.
IDLE_ACTS = bool(read_driver(System()))
if not IDLE_ACTS:
    del SETTINGS["PM QoS"], SETTINGS["cpu1 resume latency"]


@dataclass
class Sampler:
    """Reads every setting in a tight loop; records each sample that shows an original."""

    originals: dict[str, object]
    samples: int = 0
    seconds: float = 0.0
    flips: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        start = time.monotonic()
        while not self.stop.is_set():
            for name, reader in SETTINGS.items():
                if reader() == self.originals[name]:
                    self.flips[name] = self.flips.get(name, 0) + 1
            self.samples += 1
        self.seconds = time.monotonic() - start

    @property
    def rate_hz(self) -> float:
        return self.samples / self.seconds if self.seconds else 0.0


def finish(sampler: Sampler) -> Sampler:
    """The sampler stopped, having sampled. How often it sampled (well over 1 kHz on a
    quiet machine, less beside a busy neighbour) is how short a flip it would have seen:
    said, not judged, as the machine's load moves it."""
    sampler.stop.set()
    while sampler.seconds == 0.0:
        time.sleep(0.001)
    print(f"the sampler ran at {sampler.rate_hz:.0f} Hz ({sampler.samples} samples)")
    assert sampler.samples > 0
    return sampler


def all_tuned(originals: dict[str, object]) -> bool:
    return all(reader() != originals[name] for name, reader in SETTINGS.items())


@contextlib.contextmanager
def sampling(originals: dict[str, object]) -> Iterator[Sampler]:
    """A sampler running in a thread for the duration of the block."""
    sampler = Sampler(originals)
    thread = threading.Thread(target=sampler.run)
    thread.start()
    try:
        yield sampler
    finally:
        sampler.stop.set()
        thread.join()
