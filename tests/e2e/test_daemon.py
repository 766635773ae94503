"""The real daemon on a private bus, driven by the real latencyctl."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from latencyd.core.journal import Journal
from tests.harness import (
    STARTED_DAEMONS,
    BusListener,
    Latencyd,
    recover_killed_runs,
    signal_listener,
    sysctl,
    unlike_machine,
    wait_for,
)
from tests.nobody import PERMISSIVE_POLICY, cli_as_nobody

DIRTY_PAIR = ("vm.dirty_ratio", "vm.dirty_bytes")

# Every sysctl the test-a profile changes.
TEST_A_KEYS = (
    "vm.swappiness",
    "vm.dirty_ratio",
    "vm.dirty_bytes",
    "vm.dirty_expire_centisecs",
    "vm.stat_interval",
)


def test_start_applies_profile_and_status_reports_it(start_daemon: Callable[..., Latencyd]) -> None:
    before = {k: sysctl(k) for k in ("vm.swappiness", "vm.stat_interval", *DIRTY_PAIR)}
    d = start_daemon("test-a")
    assert sysctl("vm.swappiness") == "11"
    assert sysctl("vm.dirty_bytes") == str(64 << 20)
    assert sysctl("vm.dirty_ratio") == "0"  # the kernel keeps only one of the pair
    assert sysctl("vm.stat_interval") == "7"

    r = d.ctl("active")
    assert (r.returncode, r.stdout.strip()) == (0, "test-a")
    status = json.loads(d.ctl("status", "--json").stdout)
    assert status["active_profile"] == "test-a"
    applied = {i["target"]["key"]: i for i in status["plugins"]["sysctl"]["applied"]}
    assert applied["vm.swappiness"]["value"] == "11"
    assert applied["vm.swappiness"]["original"] == before["vm.swappiness"]
    writeback = status["plugins"]["writeback"]["applied"]
    dirty = next(i for i in writeback if i["target"] == {"kind": "dirty_limit", "pair": "dirty"})
    assert dirty["value"] == {"bytes": 64 << 20}
    # The machine's own mode: a ratio, or bytes (then its ratio reads 0).
    nbytes = int(before["vm.dirty_bytes"])
    original = {"bytes": nbytes} if nbytes else {"ratio": int(before["vm.dirty_ratio"])}
    assert dirty["original"] == original
    text = d.ctl("status").stdout
    assert "active profile: test-a" in text and "vm.dirty_bytes = 67108864" in text


def test_incremental_switch_touches_only_differences(start_daemon: Callable[..., Latencyd]) -> None:
    original_stat_interval = sysctl("vm.stat_interval")
    original_timer_migration = sysctl("kernel.timer_migration")
    timer_migration = unlike_machine("kernel.timer_migration", "0", "1")  # test-b's
    d = start_daemon("test-a")
    r = d.ctl("switch", "test-b", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    # swappiness is shared: unchanged. dirty pair + expire change; stat_interval restored;
    # timer_migration new.
    assert report["unchanged"] == 1
    assert report["restored"] == 1
    assert report["applied"] == 3
    assert sysctl("vm.swappiness") == "11"
    assert sysctl("vm.dirty_ratio") == "15" and sysctl("vm.dirty_bytes") == "0"
    assert sysctl("vm.dirty_expire_centisecs") == "1600"
    assert sysctl("vm.stat_interval") == original_stat_interval
    assert sysctl("kernel.timer_migration") == timer_migration
    assert d.ctl("active").stdout.strip() == "test-b"
    assert d.ctl("off").returncode == 0
    assert sysctl("kernel.timer_migration") == original_timer_migration
    assert d.ctl("active", "--json").stdout.strip() == json.dumps({"active": None}, indent=2)


def test_bad_profile_is_rejected_and_active_stays(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    d = start_daemon("test-a")
    r = d.ctl("switch", "test-bad")
    assert r.returncode == 2
    assert f"{profiles / 'test-bad.toml'}:7: unknown option 'no_such_option'" in r.stderr
    assert d.ctl("active").stdout.strip() == "test-a"
    assert sysctl("vm.swappiness") == "11"
    assert sysctl("vm.dirty_bytes") == str(64 << 20)  # dirty_ratio = 12 was not applied
    listing = json.loads(d.ctl("list", "--json").stdout)
    bad = next(p for p in listing["profiles"] if p["name"] == "test-bad")
    assert "unknown option 'no_such_option'" in bad["error"]
    assert listing["active"] == "test-a"
    r = d.ctl("switch", "no-such-profile")
    assert r.returncode == 2 and "no profile named 'no-such-profile'" in r.stderr


def test_kernel_refusal_rolls_back_whole_step(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    (profiles / "test-refused.toml").write_text(
        '[sysctl]\n"vm.stat_interval" = 9\n"vm.swappiness" = 500\n'  # swappiness max is 200
    )
    d = start_daemon("test-a")
    r = d.ctl("switch", "test-refused")
    assert r.returncode == 1
    assert "vm.swappiness" in r.stderr and "Invalid argument" in r.stderr
    assert "rolled back" in r.stderr
    assert d.ctl("active").stdout.strip() == "test-a"
    assert sysctl("vm.stat_interval") == "7"  # test-a's value, not 9
    assert d.ctl("verify").returncode == 0


def test_verify_reports_drift_when_the_profile_says_report(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    (profiles / "report.toml").write_text(
        '[main]\ninclude = ["test-a"]\n[sysctl]\non_drift = "report"\n'
    )
    d = start_daemon("report")
    assert d.ctl("verify").returncode == 0
    Path("/proc/sys/vm/swappiness").write_text("33")
    wait_for(lambda: "drift: [sysctl] sysctl vm.swappiness = 11" in d.log())
    r = d.ctl("verify", "--json")
    assert r.returncode == 1
    drift = json.loads(r.stdout)["drift"]
    assert drift == [
        {
            "plugin": "sysctl",
            "target": {"kind": "sysctl", "key": "vm.swappiness"},
            "setting": "sysctl vm.swappiness = 11",
            "wanted": "11",
            "actual": "33",
        }
    ]
    # This test wrote it: the drift names it, by pid and name.
    me = f"{os.getpid()} ({Path('/proc/self/comm').read_text().strip()})"
    assert f"but it is '33', written by {me}: reported" in d.log()
    assert d.ctl("verify").stdout.startswith("drift: [sysctl] sysctl vm.swappiness = 11")


def test_kill9_then_restart_adopts_and_stop_restores_every_original(
    start_daemon: Callable[..., Latencyd], kernel_guard: None
) -> None:
    before = {k: sysctl(k) for k in TEST_A_KEYS}
    d = start_daemon("test-a")
    d.kill9()
    assert sysctl("vm.swappiness") == "11"  # nobody restored: the process died
    journal = Journal(d.state_dir).load()
    assert journal is not None
    key = ("sysctl", '{"key":"vm.swappiness","kind":"sysctl"}')
    assert journal.originals[key] == before["vm.swappiness"]
    d.start()  # same state dir and profile: it adopts, and changes nothing
    assert "adopted 4 settings from the journal of a previous run (profile test-a)" in d.log()
    assert "profile test-a active: 0 applied, 0 restored, 4 unchanged" in d.log()
    d.stop()
    after = {k: sysctl(k) for k in before}
    assert after == before
    assert not (d.state_dir / "journal.jsonl").exists()


def test_kill9_then_restart_without_profile_leaves_originals(
    start_daemon: Callable[..., Latencyd],
) -> None:
    before = {k: sysctl(k) for k in ("vm.swappiness", "vm.stat_interval", *DIRTY_PAIR)}
    d = start_daemon("test-a")
    d.kill9()
    d.profile = None
    d.extra = ["--no-profile"]
    d.start()
    assert {k: sysctl(k) for k in before} == before
    assert d.ctl("active").stdout.strip() == "none (all settings at their originals)"


def test_restore_puts_back_what_a_killed_run_left_and_exits(
    start_daemon: Callable[..., Latencyd],
) -> None:
    """`latencyd --restore` (the Debian package's prerm runs it on remove where the service
    is not running): the journal a previous run left is restored, and the process exits."""
    before = {k: sysctl(k) for k in TEST_A_KEYS}
    d = start_daemon("test-a")
    d.kill9()
    assert sysctl("vm.swappiness") == "11"
    d.profile = None
    done = subprocess.run(
        [*d.argv(), "--restore"], env=d.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert {k: sysctl(k) for k in before} == before
    assert not (d.state_dir / "journal.jsonl").exists()
    assert "restored what a previous run left" in done.stderr


def test_sigterm_restores_every_original(start_daemon: Callable[..., Latencyd]) -> None:
    before = {k: sysctl(k) for k in TEST_A_KEYS}
    d = start_daemon("test-a")
    assert sysctl("vm.swappiness") == "11"
    assert d.stop() == 0
    assert {k: sysctl(k) for k in before} == before
    assert not (d.state_dir / "journal.jsonl").exists()


def test_sighup_reloads_changed_profile(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    d = start_daemon("test-a")
    path = profiles / "test-a.toml"
    path.write_text(path.read_text().replace('"vm.swappiness" = 11', '"vm.swappiness" = 12'))
    d.signal(signal.SIGHUP)
    wait_for(lambda: sysctl("vm.swappiness") == "12")
    # A profile broken on disk is refused on reload; the applied one stays.
    path.write_text("[writeback\n")
    d.signal(signal.SIGHUP)
    wait_for(lambda: "reload failed" in d.log())
    assert d.ctl("active").stdout.strip() == "test-a"
    assert sysctl("vm.swappiness") == "12"
    assert "TOML syntax error" in d.log()


def test_unreachable_daemon_exit_code(private_bus: str, tmp_path: Path) -> None:
    d = Latencyd(private_bus, tmp_path)  # never started
    r = d.ctl("status")
    assert r.returncode == 3
    assert "not running" in r.stderr


def test_explain_works_without_daemon(profiles: Path, tmp_path: Path) -> None:
    d = Latencyd("unix:path=/nonexistent", tmp_path)
    r = d.ctl("explain", "test-b", "--profile-dir", str(profiles), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    sections = {s: {o["option"]: o for o in opts} for s, opts in data["sections"].items()}
    assert sections["writeback"]["dirty_ratio"]["value"] == 15
    assert sections["writeback"]["dirty_ratio"]["from"] == f"{profiles / 'test-b.toml'}:6"
    r = d.ctl("explain", str(profiles / "test-bad.toml"))
    assert r.returncode == 2 and "test-bad.toml:7: unknown option" in r.stderr


def test_unprivileged_caller_denied_by_bus_policy_reads_allowed(
    start_daemon: Callable[..., Latencyd], tmp_path: Path
) -> None:
    d = start_daemon("test-a")
    out = tmp_path / "out.txt"
    assert cli_as_nobody(d.address, "active", capture=out) == 0
    assert out.read_text().strip() == "test-a"
    assert cli_as_nobody(d.address, "status", capture=out) == 0
    assert cli_as_nobody(d.address, "verify", capture=out) == 0
    assert cli_as_nobody(d.address, "switch", "test-b", capture=out) == 4
    assert "permission denied" in out.read_text()
    assert cli_as_nobody(d.address, "off", capture=out) == 4
    assert d.ctl("active").stdout.strip() == "test-a"
    assert sysctl("vm.swappiness") == "11"


def monitor(address: str, user: int | None) -> BusListener:
    """gdbus monitor of the daemon's signals (match rules, as any client subscribes). It
    has subscribed once it says who owns the name: that answer came after its AddMatch."""
    cmd = ["gdbus", "monitor", "--address", address, "--dest", "org.latencyd.Daemon1"]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return BusListener(cmd, ready="is owned by")


def test_signals_naming_tasks_reach_root_only(start_daemon: Callable[..., Latencyd]) -> None:
    """Drift and NoiseExceeded name tasks (pid, comm, CPUs): the bus policy delivers them to
    root (and an admin group it names), as Status shows tasks to them only; everybody
    still hears ProfileChanged."""
    d = start_daemon("test-a")
    listeners = {"root": monitor(d.address, None), "nobody": monitor(d.address, 65534)}
    try:
        Path("/proc/sys/vm/swappiness").write_text("12")
        wait_for(lambda: sysctl("vm.swappiness") == "11")  # put back: drift
        assert d.ctl("switch", "test-b").returncode == 0
        # The bus delivers one sender's signals in order: whoever heard the switch had
        # been sent the drift before it, or was refused it.
        for listener in listeners.values():
            wait_for(lambda x=listener: "ProfileChanged ('test-b'" in x.heard())
    finally:
        heard = {who: listener.stop() for who, listener in listeners.items()}
    assert "org.latencyd.Daemon1.Drift" in heard["root"], heard["root"]
    assert "org.latencyd.Daemon1.ProfileChanged ('test-b'" in heard["nobody"], heard["nobody"]
    assert "Drift" not in heard["nobody"] and "swappiness" not in heard["nobody"]


def test_daemon_checks_uid_even_when_bus_policy_allows(
    tmp_path: Path, profiles: Path, kernel_guard: None
) -> None:
    """Second line of defence: a too-permissive policy file alone does not open the door."""
    from scripts.private_bus import PrivateBus

    policy = tmp_path / "permissive.conf"
    policy.write_text(PERMISSIVE_POLICY)
    with PrivateBus(policy) as bus:
        d = Latencyd(bus.address, tmp_path, profile="test-a", profile_dirs=[profiles]).start()
        try:
            out = tmp_path / "out.txt"
            assert cli_as_nobody(bus.address, "switch", "test-b", capture=out) == 4
            text = out.read_text()
            assert "SwitchProfile needs root" in text and "uid 65534" in text
            assert d.ctl("active").stdout.strip() == "test-a"
        finally:
            d.stop()


def test_admin_group_member_may_switch(
    tmp_path: Path, profiles: Path, private_bus: str, kernel_guard: None
) -> None:
    """Members of the configured admin group may change state (policy allows via daemon check)."""
    from scripts.private_bus import PrivateBus

    policy = tmp_path / "permissive.conf"
    policy.write_text(PERMISSIVE_POLICY)
    with PrivateBus(policy) as bus:
        d = Latencyd(
            bus.address,
            tmp_path,
            profile="test-a",
            profile_dirs=[profiles],
            config='admin_group = "nogroup"\n',
        ).start()
        try:
            out = tmp_path / "out.txt"
            assert cli_as_nobody(bus.address, "switch", "test-b", capture=out) == 0, out.read_text()
            assert d.ctl("active").stdout.strip() == "test-b"
        finally:
            d.stop()


@pytest.mark.parametrize("method", ["Get", "GetAll"])
def test_active_profile_property(start_daemon: Callable[..., Latencyd], method: str) -> None:
    import dbus

    d = start_daemon("test-a")
    conn = dbus.bus.BusConnection(d.address)
    try:
        obj = conn.get_object("org.latencyd.Daemon1", "/org/latencyd/Daemon1", introspect=False)
        props = dbus.Interface(obj, "org.freedesktop.DBus.Properties")
        if method == "Get":
            assert props.Get("org.latencyd.Daemon1", "ActiveProfile") == "test-a"
        else:
            everything = props.GetAll("org.latencyd.Daemon1")
            assert everything == {"ActiveProfile": "test-a", "RebootPending": False}
    finally:
        conn.close()


def test_profile_changed_signal(start_daemon: Callable[..., Latencyd]) -> None:
    d = start_daemon("test-a")
    monitor = signal_listener(d.address, "ProfileChanged")
    try:
        assert d.ctl("switch", "test-b").returncode == 0
        wait_for(lambda: 'string "test-b"' in monitor.heard())
    finally:
        out = monitor.stop()
    assert "member=ProfileChanged" in out and 'string "test-b"' in out


def test_the_next_run_restores_what_a_killed_runs_daemon_left(
    start_daemon: Callable[..., Latencyd], private_bus: str, kernel_guard: None
) -> None:
    """A test run killed outright (CI timeout, kill -9) cannot stop its daemons; the next
    run restores their journals before it takes its snapshot of the machine."""
    before = {k: sysctl(k) for k in TEST_A_KEYS}
    d = start_daemon("test-a")
    d.kill9()
    assert sysctl("vm.swappiness") == "11"
    dead = subprocess.Popen(["true"])  # its PID stands for the run that was killed
    dead.wait()
    killed_runs_record = STARTED_DAEMONS / f"{dead.pid}-{id(d)}.json"
    d.record.rename(killed_runs_record)
    assert recover_killed_runs(private_bus) == [str(d.state_dir)]
    assert {k: sysctl(k) for k in before} == before
    assert not killed_runs_record.exists() and not (d.state_dir / "journal.jsonl").exists()
