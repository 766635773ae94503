"""The net plugin on a fake /sys/class/net and a fake ethtool backend that refuses like drivers."""

from __future__ import annotations

import copy
import errno
import logging
import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.net import NetPlugin, NetRules, NicFile, NicSetting

from latencyd.core.capabilities import files_to_watch
from latencyd.core.engine import Engine, Refused, SettingId, plugin_options, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import (
    DeviceEvent,
    Expansion,
    Monitor,
    Target,
    Value,
    decode_target,
    encode_target,
    target_kinds,
)
from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import SchemaError, validate
from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, NotApplicable
from latencyd.kernel.ethtool import FEATURE_ALIASES, GROUPS
from latencyd.kernel.system import Machine, System
from latencyd.service.daemon import Daemon, without_covered
from tests.unit.fakesys import (
    FakeEthtool,
    FakeNic,
    add_irqs,
    add_nic,
    make_fake_root,
    put,
    rename_nic,
    tree_values,
)
from tests.wanted import wanted as keyed_wanted

NET = "sys/class/net"
ETH0_MAC = "3c:fd:fe:00:00:01"
ETH0 = "dev:pci0000:00/0000:3b:00.0/0"  # an ice port: its device's sysfs path and port
ETH1 = "dev:pci0000:00/0000:00:04.0/virtio3/0"  # virtio_net, random MAC, under a PCI slot
LO = "ifindex:1"
TAP0 = "ifindex:9"
VETH0 = "ifindex:10"
IDENTITIES = {"lo": LO, "eth0": ETH0, "eth1": ETH1, "tap0": TAP0, "veth0": VETH0}

DRIVER = "the NIC's driver refused it"  # NicSetting.refusal_means
UNSUPPORTED = "cannot modify an unsupported parameter: Invalid argument (EINVAL)"
ENOTSUP = "Operation not supported (ENOTSUP)"  # what EOPNOTSUPP reads as


def ice() -> FakeNic:
    """An Intel E810 port: adaptive coalescing but no frame counts (ice has no max_frames)."""
    return FakeNic(
        values={
            "coalesce": {"rx-usecs": 50, "tx-usecs": 50, "adaptive-rx": True, "adaptive-tx": True},
            "ring": {"rx": 512, "tx": 512},
            "channels": {"combined": 2, "other": 1},
            "pause": {"autoneg": False, "rx": True, "tx": True},
        },
        features={
            "rx-gro": True,
            "rx-lro": False,
            "rx-checksum": True,
            "rx-hashing": True,
            "tx-scatter-gather": True,
            "tx-tcp-segmentation": True,
            "tx-tcp6-segmentation": True,
            "tx-generic-segmentation": True,
        },
        # rx-lro (no LRO in ice) and rx-hashing are fixed here.
        changeable={
            "rx-gro",
            "rx-checksum",
            "tx-scatter-gather",
            "tx-tcp-segmentation",
            "tx-tcp6-segmentation",
            "tx-generic-segmentation",
        },
        limits={("ring", "rx"): 4096, ("ring", "tx"): 4096, ("channels", "combined"): 8},
    )


def virtio() -> FakeNic:
    """virtio_net without VIRTIO_NET_F_VQ_NOTF_COAL: adaptive-rx is taken and kept."""
    return FakeNic(
        values={
            "coalesce": {"rx-usecs": 0, "tx-usecs": 0, "rx-frames": 0, "tx-frames": 1},
            "ring": {"rx": 256, "tx": 256},
            "channels": {"combined": 1},
        },
        features={"rx-gro": True, "rx-lro": False},
        changeable={"rx-gro"},
        ignored={("coalesce", "adaptive-rx")},
        limits={("ring", "rx"): 256, ("ring", "tx"): 256, ("channels", "combined"): 1},
    )


def tap() -> FakeNic:
    """tun/tap: the only coalescing parameter is rx-frames (napi batching)."""
    return FakeNic(
        values={"coalesce": {"rx-frames": 0}},
        features={"rx-gro": True},
        changeable={"rx-gro"},
    )


def veth() -> FakeNic:
    """A veth whose coalescing settings are readable but every write is EOPNOTSUPP."""
    return FakeNic(
        values={"coalesce": {"rx-usecs": 8}, "channels": {"combined": 1}},
        features={"rx-gro": False},
        changeable={"rx-gro"},
        refused={"coalesce": errno.EOPNOTSUPP},
    )


class DriverLikeEthtool(FakeEthtool):
    """FakeEthtool plus two things the kernel does that some tests need.

    A coalescing key the driver does not support is still in the GET reply when its value
    is not 0 (coalesce_put_u32), and a write to it is EINVAL: `unsupported` lists such
    (ifname, group, key). And a channel change adds or removes the NIC's queues/rx-N and
    tx-N directories, as netif_set_real_num_{rx,tx}_queues do.
    """

    def __init__(self, root: Path, nics: dict[str, FakeNic]) -> None:
        super().__init__(nics)
        self.root = root
        self.unsupported: set[tuple[str, str, str]] = set()

    def write(self, ifname: str, group: str, key: str, value: int | bool) -> None:
        if (ifname, group, key) in self.unsupported:
            self.writes.append((ifname, group, key, value))
            raise KernelRefused(f"setting {ifname} {group} {key} = {value}", UNSUPPORTED)
        super().write(ifname, group, key, value)
        if group == "channels":
            channels = self.nics[ifname].values["channels"]
            combined = int(channels.get("combined", 0))
            self._queues(ifname, "rx", combined + int(channels.get("rx", 0)), "rps_cpus")
            self._queues(ifname, "tx", combined + int(channels.get("tx", 0)), "xps_cpus")

    def _queues(self, ifname: str, kind: str, count: int, cpu_file: str) -> None:
        base = self.root / NET / ifname / "queues"
        for queue in base.glob(f"{kind}-*"):
            if int(queue.name.split("-")[1]) >= count:
                shutil.rmtree(queue)
        for n in range(count):
            if not (base / f"{kind}-{n}").exists():
                put(self.root, f"{NET}/{ifname}/queues/{kind}-{n}/{cpu_file}", "0")


