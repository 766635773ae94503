"""This machine's facts that the conversion may consult (`Host`: CPU topology, whether
it is virtual, idle states...), and `read_host`, the I/O edge that gathers them.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from latencyd.kernel.system import System
from latencyd.tools.tuned_import.cpulists import cpulist_unpack


@dataclass(frozen=True)
class IdleState:
    """One of this machine's CPU idle states: TuneD's cstate.id:N names it by `index`."""

    index: int
    name: str
    latency_us: int


@dataclass(frozen=True)
class Host:
    """What the conversion may know about the machine it runs on. Everything TuneD would
    evaluate on the machine (and latencyd cannot express) is evaluated from these facts,
    and reported as such."""

    online: tuple[int, ...] = ()
    present: tuple[int, ...] = ()
    packages: Mapping[int, str] = field(default_factory=dict)  # CPU -> physical package id
    cpuinfo: str = ""
    uname: str = ""
    virtualized: str | None = None  # how we know it is virtual ("" = we know it is not)
    idle_states: tuple[IdleState, ...] = ()
    exists: Callable[[str], bool] = lambda path: True  # an absolute path, or a glob

    def has_sysctl(self, key: str) -> bool:
        rel = key.strip("/") if "/" in key else key.replace(".", "/")
        return self.exists(f"/proc/sys/{rel}")


def read_host(system: System) -> Host:
    """This machine's facts, read through `system` (the I/O edge of `Host`)."""
    read = system.read_or_empty

    def exists(path: str) -> bool:
        if "\0" in path:  # no file has such a name (and glob raises on it)
            return False
        return bool(system.glob(path)) if glob.has_magic(path) else system.exists(path)

    cpu_dir = "sys/devices/system/cpu"
    packages: dict[int, str] = {}
    for entry in system.glob(f"{cpu_dir}/cpu[0-9]*"):
        cpu = os.path.basename(entry)[3:]
        if cpu.isdecimal():
            packages[int(cpu)] = read(f"{cpu_dir}/cpu{cpu}/topology/physical_package_id").strip()
    states = []
    idle = f"{cpu_dir}/cpu0/cpuidle"
    for entry in system.glob(f"{idle}/state[0-9]*"):
        index = os.path.basename(entry)[5:]
        latency = read(f"{idle}/state{index}/latency").strip()
        if index.isdecimal() and latency.isdecimal():
            name = read(f"{idle}/state{index}/name").strip()
            states.append(IdleState(int(index), name, int(latency)))
    cpuinfo = read("proc/cpuinfo")
    flags = re.search(r"^flags\s*:(.*)$", cpuinfo, re.MULTILINE)
    hypervisor = read("sys/hypervisor/type").strip()
    if flags and " hypervisor" in f" {flags.group(1)} ".replace("\t", " "):
        virtual: str | None = "the CPU flag 'hypervisor' is set"
    elif hypervisor:
        virtual = f"/sys/hypervisor/type is {hypervisor!r}"
    elif flags:
        virtual = ""
    else:
        virtual = None
    return Host(
        online=tuple(cpulist_unpack(read(f"{cpu_dir}/online")) or ()),
        present=tuple(cpulist_unpack(read(f"{cpu_dir}/present")) or ()),
        packages=packages,
        cpuinfo=cpuinfo,
        uname=" ".join(os.uname()),
        virtualized=virtual,
        idle_states=tuple(states),
        exists=exists,
    )
