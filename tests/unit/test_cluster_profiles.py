"""Profiles from the cluster's directory (where a node agent installs what a cluster says)
are held to the admin group's limits by the daemon itself, whoever asks for them (the
agent asks as root): no section that can hand out root unless the node's config allows
it, no include by path, and never in place of a host profile of the same name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.sysctl import SysctlPlugin

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import Plugin
from latencyd.core.profile import ProfileLibrary
from latencyd.errors import ConfigError, PermissionDenied, ProfileError
from latencyd.kernel.system import Machine, System
from latencyd.service.config import cluster_allowed, load_config, search_path
from latencyd.service.daemon import Daemon
from tests.unit.fakesys import make_fake_root, read_sysctl

CORE = '[sysctl]\n"kernel.core_pattern" = "|/bin/sh -c x"\n"vm.swappiness" = 11\n'


def dirs(tmp_path: Path) -> tuple[Path, Path]:
    host, cluster = tmp_path / "host", tmp_path / "cluster" / "profiles"
    host.mkdir()
    cluster.mkdir(parents=True)
    return host, cluster


def new_daemon(tmp_path: Path, machine: Machine, host: Path, cluster: Path) -> Daemon:
    root = make_fake_root(tmp_path, sysctls={"kernel/core_pattern": "core"})
    system = System(root)
    plugins: dict[str, Plugin[Any, Any, Any]] = {"sysctl": SysctlPlugin(system)}
    library = ProfileLibrary([host], section_schemas(plugins), machine, cluster_dir=cluster)
    return Daemon(system, plugins, library, Engine(plugins, Journal(tmp_path / "state")))


def test_root_cannot_apply_a_cluster_profile_that_could_hand_out_root(
    tmp_path: Path, machine: Machine
) -> None:
    host, cluster = dirs(tmp_path)
    (cluster / "fleet.toml").write_text(CORE)
    (host / "local.toml").write_text(CORE)
    daemon = new_daemon(tmp_path, machine, host, cluster)
    root = daemon.system.root
    with pytest.raises(PermissionDenied, match=r"comes from the cluster .*kernel.core_pattern"):
        daemon.switch("fleet")
    # nothing of it written, kernel.core_pattern nor the harmless vm.swappiness
    assert read_sysctl(root, "kernel/core_pattern") == "core"
    assert read_sysctl(root, "vm/swappiness") != "11"
    # by its path too (root may name files): it is still the cluster's file
    with pytest.raises(PermissionDenied, match="comes from the cluster"):
        daemon.switch(str(cluster / "fleet.toml"))
    # the same text from the host's own directory: root's to apply
    daemon.switch("local")
    assert read_sysctl(root, "kernel/core_pattern") == "|/bin/sh -c x"
    assert daemon.off() == []


def test_a_host_profile_including_a_cluster_one_is_held_to_the_same_limits(
    tmp_path: Path, machine: Machine
) -> None:
    host, cluster = dirs(tmp_path)
    (cluster / "base.toml").write_text(CORE)
    (host / "mine.toml").write_text('[main]\ninclude = "base"\n')
    daemon = new_daemon(tmp_path, machine, host, cluster)
    with pytest.raises(PermissionDenied, match="comes from the cluster"):
        daemon.switch("mine")


def test_the_nodes_config_alone_allows_more(tmp_path: Path, machine: Machine) -> None:
    host, cluster = dirs(tmp_path)
    (cluster / "fleet.toml").write_text(CORE)
    daemon = new_daemon(tmp_path, machine, host, cluster)
    daemon.cluster_allow_root = frozenset({"sysctl"})
    daemon.switch("fleet")
    assert read_sysctl(daemon.system.root, "kernel/core_pattern") == "|/bin/sh -c x"
    assert daemon.off() == []


def test_a_cluster_profile_never_takes_a_host_profiles_place(
    tmp_path: Path, machine: Machine
) -> None:
    host, cluster = dirs(tmp_path)
    (host / "shared.toml").write_text('[sysctl]\n"vm.swappiness" = 12\n')
    (cluster / "shared.toml").write_text('[sysctl]\n"vm.swappiness" = 13\n')
    (cluster / "only.toml").write_text('[sysctl]\n"vm.swappiness" = 14\n')
    # named first on the path (as the fleet docs once said to): still searched last
    library = ProfileLibrary([cluster, host], {}, machine, cluster_dir=cluster)
    assert library.find("shared") == host / "shared.toml"
    assert library.find("only") == cluster.resolve() / "only.toml"
    assert library.search_path == [host, cluster.resolve()]


def test_a_cluster_profile_includes_by_name_only(tmp_path: Path, machine: Machine) -> None:
    host, cluster = dirs(tmp_path)
    (cluster / "b.toml").write_text("[main]\n")
    (cluster / "a.toml").write_text(f'[main]\nsummary = "a"\ninclude = ["{cluster}/b.toml"]\n')
    (cluster / "c.toml").write_text('[main]\ninclude = ["b.toml"]\n')
    (cluster / "d.toml").write_text('[main]\ninclude = ["b"]\n')
    library = ProfileLibrary([host], {}, machine, cluster_dir=cluster)
    with pytest.raises(ProfileError, match=r"a\.toml:3: a profile from the cluster includes by"):
        library.load("a")
    with pytest.raises(ProfileError, match="includes by name only"):
        library.load("c")
    assert library.load("d").from_cluster
    # the host's own profiles may include by path, as before
    (host / "e.toml").write_text(f'[main]\ninclude = ["{cluster}/b.toml"]\n')
    assert library.load("e").from_cluster


def test_the_config_names_the_cluster_directory_and_what_it_may_do(tmp_path: Path) -> None:
    conf = tmp_path / "latencyd.conf"
    conf.write_text('cluster_profiles = "/srv/c"\ncluster_allow_root = ["bootloader"]\n')
    config = load_config(conf)
    assert config.cluster_profiles == Path("/srv/c")
    assert cluster_allowed(config, ["sysctl", "bootloader"], conf) == {"bootloader"}
    conf.write_text('\n\ncluster_allow_root = ["bootlaoder"]\n')
    with pytest.raises(
        ConfigError, match=r"latencyd.conf:3: cluster_allow_root names no .*bootlaoder"
    ):
        cluster_allowed(load_config(conf), ["sysctl", "bootloader"], conf)
    conf.write_text('cluster_profiles = ""\n')
    assert load_config(conf).cluster_profiles is None
    assert Path("/srv/c") not in search_path([], load_config(conf))
