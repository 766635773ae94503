"""explain: a profile's merged settings and the file and line each came from (no daemon needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from latencyd.config import CONFIG_FILE, load_config, search_path
from latencyd.cpuset import CpuSet
from latencyd.plugin import load_plugins
from latencyd.profile import ProfileLibrary
from latencyd.schema import Machine
from latencyd.system import System


def plain(value: Any) -> Any:
    """Profile values as JSON: CPU sets as cpulists."""
    if isinstance(value, CpuSet):
        return value.to_list()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def explain(name_or_path: str, profile_dirs: list[Path], root: str = "/") -> dict[str, Any]:
    system = System(root)
    plugins = load_plugins(system)
    library = ProfileLibrary(
        search_path(profile_dirs, load_config(CONFIG_FILE)),
        {n: p.schema for n, p in plugins.items()},
        Machine(system.online_cpus(), system.mem_total_bytes()),
    )
    profile = library.load(name_or_path)
    sections = {
        section: [
            {
                "option": opt,
                "value": plain(value),
                "from": str(profile.origins[section].get(opt, "(default)")),
            }
            for opt, value in options.items()
        ]
        for section, options in profile.sections.items()
    }
    return {
        "name": profile.name,
        "summary": profile.summary,
        "files": [str(f) for f in profile.files],
        "variables": plain(profile.variables),
        "sections": sections,
    }