class Rig:
    """A 4-CPU machine with lo, an ice port (eth0, 2 queues), a virtio NIC (eth1), a tap
    (tap0) and a veth (veth0)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.root = root = make_fake_root(tmp_path, cpus="0-3", defaults=False)
        add_nic(root, "lo", 1, mac="00:00:00:00:00:00", assign=0)
        add_nic(root, "eth0", 2, ETH0_MAC, assign=0, bus="0000:3b:00.0", driver="ice", queues=2)
        add_nic(root, "eth1", 3, bus="0000:00:04.0/virtio3", driver="virtio_net")
        add_nic(root, "tap0", 9)
        add_nic(root, "veth0", 10)
        self.ethtool = DriverLikeEthtool(
            root,
            {
                "lo": FakeNic(features={"rx-checksum": True}),
                "eth0": ice(),
                "eth1": virtio(),
                "tap0": tap(),
                "veth0": veth(),
            },
        )
        self.system = System(root, ethtool=self.ethtool)
        self.plugin = NetPlugin(self.system)
        self.machine = Machine(CpuSet.from_list("0-3"), 8 << 30)
        self.state_dir = tmp_path / "state"

    # -- the machine -------------------------------------------------------------------
    def snapshot(self) -> tuple[dict[str, str], dict[str, Any]]:
        """Every sysfs file and every NIC's ethtool values and features, to compare."""
        nics = {
            n: (copy.deepcopy(nic.values), dict(nic.features))
            for n, nic in self.ethtool.nics.items()
        }
        return tree_values(self.root, "sys"), nics

    def rename(self, old: str, new: str) -> None:
        """`ip link set OLD name NEW`: sysfs and the netlink backend both see the new name."""
        rename_nic(self.root, old, new)
        self.ethtool.nics[new] = self.ethtool.nics.pop(old)

    def unplug(self, name: str) -> None:
        shutil.rmtree(self.root / NET / name)
        del self.ethtool.nics[name]

    def file(self, name: str, path: str) -> str:
        return (self.root / NET / name / path).read_text().strip()

    def values(self, name: str, group: str) -> dict[str, int | bool]:
        return self.ethtool.nics[name].values[group]

    def features(self, name: str) -> dict[str, bool]:
        return self.ethtool.nics[name].features

    # -- the plugin and the engine -----------------------------------------------------------
    def section(self, raw: dict[str, Any]) -> dict[str, Any]:
        """A section as a profile holds it: validated, with the engine's `on_drift` too."""
        return validate(section_schemas({"net": self.plugin})["net"], raw, self.machine)

    def expand(self, *entries: dict[str, Any]) -> Expansion:
        section = plugin_options(self.section({"nic": list(entries)}))
        return self.plugin.expand(self.plugin.options_of(section), {})

    def wanted(self, *entries: dict[str, Any]) -> dict[SettingId, Value]:
        return keyed_wanted(self.plugin, plugin_options(self.section({"nic": list(entries)})))

    def engine(self) -> Engine:
        return Engine({"net": self.plugin}, Journal(self.state_dir))

    def library(self, text: str) -> ProfileLibrary:
        pdir = self.tmp_path / "profiles"
        pdir.mkdir(exist_ok=True)
        (pdir / "p.toml").write_text(textwrap.dedent(text).lstrip("\n"))
        return ProfileLibrary([pdir], section_schemas({"net": self.plugin}), self.machine)

    def daemon(self, text: str) -> Daemon:
        daemon = Daemon(self.system, {"net": self.plugin}, self.library(text), self.engine())
        daemon.switch("p")
        return daemon


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One rig shared by the tests that only look (validate, expand): checked unchanged."""
    rig = Rig(tmp_path_factory.mktemp("shared"))
    pristine = rig.snapshot()
    yield rig
    assert rig.snapshot() == pristine
    assert rig.ethtool.writes == []


def target(nic: str, key: str) -> Target:
    """One NIC's target by a short name: "coalesce rx-usecs", or a sysfs file's path."""
    if "/" in key or key in ("napi_defer_hard_irqs", "gro_flush_timeout"):
        return NicFile(nic, key)
    group, _, name = key.partition(" ")
    return NicSetting(nic, group, name)


def targets(nic: str, *keys: str) -> set[Target]:
    return {target(nic, k) for k in keys}


def on(nic: str, settings: dict[str, Any]) -> dict[Target, Value]:
    """Settings for one NIC, by short names (see `target`)."""
    return {target(nic, k): v for k, v in settings.items()}


def names_cache(rig: Rig) -> dict[str, str]:
    """The plugin's identity -> name cache, checked to hold nothing else: each entry is
    (name, ifindex) of a NIC as it was when last seen."""
    out = {}
    for identity, (name, ifindex) in rig.plugin._names.items():
        assert isinstance(identity, str) and identity.split(":")[0] in ("mac", "dev", "ifindex")
        assert isinstance(name, str) and isinstance(ifindex, str) and ifindex.isdigit()
        out[identity] = name
    return out


def nic_of(target: Target) -> str:
    assert isinstance(target, NicSetting | NicFile)
    return target.nic


def net(settings: dict[Target, Value]) -> dict[SettingId, Value]:
    return {("net", t): v for t, v in settings.items()}


def refused(nic: str, reasons: dict[str, tuple[Value, str]]) -> dict[SettingId, Refused]:
    """The engine's not-applicable entries for one NIC: short name -> (wanted, reason)."""
    return {("net", target(nic, k)): Refused(w, why) for k, (w, why) in reasons.items()}


# -- schema -----------------------------------------------------------------------------------


def test_schema_takes_every_key_of_every_group_with_its_type(shared: Rig) -> None:
    entry: dict[str, Any] = {
        group: {k.name: k.flag or 7 for k in g.keys} for group, g in GROUPS.items()
    }
    [nic] = shared.section({"nic": [entry]})["nic"]
    for group, g in GROUPS.items():
        assert nic[group] == {k.name: True if k.flag else 7 for k in g.keys}
        assert all(
            type(v) is (bool if k.flag else int)
            for k, v in zip(g.keys, nic[group].values(), strict=True)
        )
    # The flags are ethtool's on/off keys; everything else is a number.
    flags = {(group, k.name) for group, g in GROUPS.items() for k in g.keys if k.flag}
    assert flags == {
        ("coalesce", "adaptive-rx"),
        ("coalesce", "adaptive-tx"),
        ("coalesce", "cqe-mode-tx"),
        ("coalesce", "cqe-mode-rx"),
        ("ring", "tx-push"),
        ("ring", "rx-push"),
        ("pause", "autoneg"),
        ("pause", "rx"),
        ("pause", "tx"),
    }
    for group, g in GROUPS.items():
        for k in g.keys:
            wrong: Any = 1 if k.flag else True
            expected = (
                "expected true or false, got 1" if k.flag else "expected an integer, got True"
            )
            with pytest.raises(SchemaError) as info:
                shared.section({"nic": [{group: {k.name: wrong}}]})
            assert info.value.path == ("nic", 0, group)
            assert info.value.message == f"{group}: {k.name}: {expected}"
    with pytest.raises(SchemaError, match=r"^ring: rx: -1 is below the minimum 0$"):
        shared.section({"nic": [{"ring": {"rx": -1}}]})
    with pytest.raises(SchemaError, match=r"^coalesce: rx-usecs: 4294967296 is above the maximum"):
        shared.section({"nic": [{"coalesce": {"rx-usecs": 1 << 32}}]})


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_schema_unknown_key_lists_the_known_ones(shared: Rig, group: str) -> None:
    with pytest.raises(SchemaError) as info:
        shared.section({"nic": [{group: {"rx_usecs": 0}}]})
    known = ", ".join(k.name for k in GROUPS[group].keys)
    assert info.value.message == f"{group}: unknown {group} key 'rx_usecs' (known: {known})"


def test_schema_features_by_ethtool_or_kernel_name(shared: Rig) -> None:
    names = [*FEATURE_ALIASES, "rx-gro", "rx-udp-gro-forwarding", "tx-udp-segmentation"]
    [nic] = shared.section({"nic": [{"features": dict.fromkeys(names, False)}]})["nic"]
    assert nic["features"] == dict.fromkeys(names, False)
    for garbage in ("GRO", "rx_gro", "-gro", "gro lro", "", "rx-gro!"):
        with pytest.raises(SchemaError) as info:
            shared.section({"nic": [{"features": {garbage: False}}]})
        assert info.value.message == (
            f"features: {garbage!r} is not a feature name "
            "(ethtool's, like gro, or the kernel's, like rx-gro)"
        )
    with pytest.raises(SchemaError, match=r"^features: gro: expected true or false, got 0$"):
        shared.section({"nic": [{"features": {"gro": 0}}]})
    with pytest.raises(SchemaError, match=r"^features: expected a table like"):
        shared.section({"nic": [{"features": ["gro"]}]})


def test_schema_defaults_cpus_and_numbers(shared: Rig) -> None:
    [nic] = shared.section({"nic": [{}]})["nic"]
    assert nic == {"match": ["*"], "exclude": ["lo"]}
    [nic] = shared.section(
        {"nic": [{"match": "eth*", "driver": "ice", "rps_cpus": "none", "xps_cpus": "all - 0"}]}
    )["nic"]
    assert nic["match"] == ["eth*"] and nic["driver"] == ["ice"]
    assert nic["rps_cpus"] == CpuSet() and nic["rps_cpus"].to_list() == ""
    assert nic["xps_cpus"] == CpuSet.from_list("1-3")
    assert shared.section({"nic": [{"exclude": []}]})["nic"][0]["exclude"] == []
    for raw, message in (
        ({"rps_cpus": ""}, "rps_cpus: empty CPU list (write 'none' for no CPUs)"),
        ({"xps_cpus": "4"}, "xps_cpus: CPU list '4' names CPUs 4 that are not online"),
        ({"napi_defer_hard_irqs": -1}, "napi_defer_hard_irqs: -1 is below the minimum 0"),
        ({"napi_defer_hard_irqs": 1 << 31}, "napi_defer_hard_irqs: 2147483648 is above"),
        ({"gro_flush_timeout": "soon"}, "gro_flush_timeout: expected an integer, got 'soon'"),
        ({"speed": 1000}, "unknown option 'speed' (known options: match, driver, bus, mac"),
    ):
        with pytest.raises(SchemaError) as info:
            shared.section({"nic": [raw]})
        assert info.value.message.startswith(message)


ISSUE_EXAMPLE = """
[variables]
housekeeping = "0-1"

[[net.nic]]
match = "eth*"
coalesce = { rx-usecs = 0, tx-usecs = 0, adaptive-rx = false, rx-frames = 1 }
ring = { rx = 4096 }
channels = { combined = 4 }
features = { gro = false, lro = false }
pause = { rx = false, tx = false }
rps_cpus = "${housekeeping}"
xps_cpus = "${housekeeping}"
napi_defer_hard_irqs = 0
gro_flush_timeout = 0
"""


