"""The plugin contract, checked for every plugin found (the files of plugins/, then the
entry-point group of other installed packages) and for the example plugin in the README:
documented options, targets that round-trip through the journal, and an example section
that applies, verifies and restores on a fake machine leaving it exactly as it was."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import (
    Plugin,
    built_in,
    decode_target,
    discover,
    encode_target,
    target_kinds,
)
from latencyd.core.profile import Profile
from latencyd.core.schema import ArrayOfTables, Schema, validate
from tests.harness import REPO
from tests.unit.fakesys import make_fake_machine, tree_values


def readme_example() -> str:
    """The "Writing a plugin" example: the README's code block as it stands."""
    text = (REPO / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", text[text.index("## Writing a plugin") :], re.S)
    assert code, "the README's plugin example is missing"
    return code.group(1)


def readme_plugin() -> type[Plugin[Any, Any, Any]]:
    """The README's example, loaded."""
    spec = importlib.util.spec_from_loader("readme_plugin", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["readme_plugin"] = module
    exec(compile(readme_example(), "README.md", "exec"), module.__dict__)
    plugins = [
        v for v in vars(module).values()
        if isinstance(v, type) and issubclass(v, Plugin) and v is not Plugin
    ]  # fmt: skip
    assert len(plugins) == 1
    return plugins[0]


PLUGINS: dict[str, type[Plugin[Any, Any, Any]]] = discover() | {"readme": readme_plugin()}


def every_option(schema: Schema) -> list[tuple[str, str]]:
    out = [(o.name, o.doc) for o in schema.options]
    for table in schema.tables:
        out.append((table.name, table.doc))
        out += [(f"{table.name}.{n}", d) for n, d in every_option(table.schema)]
    return out


@pytest.mark.parametrize("key", sorted(PLUGINS))
def test_plugin_keeps_the_contract(key: str, tmp_path: Path) -> None:
    system = make_fake_machine(tmp_path)
    plugin = PLUGINS[key](system)
    # Named, summarised, every option documented.
    assert plugin.name and plugin.summary and (plugin.targets or plugin.schema.watches_only)
    assert all(doc.strip() for _, doc in every_option(plugin.schema)), every_option(plugin.schema)
    assert len({t.kind for t in plugin.targets}) == len(plugin.targets)
    # The example is a valid section (with the engine's options added).
    schema = section_schemas({plugin.name: plugin})[plugin.name]
    assert plugin.example, f"{key}: no example section"
    options = validate(schema, plugin.example, system.machine())
    profile = Profile("example", tmp_path / "example.toml", "", {plugin.name: options}, {})
    engine = Engine({plugin.name: plugin}, Journal(tmp_path / "state"))
    expansion = engine.expand(profile)[plugin.name]
    if plugin.schema.watches_only:  # sets nothing ([monitor]): what it watches is in status
        assert not plugin.targets and not expansion.settings
        assert plugin.monitor(expansion.rules).facts
        return
    assert expansion.settings, f"{key}: the example wants nothing on the fake machine"
    # Targets round-trip through the journal's form.
    kinds = target_kinds(plugin)
    for target in expansion.settings:
        data = json.loads(json.dumps(encode_target(target)))
        assert decode_target(kinds, data) == target
        assert plugin.describe(target, expansion.settings[target])
    # Applied, verified, restored: the machine is as it was.
    nics = system.ethtool.nics  # type: ignore[attr-defined]  # the fake's
    # (dev/cpu_dma_latency is a plain file in the fake: the request is checked by pmqos.)
    before = (
        tree_values(system.root, "proc"),
        tree_values(system.root, "sys"),
        (
            system.sched.state(),
            copy.deepcopy(nics),
        ),
    )
    report = engine.apply(profile)
    assert report.applied > 0, report
    assert engine.verify() == []
    assert engine.off() == []
    after = tree_values(system.root, "proc"), tree_values(system.root, "sys")
    assert after == before[:2]
    assert (system.sched.state(), nics) == before[2]
    assert system.pmqos.held() is None
    assert not (tmp_path / "state" / "journal.jsonl").exists()


@pytest.mark.parametrize("key", sorted(PLUGINS))
def test_a_plugins_hooks_get_its_section_as_its_options_class(key: str, tmp_path: Path) -> None:
    """Issue 53: a plugin whose options class declares its schema (Schema.section) gets its
    validated section as that class (Plugin.options_of), each option at its field and
    each entry of a table of its own class; one without (free keys) the mapping itself."""
    system = make_fake_machine(tmp_path)
    plugin = PLUGINS[key](system)
    options = validate(plugin.schema, plugin.example, system.machine())
    typed = plugin.options_of({**options, "on_drift": "restore"})  # the engine's: left out
    if plugin.schema.section is None:  # only a section of free keys ([sysctl]) has none
        assert plugin.schema.free_keys is not None and not plugin.schema.options
        assert plugin.options_of(options) is options
        return
    assert isinstance(typed, plugin.schema.section)
    for name, value in options.items():
        table = plugin.schema.table(name)
        if table is None:
            assert getattr(typed, name) == value, name
            continue
        entries = getattr(typed, name)
        assert all(isinstance(e, table.schema.section) for e in entries), name
        set_fields = [
            {k: v for k, v in dataclasses.asdict(e).items() if v is not None} for e in entries
        ]
        assert set_fields == value, name


def test_every_file_and_package_in_plugins_is_a_built_in_plugin() -> None:
    in_plugins = {p.stem for p in (REPO / "plugins").glob("*.py") if p.stem != "__init__"}
    in_plugins |= {p.parent.name for p in (REPO / "plugins").glob("*/__init__.py")}
    assert set(built_in()) == in_plugins
    assert in_plugins <= set(discover())


def test_a_new_file_in_plugins_is_a_plugin_with_no_other_file_edited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 53: the README's example saved as one more file of a copy of plugins/ is
    found beside the built-ins and applied: no entry point, no list, nothing outside
    plugins/ to edit."""
    site = tmp_path / "site"
    copied = site / "copied_plugins"
    shutil.copytree(REPO / "plugins", copied, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (copied / "ksm.py").write_text(readme_example())
    monkeypatch.syspath_prepend(str(site))
    found = discover([str(tmp_path / "nothing installed")], package="copied_plugins")
    assert set(found) == set(built_in()) | {"ksm"}
    assert found["ksm"].__module__ == "copied_plugins.ksm"
    system = make_fake_machine(tmp_path / "machine")
    before = tree_values(system.root, "sys")
    plugins = {"ksm": found["ksm"](system)}
    engine = Engine(plugins, Journal(tmp_path / "state"))
    section = validate(section_schemas(plugins)["ksm"], {"run": True}, system.machine())
    report = engine.apply(Profile("p", tmp_path / "p.toml", "", {"ksm": section}, {}))
    assert report.applied == 1 and engine.verify() == []
    assert engine.off() == [] and tree_values(system.root, "sys") == before


def test_an_installed_plugin_with_a_built_in_name_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A profile's [irq] is latencyd's irq whatever else is installed: an entry point
    under a built-in's name is refused with a log line saying so, and others still load."""
    site = tmp_path / "site"
    (site / "other-1.0.dist-info").mkdir(parents=True)
    (site / "other-1.0.dist-info" / "entry_points.txt").write_text(
        "[latencyd.plugins]\nirq = other_irq:IrqPlugin\n"
    )
    (site / "latencyd-0.1.dist-info").mkdir()  # an install made when built-ins had lines
    (site / "latencyd-0.1.dist-info" / "entry_points.txt").write_text(
        "[latencyd.plugins]\nnet = latencyd.plugins.net:NetPlugin\n"
    )
    found = discover([str(site)])
    assert found["irq"] is built_in()["irq"] and found["net"] is built_in()["net"]
    assert "plugin irq (other_irq:IrqPlugin) refused: irq is a built-in plugin's name" in (
        caplog.text
    )
    assert "plugin net" not in caplog.text  # the built-in's own line: nothing to refuse


def test_the_schemas_tables_are_documented_in_plugin_docs() -> None:
    from latencyd.tools.explain import plugin_docs

    docs = plugin_docs()
    for name, cls in discover().items():
        tables = [t.name for t in cls.schema.tables if isinstance(t, ArrayOfTables)]
        listed = {o["option"] for o in docs[name]["options"]}
        assert {f"[[{name}.{t}]]" for t in tables} <= listed


# A capability declared by a plugin that lives outside latencyd, beside the README's
# example: the engine finds it by what the plugin is, with nothing of latencyd edited.
GROUPED_PLUGIN = """
from collections.abc import Hashable, Mapping, Sequence

from latencyd.core.capabilities import ReportsGrouped
from latencyd.core.plugin import Expansion, Options, Plugin, Target, Value
from latencyd.core.schema import Schema

from ksm_plugins.ksm import KsmRun

SAID: list[list[tuple[KsmRun, Value, Value]]] = []


class SaysKsm(Plugin[KsmRun, None, Options], ReportsGrouped[KsmRun]):
    name = "sayksm"
    summary = "KSM, said in one line per step"
    schema = Schema()
    targets = (KsmRun,)

    def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion[None]:
        return Expansion({KsmRun(): "1"})

    def report(self, changes: list[tuple[KsmRun, Value, Value]]) -> None:
        SAID.append(changes)

    def group(self, target: KsmRun) -> Hashable | None:
        return None

    def describe_group(self, targets: Sequence[KsmRun], value: Value) -> str:
        return "KSM"
"""


def test_a_plugin_written_from_the_readme_needs_only_its_own_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 53: the README's example, written as a package of its own with the entry
    point an install writes, is found and applied, and a capability it declares is asked
    for, with nothing of latencyd (core, engine, daemon) edited; a plugin without the
    capability is never asked."""
    site = tmp_path / "site"
    package = site / "ksm_plugins"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ksm.py").write_text(readme_example())
    (package / "sayksm.py").write_text(GROUPED_PLUGIN)
    (site / "ksm_plugins-1.0.dist-info").mkdir()
    (site / "ksm_plugins-1.0.dist-info" / "entry_points.txt").write_text(
        "[latencyd.plugins]\nksm = ksm_plugins.ksm:KsmPlugin\nsayksm = ksm_plugins.sayksm:SaysKsm\n"
    )
    monkeypatch.syspath_prepend(str(site))
    found = {n: c for n, c in discover([str(site)]).items() if n not in built_in()}
    assert sorted(found) == ["ksm", "sayksm"]
    system = make_fake_machine(tmp_path / "machine")
    before = tree_values(system.root, "sys")
    plugins = {name: cls(system) for name, cls in found.items()}
    engine = Engine(plugins, Journal(tmp_path / "state"))
    section = validate(section_schemas(plugins)["ksm"], {"run": True}, system.machine())
    for sections in ({"ksm": section}, {"sayksm": {}}):
        profile = Profile("p", tmp_path / "p.toml", "", sections, {})
        report = engine.apply(profile)
        assert report.applied == 1 and engine.verify() == []
        assert engine.off() == [] and tree_values(system.root, "sys") == before
    said = sys.modules["ksm_plugins.sayksm"].SAID
    # Asked of the plugin that declares it, once per step: the apply, then the off.
    assert [[(type(t).kind, after) for t, _, after in step] for step in said] == [
        [("ksm_run", "1")],
        [("ksm_run", "0")],
    ]
    assert not hasattr(plugins["ksm"], "report")
