"""One plugin on a fake machine: its section validated and expanded, an engine over it, and
the apply / verify / restore round trip every plugin's unit tests start from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from latencyd.plugins.sysctl import SysctlPlugin

from latencyd.core.engine import Engine, plugin_options, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import Expansion, Plugin
from latencyd.core.profile import Profile, ProfileLibrary
from latencyd.core.schema import validate
from latencyd.kernel.system import Machine, System
from latencyd.service.daemon import Daemon
from tests.unit.fakesys import make_fake_root, tree_bytes


def swap_daemon(tmp_path: Path, machine: Machine) -> tuple[Path, Daemon]:
    """A daemon on a fake root with the sysctl plugin and one profile, `swap`
    (vm.swappiness = 10): the daemon's own behaviour, with a plugin to apply."""
    root = make_fake_root(tmp_path)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "swap.toml").write_text('[sysctl]\n"vm.swappiness" = 10\n')
    system = System(root)
    plugins: dict[str, Plugin[Any, Any, Any]] = {"sysctl": SysctlPlugin(system)}
    library = ProfileLibrary([pdir], section_schemas(plugins), machine)
    return root, Daemon(system, plugins, library, Engine(plugins, Journal(tmp_path / "state")))


class PluginRig:
    """`name` is the plugin's section; subclasses build the fake tree under `root`."""

    def __init__(self, tmp_path: Path, root: Path, name: str, system: System,
                 plugin: Plugin[Any, Any, Any]) -> None:  # fmt: skip
        self.tmp_path, self.root, self.name = tmp_path, root, name
        self.system, self.plugin = system, plugin
        self.machine = Machine(system.online_cpus(), 8 << 30)

    def section(self, raw: dict[str, Any]) -> dict[str, Any]:
        return validate(section_schemas({self.name: self.plugin})[self.name], raw, self.machine)

    def expand(self, raw: dict[str, Any]) -> Expansion:
        return self.plugin.expand(self.plugin.options_of(plugin_options(self.section(raw))), {})

    def profile(self, raw: dict[str, Any], name: str = "p") -> Profile:
        return Profile(name, Path(f"{name}.toml"), "", {self.name: self.section(raw)}, {})

    def engine(self) -> Engine:
        return Engine({self.name: self.plugin}, Journal(self.tmp_path / "state"))

    def snapshot(self) -> dict[str, bytes]:
        return tree_bytes(self.root, "sys")

    def round_trip(self, raw: dict[str, Any]) -> Engine:
        """Apply, verify, restore: every file byte for byte as it was, the journal gone."""
        before = self.snapshot()
        engine = self.engine()
        report = engine.apply(self.profile(raw))
        assert report.applied > 0 and report.not_applicable == {}, report
        assert engine.verify() == []
        assert engine.off() == []
        assert self.snapshot() == before
        assert not (self.tmp_path / "state" / "journal.jsonl").exists()
        return engine
