"""The files in systemd/ are valid, checked with the real tools.

- latencyd.service passes `systemd-analyze verify` and keeps what the daemon needs;
- latencyd.tmpfiles.conf is accepted by systemd-tmpfiles and creates /run/latencyd 0700;
- latencyd.conf is valid TOML;
- org.latencyd.Daemon1.conf parses (dbus-daemon refuses to start on a malformed
  <include>) and is enforced on a private system-like bus: only root owns the name,
  anyone may call the read-only methods, only root the mutating ones. Unprivileged
  calls are made with dbus-send under `runuser -u nobody` (the venv's Python lives
  under /root, mode 700, so an unprivileged client must be a system binary).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `pytest` run without `python -m` from the repo root
    sys.path.insert(0, str(ROOT))

from latencyd.service.dbus import READ_METHODS, Service, dbus_methods  # noqa: E402
from latencyd.tools.manpages import PAGES, page  # noqa: E402
from scripts.private_bus import PrivateBus, PrivateBusError  # noqa: E402

SYSTEMD = ROOT / "systemd"
UNIT = SYSTEMD / "latencyd.service"
POLICY = SYSTEMD / "org.latencyd.Daemon1.conf"
TMPFILES = SYSTEMD / "latencyd.tmpfiles.conf"
CONFIG = SYSTEMD / "latencyd.conf"

NAME = "org.latencyd.Daemon1"
OBJECT_PATH = "/org/latencyd/Daemon1"
READ_ONLY = sorted(READ_METHODS)
# Every other method the daemon exports (HoldAndPlaceOn too): none left out by a list here.
MUTATING = sorted({m for (i, m) in dbus_methods(Service) if i == NAME} - READ_METHODS)
TIMEOUT_S = 10
UNITS_LOAD_STAMP = Path("/run/systemd/systemd-units-load")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="runuser and owning the bus name as root need root"
)


def _unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-analyze verify` a copy of the unit whose ExecStart= exists here."""
    exe = Path(sys.prefix) / "bin" / "latencyd"
    if not os.access(exe, os.X_OK):
        exe = Path(sys.executable)
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    copy = unit_dir / "latencyd.service"
    copy.write_text(unit_text.replace("ExecStart=/usr/bin/latencyd", f"ExecStart={exe}"))
    # Documentation=man:... is checked with `man`: the pages, as the package installs them.
    man = tmp_path / "man"
    for name, section in PAGES.items():
        (man / f"man{section}").mkdir(parents=True, exist_ok=True)
        (man / f"man{section}" / f"{name}.{section}").write_text(page(name))
    # verify loads units as systemd does, which marks the load in /run/systemd: on a
    # host whose systemd is not running, that file is ours to take away again.
    stamp_was_there = UNITS_LOAD_STAMP.exists()
    try:
        return subprocess.run(
            ["systemd-analyze", "verify", str(copy)],
            capture_output=True,
            text=True,
            env={**os.environ, "MANPATH": str(man)},
            timeout=TIMEOUT_S,
        )
    finally:
        if not stamp_was_there:
            UNITS_LOAD_STAMP.unlink(missing_ok=True)


# --- latencyd.service -------------------------------------------------------------


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not found")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    text = UNIT.read_text()
    assert text.count("ExecStart=/usr/bin/latencyd\n") == 1
    result = _verify(text, tmp_path)
    # verify exits 0 on unknown keys and bad values: the warnings are on stderr.
    complaints = [ln for ln in result.stderr.splitlines() if "latencyd" in ln]
    assert result.returncode == 0, result.stderr
    assert complaints == []


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not found")
def test_verify_would_catch_a_broken_unit(tmp_path: Path) -> None:
    unit = UNIT.read_text()
    assert "\nProtectSystem=" in unit
    broken = unit.replace("\nProtectSystem=", "\nProtectSystem=nonsense\nNoSuchKey=1\n#", 1)
    result = _verify(broken, tmp_path)
    assert "nonsense" in result.stderr
    assert "NoSuchKey" in result.stderr


