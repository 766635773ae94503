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


def check(
    name: str, profiles: ProfileSet, staging: Path, system: System, boot_writes: bool = False
) -> Checked:
    """Load `name` from `profiles` as the daemon would; `staging` is removed after. A
    profile that would have the daemon write the host's boot configuration is refused
    unless the agent was started to allow it (`boot_writes`): from a cluster, kernel
    arguments go to the machine-config layer (the kernel-args annotation)."""
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
        boot = loaded.sections.get("bootloader", {})
        if boot.get("write") and not boot_writes:
            at = loaded.origins.get("bootloader", {}).get("write")
            where = in_cluster_terms(str(at), staging, profiles) if at else name
            return Checked(
                name,
                f"{where}: [bootloader] write = true would have latencyd write this host's "
                "boot configuration; from the cluster, kernel arguments are published in "
                "the latencyd.org/kernel-args annotation (start the agent with "
                "--allow-boot-writes to let latencyd write them)",
            )
        args = boot.get("cmdline") or ()
        isolated = CpuSet()
        for section, options in loaded.sections.items():
            if section in schemas:
                isolated = isolated | shielded_cpus(schemas[section], options)
        return Checked(name, None, tuple(str(a) for a in args), isolated)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
