"""A cluster profile checked by latencyd's own loader before the daemon sees it: the
rendered set, staged whole in a fresh directory (install.ProfileDir.stage), is loaded
from there as the daemon loads its cluster directory (after the host's profiles, which
`include` may name by name; never by path), against this machine's plugins, and that
same directory is what is then swapped in. A refusal is said in the cluster's terms
(`LatencyProfile ns/name: line 7: ...`), and the daemon's profile directory is never
touched by a profile that fails here. What the agent reports from a loaded profile (the
kernel arguments its bootloader section wants, the CPUs it isolates) is read here too."""

from __future__ import annotations

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


def shadowed(name: str, host_file: Path | str) -> str:
    return (
        f"the host's profile {host_file} has the name {name!r}: the host's profiles come "
        "first, a cluster profile never takes their place; give the LatencyProfile "
        "another name"
    )


def check(
    name: str, profiles: ProfileSet, staged: Path, system: System, boot_writes: bool = False
) -> Checked:
    """Load `name` as the daemon would from `staged`, which holds `profiles`. A profile
    that would have the daemon write the host's boot configuration is refused unless the
    agent was started to allow it (`boot_writes`): from a cluster, kernel arguments go to
    the machine-config layer (the kernel-args annotation). The daemon holds cluster
    profiles to its own limits besides (Daemon.load): this check says why early, in the
    cluster's terms."""
    plugins = load_plugins(system)
    schemas = section_schemas(plugins)
    library = ProfileLibrary(
        [ETC_PROFILES, shipped_profiles_dir()], schemas, system.machine(), cluster_dir=staged
    )
    try:
        loaded = library.load(name, by_path=False)
    except LatencydError as exc:
        return Checked(name, in_cluster_terms(str(exc), staged, profiles))
    if not loaded.from_cluster:
        return Checked(name, shadowed(name, loaded.path))
    boot = loaded.sections.get("bootloader", {})
    if boot.get("write") and not boot_writes:
        at = loaded.origins.get("bootloader", {}).get("write")
        where = in_cluster_terms(str(at), staged, profiles) if at else name
        return Checked(
            name,
            f"{where}: [bootloader] write = true would have latencyd write this host's "
            "boot configuration; from the cluster, kernel arguments are published in "
            "the latencyd.org/kernel-args annotation (start the agent with "
            "--allow-boot-writes, and allow it in the node's latencyd.conf with "
            'cluster_allow_root = ["bootloader"], to let latencyd write them)',
        )
    args = boot.get("cmdline") or ()
    isolated = CpuSet()
    for section, options in loaded.sections.items():
        if section in schemas:
            isolated = isolated | shielded_cpus(schemas[section], options)
    return Checked(name, None, tuple(str(a) for a in args), isolated)
