"""The daemon tuning NICs inside a network namespace the test owns: NICs hot-plugged
while it runs, renamed, deleted and re-created; a crash with NIC settings applied."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import Latencyd, wait_for
from tests.netns import NetNs, netns

PROFILE = """
[[net.nic]]
match = "lt*"
coalesce = { rx-frames = 5 }

[[net.nic]]
match = "ve*"
features = { gro = true }
rps_cpus = "1"
"""
NO_TICK = "verify_interval_s = 0\n"  # only events: nothing is found by a periodic rescan


@pytest.fixture
def ns() -> Iterator[NetNs]:
    with netns() as n:
        yield n


@pytest.fixture
def inside(
    ns: NetNs, start_daemon: Callable[..., Latencyd], profiles: Path
) -> Callable[..., Latencyd]:
    """Start latencyd inside the namespace (same private bus, journal and profiles)."""
    (profiles / "nics.toml").write_text(PROFILE)

    def start(profile: str | None = "nics", **kwargs: object) -> Latencyd:
        d = start_daemon(profile, launch=False, **kwargs)
        d.launcher = lambda argv: (ns.argv(*argv), [], {})
        return d.start()

    return start


def rx_frames(ns: NetNs, ifname: str) -> int:
    line = next(
        x for x in ns.run("ethtool", "-c", ifname).splitlines() if x.startswith("rx-frames:")
    )
    return int(line.split()[1])


def gro(ns: NetNs, ifname: str) -> str:
    line = next(x for x in ns.run("ethtool", "-k", ifname).splitlines() if "generic-receive" in x)
    return line.split(":")[1].split()[0]


def test_nics_that_come_go_and_change_names_are_followed(
    ns: NetNs, inside: Callable[..., Latencyd]
) -> None:
    d = inside(config=NO_TICK)
    ns.ip("tuntap", "add", "mode", "tap", "name", "lt0")
    wait_for(lambda: rx_frames(ns, "lt0") == 5)

    ns.ip("link", "set", "lt0", "name", "lt1")  # a rename keeps the NIC and its settings
    wait_for(lambda: "lt1 coalesce rx-frames = 5" in d.ctl("status").stdout)
    assert rx_frames(ns, "lt1") == 5

    ns.ip("link", "set", "lt1", "name", "other")  # no entry matches now: given back
    wait_for(lambda: rx_frames(ns, "other") == 0)
    ns.ip("link", "set", "other", "name", "lt2")
    wait_for(lambda: rx_frames(ns, "lt2") == 5)

    ns.ip("link", "del", "lt2")  # gone: dropped without an error
    wait_for(lambda: "lt2" not in d.ctl("status").stdout)
    ns.ip("tuntap", "add", "mode", "tap", "name", "lt0")  # back again: tuned again
    wait_for(lambda: rx_frames(ns, "lt0") == 5)

    ns.ip("link", "add", "ve0", "type", "veth", "peer", "name", "ve1")
    wait_for(lambda: gro(ns, "ve0") == "on" and gro(ns, "ve1") == "on")
    assert ns.read("ve0", "queues/rx-0/rps_cpus") == "2"
    assert "ERROR" not in d.log() and "Traceback" not in d.log()

    status = json.loads(d.ctl("status", "--json").stdout)["plugins"]["net"]
    nics = {row[0]: row for row in status["tables"][0]["rows"]}
    assert nics["lt0"][3] == 1 and nics["ve0"][3] == 2 and nics["lo"][3] == "-"
    d.stop()
    assert rx_frames(ns, "lt0") == 0 and gro(ns, "ve0") == "off"
    assert ns.read("ve0", "queues/rx-0/rps_cpus") == "0"


def test_a_crash_with_nic_settings_applied_is_restored_by_identity(
    ns: NetNs, inside: Callable[..., Latencyd]
) -> None:
    ns.ip("tuntap", "add", "mode", "tap", "name", "lt0")
    d = inside()
    assert rx_frames(ns, "lt0") == 5
    d.kill9()
    ns.ip("link", "set", "lt0", "name", "lt9")  # renamed while no daemon ran
    d.profile = None
    d.extra = ["--no-profile"]
    d.start()  # adopts the journal, wants nothing: restores the NIC found by identity
    assert rx_frames(ns, "lt9") == 0


def test_nic_drift_is_put_back_by_the_poll(ns: NetNs, inside: Callable[..., Latencyd]) -> None:
    ns.ip("tuntap", "add", "mode", "tap", "name", "lt0")
    d = inside(config=NO_TICK)
    ns.run("ethtool", "-C", "lt0", "rx-frames", "9")  # someone else changes it
    wait_for(lambda: rx_frames(ns, "lt0") == 5)
    wait_for(lambda: "lt0 coalesce rx-frames = 5, but it is 9: reapplied" in d.log())