def test_the_issues_example_loads_as_written_and_applies(rig: Rig) -> None:
    pristine = rig.snapshot()
    profile = rig.library(ISSUE_EXAMPLE).load("p")
    housekeeping = CpuSet.from_list("0-1")
    assert profile.variables == {"housekeeping": "0-1"}
    assert profile.sections == {
        "net": {
            "nic": [
                {
                    "match": ["eth*"],
                    "coalesce": {
                        "rx-usecs": 0,
                        "tx-usecs": 0,
                        "adaptive-rx": False,
                        "rx-frames": 1,
                    },
                    "ring": {"rx": 4096},
                    "channels": {"combined": 4},
                    "features": {"gro": False, "lro": False},
                    "pause": {"rx": False, "tx": False},
                    "rps_cpus": housekeeping,
                    "xps_cpus": housekeeping,
                    "napi_defer_hard_irqs": 0,
                    "gro_flush_timeout": 0,
                    "exclude": ["lo"],
                }
            ],
            "on_drift": "reapply",
        }
    }
    expansion = rig.engine().expand(profile)["net"]
    common = {
        "coalesce rx-usecs": 0,
        "coalesce tx-usecs": 0,
        "coalesce adaptive-rx": False,
        "coalesce rx-frames": 1,
        "ring rx": 4096,
        "channels combined": 4,
        "pause rx": False,
        "pause tx": False,
        "feature rx-gro": False,
        "feature rx-lro": False,
        "queues/rx-0/rps_cpus": "0-1",
        "queues/tx-0/xps_cpus": "0-1",
        "napi_defer_hard_irqs": "0",
        "gro_flush_timeout": "0",
    }
    eth0 = {**common, "queues/rx-1/rps_cpus": "0-1", "queues/tx-1/xps_cpus": "0-1"}
    assert expansion.settings == on(ETH0, eth0) | on(ETH1, common)

    engine = rig.engine()
    report = engine.apply(profile)
    assert report.not_applicable == refused(
        ETH0, {"coalesce rx-frames": (1, "eth0's driver does not report coalesce rx-frames")}
    ) | refused(
        ETH1,
        {
            "coalesce adaptive-rx": (False, "eth1's driver does not report coalesce adaptive-rx"),
            "ring rx": (4096, f"{DRIVER}: requested ring size exceeds maximum: Invalid argument"),
            "channels combined": (
                4,
                f"{DRIVER}: requested ring size exceeds maximum: Invalid argument",
            ),
            "pause rx": (False, f"{DRIVER}: {ENOTSUP}"),
            "pause tx": (False, f"{DRIVER}: {ENOTSUP}"),
        },
    )
    assert rig.values("eth0", "coalesce") == {
        "rx-usecs": 0,
        "tx-usecs": 0,
        "adaptive-rx": False,
        "adaptive-tx": True,
    }
    assert rig.values("eth0", "ring") == {"rx": 4096, "tx": 512}
    assert rig.values("eth0", "channels") == {"combined": 4, "other": 1}
    assert rig.values("eth0", "pause") == {"autoneg": False, "rx": False, "tx": False}
    assert rig.features("eth0")["rx-gro"] is False and rig.features("eth1")["rx-gro"] is False
    assert rig.file("eth0", "queues/rx-1/rps_cpus") == "3"
    assert rig.file("eth1", "queues/tx-0/xps_cpus") == "3"
    assert engine.verify() == []
    assert engine.off() == []
    assert rig.snapshot() == pristine


# -- identity -----------------------------------------------------------------------------------


def test_identity_is_the_device_path_else_the_permanent_mac_else_ifindex(rig: Rig) -> None:
    # lo's address is all zeros: not a MAC to know it by, and it has no device.
    assert {n.name: n.identity for n in rig.plugin.nics()} == IDENTITIES
    put(rig.root, f"{NET}/eth1/dev_port", "1")  # the second port of one PCI function
    assert rig.plugin.nic_identity("eth1") == "dev:pci0000:00/0000:00:04.0/virtio3/1"
    (rig.root / NET / "eth1/dev_port").unlink()
    assert rig.plugin.nic_identity("eth1") == ETH1
    # A physical NIC whose MAC is not its permanent one is known by where it sits.
    add_nic(rig.root, "eth2", 4, "02:00:00:00:00:04", assign=3, bus="0000:3b:00.1", driver="ice")
    assert rig.plugin.nic_identity("eth2") == "dev:pci0000:00/0000:3b:00.1/0"
    # A virtual NIC with a permanent MAC is known by it.
    add_nic(rig.root, "dummy0", 5, "02:aa:00:00:00:05", assign=0)
    assert rig.plugin.nic_identity("dummy0") == "mac:02:aa:00:00:00:05"
    eth1 = rig.plugin.nic("eth1")
    assert eth1 is not None
    assert (eth1.driver, eth1.bus, eth1.rx_queues, eth1.tx_queues) == (
        "virtio_net",
        "0000:00:04.0",
        ("rx-0",),
        ("tx-0",),
    )
    assert rig.plugin.nic("gone0") is None


def test_ifname_follows_a_rename_and_is_none_once_the_nic_is_gone(rig: Rig) -> None:
    for identity, name in ((ETH0, "lan0"), (VETH0, "peer0"), (ETH1, "wan0")):
        old = next(n for n, i in IDENTITIES.items() if i == identity)
        assert rig.plugin.ifname(identity) == old
        rig.rename(old, name)
        assert rig.plugin.ifname(identity) == name
    # The name of a NIC that went away is not handed to the one that takes its name.
    rig.unplug("peer0")
    add_nic(rig.root, "peer0", 11)
    assert rig.plugin.ifname(VETH0) is None
    assert rig.plugin.ifname("ifindex:11") == "peer0"
    assert rig.plugin.ifname("mac:00:11:22:33:44:55") is None
    assert names_cache(rig) == {n.identity: n.name for n in rig.plugin.nics()}


def test_the_bonding_drivers_bonding_masters_file_is_not_a_nic(rig: Rig) -> None:
    """With the bonding module loaded, /sys/class/net/bonding_masters is a file."""
    put(rig.root, f"{NET}/bonding_masters", "bond0")
    add_nic(rig.root, "bond0", 30)
    rig.ethtool.nics["bond0"] = FakeNic()
    assert {n.name for n in rig.plugin.nics()} == {*IDENTITIES, "bond0"}
    settings = rig.expand({"match": "bond*", "napi_defer_hard_irqs": 1}).settings
    assert settings == {NicFile("ifindex:30", "napi_defer_hard_irqs"): "1"}


def test_usb_nics_on_one_host_controller_have_distinct_identities(rig: Rig) -> None:
    """Two USB NICs with random MACs (cdc_ether, rndis tethering) on one xHCI controller:
    their device links lead to .../0000:00:14.0/usb1/1-N/1-N:1.0."""
    add_nic(rig.root, "usb0", 20, bus="0000:00:14.0/usb1/1-1/1-1:1.0", driver="cdc_ether")
    add_nic(rig.root, "usb1", 21, bus="0000:00:14.0/usb1/1-2/1-2:1.0", driver="cdc_ether")
    usb0, usb1 = rig.plugin.nic_identity("usb0"), rig.plugin.nic_identity("usb1")
    assert usb0 != usb1, f"both are {usb0}: the settings of one would go to the other"


# -- matching ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "names"),
    [
        ({}, {"eth0", "eth1", "tap0", "veth0"}),  # virtual NICs too, not lo
        ({"match": "eth*"}, {"eth0", "eth1"}),
        ({"match": ["tap*", "veth?"]}, {"tap0", "veth0"}),
        ({"driver": "virtio*"}, {"eth1"}),
        ({"bus": "0000:3b:*"}, {"eth0"}),
        ({"mac": "3c:fd:fe:*"}, {"eth0"}),
        ({"mac": "5a:00:00:00:00:0?"}, {"eth1", "tap0", "veth0"}),
        ({"match": "eth*", "driver": ["ice", "i40e"]}, {"eth0"}),  # all that are given
        ({"match": "tap*", "driver": "ice"}, set()),
        ({"match": "eth*", "bus": "0000:00:04.0", "mac": "5a:*"}, {"eth1"}),
        ({"exclude": "eth1"}, {"lo", "eth0", "tap0", "veth0"}),  # replaces the default
        ({"match": "*", "exclude": ["eth*", "lo"]}, {"tap0", "veth0"}),
        ({"match": "lo"}, set()),  # lo is excluded unless exclude says otherwise
        ({"match": "lo", "exclude": []}, {"lo"}),
    ],
)
def test_entries_select_nics(shared: Rig, entry: dict[str, Any], names: set[str]) -> None:
    settings = shared.expand(entry | {"napi_defer_hard_irqs": 1}).settings
    by_identity = {i: n for n, i in IDENTITIES.items()}
    assert {by_identity[nic_of(t)] for t in settings} == names
    assert all(t == NicFile(nic_of(t), "napi_defer_hard_irqs") for t in settings)


