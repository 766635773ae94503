"""net: NIC interrupt coalescing, rings, channels, pause, features, RPS/XPS and NAPI knobs.

Every NIC a `[[net.nic]]` entry matches (by name, driver, bus address or MAC; the
first matching entry wins) gets the entry's settings, virtual NICs included (veth,
tap, bond, vlan: TuneD skips everything under /virtual/). ethtool settings go over
netlink (latencyd.kernel.ethtool), never through ethtool's text. Every write is read back: a
driver that does not support a key, or accepts a value and keeps another
(virtio_net's adaptive-rx), makes the setting "not applicable, with the reason".

A NIC is known by a stable identity — its permanent MAC, else its bus address and
port, else its ifindex (virtual NICs) — not by its name, which can change: a rename
keeps its settings, and the journal restores the right NIC after a crash. NICs that
appear later (hot-plug, a driver rebind, a move into this namespace) and renames are
tuned from udev events; a NIC that disappears is dropped without error.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, ClassVar

from latencyd.core.capabilities import FindsDeviceFiles, FollowsDevices
from latencyd.core.plugin import (
    DeviceEvent,
    Expansion,
    Follows,
    Monitor,
    Plugin,
    Settings,
    Table,
    Target,
    V,
    Value,
    of_device,
    plain_path,
    same_cpus,
)
from latencyd.core.schema import Bool, Cpus, Fields, Int, Kind, ListOf, Schema, Str, option, table
from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.kernel.ethtool import FEATURE_ALIASES, GROUPS
from latencyd.kernel.owners import NIC, Claim
from latencyd.kernel.system import System

NET = "sys/class/net"
PCI_ADDR = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")
CPU_FILES = ("rps_cpus", "xps_cpus")  # per queue: rx-N/rps_cpus, tx-N/xps_cpus
FEATURE_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


@dataclass(frozen=True)
class NicTarget(Target[V]):
    """A setting of one NIC, known by its stable identity (see NetPlugin.nic_identity).
    It is reached through the NIC's current name, which only the plugin knows (a NIC can
    be renamed), so its kind's verbs are given that name."""

    nic: str  # stable identity, see nic_identity

    def device(self) -> str:
        return self.nic

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(NIC),)

    @property
    def setting(self) -> str:
        """What the setting is called on its NIC ("coalesce rx-usecs", "queues/rx-0/rps_cpus")."""
        raise NotImplementedError

    def read_nic(self, system: System, name: str) -> V:
        raise NotImplementedError

    def write_nic(self, system: System, name: str, value: V) -> None:
        raise NotImplementedError

    def nic_exists(self, system: System, name: str) -> bool:
        """Whether the setting is there on the NIC (which is)."""
        return True

    def nic_files(self, ifname: Callable[[str], str | None]) -> tuple[str, ...]:
        """Files whose modification can change the setting; `ifname` gives the NIC's
        name now (None: gone), asked only by a kind that has files."""
        return ()

    def describe_nic(self, name: str, value: V) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class NicSetting(NicTarget[int | bool]):
    """An ethtool setting of one NIC: group "coalesce", "ring", "channels", "pause" or
    "feature", and its key (ethtool's name; for features the kernel's name). Over
    netlink (latencyd.kernel.ethtool), never a file."""

    kind: ClassVar[str] = "nic"
    refusal_means: ClassVar[str | None] = "the NIC's driver refused it"
    group: str
    key: str

    def problem(self) -> str | None:
        known = (*GROUPS, "feature")
        return None if self.group in known else f"no ethtool group {self.group!r} ({known})"

    @property
    def setting(self) -> str:
        return f"{self.group} {self.key}"

    def read_nic(self, system: System, name: str) -> int | bool:
        if self.group == "feature":
            features = system.ethtool.features(name)
            if self.key not in features.known:
                raise NotApplicable(f"this kernel has no NIC feature {self.key!r}")
            return self.key in features.active
        values = system.ethtool.read(name, self.group)
        if self.key not in values:
            raise NotApplicable(f"{name}'s driver does not report {self.group} {self.key}")
        return values[self.key]

    def write_nic(self, system: System, name: str, value: int | bool) -> None:
        if self.group == "feature":
            if self.key not in system.ethtool.features(name).changeable:
                raise NotApplicable(f"{name}: feature {self.key} is fixed by its driver")
            system.ethtool.set_feature(name, self.key, bool(value))
        else:
            system.ethtool.write(name, self.group, self.key, value)

    def describe_nic(self, name: str, value: int | bool) -> str:
        if self.group == "feature":
            return f"{name} feature {self.key} {'on' if value else 'off'}"
        shown = ("on" if value else "off") if isinstance(value, bool) else value
        return f"{name} {self.group} {self.key} = {shown}"


