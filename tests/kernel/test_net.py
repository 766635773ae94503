"""The net plugin on real tap and veth devices, in a network namespace each test owns;
and the ethtool key tables against the uapi header and the running kernel."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from latencyd.kernel.ethtool import FEATURES_SET, GROUPS, NOT_OFFERED, NetlinkEthtool
from tests.netns import NetNs, netns

pytestmark = pytest.mark.usefixtures("kernel_guard")

# Runs inside the namespace: the real System, the net plugin and the engine; applies the
# section given as JSON, reads back, restores, and prints what it saw as JSON.
CHILD = r"""
import json, sys, tempfile
from latencyd.cpuset import CpuSet
from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import encode_target
from latencyd.plugins.net import NetPlugin
from latencyd.core.profile import Profile
from latencyd.core.schema import validate
from latencyd.kernel.system import System

system = System("/")
plugin = NetPlugin(system)
section = validate(section_schemas({"net": plugin})["net"], json.loads(sys.argv[1]),
                   system.machine())
engine = Engine({"net": plugin}, Journal(tempfile.mkdtemp()))
report = engine.apply(Profile("t", None, "", {"net": section}, {}))
def state():
    return {plugin.describe(t, v): plugin.read(t) for (_, t), v in engine.applied.items()}
applied = state()
drift = [d.as_json() for d in engine.verify()]
refused = {plugin.describe(t, r.wanted): r.reason for (_, t), r in report.not_applicable.items()}
problems = engine.off()
print(json.dumps({"applied": applied, "refused": refused, "drift": drift,
                  "problems": problems, "written": report.applied}))
"""


@pytest.fixture
def ns() -> Iterator[NetNs]:
    with netns() as n:
        yield n


def apply(ns: NetNs, section: str) -> dict[str, object]:
    result = ns.python(CHILD, section)
    assert isinstance(result, dict)
    return result


def ethtool(ns: NetNs, *args: str) -> str:
    return ns.run("ethtool", *args)


def test_tap_rx_frames_is_applied_read_back_and_restored(ns: NetNs) -> None:
    ns.ip("tuntap", "add", "mode", "tap", "name", "tap0")
    before = ethtool(ns, "-c", "tap0")
    assert "rx-frames: 0" in before
    result = apply(ns, '{"nic": [{"match": "tap*", "coalesce": {"rx-frames": 8}}]}')
    assert result["applied"] == {"tap0 coalesce rx-frames = 8": 8}
    assert result["written"] == 1 and result["drift"] == [] and result["problems"] == []
    assert ethtool(ns, "-c", "tap0") == before  # restored


def test_veth_channels_features_and_rps_are_applied_and_restored(ns: NetNs) -> None:
    ns.ip("link", "add", "v0", "type", "veth", "peer", "name", "v1")
    features_before = ethtool(ns, "-k", "v0")
    section = (
        '{"nic": [{"match": "v0", "channels": {"rx": 1}, "features": {"gro": true},'
        ' "rps_cpus": "1", "napi_defer_hard_irqs": 2, "gro_flush_timeout": 20000}]}'
    )
    result = apply(ns, section)
    assert result["applied"] == {
        "v0 channels rx = 1": 1,
        "v0 feature rx-gro on": True,
        "v0 queues/rx-0/rps_cpus = 1": "1",
        "v0 napi_defer_hard_irqs = 2": "2",
        "v0 gro_flush_timeout = 20000": "20000",
    }
    assert result["drift"] == [] and result["problems"] == []
    assert ethtool(ns, "-k", "v0") == features_before
    assert ns.read("v0", "queues/rx-0/rps_cpus") == "0"
    assert ns.read("v0", "napi_defer_hard_irqs") == "0"
    assert ns.read("v0", "gro_flush_timeout") == "0"


def test_veth_refuses_coalescing_and_says_why(ns: NetNs) -> None:
    ns.ip("link", "add", "v0", "type", "veth", "peer", "name", "v1")
    result = apply(
        ns, '{"nic": [{"match": "v0", "coalesce": {"rx-usecs": 3}, "features": {"lro": true}}]}'
    )
    assert result["applied"] == {}
    refused = result["refused"]
    assert isinstance(refused, dict)
    assert refused["v0 coalesce rx-usecs = 3"] == (
        "the NIC's driver refused it: Operation not supported (ENOTSUP)"
    )
    assert "fixed by its driver" in refused["v0 feature rx-lro on"]


def test_a_ring_size_the_driver_refuses_is_not_applicable(ns: NetNs) -> None:
    ns.ip("link", "add", "v0", "type", "veth", "peer", "name", "v1")
    result = apply(ns, '{"nic": [{"match": "v0", "channels": {"rx": 99}}]}')
    refused = result["refused"]
    assert isinstance(refused, dict)
    (reason,) = refused.values()
    assert reason.startswith("the NIC's driver refused it")
    assert "Invalid argument" in reason or "EINVAL" in reason


# -- the key tables ----------------------------------------------------------------------------

UAPI = Path("/usr/include/linux/ethtool_netlink.h")
ENUMS = {"coalesce": "COALESCE", "ring": "RINGS", "channels": "CHANNELS", "pause": "PAUSE"}


def uapi_enum(text: str, prefix: str) -> dict[str, int]:
    """ETHTOOL_A_<prefix>_* names -> values, from the header's enum."""
    match = re.search(r"enum\s*{\s*ETHTOOL_A_" + prefix + r"_UNSPEC,(.*?)};", text, re.S)
    assert match, prefix
    body = match.group(1).split("__ETHTOOL_A_")[0]  # the members, not _CNT and _MAX
    names = re.findall(r"ETHTOOL_A_" + prefix + r"_(\w+)", body)
    return {n: i + 1 for i, n in enumerate(names)}


@pytest.mark.skipif(not UAPI.exists(), reason="no /usr/include/linux/ethtool_netlink.h")
def test_the_tables_hold_every_attribute_of_the_uapi_header() -> None:
    text = UAPI.read_text()
    for group, prefix in ENUMS.items():
        header = uapi_enum(text, prefix)
        ours = {k.attr for k in GROUPS[group].keys} | NOT_OFFERED[group]
        writable = {v for n, v in header.items() if not n.endswith(("MAX", "STATS", "SRC"))}
        assert writable - ours == set(), (group, sorted(writable - ours))


def test_the_running_kernel_accepts_no_key_the_tables_lack() -> None:
    """A kernel that grows a coalesce/ring/channels/pause attribute fails this test."""
    ethtool = NetlinkEthtool()
    try:
        for group in GROUPS.values():
            accepted = ethtool.accepted_attributes(group.set)
            ours = {k.attr for k in group.keys} | NOT_OFFERED[group.name]
            assert accepted, group.name
            assert accepted - ours == set(), (group.name, sorted(accepted - ours))
        assert ethtool.accepted_attributes(FEATURES_SET) >= {1, 3}
    finally:
        ethtool.close()