def test_the_first_matching_entry_wins_and_entries_are_not_merged(shared: Rig) -> None:
    expansion = shared.expand(
        {"match": "eth0", "napi_defer_hard_irqs": 1},
        {"match": ["eth*", "tap*"], "napi_defer_hard_irqs": 2, "gro_flush_timeout": 5000},
        {"napi_defer_hard_irqs": 3},
    )
    assert expansion.settings == {
        NicFile(ETH0, "napi_defer_hard_irqs"): "1",
        NicFile(ETH1, "napi_defer_hard_irqs"): "2",
        NicFile(ETH1, "gro_flush_timeout"): "5000",
        NicFile(TAP0, "napi_defer_hard_irqs"): "2",
        NicFile(TAP0, "gro_flush_timeout"): "5000",
        NicFile(VETH0, "napi_defer_hard_irqs"): "3",
    }
    assert isinstance(expansion.rules, NetRules)
    assert [r.index for r in expansion.rules.rules] == [1, 2, 3]
    assert expansion.notes == {} and expansion.refused == {}


# -- expand -----------------------------------------------------------------------------------


EVERYTHING = {
    "match": "eth0",
    "coalesce": {"rx-usecs": 8, "adaptive-rx": False},
    "ring": {"rx": 1024, "tx": 2048},
    "channels": {"combined": 2},
    "pause": {"autoneg": False, "rx": False},
    "features": {"gro": False, "tso": False, "rx-hashing": True},
    "rps_cpus": "2-3",
    "xps_cpus": "0",
    "napi_defer_hard_irqs": 2,
    "gro_flush_timeout": 200000,
}


def test_expand_gives_every_setting_of_each_matched_nic(shared: Rig) -> None:
    second = {"match": "tap*", "features": {"lro": True}, "rps_cpus": "none"}
    assert shared.expand(EVERYTHING, second).settings == on(
        ETH0,
        {
            "ring rx": 1024,
            "ring tx": 2048,
            "channels combined": 2,
            "coalesce rx-usecs": 8,
            "coalesce adaptive-rx": False,
            "pause autoneg": False,
            "pause rx": False,
            "feature rx-gro": False,  # ethtool's names stand for the kernel's
            "feature tx-tcp-segmentation": False,
            "feature tx-tcp-ecn-segmentation": False,
            "feature tx-tcp-mangleid-segmentation": False,
            "feature tx-tcp6-segmentation": False,
            "feature rx-hashing": True,
            "queues/rx-0/rps_cpus": "2-3",  # per queue, as cpulists
            "queues/rx-1/rps_cpus": "2-3",
            "queues/tx-0/xps_cpus": "0",
            "queues/tx-1/xps_cpus": "0",
            "napi_defer_hard_irqs": "2",
            "gro_flush_timeout": "200000",
        },
    ) | on(TAP0, {"feature rx-lro": True, "queues/rx-0/rps_cpus": ""})


def test_expand_changes_nothing_and_keeps_nothing_but_names(rig: Rig) -> None:
    assert rig.plugin.ifname(ETH1) == "eth1"  # fill the name cache
    rig.rename("eth1", "wan0")  # and make it stale
    before = {k: copy.deepcopy(v) for k, v in vars(rig.plugin).items() if k != "system"}
    tree = rig.snapshot()
    first = rig.expand(EVERYTHING, {"match": "*", "napi_defer_hard_irqs": 1})
    second = rig.expand(EVERYTHING, {"match": "*", "napi_defer_hard_irqs": 1})
    assert first == second
    after = vars(rig.plugin)
    assert after["system"] is rig.system
    assert {k: v for k, v in after.items() if k not in ("system", "_names")} == {
        k: v for k, v in before.items() if k != "_names"
    }
    # The only state it may keep is the identity -> name cache (entries are checked on use,
    # so one may be stale).
    seen = {(i, n) for n, i in IDENTITIES.items()} | {(ETH1, "wan0")}
    assert set(names_cache(rig).items()) <= seen
    assert rig.plugin.ifname(ETH1) == "wan0"
    assert names_cache(rig) == {n.identity: n.name for n in rig.plugin.nics()}
    assert rig.snapshot() == tree
    assert rig.ethtool.writes == []


# -- one NIC through the engine ---------------------------------------------------------------


def test_engine_applies_every_option_and_off_restores_the_exact_originals(rig: Rig) -> None:
    pristine = rig.snapshot()
    engine = rig.engine()
    report = engine.switch(rig.wanted(EVERYTHING), "p")
    # tso stands for four kernel features; this kernel (the fake's) has two of them.
    assert report.not_applicable == refused(
        ETH0,
        {
            f"feature {name}": (False, f"this kernel has no NIC feature {name!r}")
            for name in ("tx-tcp-ecn-segmentation", "tx-tcp-mangleid-segmentation")
        },
    )
    # channels combined = 2, pause autoneg off and rx-hashing on were already so:
    # recorded, not written.
    assert (report.applied, report.unchanged) == (14, 3)
    assert rig.values("eth0", "coalesce") == {
        "rx-usecs": 8,
        "tx-usecs": 50,
        "adaptive-rx": False,
        "adaptive-tx": True,
    }
    assert rig.values("eth0", "ring") == {"rx": 1024, "tx": 2048}
    assert rig.values("eth0", "pause") == {"autoneg": False, "rx": False, "tx": True}
    assert {f for f, on_ in rig.features("eth0").items() if not on_} == {
        "rx-gro",
        "rx-lro",
        "tx-tcp-segmentation",
        "tx-tcp6-segmentation",
    }
    assert [rig.file("eth0", f"queues/rx-{n}/rps_cpus") for n in (0, 1)] == ["c", "c"]
    assert [rig.file("eth0", f"queues/tx-{n}/xps_cpus") for n in (0, 1)] == ["1", "1"]
    assert rig.file("eth0", "napi_defer_hard_irqs") == "2"
    assert rig.file("eth0", "gro_flush_timeout") == "200000"
    assert engine.verify() == []
    journal = Journal(rig.state_dir).load()
    assert journal is not None and len(journal.originals) == 17
    rig.ethtool.writes.clear()
    assert engine.off() == []
    assert rig.snapshot() == pristine
    # Only what was changed is written back: not channels, autoneg, rx-hashing.
    assert sorted((g, k) for _, g, k, _ in rig.ethtool.writes) == [
        ("coalesce", "adaptive-rx"),
        ("coalesce", "rx-usecs"),
        ("feature", "rx-gro"),
        ("feature", "tx-tcp-segmentation"),
        ("feature", "tx-tcp6-segmentation"),
        ("pause", "rx"),
        ("ring", "rx"),
        ("ring", "tx"),
    ]
    assert Journal(rig.state_dir).load() is None


def test_tap_like_nic_takes_only_rx_frames(rig: Rig) -> None:
    pristine = rig.snapshot()
    engine = rig.engine()
    report = engine.switch(
        rig.wanted({"match": "tap0", "coalesce": {"rx-frames": 64, "rx-usecs": 0}}), "p"
    )
    assert report.not_applicable == refused(
        TAP0, {"coalesce rx-usecs": (0, "tap0's driver does not report coalesce rx-usecs")}
    )
    assert engine.not_applicable == report.not_applicable
    assert rig.values("tap0", "coalesce") == {"rx-frames": 64}
    assert engine.applied == net(on(TAP0, {"coalesce rx-frames": 64}))
    # What the driver does not report is never written.
    assert rig.ethtool.writes == [("tap0", "coalesce", "rx-frames", 64)]
    assert engine.verify() == []
    assert engine.off() == []
    assert rig.snapshot() == pristine


def test_veth_like_coalescing_refused_is_not_applicable(rig: Rig) -> None:
    pristine = rig.snapshot()
    engine = rig.engine()
    wanted = rig.wanted({"match": "veth0", "coalesce": {"rx-usecs": 0}, "features": {"gro": True}})
    report = engine.switch(wanted, "p")
    assert report.not_applicable == refused(
        VETH0, {"coalesce rx-usecs": (0, f"{DRIVER}: {ENOTSUP}")}
    )
    assert report.not_applicable[
        ("net", NicSetting(VETH0, "coalesce", "rx-usecs"))
    ].reason.startswith("the NIC's driver refused it")
    assert engine.applied == net(on(VETH0, {"feature rx-gro": True}))  # the rest applies
    assert rig.values("veth0", "coalesce") == {"rx-usecs": 8}
    assert engine.verify() == []
    assert engine.off() == []
    assert rig.snapshot() == pristine
    assert rig.ethtool.writes == [
        ("veth0", "coalesce", "rx-usecs", 0),
        ("veth0", "feature", "rx-gro", True),
        ("veth0", "feature", "rx-gro", False),
    ]