@dataclass(frozen=True)
class NicFile(NicTarget[str]):
    """A sysfs file of one NIC, relative to /sys/class/net/IF/ (queues/rx-0/rps_cpus); a
    queue's RPS/XPS CPUs are a mask in the file, a CPU list as a value. A queue's file
    goes with its queue (channels can remove it); a NIC-wide file the kernel lacks is not
    applicable, with the reason, not gone."""

    kind: ClassVar[str] = "nic_file"
    refusal_means: ClassVar[str | None] = "the kernel refused it for this NIC"
    path: str

    def problem(self) -> str | None:
        return None if plain_path(self.path) else f"NIC file {self.path!r} is not below the NIC"

    @property
    def setting(self) -> str:
        return self.path

    @property
    def cpus(self) -> bool:
        """Whether the file holds CPUs (rps_cpus, xps_cpus)."""
        return self.path.rsplit("/", 1)[-1] in CPU_FILES

    def read_nic(self, system: System, name: str) -> str:
        text = system.read(f"{NET}/{name}/{self.path}")
        return CpuSet.from_mask(text).to_list() if self.cpus else text

    def write_nic(self, system: System, name: str, value: str) -> None:
        text = str(value)
        if self.cpus:
            nr = max(system.online_cpus()) + 1
            text = CpuSet.from_list(text).to_mask(nr)
        system.write(f"{NET}/{name}/{self.path}", text)

    def same(self, system: System, wanted: str, actual: str) -> bool:
        return same_cpus(wanted, actual) if self.cpus else bool(wanted == actual)

    def nic_exists(self, system: System, name: str) -> bool:
        return not self.path.startswith("queues/") or system.exists(f"{NET}/{name}/{self.path}")

    def nic_files(self, ifname: Callable[[str], str | None]) -> tuple[str, ...]:
        name = ifname(self.nic)
        return (f"{NET}/{name}/{self.path}",) if name else ()

    def describe_nic(self, name: str, value: str) -> str:
        return f"{name} {self.path} = {value}"


@dataclass(frozen=True)
class Nic:
    """One network interface as found in sysfs."""

    name: str
    identity: str
    driver: str
    bus: str
    mac: str
    rx_queues: tuple[str, ...]
    tx_queues: tuple[str, ...]


@dataclass(frozen=True)
class NicRule:
    index: int  # its place among the section's [[net.nic]] entries, from 1
    options: NicOptions

    def matches(self, nic: Nic) -> bool:
        o = self.options
        if any(fnmatch.fnmatchcase(nic.name, g) for g in o.exclude):
            return False
        checks = [
            (o.match, nic.name),
            (o.driver, nic.driver),
            (o.bus, nic.bus),
            (o.mac, nic.mac),
        ]
        return all(
            any(fnmatch.fnmatchcase(value, g) for g in globs)
            for globs, value in checks
            if globs is not None
        )


@dataclass(frozen=True)
class NetRules:
    rules: tuple[NicRule, ...]
    queues: frozenset[tuple[str, str]] = frozenset()  # (NIC, queue) when expanded

    def rule_for(self, nic: Nic) -> NicRule | None:
        return next((r for r in self.rules if r.matches(nic)), None)


