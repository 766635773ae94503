"""The D-Bus API as a caller sees it: declared errors without internals, one list of
methods (policy = introspection = code), and what members of admin_group may not do."""

from __future__ import annotations

import json
import re
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dbus
import pytest

from latencyd import BUS_NAME, INTERFACE, OBJECT_PATH
from latencyd.service.dbus import READ_METHODS, Service, dbus_methods
from tests.harness import POLICY, Latencyd
from tests.nobody import PERMISSIVE_POLICY, cli_as_nobody

PROPERTIES = "org.freedesktop.DBus.Properties"


def call(address: str, interface: str, method: str, *args: Any) -> Any:
    import dbus

    conn = dbus.bus.BusConnection(address)
    try:
        obj = conn.get_object(BUS_NAME, OBJECT_PATH, introspect=False)
        return getattr(obj, method)(*args, dbus_interface=interface)
    finally:
        conn.close()


def error_of(address: str, interface: str, method: str, *args: Any) -> tuple[str, str]:
    import dbus

    with pytest.raises(dbus.DBusException) as info:
        call(address, interface, method, *args)
    return info.value.get_dbus_name(), info.value.get_dbus_message()


def test_policy_introspection_and_code_name_the_same_methods(
    start_daemon: Callable[..., Latencyd],
) -> None:
    d = start_daemon("test-a")
    xml = call(d.address, "org.freedesktop.DBus.Introspectable", "Introspect")
    exported = {
        (iface.get("name"), m.get("name"))
        for iface in ET.fromstring(xml).iter("interface")
        for m in iface.iter("method")
    }
    in_code = set(dbus_methods(Service))
    assert exported == in_code
    ours = {m for i, m in in_code if i == INTERFACE}
    policy = ET.parse(POLICY).getroot()
    default = next(p for p in policy.iter("policy") if p.get("context") == "default")
    allowed = {
        (rule.get("send_interface"), rule.get("send_member"))
        for rule in default.iter("allow")
        if rule.get("send_member")
    }
    assert {m for i, m in allowed if i == INTERFACE} == READ_METHODS
    assert ours >= READ_METHODS
    assert allowed - {(INTERFACE, m) for m in READ_METHODS} == {
        (PROPERTIES, "Get"),
        (PROPERTIES, "GetAll"),
    }


@pytest.mark.parametrize(
    ("interface", "method", "args", "name"),
    [
        (PROPERTIES, "Get", ("x", "ActiveProfile"), "org.freedesktop.DBus.Error.UnknownInterface"),
        (PROPERTIES, "Get", (INTERFACE, "Nope"), "org.freedesktop.DBus.Error.UnknownProperty"),
        (PROPERTIES, "GetAll", ("x",), "org.freedesktop.DBus.Error.UnknownInterface"),
        (PROPERTIES, "Set", (INTERFACE, "ActiveProfile", dbus.String("x", variant_level=1)),
         "org.freedesktop.DBus.Error.PropertyReadOnly"),
        (PROPERTIES, "Set", (INTERFACE, "ActiveProfile", "x"), "org.freedesktop.DBus.Error."
         "InvalidArgs"),
        (INTERFACE, "NoSuchMethod", (), "org.freedesktop.DBus.Error.UnknownMethod"),
        (INTERFACE, "SwitchProfile", (7,), "org.freedesktop.DBus.Error.InvalidArgs"),
        (INTERFACE, "SwitchProfile", ("a", "b"), "org.freedesktop.DBus.Error.InvalidArgs"),
        (INTERFACE, "SwitchProfile", ("no-such",), "org.latencyd.Error.NoSuchProfile"),
        (INTERFACE, "SwitchProfile", ("test-bad",), "org.latencyd.Error.BadProfile"),
        (INTERFACE, "SwitchProfile", ("p" * 100_000,), "org.latencyd.Error.NoSuchProfile"),
        (INTERFACE, "HoldProfile", ("../x", ""), "org.latencyd.Error.NoSuchProfile"),
        (INTERFACE, "HoldAndPlaceOn", ("test-a", "", "1-x"), "org.latencyd.Error.BadProfile"),
        (INTERFACE, "HoldAndPlace", ("test-a", "", "1"), "org.freedesktop.DBus.Error.InvalidArgs"),
    ],
)  # fmt: skip
def test_every_error_is_declared_and_one_line(
    start_daemon: Callable[..., Latencyd],
    interface: str,
    method: str,
    args: tuple[Any, ...],
    name: str,
) -> None:
    d = start_daemon("test-a")
    got_name, message = error_of(d.address, interface, method, *args)
    assert got_name == name, message
    assert "\n" not in message and "Traceback" not in message and len(message) < 400
    assert d.ctl("active").stdout.strip() == "test-a"


BROKEN_PLUGIN = '''
from latencyd.core.plugin import Plugin
from latencyd.core.schema import Bool, Option, Schema


class BrokenPlugin(Plugin):
    """A third-party plugin with a bug: its expand raises what no plugin should."""

    name = "broken"
    summary = "raises an internal error on purpose"
    schema = Schema(options=(Option("crash", Bool(), "raise a bug"),))

    def expand(self, options, owned):
        raise RuntimeError("secret internal detail")
'''