def test_virtio_like_adaptive_rx_taken_but_kept_is_not_applicable(rig: Rig) -> None:
    rig.values("eth1", "coalesce")["adaptive-rx"] = False  # reported, but kept (ignored)
    engine = rig.engine()
    wanted = rig.wanted({"match": "eth1", "coalesce": {"adaptive-rx": True, "rx-frames": 1}})
    report = engine.switch(wanted, "p")
    assert report.not_applicable == refused(
        ETH1,
        {"coalesce adaptive-rx": (True, f"{DRIVER}: the kernel accepted the write but kept False")},
    )
    assert "accepted the write but kept" in str(report.not_applicable)
    assert rig.values("eth1", "coalesce")["rx-frames"] == 1
    assert engine.applied == net(on(ETH1, {"coalesce rx-frames": 1}))
    assert engine.verify() == []  # a setting the driver keeps is not drift
    assert engine.off() == []
    assert rig.values("eth1", "coalesce") == {
        "rx-usecs": 0,
        "tx-usecs": 0,
        "rx-frames": 0,
        "tx-frames": 1,
        "adaptive-rx": False,
    }
    # adaptive-rx was written once and, as the driver kept the original, not "restored".
    assert [w for w in rig.ethtool.writes if w[2] == "adaptive-rx"] == [
        ("eth1", "coalesce", "adaptive-rx", True)
    ]


def test_unsupported_key_is_the_drivers_einval_and_not_applicable(rig: Rig) -> None:
    # The plugin passes the kernel's refusal on as it is...
    with pytest.raises(KernelRefused) as info:
        rig.plugin.write(NicSetting(ETH0, "coalesce", "rx-frames"), 4)
    assert info.value.what == "setting eth0 coalesce rx-frames = 4"
    assert info.value.reason == UNSUPPORTED
    # ...and the engine makes it "not applicable" when the driver reports the key (its value
    # is not 0) but refuses to change it.
    rig.values("eth0", "coalesce")["rx-usecs-high"] = 8
    rig.ethtool.unsupported.add(("eth0", "coalesce", "rx-usecs-high"))
    rig.ethtool.writes.clear()
    engine = rig.engine()
    wanted = rig.wanted({"match": "eth0", "coalesce": {"rx-usecs-high": 0, "rx-usecs": 10}})
    report = engine.switch(wanted, "p")
    assert report.not_applicable == refused(
        ETH0, {"coalesce rx-usecs-high": (0, f"{DRIVER}: {UNSUPPORTED}")}
    )
    assert engine.applied == net(on(ETH0, {"coalesce rx-usecs": 10}))
    assert rig.values("eth0", "coalesce")["rx-usecs-high"] == 8
    assert engine.off() == []
    assert rig.values("eth0", "coalesce")["rx-usecs"] == 50


def test_key_missing_from_the_reply_is_not_applicable_and_never_written(rig: Rig) -> None:
    target = NicSetting(ETH0, "coalesce", "rx-frames")  # ice does not report max frames
    with pytest.raises(NotApplicable, match=r"^eth0's driver does not report coalesce rx-frames$"):
        rig.plugin.read(target)
    engine = rig.engine()
    report = engine.switch(net({target: 1}), "p")
    assert report.not_applicable == {
        ("net", target): Refused(1, "eth0's driver does not report coalesce rx-frames")
    }
    assert (report.applied, engine.applied) == (0, {})
    assert rig.ethtool.writes == []
    assert Journal(rig.state_dir).load() is None  # no original to keep
    # A group the driver has no support for at all: the kernel's ENOTSUP when reading.
    report = engine.switch(net(on(TAP0, {"ring rx": 1024, "channels combined": 2})), "p")
    assert report.not_applicable == refused(
        TAP0,
        {
            "ring rx": (1024, f"{DRIVER}: {ENOTSUP}"),
            "channels combined": (2, f"{DRIVER}: {ENOTSUP}"),
        },
    )
    assert rig.ethtool.writes == []


def test_ring_above_the_drivers_maximum_is_not_applicable(rig: Rig) -> None:
    engine = rig.engine()
    report = engine.switch(rig.wanted({"match": "eth0", "ring": {"rx": 8192, "tx": 4096}}), "p")
    assert report.not_applicable == refused(
        ETH0,
        {"ring rx": (8192, f"{DRIVER}: requested ring size exceeds maximum: Invalid argument")},
    )
    assert rig.values("eth0", "ring") == {"rx": 512, "tx": 4096}
    assert engine.applied == net(on(ETH0, {"ring tx": 4096}))
    # Not a failed profile: the step went through, and a later step can lift it.
    assert engine.profile == "p"
    report = engine.switch(rig.wanted({"match": "eth0", "ring": {"rx": 4096, "tx": 4096}}), "q")
    assert report.not_applicable == {} and engine.not_applicable == {}
    assert rig.values("eth0", "ring") == {"rx": 4096, "tx": 4096}
    assert engine.off() == []
    assert rig.values("eth0", "ring") == {"rx": 512, "tx": 512}


def test_fixed_and_unknown_features_are_not_applicable(rig: Rig) -> None:
    pristine = rig.snapshot()
    engine = rig.engine()
    # rx-hashing is fixed on, rx-lro fixed off; sg also names tx-scatter-gather-fraglist,
    # which this (fake) kernel does not have; rx-foo no kernel has.
    features = {"rx-hashing": False, "lro": False, "sg": False, "rx-foo": True, "gro": False}
    report = engine.switch(rig.wanted({"match": "eth0", "features": features}), "p")
    assert report.not_applicable == refused(
        ETH0,
        {
            "feature rx-hashing": (False, "eth0: feature rx-hashing is fixed by its driver"),
            "feature tx-scatter-gather-fraglist": (
                False,
                "this kernel has no NIC feature 'tx-scatter-gather-fraglist'",
            ),
            "feature rx-foo": (True, "this kernel has no NIC feature 'rx-foo'"),
        },
    )
    # A fixed feature that is already as wanted is simply as wanted.
    assert engine.applied == net(
        on(
            ETH0,
            {"feature rx-lro": False, "feature tx-scatter-gather": False, "feature rx-gro": False},
        )
    )
    assert [w[2] for w in rig.ethtool.writes] == ["tx-scatter-gather", "rx-gro"]
    assert rig.features("eth0")["rx-hashing"] is True
    assert engine.verify() == []
    assert engine.off() == []
    assert rig.snapshot() == pristine


def test_rps_cpus_written_as_a_hex_mask_and_read_as_a_cpulist(rig: Rig) -> None:
    target = NicFile(ETH0, "queues/rx-1/rps_cpus")
    assert rig.plugin.read(target) == ""  # the kernel's "0": no CPUs
    rig.plugin.write(target, "1,3")
    assert rig.file("eth0", "queues/rx-1/rps_cpus") == "a"
    assert rig.plugin.read(target) == "1,3"
    assert rig.plugin.same(target, "3,1", "1,3") and not rig.plugin.same(target, "1", "1,3")
    engine = rig.engine()
    # A kernel with more possible CPUs than online ones prints wider masks.
    put(rig.root, f"{NET}/eth0/queues/rx-1/rps_cpus", "00000000,0000000f")
    report = engine.switch(rig.wanted({"match": "eth0", "rps_cpus": "all", "xps_cpus": "0,2"}), "p")
    assert report.unchanged == 1 and report.applied == 3  # rx-1 already had 0-3
    assert [rig.file("eth0", f"queues/rx-{n}/rps_cpus") for n in (0, 1)] == [
        "f",
        "00000000,0000000f",
    ]
    assert [rig.file("eth0", f"queues/tx-{n}/xps_cpus") for n in (0, 1)] == ["5", "5"]
    assert engine.verify() == []
    put(rig.root, f"{NET}/eth0/queues/tx-1/xps_cpus", "4")  # someone else moved it
    [drift] = engine.verify()
    assert (drift.target, drift.wanted, drift.actual) == (
        NicFile(ETH0, "queues/tx-1/xps_cpus"),
        "0,2",
        "2",
    )
    assert engine.off() == []
    assert rig.file("eth0", "queues/rx-0/rps_cpus") == "0"
    assert rig.file("eth0", "queues/rx-1/rps_cpus") == "00000000,0000000f"
    assert rig.file("eth0", "queues/tx-1/xps_cpus") == "0"