def _group_fields(group: str) -> Fields[int | bool]:
    kinds: tuple[tuple[str, Kind[int | bool]], ...] = tuple(
        (k.name, Bool() if k.flag else Int(0, 2**32 - 1)) for k in GROUPS[group].keys
    )
    return Fields(kinds, what=f"{group} key")


def _feature_name(name: str) -> str | None:
    if name in FEATURE_ALIASES or FEATURE_NAME.fullmatch(name):
        return None
    return f"{name!r} is not a feature name (ethtool's, like gro, or the kernel's, like rx-gro)"


# What chooses the NICs an entry applies to (the first entry that matches one wins).
NIC_SELECTORS = ("match", "driver", "bus", "mac", "exclude")


@dataclass(frozen=True)
class NicOptions:
    """One [[net.nic]] entry."""

    match: list[str] = option(
        ListOf(Str()),
        'Interface-name globs ("eth*", "enp3s0f*"); with driver, bus or mac, all must match',
        default=["*"],
    )
    driver: list[str] | None = option(ListOf(Str()), 'Driver-name globs ("mlx5_core", "ice")')
    bus: list[str] | None = option(ListOf(Str()), 'Bus-address globs ("0000:3b:00.*")')
    mac: list[str] | None = option(ListOf(Str()), 'MAC-address globs ("3c:fd:fe:*")')
    exclude: list[str] = option(
        ListOf(Str()),
        'Interface-name globs never tuned by this entry (setting it replaces the default ["lo"])',
        default=["lo"],
    )
    coalesce: dict[str, int | bool] | None = option(
        _group_fields("coalesce"), "Interrupt coalescing (ethtool -C)"
    )
    ring: dict[str, int | bool] | None = option(_group_fields("ring"), "Ring sizes (ethtool -G)")
    channels: dict[str, int | bool] | None = option(
        _group_fields("channels"), "Queue counts (ethtool -L)"
    )
    pause: dict[str, int | bool] | None = option(
        _group_fields("pause"), "Pause frames (ethtool -A)"
    )
    features: dict[str, bool] | None = option(
        Fields(check=_feature_name, kind=Bool(), what="feature"),
        'Offload features by ethtool name or kernel name ("gro", "rx-gro"; ethtool -K)',
    )
    rps_cpus: CpuSet | None = option(
        Cpus(allow_empty=True),
        'CPUs for receive packet steering on every rx queue ("none": off)',
    )
    xps_cpus: CpuSet | None = option(Cpus(allow_empty=True), "CPUs for transmit packet steering")
    napi_defer_hard_irqs: int | None = option(
        Int(0, 2**31 - 1), "NAPI polls to run before re-enabling the NIC's interrupt (0: none)"
    )
    gro_flush_timeout: int | None = option(
        Int(0, 2**63 - 1),
        "How long GRO may hold packets and the IRQ stays off (0: flush at once)",
        unit="ns",
    )

    def groups(self) -> dict[str, dict[str, int | bool]]:
        """The ethtool groups the entry sets, by name, in GROUPS' order."""
        given = {
            "coalesce": self.coalesce,
            "ring": self.ring,
            "channels": self.channels,
            "pause": self.pause,
        }
        return {g: values for g in GROUPS if (values := given[g]) is not None}


@dataclass(frozen=True)
class NetOptions:
    nic: tuple[NicOptions, ...] = table(
        NicOptions,
        "NIC entries: the first one that matches a NIC (all of match, driver, bus, "
        "mac it names) gives it its settings",
        selectors=NIC_SELECTORS,
    )


