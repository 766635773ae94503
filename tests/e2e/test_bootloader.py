"""A [bootloader] section in the daemon: written (here, where no bootloader tool is found,
latencyd's own file), pending until a reboot everywhere a user looks (status, verify's
exit code, the D-Bus property), and taken back by off. On a machine whose mechanism is a
real bootloader (grubby, kernel-install entries, GRUB) the test is skipped: it never
touches a machine's own boot configuration."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from latencyd.kernel.bootloaders import RECORD, PlainFile, detect
from latencyd.kernel.system import System
from tests.harness import Latencyd

PENDING = 5  # latencyctl verify: as wanted, part of it at the next boot
PROFILE = """
[main]
summary = "kernel arguments for the next boot"

[bootloader]
cmdline = ["skew_tick=1", "nohz_full=1"]
write = true
"""


@pytest.fixture
def record() -> Iterator[Path]:
    system = System("/")
    if not isinstance(detect(system), PlainFile):
        pytest.skip("this machine has a bootloader tool: its boot configuration is not ours")
    path = system.path(RECORD)
    if path.exists():
        pytest.skip(f"{path} exists: a latencyd of this machine has written it")
    made = [p for p in (path.parent, path.parent.parent) if not p.exists()]
    yield path
    path.unlink(missing_ok=True)
    for directory in made:
        shutil.rmtree(directory, ignore_errors=True)


def reboot_pending_property(d: Latencyd) -> str:
    out = subprocess.run(
        ["gdbus", "call", "--address", d.address, "--dest", "org.latencyd.Daemon1",
         "--object-path", "/org/latencyd/Daemon1", "--method",
         "org.freedesktop.DBus.Properties.Get", "org.latencyd.Daemon1", "RebootPending"],
        capture_output=True, text=True, timeout=10, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def test_kernel_arguments_are_pending_until_a_reboot_and_off_takes_them_back(
    start_daemon: Callable[..., Latencyd], profiles: Path, record: Path
) -> None:
    (profiles / "boot-args.toml").write_text(PROFILE)
    booted_nohz_full = Path("/sys/devices/system/cpu/nohz_full").exists()
    d = start_daemon("boot-args")
    status = json.loads(d.ctl("status", "--json").stdout)
    if booted_nohz_full:
        assert record.read_text() == "skew_tick=1 nohz_full=1\n"
    else:  # this kernel ignores nohz_full=: not applicable, never written nor pending
        refused = {
            r["text"]: r["reason"] for r in status["plugins"]["bootloader"]["not_applicable"]
        }
        assert "CONFIG_NO_HZ_FULL" in refused["nohz_full=1"]
        assert record.read_text() == "skew_tick=1\n"
    [pending] = status["reboot_pending"]
    assert pending["plugin"] == "bootloader"
    assert pending["reason"].startswith("the next boot brings skew_tick=1")
    assert reboot_pending_property(d) == "(<true>,)"
    verify = d.ctl("verify")
    assert verify.returncode == PENDING, verify.stdout + verify.stderr
    assert "reboot pending: [bootloader]" in verify.stdout
    assert d.ctl("off").returncode == 0
    assert not record.exists()
    assert reboot_pending_property(d) == "(<false>,)"
    assert json.loads(d.ctl("status", "--json").stdout)["reboot_pending"] == []


def test_the_daemons_config_fixing_write_false_writes_nothing_whatever_the_profile_says(
    start_daemon: Callable[..., Latencyd], profiles: Path, record: Path
) -> None:
    """[plugin.bootloader] write = false in latencyd.conf: the profile's write = true is
    overridden, the arguments are shown, nothing is written, and status names the line."""
    (profiles / "boot-args.toml").write_text(PROFILE)
    config = "# no boot configuration from any profile\n[plugin.bootloader]\nwrite = false\n"
    d = start_daemon("boot-args", config=config)
    status = json.loads(d.ctl("status", "--json").stdout)
    bootloader = status["plugins"]["bootloader"]
    assert bootloader["fixed"] == {"write": f"{d.config}:3"}
    assert {r["text"] for r in bootloader["not_applicable"]} >= {"skew_tick=1"}
    assert all("fixed by the daemon's config" in r["reason"] or "CONFIG_NO_HZ_FULL" in r["reason"]
               for r in bootloader["not_applicable"])  # fmt: skip
    assert not record.exists() and status["reboot_pending"] == []
    assert d.ctl("off").returncode == 0 and not record.exists()


def test_a_stop_leaves_the_next_boots_arguments_and_a_switch_away_after_it_takes_them(
    start_daemon: Callable[..., Latencyd], profiles: Path, record: Path
) -> None:
    """SIGTERM, as at a shutdown: every setting restored but the kernel arguments for the
    next boot (issue 51, 4a: the reboot came back without them). A daemon started on an
    empty state directory, as after a reboot, owns them from latencyd's record on disk,
    writes nothing to keep them, and a switch to a profile without them takes them out."""
    (profiles / "boot-args.toml").write_text(PROFILE + '\n[sysctl]\n"vm.swappiness" = 11\n')
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    d = start_daemon("boot-args")
    written = record.read_text()
    assert written.startswith("skew_tick=1")
    assert d.stop() == 0
    assert record.read_text() == written
    assert Path("/proc/sys/vm/swappiness").read_text() == swappiness
    assert "next boot's kernel arguments: " in d.log() and "left for the next boot" in d.log()
    after = start_daemon("boot-args")  # a state directory of its own: /run after a reboot
    assert record.read_text() == written
    assert after.ctl("verify").returncode == PENDING
    assert after.ctl("switch", "test-a").returncode == 0
    assert not record.exists()
    assert json.loads(after.ctl("status", "--json").stdout)["reboot_pending"] == []


def test_a_start_without_a_profile_after_a_stop_takes_latencyds_arguments_out(
    start_daemon: Callable[..., Latencyd], profiles: Path, record: Path
) -> None:
    """Off is off: a start with no profile (a reboot's, say) restores what latencyd's record
    holds, the boot configuration too."""
    (profiles / "boot-args.toml").write_text(PROFILE)
    d = start_daemon("boot-args")
    assert record.exists() and d.stop() == 0 and record.exists()
    start_daemon(None)
    assert not record.exists()