def test_cpu_masks_beyond_32_cpus_use_the_kernels_word_form(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, cpus="0-39")
    add_nic(root, "eth0", 2, ETH0_MAC, assign=0, bus="0000:3b:00.0", driver="ice")
    plugin = NetPlugin(System(root, ethtool=FakeEthtool({"eth0": ice()})))
    plugin.write(NicFile(ETH0, "queues/rx-0/rps_cpus"), "0,33")
    assert (root / NET / "eth0/queues/rx-0/rps_cpus").read_text() == "2,00000001"
    assert plugin.read(NicFile(ETH0, "queues/rx-0/rps_cpus")) == "0,33"


def test_rps_none_turns_steering_off_and_napi_knobs_are_plain_numbers(rig: Rig) -> None:
    put(rig.root, f"{NET}/tap0/queues/rx-0/rps_cpus", "e")
    put(rig.root, f"{NET}/tap0/gro_flush_timeout", "20000")
    engine = rig.engine()
    entry = {
        "match": "tap0",
        "rps_cpus": "none",
        "napi_defer_hard_irqs": 100,
        "gro_flush_timeout": 0,
    }
    report = engine.switch(rig.wanted(entry), "p")
    assert report.not_applicable == {} and report.applied == 3
    assert rig.file("tap0", "queues/rx-0/rps_cpus") == "0"
    assert rig.file("tap0", "napi_defer_hard_irqs") == "100"
    assert rig.file("tap0", "gro_flush_timeout") == "0"
    assert rig.plugin.read(NicFile(TAP0, "napi_defer_hard_irqs")) == "100"
    assert engine.verify() == []
    assert engine.off() == []
    assert rig.file("tap0", "queues/rx-0/rps_cpus") == "e"
    assert rig.file("tap0", "napi_defer_hard_irqs") == "0"
    assert rig.file("tap0", "gro_flush_timeout") == "20000"


def test_off_restores_nics_renamed_meanwhile(rig: Rig) -> None:
    engine = rig.engine()
    entry = {"match": ["eth0", "veth0"], "features": {"gro": True}, "napi_defer_hard_irqs": 5}
    engine.switch(rig.wanted(entry, {"match": "eth1", "ring": {"rx": 128}}), "p")
    assert rig.file("veth0", "napi_defer_hard_irqs") == "5"
    rig.rename("eth0", "lan0")
    rig.rename("veth0", "eth0")  # a new NIC under an old name is not the one tuned
    rig.rename("eth1", "wan0")
    assert engine.verify() == []
    rig.ethtool.writes.clear()
    assert engine.off() == []
    assert sorted(rig.ethtool.writes) == [
        ("eth0", "feature", "rx-gro", False),  # veth0's, now called eth0
        ("wan0", "ring", "rx", 256),
    ]
    assert rig.file("eth0", "napi_defer_hard_irqs") == "0"
    assert rig.file("lan0", "napi_defer_hard_irqs") == "0"
    assert rig.values("wan0", "ring") == {"rx": 256, "tx": 256}
    assert rig.features("eth0")["rx-gro"] is False and rig.features("lan0")["rx-gro"] is True


def test_off_restores_a_nic_whose_mac_was_changed_meanwhile(rig: Rig) -> None:
    """`ip link set eth0 address ...`, or enslaving eth0 to a bond, sets its MAC and makes
    addr_assign_type NET_ADDR_SET (3): it is still the same NIC, tuned by us."""
    engine = rig.engine()
    entry = {"match": ["eth0", "veth0"], "coalesce": {"rx-usecs": 0}, "napi_defer_hard_irqs": 1}
    engine.switch(rig.wanted(entry), "p")
    assert rig.values("eth0", "coalesce")["rx-usecs"] == 0
    put(rig.root, f"{NET}/eth0/address", "02:00:00:00:00:01")
    put(rig.root, f"{NET}/eth0/addr_assign_type", "3")
    rig.unplug("veth0")  # anything that makes the plugin look at the NICs again
    assert engine.off() == []
    assert rig.file("eth0", "napi_defer_hard_irqs") == "0", "eth0 was left tuned"
    assert rig.values("eth0", "coalesce")["rx-usecs"] == 50, "eth0 was left tuned"


def test_a_nic_that_vanished_is_dropped_without_error(rig: Rig) -> None:
    engine = rig.engine()
    engine.switch(rig.wanted({"match": ["tap0", "veth0"], "napi_defer_hard_irqs": 3}), "p")
    rig.unplug("tap0")
    assert engine.verify() == []
    assert engine.applied == net(on(VETH0, {"napi_defer_hard_irqs": "3"}))
    rig.unplug("veth0")
    assert engine.off() == []
    assert Journal(rig.state_dir).load() is None


def test_queues_a_channel_change_adds_get_rps_cpus(rig: Rig) -> None:
    """channels and rps_cpus in one entry, as in the issue: eth0 goes from 2 to 4 queues."""
    daemon = rig.daemon(
        """
        [[net.nic]]
        match = "eth0"
        channels = { combined = 4 }
        rps_cpus = "0-1"
        """
    )
    assert rig.values("eth0", "channels")["combined"] == 4
    assert sorted(p.name for p in (rig.root / NET / "eth0/queues").glob("rx-*")) == [
        "rx-0",
        "rx-1",
        "rx-2",
        "rx-3",
    ]
    daemon.check()  # the safety-net tick
    masks = [rig.file("eth0", f"queues/rx-{n}/rps_cpus") for n in range(4)]
    assert masks == ["3"] * 4, f"rps_cpus of rx-0..3: {masks}"


def test_queues_a_channel_change_removes_are_dropped_without_a_reason(rig: Rig) -> None:
    pristine = rig.snapshot()
    engine = rig.engine()
    wanted = rig.wanted({"match": "eth0", "channels": {"combined": 1}, "rps_cpus": "1"})
    assert ("net", NicFile(ETH0, "queues/rx-1/rps_cpus")) in wanted
    report = engine.switch(wanted, "p")
    # rx-1 went with the channel it belonged to: nothing to tune, nothing to explain.
    assert report.not_applicable == {} and engine.not_applicable == {}
    assert engine.applied == net(on(ETH0, {"channels combined": 1, "queues/rx-0/rps_cpus": "1"}))
    assert not (rig.root / NET / "eth0/queues/rx-1").exists()
    assert rig.file("eth0", "queues/rx-0/rps_cpus") == "2"
    assert engine.verify() == []
    assert engine.off() == []
    assert rig.snapshot() == pristine  # channels back to 2: rx-1 is there again, as it was


# -- hot-plug ---------------------------------------------------------------------------------


ENTRIES = ({"match": ["eth*", "veth*"], "napi_defer_hard_irqs": 4, "features": {"gro": False}},)


def test_on_device_add_gives_just_the_new_nics_settings(rig: Rig) -> None:
    engine = rig.engine()
    expansion = rig.expand(*ENTRIES)
    engine.switch(net(expansion.settings), "p")
    add_nic(rig.root, "veth1", 12)
    rig.ethtool.nics["veth1"] = veth()
    owned = engine.owned("net")
    update = rig.plugin.on_device(expansion.rules, DeviceEvent("net", "add", "veth1"), owned)
    assert update == (
        on("ifindex:12", {"napi_defer_hard_irqs": "4", "feature rx-gro": False}),
        set(),
    )
    # A NIC that comes back (driver rebind) with the same identity: its owned targets too.
    update = rig.plugin.on_device(expansion.rules, DeviceEvent("net", "add", "eth1"), owned)
    eth1 = on(ETH1, {"napi_defer_hard_irqs": "4", "feature rx-gro": False})
    assert update == (eth1, set(eth1))
    # One that no entry wants.
    add_nic(rig.root, "tap1", 13)
    update = rig.plugin.on_device(expansion.rules, DeviceEvent("net", "add", "tap1"), owned)
    assert update == ({}, set())
    # One that is gone again before we look; and rules of a section that was refused.
    assert rig.plugin.on_device(expansion.rules, DeviceEvent("net", "add", "nope0"), owned) == (
        {},
        set(),
    )
    assert rig.plugin.on_device(None, DeviceEvent("net", "add", "veth1"), owned) is None
    assert rig.ethtool.writes == [
        ("eth0", "feature", "rx-gro", False),
        ("eth1", "feature", "rx-gro", False),
    ]  # on_device itself writes nothing


