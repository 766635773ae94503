"""Losing the D-Bus daemon loses no control: the tuning stays and is still kept, the
daemon re-owns its name when the bus is back, and it answers as before."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import POLICY, Latencyd, name_has_owner, sysctl, wait_for


@pytest.fixture
def own_bus() -> Iterator[object]:
    """A bus of this test's own, so stopping it touches no other test."""
    from scripts.private_bus import PrivateBus

    with PrivateBus(POLICY) as bus:
        yield bus


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_the_bus_going_away_and_coming_back(
    own_bus: object, tmp_path: Path, profiles: Path, kernel_guard: None, how: int
) -> None:
    from scripts.private_bus import PrivateBus

    assert isinstance(own_bus, PrivateBus)
    before = sysctl("vm.swappiness")
    d = Latencyd(own_bus.address, tmp_path, profile="test-a", profile_dirs=[profiles]).start()
    try:
        assert sysctl("vm.swappiness") == "11"
        # A holder on the old bus: its hold cannot outlive the bus it was made on.
        (profiles / "held.toml").write_text(
            '[main]\ninclude = ["test-a"]\n[sysctl]\n"kernel.timer_migration" = 0\n'
        )
        holder = d.spawn_ctl("hold", "held", "--", "sleep", "30")
        wait_for(lambda: d.ctl("active").stdout.strip() == "held")

        own_bus.go_away(how)
        wait_for(lambda: "lost the system bus" in d.log())
        time.sleep(0.3)
        assert d.proc is not None and d.proc.poll() is None, d.log()
        assert sysctl("vm.swappiness") == "11"  # the tuning stays in force...
        Path("/proc/sys/vm/swappiness").write_text("42")  # ...and is still kept
        wait_for(lambda: sysctl("vm.swappiness") == "11")

        own_bus.come_back()
        wait_for(lambda: name_has_owner(own_bus.address))
        wait_for(lambda: "system bus is back: org.latencyd.Daemon1 owned again" in d.log())
        wait_for(lambda: "hold 1 on held ended" in d.log())
        assert d.ctl("active").stdout.strip() == "test-a"
        r = d.ctl("switch", "test-b")
        assert r.returncode == 0, r.stderr
        assert d.ctl("verify").returncode == 0
        assert d.ctl("off").returncode == 0
        assert sysctl("vm.swappiness") == before
        holder.kill()
        holder.wait(5)
    finally:
        d.stop()


def test_sigterm_while_the_bus_is_gone_still_restores(
    own_bus: object, tmp_path: Path, profiles: Path, kernel_guard: None
) -> None:
    from scripts.private_bus import PrivateBus

    assert isinstance(own_bus, PrivateBus)
    before = sysctl("vm.swappiness")
    d = Latencyd(own_bus.address, tmp_path, profile="test-a", profile_dirs=[profiles]).start()
    own_bus.go_away()
    wait_for(lambda: "lost the system bus" in d.log())
    assert d.stop() == 0
    assert sysctl("vm.swappiness") == before
