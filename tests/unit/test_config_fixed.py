"""The daemon's config fixes a plugin's options over every profile ([plugin.NAME]):
checked against the plugin's schema with the config's file and line, laid over the
profile's section where the profile has one (never creating one), and named by explain
and status. The bootloader case: write = false in the config, write = true in a profile,
and nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.bootloader import NOT_WRITTEN, BootloaderPlugin
from latencyd.plugins.writeback import WritebackPlugin

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import Plugin
from latencyd.core.profile import ProfileLibrary
from latencyd.cpuset import CpuSet
from latencyd.errors import ConfigError, Location, ProfileError
from latencyd.kernel.bootloaders import RECORD
from latencyd.kernel.system import Machine, System
from latencyd.service.config import fixed_options, load_config
from latencyd.service.daemon import Daemon
from latencyd.tools.cli import format_explain, format_status
from tests.unit.fakesys import make_fake_root
from tests.unit.test_bootloader import rig

MACHINE = Machine(CpuSet.from_list("0-3"), 8 << 30)
NO_WRITE = "# the boot configuration is its owner's\n[plugin.bootloader]\nwrite = false\n"


def plugins(tmp_path: Path) -> dict[str, Plugin[Any, Any, Any]]:
    return {"bootloader": BootloaderPlugin(rig(tmp_path))}


def library(
    tmp_path: Path,
    config: str,
    profiles: dict[str, str],
    found: dict[str, Plugin[Any, Any, Any]],
    machine: Machine = MACHINE,
) -> ProfileLibrary:
    """Profiles as the daemon loads them under a config file holding `config`."""
    (tmp_path / "latencyd.conf").write_text(config)
    pdir = tmp_path / "profiles"
    pdir.mkdir(exist_ok=True)
    for name, text in profiles.items():
        (pdir / f"{name}.toml").write_text(text)
    schemas = section_schemas(found)
    fixed = fixed_options(load_config(tmp_path / "latencyd.conf"), schemas, machine)
    return ProfileLibrary([pdir], schemas, machine, fixed=fixed)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[plugin.bootloader]\nwrite = 'no'\n",
         "4: [plugin.bootloader] write: expected true or false, got 'no'"),
        ("[plugin.bootloader]\nwirte = false\n",
         "4: [plugin.bootloader] has no option 'wirte' to fix "
         "(options: cmdline, remove, write, on_drift)"),
        ("[plugin.bootloder]\nwrite = false\n",
         "4: unknown plugin 'bootloder' in [plugin.bootloder] (plugins: bootloader)"),
        ("[plugin.bootloader]\non_drift = 'ignore'\n", "4: [plugin.bootloader] on_drift: "),
        ("[plugin.bootloader]\ncmdline = ['nohz_full=7']\n", "4: [plugin.bootloader] cmdline: "),
        ("plugin.bootloader.write = 1\n",
         "3: [plugin.bootloader] write: expected true or false, got 1"),
        ("plugin.bootloader = 3\n", "3: plugin.bootloader must be a table of the plugin's options"),
        ("plugin = 3\n", "3: plugin has the wrong type (3)"),
    ],
)  # fmt: skip
def test_fixed_options_are_checked_against_the_plugin_with_the_config_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "latencyd.conf"
    path.write_text(f"# latencyd.conf\n\n{text}")
    schemas = section_schemas(plugins(tmp_path))
    with pytest.raises(ConfigError) as info:
        fixed_options(load_config(path), schemas, MACHINE)
    assert str(info.value).startswith(f"{path}:{message}")


def test_a_fixed_option_overrides_the_profile_and_says_so(tmp_path: Path) -> None:
    conf = tmp_path / "latencyd.conf"
    found = plugins(tmp_path)
    profiles = library(tmp_path, NO_WRITE, {
        "rt": '[bootloader]\ncmdline = ["nohz_full=1-3"]\nwrite = true\n',
        "plain": '[main]\nsummary = "no boot arguments"\n',
    }, found)  # fmt: skip
    rt = profiles.load("rt")
    assert rt.sections["bootloader"]["write"] is False
    assert rt.origins["bootloader"]["write"] == Location(conf, 3)
    assert rt.fixed == {"bootloader": {"write": Location(conf, 3)}}
    assert rt.written["bootloader"]["write"] is True  # what the file says, for derived ones
    # No section is created where the profile has none: the config limits, adds nothing.
    assert profiles.load("plain").sections == {}

    # The daemon applies it: nothing written, the reason and the config's line in status.
    system = found["bootloader"].system
    daemon = Daemon(system, found, profiles, Engine(found, Journal(tmp_path / "state")))
    daemon.switch("rt")
    assert not (system.root / RECORD).exists() and daemon.reboot_pending == []
    status = daemon.status()["plugins"]["bootloader"]
    assert [r["reason"] for r in status["not_applicable"]] == [NOT_WRITTEN]
    assert "fixed by the daemon's config" in NOT_WRITTEN
    assert status["fixed"] == {"write": f"{conf}:3"}
    assert f"  write fixed by the daemon's config ({conf}:3)" in format_status(daemon.status())
    assert daemon.off() == []

    row = {"option": "write", "value": False, "from": f"{conf}:3", "fixed": True}
    explained = {"name": "rt", "summary": "", "files": [], "variables": {},
                 "sections": {"bootloader": [row]}}  # fmt: skip
    fixed_row = f"  write = False   # {conf}:3 (fixed by the daemon's config)"
    assert fixed_row in format_explain(explained)


def test_a_fixed_value_the_profile_cannot_take_is_an_error_at_the_config_line(
    tmp_path: Path,
) -> None:
    """The fixed value is checked with the profile's other options, against this machine."""
    found = plugins(tmp_path)
    config = "[plugin.bootloader]\ncmdline = ['nohz_full=1']\n"
    profiles = {"rt": '[bootloader]\ncmdline = ["nohz_full=2"]\nwrite = true\n'}
    rt = library(tmp_path, config, profiles, found).load("rt")
    assert rt.sections["bootloader"]["cmdline"] == ["nohz_full=1"]
    # Once CPU 1 is gone (the config was checked when it was there), the config's line
    # says so: the library follows the machine, the config's check was at start.
    profiles_now = library(tmp_path, config, profiles, found)
    profiles_now.machine = Machine(CpuSet.from_list("0"), 8 << 30)
    with pytest.raises(ProfileError) as info:
        profiles_now.load("rt")
    conf = tmp_path / "latencyd.conf"
    assert str(info.value).startswith(f"{conf}:2: [plugin.bootloader] cmdline: nohz_full: ")


def test_a_fixed_option_replaces_the_profiles_choice_of_its_exclusive_other(
    tmp_path: Path,
) -> None:
    """dirty_bytes fixed: a profile's dirty_ratio gives way, as to a later file's."""
    system = System(make_fake_root(tmp_path))
    wb = library(tmp_path, "[plugin.writeback]\ndirty_bytes = 1000000\n",
                 {"wb": "[writeback]\ndirty_ratio = 10\ndirty_background_ratio = 5\n"},
                 {"writeback": WritebackPlugin(system)}, system.machine()).load("wb")  # fmt: skip
    assert "dirty_ratio" not in wb.sections["writeback"]
    assert wb.sections["writeback"]["dirty_bytes"] == 1000000
    assert wb.sections["writeback"]["dirty_background_ratio"] == 5
