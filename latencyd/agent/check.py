"""A cluster profile checked by latencyd's own loader before the daemon sees it: the
rendered set is written to a private staging directory and the chosen profile loaded
from there (then from the shipped profiles, which `include` may name), against this
machine's plugins. A refusal is said in the cluster's terms (`LatencyProfile ns/name:
line 7: ...`), and the daemon's profile directory is never touched by a profile that
fails here. What the agent reports from a loaded profile (the kernel arguments its
bootloader section wants, the CPUs it isolates) is read here too."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from latencyd.agent.render import ProfileSet, in_cluster_terms
from latencyd.core.engine import section_schemas
from latencyd.core.plugin import load_plugins
from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import shielded_cpus
from latencyd.cpuset import CpuSet
from latencyd.errors import LatencydError
from latencyd.kernel.system import System
from latencyd.paths import ETC_PROFILES, shipped_profiles_dir


@dataclass(frozen=True)
class Checked:
    profile: str
    error: str | None  # why latencyd refuses it (None: it loads)
    kernel_args: tuple[str, ...] = ()  # [bootloader] cmdline, as the profile gives them
    isolated: CpuSet = field(
        default_factory=CpuSet
    )  # the CPUs its sections keep for the application


def check(name: str, profiles: ProfileSet, staging: Path, system: System) -> Checked:
    """Load `name` from `profiles` as the daemon would; `staging` is removed after."""
    try:
        for file_name, data in profiles.files().items():
            (staging / file_name).write_bytes(data)
        plugins = load_plugins(system)
        schemas = section_schemas(plugins)
        library = ProfileLibrary(
            [staging, ETC_PROFILES, shipped_profiles_dir()], schemas, system.machine()
        )
        try:
            loaded = library.load(name, by_path=False)
        except LatencydError as exc:
            return Checked(name, in_cluster_terms(str(exc), staging, profiles))
        args = loaded.sections.get("bootloader", {}).get("cmdline") or ()
        isolated = CpuSet()
        for section, options in loaded.sections.items():
            if section in schemas:
                isolated = isolated | shielded_cpus(schemas[section], options)
        return Checked(name, None, tuple(str(a) for a in args), isolated)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