def test_a_queue_event_retunes_just_its_nic(rig: Rig) -> None:
    """Every new NIC and every channel change sends queue events: each re-tunes the NIC
    whose queue it is (from DEVPATH), never every NIC (that made a burst of hot-plugged
    NICs quadratic)."""
    engine = rig.engine()
    entry = {"match": "eth*", "rps_cpus": "2-3"}
    expansion = rig.expand(entry)
    engine.switch(net(expansion.settings), "p")
    owned = engine.owned("net")
    mine = {t for t in owned if t.nic == ETH0}
    add = DeviceEvent("queues", "add", "rx-1", devpath="/devices/pci0000:3b/net/eth0/queues/rx-1")
    assert rig.plugin.on_device(expansion.rules, add, owned) == (
        {t: v for t, v in expansion.settings.items() if t.nic == ETH0},
        mine,
    )
    # Without a DEVPATH nobody can tell whose queue it is: the section is expanded again.
    assert (
        rig.plugin.on_device(expansion.rules, DeviceEvent("queues", "add", "rx-1"), owned) is None
    )


def test_queue_events_are_covered_by_their_nics_add_in_the_same_batch() -> None:
    """A new NIC's add is handled as a whole (its queues with it): the queue events read in
    the same batch add nothing, and handling each cost a burst of hot-plugged NICs its
    5 ms goal. Queue events of NICs not added in the batch (a channel change) stay."""
    veth = "/devices/virtual/net/veth7"
    add = DeviceEvent("net", "add", "veth7", devpath=veth)
    rx = DeviceEvent("queues", "add", "rx-0", devpath=f"{veth}/queues/rx-0")
    other = DeviceEvent("queues", "add", "rx-1", devpath="/devices/virtual/net/veth8/queues/rx-1")
    gone = DeviceEvent("queues", "remove", "rx-1", devpath=f"{veth}/queues/rx-1")
    assert without_covered([add, rx, other, gone]) == [add, other]
    assert without_covered([rx, other]) == [rx, other]
    pathless = DeviceEvent("queues", "add", "rx-0")
    assert without_covered([add, pathless]) == [add, pathless]


def test_on_device_move_and_remove_name_the_owned_targets(rig: Rig) -> None:
    engine = rig.engine()
    expansion = rig.expand(*ENTRIES)
    engine.switch(net(expansion.settings), "p")
    owned = engine.owned("net")
    eth1 = on(ETH1, {"napi_defer_hard_irqs": "4", "feature rx-gro": False})
    # Renamed to a name that still matches: the same settings, under its identity.
    rig.rename("eth1", "eth9")
    move = DeviceEvent("net", "move", "eth9", old_name="eth1")
    assert rig.plugin.on_device(expansion.rules, move, owned) == (eth1, set(eth1))
    # Renamed to one that does not: nothing wanted, its owned targets to give back.
    rig.rename("eth9", "wan0")
    move = DeviceEvent("net", "move", "wan0", old_name="eth9")
    assert rig.plugin.on_device(expansion.rules, move, owned) == ({}, set(eth1))
    # Removed: the named NIC's owned targets (a burst of removals costs each its own).
    rig.unplug("veth0")
    rig.unplug("eth0")
    keys = ("napi_defer_hard_irqs", "feature rx-gro")
    remove = DeviceEvent("net", "remove", "eth0")
    assert rig.plugin.on_device(expansion.rules, remove, owned) == ({}, targets(ETH0, *keys))
    # A name never seen (events read after a rename we missed): every NIC that is gone.
    remove = DeviceEvent("net", "remove", "unknown0")
    gone = rig.plugin.on_device(expansion.rules, remove, owned)
    assert gone == ({}, targets(ETH0, *keys) | targets(VETH0, *keys))


def test_the_engine_finds_a_nics_settings_by_device_not_by_a_scan(rig: Rig) -> None:
    """A device event asks for one NIC's owned settings; the engine keeps them by device
    (a scan of every owned setting per event made a burst of NICs quadratic)."""
    engine = rig.engine()
    expansion = rig.expand(*ENTRIES)
    engine.switch(net(expansion.settings), "p")
    owned = engine.owned("net")
    eth1 = set(on(ETH1, {"napi_defer_hard_irqs": "4", "feature rx-gro": False}))
    assert owned.of_device(ETH1) == eth1
    assert {t for t in owned if t.device() == ETH1} == eth1  # the index agrees with a scan
    assert engine.by_device[("net", ETH1)] == eth1
    engine.update("net", {}, [("net", t) for t in eth1], {("net", t) for t in eth1})
    assert owned.of_device(ETH1) == set() and ("net", ETH1) not in engine.by_device
    engine.off()
    assert engine.by_device == {}