@pytest.fixture
def broken_plugin(tmp_path: Path) -> dict[str, str]:
    """An installed third-party plugin (found through its entry point) that has a bug."""
    site = tmp_path / "site"
    (site / "brokenplug-0.1.dist-info").mkdir(parents=True)
    (site / "brokenplug.py").write_text(BROKEN_PLUGIN)
    (site / "brokenplug-0.1.dist-info" / "entry_points.txt").write_text(
        "[latencyd.plugins]\nbroken = brokenplug:BrokenPlugin\n"
    )
    return {"PYTHONPATH": str(site)}


def test_an_internal_error_is_logged_in_full_and_answered_without_internals(
    start_daemon: Callable[..., Latencyd], profiles: Path, broken_plugin: dict[str, str]
) -> None:
    (profiles / "buggy.toml").write_text('[sysctl]\n"vm.swappiness" = 12\n[broken]\ncrash = true\n')
    d = start_daemon("test-a", environment=broken_plugin)
    name, message = error_of(d.address, INTERFACE, "SwitchProfile", "buggy")
    assert name == "org.latencyd.Error.Internal"
    assert message == "internal error in latencyd; the details are in its log"
    log = d.log()
    assert "Traceback" in log and "RuntimeError: secret internal detail" in log
    assert d.ctl("active").stdout.strip() == "test-a"
    r = d.ctl("switch", "buggy")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert d.ctl("verify").returncode == 0  # test-a is still applied as it was


@pytest.fixture
def admin_daemon(
    tmp_path: Path, profiles: Path, kernel_guard: None
) -> Iterator[tuple[Latencyd, Path]]:
    """The daemon with admin_group = nogroup, on a bus whose policy lets anyone call."""
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
            yield d, tmp_path / "out.txt"
        finally:
            d.stop()


def test_admin_group_members_name_profiles_only(
    admin_daemon: tuple[Latencyd, Path], profiles: Path
) -> None:
    """A path would let them read root-only files through the daemon's parse errors."""
    d, out = admin_daemon
    for ref in (str(profiles / "test-b.toml"), "/etc/shadow", "../../../etc/shadow", "x.toml"):
        assert cli_as_nobody(d.address, "switch", ref, capture=out) == 2
        assert "only root may apply profile files" in out.read_text()
    assert cli_as_nobody(d.address, "switch", "test-b", capture=out) == 0, out.read_text()
    # Root may name a file.
    r = d.ctl("switch", str(profiles / "test-a.toml"))
    assert r.returncode == 0, r.stderr


def test_admin_group_members_cannot_apply_sysctls_that_hand_out_root(
    admin_daemon: tuple[Latencyd, Path], profiles: Path
) -> None:
    d, out = admin_daemon
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    (profiles / "sneaky.toml").write_text(
        textwrap.dedent("""\
        [main]
        include = ["test-a"]
        [sysctl]
        "kernel/core_pattern" = "|/tmp/pwn"
        """)
    )
    assert cli_as_nobody(d.address, "switch", "sneaky", capture=out) == 4
    text = out.read_text()
    assert "sysctl 'kernel/core_pattern' can hand out root" in text
    assert "only root may apply it" in text
    assert cli_as_nobody(d.address, "hold", "sneaky", "--", "true", capture=out) == 4
    assert Path("/proc/sys/kernel/core_pattern").read_text().strip() == pattern
    assert d.ctl("active").stdout.strip() == "test-a"


def test_profiles_others_could_write_are_refused(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    d = start_daemon("test-a")
    planted = profiles / "planted.toml"
    planted.write_text('[sysctl]\n"vm.swappiness" = 1\n')
    planted.chmod(0o666)
    r = d.ctl("switch", "planted")
    assert r.returncode == 2 and "writable by group or others (mode 666)" in r.stderr
    listed = d.ctl("list").stdout
    assert re.search(r"planted +INVALID: .*writable by group or others", listed)
    assert d.ctl("active").stdout.strip() == "test-a"


def test_a_number_python_cannot_hold_stops_neither_the_daemon_nor_the_listing(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    """Issue 37, defect 7: a 5,000-digit integer made tomllib raise ValueError, not a
    ProfileError: as the start-up profile it stopped the daemon (at every restart), and
    on the search path it failed ListProfiles for every caller."""
    digits = profiles / "digits.toml"
    digits.write_text("[writeback]\ndirty_ratio = 1" + "0" * 5000 + "\n")
    d = start_daemon("digits")
    status = json.loads(d.ctl("status", "--json").stdout)
    error = f"{digits}:2: an integer of more than 4300 digits (TOML's are 64-bit)"
    assert (status.get("active_profile"), status.get("last_error")) == ("", error), d.log()
    listed = d.ctl("list")
    assert listed.returncode == 0, listed.stderr
    assert re.search(rf"digits +INVALID: {re.escape(error)}", listed.stdout)
    assert re.search(r"test-a +\S", listed.stdout)
    assert "Traceback" not in d.log()
