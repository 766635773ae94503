"""explain: a profile's merged settings and the file and line each came from (no daemon needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from latencyd.core.engine import plugin_options, section_schemas
from latencyd.core.plugin import load_plugins
from latencyd.core.profile import Profile, ProfileLibrary
from latencyd.core.schema import Schema
from latencyd.cpuset import CpuSet
from latencyd.errors import LatencydError
from latencyd.kernel.owners import read_owners
from latencyd.kernel.system import System
from latencyd.paths import CONFIG_FILE
from latencyd.service.config import fixed_options, load_config, search_path


def plain(value: Any) -> Any:
    """Profile values as JSON: CPU sets as cpulists."""
    if isinstance(value, CpuSet):
        return value.to_list()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def library(profile_dirs: list[Path], system: System) -> ProfileLibrary:
    """Profiles as the CLI reads them without the daemon: the config's search path, this
    machine's plugins (explain, measure --attribute)."""
    config = load_config(CONFIG_FILE)
    schemas, machine = section_schemas(load_plugins(system)), system.machine()
    return ProfileLibrary(
        search_path(profile_dirs, config),
        schemas,
        machine,
        fixed=fixed_options(config, schemas, machine),  # as the daemon has them
        cluster_dir=config.cluster_profiles,
    )


def other_owners(profile: Profile, system: System) -> dict[str, list[dict[str, Any]]]:
    """Per section, what else sets what it would set (latencyd.kernel.owners), one entry
    per claim: the sections are expanded on this machine as a switch would, nothing set."""
    plugins, index = load_plugins(system), read_owners(system)
    out: dict[str, list[dict[str, Any]]] = {}
    for section, options in profile.sections.items():
        if section not in plugins:
            continue
        try:
            plugin = plugins[section]
            wanted = plugin.expand(plugin.options_of(plugin_options(options)), {}).settings
        except LatencydError:
            continue  # what cannot expand here is for switch to say
        claims = dict.fromkeys(c for t in wanted for c in t.claims())
        found = [(c, index.of([c])) for c in claims]
        if rows := [{"setting": str(c), "owners": [o.as_json() for o in owners]}
                    for c, owners in found if owners]:  # fmt: skip
            out[section] = rows
    return out


def explain(name_or_path: str, profile_dirs: list[Path], root: str = "/") -> dict[str, Any]:
    system = System(root)
    profile = library(profile_dirs, system).load(name_or_path)
    sections = {
        section: [
            {
                "option": opt,
                "value": plain(value),
                "from": str(profile.origins[section].get(opt, "(default)")),
                # "from" is then the daemon's config, over what the profile says
                **({"fixed": True} if opt in profile.fixed.get(section, {}) else {}),
            }
            for opt, value in options.items()
        ]
        for section, options in profile.sections.items()
    }
    removed = {
        section: [
            {"option": r.option or "(whole section)", "how": r.how, "from": str(r.where)}
            for r in removals
        ]
        for section, removals in profile.removed.items()
    }
    return {
        "name": profile.name,
        "summary": profile.summary,
        "files": [str(f) for f in profile.files],
        "variables": plain(profile.variables),
        "sections": sections,
        "removed": removed,
        "owners": other_owners(profile, system),
    }


def schema_doc(schema: Schema, section: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {
            "option": o.name,
            "type": o.kind.label,
            "unit": o.unit,
            "default": plain(o.default),
            "doc": o.doc,
        }
        for o in schema.options
    ]
    for table in schema.tables:
        out.append(
            {
                "option": f"[[{section}.{table.name}]]",
                "type": "tables",
                "unit": "",
                "default": None,
                "doc": table.doc,
                "fields": schema_doc(table.schema, f"{section}.{table.name}"),
            }
        )
    if schema.free_keys is not None and schema.free_kind is not None:
        out.append(
            {
                "option": "<any key>",
                "type": schema.free_kind.label,
                "unit": "",
                "default": None,
                "doc": "any key the kernel has (checked when loading)",
            }
        )
    return out


def plugin_docs(root: str = "/") -> dict[str, Any]:
    """Every installed plugin's options: type, unit, default and a one-line doc."""
    plugins = load_plugins(System(root))
    schemas = section_schemas(plugins)
    return {
        name: {"summary": p.summary, "options": schema_doc(schemas[name], name)}
        for name, p in sorted(plugins.items())
    }