def test_the_daemon_tunes_hot_plugged_nics_and_drops_removed_ones(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    pristine = rig.snapshot()
    caplog.set_level(logging.INFO)
    daemon = rig.daemon(
        """
        [[net.nic]]
        match = ["eth*", "veth*"]
        napi_defer_hard_irqs = 4
        features = { gro = false }
        """
    )
    keys = ("napi_defer_hard_irqs", "feature rx-gro")
    assert set(daemon.engine.owned("net")) == (
        targets(ETH0, *keys) | targets(ETH1, *keys) | targets(VETH0, *keys)
    )
    # A veth pair appears (a container starts).
    add_nic(rig.root, "veth1", 12)
    rig.ethtool.nics["veth1"] = FakeNic(features={"rx-gro": True}, changeable={"rx-gro"})
    daemon.on_device_events([DeviceEvent("net", "add", "veth1")])
    assert rig.file("veth1", "napi_defer_hard_irqs") == "4"
    assert rig.features("veth1")["rx-gro"] is False
    veth1 = on("ifindex:12", {"napi_defer_hard_irqs": "4", "feature rx-gro": False})
    assert net(veth1).items() <= daemon.engine.applied.items()
    # ...and goes away with the container.
    rig.unplug("veth1")
    daemon.on_device_events([DeviceEvent("net", "remove", "veth1")])
    assert not set(net(veth1)) & set(daemon.engine.applied)
    assert not set(net(veth1)) & set(daemon.engine.originals)
    # The container restarts: a new veth1, with a new ifindex, is tuned again.
    add_nic(rig.root, "veth1", 14)
    rig.ethtool.nics["veth1"] = FakeNic(features={"rx-gro": True}, changeable={"rx-gro"})
    daemon.on_device_events([DeviceEvent("net", "add", "veth1")])
    assert rig.file("veth1", "napi_defer_hard_irqs") == "4"
    veth1 = on("ifindex:14", {"napi_defer_hard_irqs": "4", "feature rx-gro": False})
    assert net(veth1).items() <= daemon.engine.applied.items()
    # A rename that stops matching gives eth1 back; one that matches again re-tunes it.
    rig.rename("eth1", "wan0")
    daemon.on_device_events([DeviceEvent("net", "move", "wan0", old_name="eth1")])
    assert rig.file("wan0", "napi_defer_hard_irqs") == "0"
    assert rig.features("wan0")["rx-gro"] is True
    assert not any(nic_of(t) == ETH1 for _, t in daemon.engine.applied)
    rig.rename("wan0", "eth7")
    daemon.on_device_events([DeviceEvent("net", "move", "eth7", old_name="wan0")])
    assert rig.file("eth7", "napi_defer_hard_irqs") == "4"
    assert rig.features("eth7")["rx-gro"] is False
    # Events of other subsystems and actions are not the plugin's.
    daemon.on_device_events(
        [DeviceEvent("block", "add", "eth8"), DeviceEvent("net", "change", "x")]
    )
    assert daemon.last_error is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert daemon.stop() == []
    assert rig.file("veth1", "napi_defer_hard_irqs") == "0"
    assert rig.features("veth1")["rx-gro"] is True
    rig.unplug("veth1")
    rig.rename("eth7", "eth1")
    assert rig.snapshot() == pristine


# -- watching, describing, monitoring ---------------------------------------------------------


def test_watch_files_name_sysfs_files_under_the_current_name(rig: Rig) -> None:
    rps = NicFile(VETH0, "queues/rx-0/rps_cpus")
    assert files_to_watch(rig.plugin, rps) == (f"{NET}/veth0/queues/rx-0/rps_cpus",)
    assert files_to_watch(rig.plugin, NicFile(ETH0, "napi_defer_hard_irqs")) == (
        f"{NET}/eth0/napi_defer_hard_irqs",
    )
    rig.rename("veth0", "peer0")
    assert files_to_watch(rig.plugin, rps) == (f"{NET}/peer0/queues/rx-0/rps_cpus",)
    assert files_to_watch(rig.plugin, NicSetting(ETH0, "coalesce", "rx-usecs")) == ()
    assert files_to_watch(rig.plugin, NicSetting(ETH0, "feature", "rx-gro")) == ()
    rig.unplug("peer0")
    assert files_to_watch(rig.plugin, rps) == ()


def test_describe(rig: Rig) -> None:
    d = rig.plugin.describe
    assert d(NicSetting(ETH0, "coalesce", "rx-usecs"), 0) == "eth0 coalesce rx-usecs = 0"
    assert (
        d(NicSetting(ETH0, "coalesce", "adaptive-rx"), False) == "eth0 coalesce adaptive-rx = off"
    )
    assert d(NicSetting(ETH1, "pause", "tx"), True) == "eth1 pause tx = on"
    assert d(NicSetting(ETH0, "ring", "rx"), 4096) == "eth0 ring rx = 4096"
    assert d(NicSetting(TAP0, "feature", "rx-gro"), False) == "tap0 feature rx-gro off"
    assert d(NicSetting(TAP0, "feature", "rx-gro"), True) == "tap0 feature rx-gro on"
    rps = NicFile(ETH0, "queues/rx-1/rps_cpus")
    assert d(rps, "0-1") == "eth0 queues/rx-1/rps_cpus = 0-1"
    rig.rename("eth0", "lan0")
    assert d(rps, "") == "lan0 queues/rx-1/rps_cpus = "
    rig.unplug("lan0")
    assert d(rps, "2") == f"{ETH0} queues/rx-1/rps_cpus = 2"  # gone: its identity


INTERRUPTS = """\
        CPU0  CPU1  CPU2  CPU3
 30:       1     0     0     0  PCI-MSIX-0000:3b:00.0  0-edge  ice-0000:3b:00.0:misc
 31:      10     0     0     0  PCI-MSIX-0000:3b:00.0  1-edge  ice-eth0-TxRx-0
 32:       0    20     0     0  PCI-MSIX-0000:3b:00.0  2-edge  ice-eth0-TxRx-1
 40:       0     0     0     0  PCI-MSIX-0000:00:04.0  0-edge  virtio3-config
 41:       5     0     0     0  PCI-MSIX-0000:00:04.0  1-edge  virtio3-input.0
 42:       0     5     0     0  PCI-MSIX-0000:00:04.0  2-edge  virtio3-output.0
 50:       0     0     7     0  IR-PCI-MSI-0000:00:05.0  0-edge  tap0-rx-0
 51:       0     0     7     0  IR-PCI-MSI-0000:00:05.0  1-edge  tap00-rx-0
NMI:       0     0     0     0  Non-maskable interrupts
"""


def test_monitor_shows_nics_their_entry_irqs_and_wanted_against_actual(rig: Rig) -> None:
    add_irqs(rig.root, INTERRUPTS, affinity="0-3")
    for irq in (30, 31, 32):  # ice's MSI-X vectors, found through the device
        put(rig.root, f"sys/devices/pci0000:00/0000:3b:00.0/msi_irqs/{irq}", "msix")
    put(rig.root, "proc/irq/31/smp_affinity_list", "0")
    put(rig.root, "sys/devices/pci0000:00/0000:3b:00.0/msi_irqs/33", "msix")  # no affinity file
    expansion = rig.expand(
        {"match": "eth0", "coalesce": {"rx-usecs": 0, "rx-frames": 1}, "rps_cpus": "1"},
        {"match": ["eth1", "tap*"], "features": {"gro": False, "rx-foo": True}, "ring": {"rx": 64}},
    )
    engine = rig.engine()
    engine.switch(net(expansion.settings), "p")
    monitor = rig.plugin.monitor(expansion.rules)
    nics, settings = monitor.tables
    assert nics.title == "NICs: the [[net.nic]] entry that matched, and queue IRQs (IRQ@CPUs)"
    assert nics.columns == ("NIC", "identity", "driver", "entry", "queue IRQs")
    assert nics.rows == (
        ("eth0", ETH0, "ice", 1, "30@0-3, 31@0, 32@0-3"),
        ("eth1", ETH1, "virtio_net", 2, "40@0-3, 41@0-3, 42@0-3"),
        ("lo", LO, "-", "-", "-"),
        ("tap0", TAP0, "-", 2, "50@0-3"),
        ("veth0", VETH0, "-", "-", "-"),
    )
    assert settings.title == "NIC settings: wanted and actual"
    assert settings.columns == ("NIC", "setting", "wanted", "actual")
    assert settings.rows == (
        ("eth0", "coalesce rx-usecs", 0, 0),
        ("eth0", "coalesce rx-frames", 1, "n/a: eth0's driver does not report coalesce rx-frames"),
        ("eth0", "queues/rx-0/rps_cpus", "1", "1"),
        ("eth0", "queues/rx-1/rps_cpus", "1", "1"),
        ("eth1", "ring rx", 64, 64),
        ("eth1", "feature rx-gro", False, False),
        ("eth1", "feature rx-foo", True, "n/a: this kernel has no NIC feature 'rx-foo'"),
        ("tap0", "ring rx", 64, f"n/a: reading tap0 ring: {ENOTSUP}"),
        ("tap0", "feature rx-gro", False, False),
        ("tap0", "feature rx-foo", True, "n/a: this kernel has no NIC feature 'rx-foo'"),
    )
    assert monitor.facts == {}
    assert rig.plugin.monitor(None) == Monitor()


def test_daemon_status_lists_applied_and_not_applicable_settings(rig: Rig) -> None:
    daemon = rig.daemon(
        """
        [[net.nic]]
        match = "veth0"
        coalesce = { rx-usecs = 0 }
        napi_defer_hard_irqs = 1
        """
    )
    status = daemon.status()["plugins"]["net"]
    assert [(a["text"], a["original"]) for a in status["applied"]] == [
        ("veth0 napi_defer_hard_irqs = 1", "0")
    ]
    assert status["not_applicable"] == [
        {
            "target": {"kind": "nic", "nic": VETH0, "group": "coalesce", "key": "rx-usecs"},
            "text": "veth0 coalesce rx-usecs = 0",
            "reason": f"{DRIVER}: {ENOTSUP}",
        }
    ]
    assert status["tables"][0]["title"].startswith("NICs")
    assert daemon.off() == []


# -- journal --------------------------------------------------------------------------------


def test_targets_round_trip_through_the_journal_form(shared: Rig) -> None:
    kinds = target_kinds(shared.plugin)
    assert kinds == {"nic": NicSetting, "nic_file": NicFile}
    assert NicFile.refusal_means == "the kernel refused it for this NIC"
    assert NicSetting.refusal_means == DRIVER
    targets = list(shared.expand(EVERYTHING, {"match": "*", "features": {"tx": True}}).settings)
    assert len(targets) > 20
    for target in targets:
        assert decode_target(kinds, encode_target(target)) == target
    assert encode_target(NicSetting(ETH0, "coalesce", "rx-usecs")) == {
        "kind": "nic",
        "nic": ETH0,
        "group": "coalesce",
        "key": "rx-usecs",
    }
    assert encode_target(NicFile(TAP0, "queues/rx-0/rps_cpus")) == {
        "kind": "nic_file",
        "nic": TAP0,
        "path": "queues/rx-0/rps_cpus",
    }
    for bad in (
        {"kind": "nic", "nic": ETH0, "group": "coalesce"},
        {"kind": "nic_file", "nic": 9, "path": "gro_flush_timeout"},
        {"kind": "irq", "irq": 1},
    ):
        with pytest.raises(ValueError):
            decode_target(kinds, bad)


def test_after_a_crash_a_new_engine_adopts_and_restores_renamed_nics(rig: Rig) -> None:
    pristine = rig.snapshot()
    entry = {
        "match": ["eth0", "tap0"],
        "coalesce": {"rx-frames": 8, "rx-usecs": 3},
        "rps_cpus": "3",
    }
    wanted = rig.wanted(entry)
    report = rig.engine().switch(wanted, "p")
    assert report.applied == 5  # eth0: rx-usecs, 2 rps; tap0: rx-frames, rps
    # kill -9; meanwhile udev renames both NICs; the daemon starts again.
    rig.rename("eth0", "enp59s0f0")
    rig.rename("tap0", "tap9")
    engine = Engine({"net": NetPlugin(rig.system)}, Journal(rig.state_dir))
    state = engine.adopt()
    assert state is not None and state.profile == "p"
    assert set(engine.originals) == set(wanted) - {
        ("net", NicSetting(ETH0, "coalesce", "rx-frames")),
        ("net", NicSetting(TAP0, "coalesce", "rx-usecs")),
    }
    assert engine.originals[("net", NicFile(ETH0, "queues/rx-1/rps_cpus"))] == ""
    assert engine.originals[("net", NicSetting(ETH0, "coalesce", "rx-usecs"))] == 50
    assert engine.off() == []
    rig.rename("enp59s0f0", "eth0")
    rig.rename("tap9", "tap0")
    assert rig.snapshot() == pristine
    assert Journal(rig.state_dir).load() is None
