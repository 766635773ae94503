"""Holding a profile while an application runs: latencyctl hold, release, holder leaving the bus."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

from tests.harness import BIN, Latencyd, sysctl, wait_for
from tests.nobody import cli_as_nobody


def active(d: Latencyd) -> str:
    return d.ctl("active").stdout.strip()


def test_hold_applies_a_profile_while_the_command_runs(
    start_daemon: Callable[..., Latencyd], tmp_path: Path
) -> None:
    d = start_daemon("test-a")
    seen = tmp_path / "seen"
    script = f"cat /proc/sys/vm/dirty_ratio > {seen}; exit 7"
    r = d.ctl("hold", "test-b", "--", "sh", "-c", script)
    assert r.returncode == 7  # the command's own exit code
    assert seen.read_text().strip() == "15"  # test-b was in force while it ran
    assert active(d) == "test-a"  # and test-a came back after
    assert sysctl("vm.dirty_bytes") == str(64 << 20)


def test_hold_ends_when_the_holder_leaves_the_bus(start_daemon: Callable[..., Latencyd]) -> None:
    d = start_daemon("test-a")
    holder = subprocess.Popen(
        [str(BIN / "latencyctl"), "hold", "test-b", "--", "sleep", "60"],
        env=d.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: active(d) == "test-b")
        status = json.loads(d.ctl("status", "--json").stdout)
        assert [h["profile"] for h in status["holds"]] == ["test-b"]
        assert status["holds"][0]["reason"] == "sleep 60"
        assert status["base_profile"] == "test-a"
        holder.send_signal(signal.SIGKILL)  # no chance to release: the bus tells the daemon
        holder.wait()
        wait_for(lambda: active(d) == "test-a")
    finally:
        holder.kill()
        subprocess.run(["pkill", "-f", "sleep 60"], check=False)
    assert "left the bus" in d.log()
    assert json.loads(d.ctl("status", "--json").stdout)["holds"] == []


def test_sigterm_reaches_the_command_and_the_hold_lasts_until_it_exits(
    start_daemon: Callable[..., Latencyd], tmp_path: Path
) -> None:
    """A service manager stops `latencyctl hold` with SIGTERM: the command gets it, and
    what it does on its way out (undo its own changes) still runs under the held profile.
    ^C is the command's to handle: it is not ignored in the command."""
    d = start_daemon("test-a")
    seen, ready = tmp_path / "seen", tmp_path / "ready"
    on_term = f"sleep 0.5; cat /proc/sys/vm/dirty_ratio > {seen}; exit 3"
    script = (f"trap '{on_term}' TERM; "
              f"python3 -c 'import signal; print(signal.getsignal(signal.SIGINT))' > {ready}; "
              "while :; do sleep 0.1; done")  # fmt: skip
    holder = d.spawn_ctl("hold", "test-b", "--", "sh", "-c", script)
    try:
        wait_for(lambda: ready.exists() and ready.read_text() != "")
        assert "default_int_handler" in ready.read_text()  # not SIG_IGN
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(10) == 3  # the command's exit code
    finally:
        holder.kill()
    assert seen.read_text().strip() == "15"  # test-b was still in force on its way out
    assert active(d) == "test-a"


def test_switch_during_a_hold_changes_the_base_for_later(
    start_daemon: Callable[..., Latencyd], tmp_path: Path
) -> None:
    d = start_daemon("test-a")
    ctl = str(BIN / "latencyctl")
    script = f"{ctl} switch balanced --json > {tmp_path / 'switch.json'}; {ctl} active"
    r = d.ctl("hold", "test-b", "--", "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "test-b"  # still held while the script ran
    report = json.loads((tmp_path / "switch.json").read_text())
    assert report["held"] is True and report["base"] == "balanced"
    assert active(d) == "balanced"  # applied when the hold ended


def test_release_by_cookie_and_unknown_cookie(start_daemon: Callable[..., Latencyd]) -> None:
    d = start_daemon("test-a")
    import dbus

    conn = dbus.bus.BusConnection(d.address)
    try:
        obj = conn.get_object("org.latencyd.Daemon1", "/org/latencyd/Daemon1", introspect=False)
        iface = dbus.Interface(obj, "org.latencyd.Daemon1")
        first = iface.HoldProfile("test-b", "first")
        second = iface.HoldProfile("balanced", "second")  # holds stack: the newest wins
        assert iface.ActiveProfile() == "balanced"
        assert d.ctl("release", str(second)).returncode == 0
        assert iface.ActiveProfile() == "test-b"
        r = d.ctl("release", "999")
        assert r.returncode == 2 and "no hold with cookie 999" in r.stderr
        iface.ReleaseProfile(first)
        assert iface.ActiveProfile() == "test-a"
    finally:
        conn.close()


def test_bad_profile_cannot_be_held(start_daemon: Callable[..., Latencyd]) -> None:
    d = start_daemon("test-a")
    r = d.ctl("hold", "test-bad", "--", "true")
    assert r.returncode == 2 and "unknown option 'no_such_option'" in r.stderr
    assert active(d) == "test-a"


def test_unprivileged_caller_cannot_hold(
    start_daemon: Callable[..., Latencyd], tmp_path: Path
) -> None:
    d = start_daemon("test-a")
    out = tmp_path / "out.txt"
    assert cli_as_nobody(d.address, "hold", "test-b", "--", "true", capture=out) == 4
    assert "permission denied" in out.read_text()
    assert active(d) == "test-a"


def test_a_hold_asking_a_setting_another_hold_sets_otherwise_is_refused_saying_why(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    """Issue 52: holds of different callers compose; one sysctl asked two ways is refused
    at the second hold, naming both holds, the setting, both values and where each is
    set; nothing changes."""
    (profiles / "swap-60.toml").write_text('[sysctl]\n"vm.swappiness" = 60\n')
    d = start_daemon(None)
    first = d.spawn_ctl("hold", "test-a", "--", "sleep", "60")
    try:
        wait_for(lambda: active(d) == "test-a")
        before = (sysctl("vm.swappiness"), sysctl("vm.stat_interval"), sysctl("vm.dirty_bytes"))
        r = d.ctl("hold", "swap-60", "--", "true")
        assert r.returncode == 1, r.stderr
        assert "(swap-60) is refused" in r.stderr and "(test-a)" in r.stderr
        assert "[sysctl] vm.swappiness: 60" in r.stderr and "against 11" in r.stderr
        assert f"{profiles / 'swap-60.toml'}:2" in r.stderr
        assert f"{profiles / 'test-a.toml'}:" in r.stderr
        after = (sysctl("vm.swappiness"), sysctl("vm.stat_interval"), sysctl("vm.dirty_bytes"))
        assert after == before
        status = json.loads(d.ctl("status", "--json").stdout)
        assert [h["profile"] for h in status["holds"]] == ["test-a"]
        assert active(d) == "test-a"
    finally:
        first.kill()
        first.wait()
