"""[main] booted_isolation = "require": the daemon refuses a switch or a hold to a profile
whose shielded CPUs the booted isolation does not match, like a bad profile (nothing
applied, the active profile stays), naming what is not booted and the arguments to boot
with. The booted state is a recorded one (tests/unit/test_boot.py's readings): this
machine's is what it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from latencyd.plugins.irq import IrqPlugin

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.profile import ProfileLibrary
from latencyd.errors import ProfileError
from latencyd.kernel.boot import NOT_SHOWN, booted
from latencyd.kernel.system import System
from latencyd.service.daemon import Daemon
from tests.unit.fakesys import add_irqs, make_fake_root
from tests.unit.test_boot import USUAL, readings
from tests.unit.test_irq import INTERRUPTS_4

RT = '[main]\nsummary = "rt"\nbooted_isolation = "require"\n\n[irq]\nisolate = "${app}"\n'


def daemon(tmp_path: Path, app: str) -> Daemon:
    """A daemon on a staged root with IRQs; profile "rt" requires CPUs `app` booted
    isolated, "plain" shields the same CPUs and only shows."""
    root = make_fake_root(tmp_path)
    add_irqs(root, INTERRUPTS_4)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "rt.toml").write_text(f'{RT}\n[variables]\napp = "{app}"\n')
    (pdir / "plain.toml").write_text(f'[irq]\nisolate = "{app}"\n')
    system = System(root)
    plugins = {"irq": IrqPlugin(system)}
    library = ProfileLibrary([pdir], section_schemas(plugins), system.machine())
    return Daemon(system, dict(plugins), library, Engine(plugins, Journal(tmp_path / "state")))


def affinities(d: Daemon) -> dict[str, str]:
    return {n.name: d.system.read(f"proc/irq/{n.name}/smp_affinity_list")
            for n in (d.system.root / "proc/irq").iterdir() if n.name.isdigit()}  # fmt: skip


def test_a_profile_requiring_isolation_not_booted_is_refused_and_the_active_one_stays(
    tmp_path: Path,
) -> None:
    d = daemon(tmp_path, "1")
    d.boot = booted(readings(USUAL))  # booted isolated: 2-3
    d.switch("plain")
    before = affinities(d)
    with pytest.raises(ProfileError) as info:
        d.switch("rt")
    message = str(info.value)
    assert message.startswith(
        f'{tmp_path}/profiles/rt.toml:3: profile rt: booted_isolation = "require", but tick '
        "not booted for CPUs 1; "
    )
    assert "tick booted for CPUs 2-3, not shielded" in message
    assert "(boot with nohz_full=1 rcu_nocbs=1 isolcpus=managed_irq,domain,1). Nothing" in message
    assert (d.active.name if d.active else None, d.base) == ("plain", "plain")
    assert affinities(d) == before
    with pytest.raises(ProfileError):
        d.hold("rt", "the application", ":1.5")
    assert d.holds == {} and d.active is not None and d.active.name == "plain"
    # "show" (the default) only shows the same findings.
    assert {f["state"] for f in (d.boot_status() or {})["findings"]} == {"not booted", "mismatch"}
    assert d.off() == []


def test_booted_to_match_it_applies_and_an_unknown_boot_never_passes(tmp_path: Path) -> None:
    d = daemon(tmp_path, "2-3")
    d.boot = booted(readings(USUAL))
    d.switch("rt")
    assert d.active is not None and d.active.name == "rt"
    assert set(affinities(d).values()) == {"0-1"}
    assert (d.boot_status() or {})["booted_isolation"] == "require"
    assert d.off() == []
    d.boot = None  # a machine that does not show how it booted
    with pytest.raises(ProfileError) as info:
        d.switch("rt")
    assert str(info.value).endswith(f'"require", but {NOT_SHOWN}')
    assert d.active is None