def test_unit_keeps_what_the_daemon_needs() -> None:
    settings = _unit_settings(UNIT.read_text())
    assert settings["Type"] == ["dbus"]
    assert settings["BusName"] == [NAME]
    assert settings["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert settings["Restart"] == ["on-failure"]
    assert settings["WantedBy"] == ["multi-user.target"]
    # The crash journal in /run/latencyd must survive a crash and the restart.
    assert settings["RuntimeDirectory"] == ["latencyd"]
    assert settings["RuntimeDirectoryPreserve"] == ["yes"]
    # The PM QoS fd goes into systemd's fd store (sd_notify FDSTORE=1 from the main pid).
    assert settings["NotifyAccess"] == ["main"]
    assert int(settings["FileDescriptorStoreMax"][0]) >= 2
    # It writes /proc/sys, /sys and /proc/irq, sets SCHED_FIFO on other tasks, and
    # holds /dev/cpu_dma_latency open.
    for forbidden in (
        "ProtectKernelTunables",
        "RestrictRealtime",
        "PrivateDevices",
        "ProtectProc",
        "ProcSubset",
        "PrivateNetwork",
        "MemoryDenyWriteExecute",
    ):
        assert forbidden not in settings, forbidden
    assert "/dev/cpu_dma_latency rw" in settings["DeviceAllow"]
    # update-grub's grub-probe reads the root's block device (its UUID): refused it,
    # grub-mkconfig wrote another grub.cfg (root=/dev/vda1, new menu entry ids) and the VM
    # booted another kernel. Read only: writing a disk is nothing latencyd does.
    assert "block-* r" in settings["DeviceAllow"]
    assert not any(a.startswith("block-") and "w" in a.split()[-1] for a in settings["DeviceAllow"])
    caps = " ".join(settings["CapabilityBoundingSet"]).split()
    assert {"CAP_SYS_NICE", "CAP_SYS_ADMIN", "CAP_NET_ADMIN"} <= set(caps)
    assert not any(f.startswith("~") and "@debug" in f for f in settings["SystemCallFilter"])
    # Issue 37: a scrape of metrics_listen on loopback must pass IPAddressDeny=any, and the
    # noise watch's tracefs is systemd's to mount (the unit forbids @mount).
    if settings.get("IPAddressDeny") == ["any"]:
        assert "localhost" in " ".join(settings.get("IPAddressAllow", [])).split()
    if any("@mount" in f for f in settings.get("SystemCallFilter", [])):
        assert "sys-kernel-tracing.mount" in " ".join(settings["Wants"]).split()
        assert "sys-kernel-tracing.mount" in " ".join(settings["After"]).split()


# --- latencyd.tmpfiles.conf, latencyd.conf ----------------------------------------


@pytest.mark.skipif(shutil.which("systemd-tmpfiles") is None, reason="systemd-tmpfiles not found")
@needs_root
def test_tmpfiles_creates_private_run_dir(tmp_path: Path) -> None:
    result = subprocess.run(
        ["systemd-tmpfiles", f"--root={tmp_path}", "--create", str(TMPFILES)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr
    st = (tmp_path / "run" / "latencyd").stat()
    assert stat.S_ISDIR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert (st.st_uid, st.st_gid) == (0, 0)


def test_example_config_is_toml() -> None:
    config = tomllib.loads(CONFIG.read_text())
    assert config == {"default_profile": "latency-performance"}
    assert '# admin_group = "latency"' in CONFIG.read_text()


# --- org.latencyd.Daemon1.conf on a private bus ------------------------------------


@pytest.fixture(scope="module")
def bus() -> Iterator[PrivateBus]:
    if shutil.which("dbus-daemon") is None:
        pytest.skip("dbus-daemon not found (Debian package dbus-daemon)")
    with PrivateBus(POLICY) as private_bus:
        yield private_bus


def test_private_bus_refuses_a_malformed_policy(tmp_path: Path) -> None:
    if shutil.which("dbus-daemon") is None:
        pytest.skip("dbus-daemon not found (Debian package dbus-daemon)")
    bad = tmp_path / POLICY.name
    bad.write_text(POLICY.read_text().replace("</busconfig>", "</busconfig"))
    with pytest.raises(PrivateBusError, match="Failed to start message bus"):
        PrivateBus(bad)


def test_policy_parses_and_bus_runs(bus: PrivateBus) -> None:
    assert bus.address.startswith("unix:path=")
    assert bus.is_running()


def _dbus_send(
    bus: PrivateBus, args: list[str], *, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """dbus-send --system (via DBUS_SYSTEM_BUS_ADDRESS), as root or as `user`."""
    cmd = [
        "env",
        f"DBUS_SYSTEM_BUS_ADDRESS={bus.address}",
        "dbus-send",
        "--system",
        "--print-reply",
        "--reply-timeout=5000",
        *args,
    ]
    if user is not None:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)


def _request_name(bus: PrivateBus, user: str | None) -> subprocess.CompletedProcess[str]:
    return _dbus_send(
        bus,
        [
            "--dest=org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus.RequestName",
            f"string:{NAME}",
            "uint32:4",  # DBUS_NAME_FLAG_DO_NOT_QUEUE
        ],
        user=user,
    )


@needs_root
def test_unprivileged_user_cannot_own_the_name(bus: PrivateBus) -> None:
    result = _request_name(bus, user="nobody")
    assert result.returncode != 0
    assert "org.freedesktop.DBus.Error.AccessDenied" in result.stderr, result.stderr


@needs_root
def test_root_can_own_the_name(bus: PrivateBus) -> None:
    result = _request_name(bus, user=None)
    assert result.returncode == 0, result.stderr
    assert "uint32 1" in result.stdout  # DBUS_REQUEST_NAME_REPLY_PRIMARY_OWNER


# A stand-in for the daemon: owns the name as root and answers every method.
_FAKE_SERVICE = """
import sys
import dbus, dbus.service
from dbus.mainloop.glib import DBusGMainLoop
from latencyd.service.mainloop import MainLoop

IFACE = "org.latencyd.Daemon1"
DBusGMainLoop(set_as_default=True)

def answering(member):
    def answer(self):
        return "ok"
    answer.__name__ = member
    return dbus.service.method(IFACE, in_signature="", out_signature="s")(answer)

# Every method of the interface (argv), answering "ok"; made at once: the class's
# metaclass reads its methods when it is made.
Fake = type(dbus.service.Object)(
    "Fake", (dbus.service.Object,),
    {"__module__": __name__, **{m: answering(m) for m in sys.argv[1:]}},
)

bus = dbus.SystemBus()
name = dbus.service.BusName(IFACE, bus, do_not_queue=True)
Fake(bus, "/org/latencyd/Daemon1")
print("ready", flush=True)
MainLoop().run()
"""


@pytest.fixture()
def fake_daemon(bus: PrivateBus) -> Iterator[None]:
    env = dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=bus.address)
    proc = subprocess.Popen(
        [sys.executable, "-c", _FAKE_SERVICE, *READ_ONLY, *MUTATING],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != "ready":
            proc.kill()
            _, err = proc.communicate(timeout=TIMEOUT_S)
            pytest.fail(f"fake daemon did not start: {err}")
        yield
    finally:
        proc.terminate()
        proc.communicate(timeout=TIMEOUT_S)


def _call(bus: PrivateBus, interface_member: str, user: str | None) -> str:
    """'reply', 'denied' or the other error dbus-send printed."""
    result = _dbus_send(bus, [f"--dest={NAME}", OBJECT_PATH, interface_member], user=user)
    if result.returncode == 0:
        return "reply"
    if "org.freedesktop.DBus.Error.AccessDenied" in result.stderr:
        return "denied"
    return result.stderr.strip()


@needs_root
@pytest.mark.usefixtures("fake_daemon")
def test_policy_lets_anyone_read_but_only_root_change(bus: PrivateBus) -> None:
    as_nobody = {m: _call(bus, f"{NAME}.{m}", user="nobody") for m in READ_ONLY + MUTATING}
    assert as_nobody == {m: "reply" for m in READ_ONLY} | {m: "denied" for m in MUTATING}

    as_root = {m: _call(bus, f"{NAME}.{m}", user=None) for m in READ_ONLY + MUTATING}
    assert as_root == {m: "reply" for m in READ_ONLY + MUTATING}

    # Introspection and property reads reach the service (not denied by the bus);
    # property writes and unknown members are denied.
    assert _call(bus, "org.freedesktop.DBus.Introspectable.Introspect", user="nobody") == "reply"
    for member in ("Get", "GetAll"):
        outcome = _call(bus, f"org.freedesktop.DBus.Properties.{member}", user="nobody")
        assert outcome != "denied"
    assert _call(bus, "org.freedesktop.DBus.Properties.Set", user="nobody") == "denied"
    assert _call(bus, f"{NAME}.NoSuchMethod", user="nobody") == "denied"