class NetPlugin(
    Plugin[NicTarget, NetRules, NetOptions], FollowsDevices[NetRules], FindsDeviceFiles[NicTarget]
):
    name = "net"
    summary = "NIC coalescing, rings, channels, pause, features, RPS/XPS and NAPI knobs"
    targets = (NicSetting, NicFile)
    example: ClassVar[dict[str, Any]] = {
        "nic": [{"coalesce": {"rx-frames": 3}, "features": {"gro": True}, "rps_cpus": "1"}]
    }
    # A channel change adds or removes queues (udev subsystem "queues"): their RPS/XPS.
    follows = Follows(
        udev={"net": frozenset({"add", "remove", "move"}), "queues": frozenset({"add", "remove"})}
    )
    schema = Schema(
        section=NetOptions,
        groups=(
            ("coalesce", ("nic.coalesce",)),
            ("steering", ("nic.rps_cpus", "nic.xps_cpus", "nic.napi_*", "nic.gro_*")),
        ),
    )

    def __init__(self, system: System) -> None:
        super().__init__(system)
        # identity -> (interface name, ifindex): a rename keeps the ifindex, so one read
        # of it tells whether the name still belongs to the NIC.
        self._names: dict[str, tuple[str, str]] = {}

    # -- the machine's NICs ----------------------------------------------------------------
    def nic_identity(self, ifname: str) -> str:
        """Where the NIC sits: its device's sysfs path and port (stable across renames,
        MAC changes and reboots); a NIC without a device (virtual) by its permanent MAC,
        else by its ifindex (a re-created virtual NIC is a new NIC)."""
        return self._identity(ifname, self._device(ifname))

    def _device(self, ifname: str) -> str | None:
        """The NIC's device, as a path below /sys (None: a virtual NIC)."""
        link = f"{NET}/{ifname}/device"
        return self.system.realpath(link) if self.system.exists(link) else None

    def _identity(self, ifname: str, device: str | None, ifindex: str = "") -> str:
        base = f"{NET}/{ifname}"
        if device is not None:
            port = (
                self.system.read(f"{base}/dev_port")
                if self.system.exists(f"{base}/dev_port")
                else "0"
            )
            return f"dev:{device.split('/devices/', 1)[-1]}/{port}"
        mac = self.system.read(f"{base}/address")
        if self.system.read(f"{base}/addr_assign_type") == "0" and mac.strip("0:"):
            return f"mac:{mac}"
        return f"ifindex:{ifindex or self.system.read(f'{base}/ifindex')}"

    @staticmethod
    def _bus(device: str | None) -> str:
        if device is None:
            return ""
        found = PCI_ADDR.findall(device)
        return found[-1] if found else device.rsplit("/", 1)[-1]

    def nic(self, ifname: str) -> Nic | None:
        """The NIC as sysfs shows it (each file read once: a burst of hundreds of NICs
        pays for every read); None for what is not a NIC (bonding_masters) or gone. It
        is remembered under its identity (see ifname)."""
        base = f"{NET}/{ifname}"
        try:
            ifindex = self.system.read(f"{base}/ifindex")
            device = self._device(ifname)
            if device is not None and self.system.exists(f"{base}/device/driver"):
                driver = self.system.realpath(f"{base}/device/driver").rsplit("/", 1)[-1]
            else:  # a virtual NIC: its driver is only known to ethtool (veth, tun, bonding)
                driver = self.system.ethtool.driver(ifname)
            queues = self.system.listdir(f"{base}/queues")
            nic = Nic(
                ifname,
                self._identity(ifname, device, ifindex),
                driver,
                self._bus(device),
                self.system.read(f"{base}/address"),
                tuple(q for q in queues if q.startswith("rx-")),
                tuple(q for q in queues if q.startswith("tx-")),
            )
        except KernelRefused:  # not a NIC, or it went away while we looked
            return None
        self._names[nic.identity] = (ifname, ifindex)
        return nic

    def nics(self) -> list[Nic]:
        found = [self.nic(name) for name in self.system.listdir(NET)]
        return [n for n in found if n is not None]

    def ifname(self, identity: str) -> str | None:
        """The NIC's current name (it may have been renamed), or None if it is gone."""
        cached = self._names.get(identity)
        if cached is not None:
            name, ifindex = cached
            try:
                if self.system.read(f"{NET}/{name}/ifindex") == ifindex:
                    return name
            except KernelRefused:
                pass
        self._names = {}
        for name in self.system.listdir(NET):
            self._remember(name)
        hit = self._names.get(identity)
        return hit[0] if hit else None

    def _remember(self, ifname: str) -> str | None:
        try:
            identity = self.nic_identity(ifname)
            self._names[identity] = (ifname, self.system.read(f"{NET}/{ifname}/ifindex"))
        except KernelRefused:
            return None
        return identity

    def _name(self, target: NicTarget) -> str:
        name = self.ifname(target.nic)
        if name is None:
            raise NotApplicable(f"NIC {target.nic} is gone")
        return name

    # -- what a section wants ----------------------------------------------------------------
    @staticmethod
    def nic_settings(rule: NicRule, nic: Nic) -> Settings:
        o = rule.options
        settings: Settings = {}
        for group, values in o.groups().items():
            for key, value in values.items():
                settings[NicSetting(nic.identity, group, key)] = value
        for feature, on in (o.features or {}).items():
            for name in FEATURE_ALIASES.get(feature, (feature,)):
                settings[NicSetting(nic.identity, "feature", name)] = on
        steering = (
            ("rps_cpus", o.rps_cpus, nic.rx_queues),
            ("xps_cpus", o.xps_cpus, nic.tx_queues),
        )
        for file, cpus, queues in steering:
            if cpus is not None:
                for queue in queues:
                    settings[NicFile(nic.identity, f"queues/{queue}/{file}")] = cpus.to_list()
        napi = {
            "napi_defer_hard_irqs": o.napi_defer_hard_irqs,
            "gro_flush_timeout": o.gro_flush_timeout,
        }
        for file, number in napi.items():
            if number is not None:
                settings[NicFile(nic.identity, file)] = str(number)
        return settings

    def changed(self, rules: NetRules | None) -> bool:
        """NICs or queues other than when expanded: the safety net behind udev events."""
        return rules is not None and rules.queues != self._queues()

    def _queues(self) -> frozenset[tuple[str, str]]:
        return frozenset((n.identity, q) for n in self.nics() for q in n.rx_queues + n.tx_queues)

    def expand(self, options: NetOptions, owned: Mapping[Target, Value]) -> Expansion[NetRules]:
        entries = tuple(NicRule(i, r) for i, r in enumerate(options.nic, 1))
        rules = NetRules(entries, self._queues())
        settings: Settings = {}
        for nic in self.nics():
            rule = rules.rule_for(nic)
            if rule is not None:
                settings.update(self.nic_settings(rule, nic))
        return Expansion(settings, rules)

    def on_device(
        self, rules: NetRules | None, event: DeviceEvent, owned: Mapping[Target, Value]
    ) -> tuple[Settings, set[Target]] | None:
        """Just the NIC the event is about: tuned as it appears or is renamed, or as its
        queues come and go (a channel change, and every new NIC); its settings dropped when
        it goes (or stops matching after a rename)."""
        if rules is None:
            return None
        name = event.name
        if event.subsystem == "queues":  # DEVPATH .../net/NIC/queues/rx-N: that NIC again
            name = PurePosixPath(event.devpath).parent.parent.name
            if not name:
                return None  # no path to tell whose: expand again
        elif event.action == "remove":
            return {}, self._gone(event.name, owned)
        nic = self.nic(name)
        if nic is None:
            return {}, set()
        rule = rules.rule_for(nic)
        settings = self.nic_settings(rule, nic) if rule is not None else {}
        return settings, of_device(owned, nic.identity)

    def _gone(self, ifname: str, owned: Mapping[Target, Value]) -> set[Target]:
        """The owned settings of the NIC that was `ifname` and is gone: found by the names
        remembered for each NIC (a burst of removals costs each its own NIC's settings),
        else, for a NIC never seen under that name, by asking every owned setting."""
        known = [i for i, (name, _) in self._names.items() if name == ifname]
        if known:
            return {t for i in known if not self._still_there(i) for t in of_device(owned, i)}
        return {t for t in owned if isinstance(t, NicTarget) and not self.exists(t)}

    def _still_there(self, identity: str) -> bool:
        """Whether the NIC remembered under `identity` is there, under whatever name: a
        rename keeps the ifindex."""
        ifindex = self._names[identity][1]
        now = self.system.interface_name(int(ifindex)) if ifindex.isdigit() else None
        if now is None:
            del self._names[identity]
            return False
        self._names[identity] = (now, ifindex)
        return True

    # -- one target: the kind's, on the NIC's name now ----------------------------------------
    def read(self, target: NicTarget) -> Value:
        value: Value = target.read_nic(self.system, self._name(target))  # its kind's
        return value

    def write(self, target: NicTarget, value: Value) -> None:
        target.write_nic(self.system, self._name(target), value)

    def exists(self, target: NicTarget) -> bool:
        """The NIC is there, and the setting on it (a queue's file: the queue)."""
        name = self.ifname(target.nic)
        return name is not None and target.nic_exists(self.system, name)

    def watch_files(self, target: NicTarget) -> tuple[str, ...]:
        return target.nic_files(self.ifname)

    def describe(self, target: NicTarget, value: Value) -> str:
        return target.describe_nic(self.ifname(target.nic) or target.nic, value)

    # -- monitoring --------------------------------------------------------------------------
    def queue_irqs(self, nic: Nic) -> list[tuple[int, str]]:
        """(IRQ, its CPUs) of the NIC's queues: MSI vectors of its device, else IRQs named
        after the interface or its virtio device."""
        numbers: set[int] = set()
        msi = f"{NET}/{nic.name}/device/msi_irqs"
        device = ""
        if self.system.exists(f"{NET}/{nic.name}/device"):
            device = self.system.realpath(f"{NET}/{nic.name}/device").rsplit("/", 1)[-1]
        numbers.update(int(n) for n in self.system.listdir(msi) if n.isdigit())
        try:
            interrupts = self.system.read("proc/interrupts").splitlines()[1:]
        except KernelRefused:
            interrupts = []
        prefixes = tuple(p for p in (f"{nic.name}-", f"{device}-") if p != "-")
        for line in interrupts:
            label, _, rest = line.partition(":")
            if (
                label.strip().isdigit()
                and prefixes
                and any(word.startswith(prefixes) for word in rest.split())
            ):
                numbers.add(int(label))
        out = []
        for n in sorted(numbers):
            try:
                out.append((n, self.system.read(f"proc/irq/{n}/smp_affinity_list")))
            except KernelRefused:
                continue
        return out

    def monitor(self, rules: NetRules | None) -> Monitor:
        if rules is None:
            return Monitor()
        nic_rows = []
        setting_rows = []
        for nic in self.nics():
            rule = rules.rule_for(nic)
            irqs = ", ".join(f"{n}@{cpus}" for n, cpus in self.queue_irqs(nic)) or "-"
            nic_rows.append(
                (nic.name, nic.identity, nic.driver or "-", rule.index if rule else "-", irqs)
            )
            if rule is None:
                continue
            for target, wanted in self.nic_settings(rule, nic).items():
                assert isinstance(target, NicTarget)
                try:
                    actual: Value = self.read(target)
                except (KernelRefused, NotApplicable) as exc:
                    actual = f"n/a: {exc}"
                setting_rows.append((nic.name, target.setting, wanted, actual))
        return Monitor(
            (
                Table(
                    "NICs: the [[net.nic]] entry that matched, and queue IRQs (IRQ@CPUs)",
                    ("NIC", "identity", "driver", "entry", "queue IRQs"),
                    tuple(nic_rows),
                ),
                Table(
                    "NIC settings: wanted and actual",
                    ("NIC", "setting", "wanted", "actual"),
                    tuple(setting_rows),
                ),
            )
        )
