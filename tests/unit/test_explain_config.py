"""`explain` (profile settings with the file:line each came from) and the daemon config."""

from __future__ import annotations

from pathlib import Path

import pytest

from latencyd.cpuset import CpuSet
from latencyd.errors import ConfigError, ProfileError
from latencyd.paths import ETC_PROFILES, shipped_profiles_dir
from latencyd.service.config import FALLBACK_PROFILE, Config, load_config, search_path
from latencyd.tools.explain import explain, plain
from tests.unit.fakesys import make_fake_root

BASE = """\
[main]
summary = "base"

[writeback]
dirty_ratio = 10
dirty_writeback_centisecs = 500
"""

TOP = """\
[main]
summary = "explained"
include = ["base"]

[variables]
expire = 700

[writeback]
dirty_bytes = "1%"
dirty_expire_centisecs = "${expire}"

[sysctl]
"vm.swappiness" = 10
"""


def test_explain_gives_values_and_their_origin(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, mem_kb=4 << 20)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    base = pdir / "base.toml"
    top = pdir / "top.toml"
    base.write_text(BASE)
    top.write_text(TOP)
    result = explain("top", [pdir], root=str(root))
    assert result["name"] == "top"
    assert result["summary"] == "explained"
    assert result["files"] == [str(base), str(top)]
    assert result["variables"] == {"expire": 700}
    assert result["sections"] == {
        "writeback": [
            {"option": "dirty_writeback_centisecs", "value": 500, "from": f"{base}:6"},
            {"option": "dirty_bytes", "value": int((4 << 30) / 100), "from": f"{top}:9"},
            {"option": "dirty_expire_centisecs", "value": 700, "from": f"{top}:10"},
            {"option": "on_drift", "value": "reapply", "from": "(default)"},
        ],
        "sysctl": [
            {"option": "vm.swappiness", "value": 10, "from": f"{top}:13"},
            {"option": "on_drift", "value": "reapply", "from": "(default)"},
        ],
    }


def test_explain_by_path_and_errors(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    bad = pdir / "bad.toml"
    bad.write_text('[sysctl]\n"vm.swappiness" = 10\n"vm.not_here" = 1\n')
    with pytest.raises(ProfileError) as info:
        explain(str(bad), [], root=str(root))
    assert str(info.value) == (
        f"{bad}:3: unknown sysctl 'vm.not_here': "
        "/proc/sys/vm/not_here does not exist on this kernel"
    )
    # The sysctl check follows the given root: with the key in the tree, it loads.
    root2 = make_fake_root(tmp_path / "other", sysctls={"vm/not_here": "0"})
    result = explain(str(bad), [], root=str(root2))
    options = [s["option"] for s in result["sections"]["sysctl"]]
    assert options == ["vm.swappiness", "vm.not_here", "on_drift"]


def test_plain_turns_cpusets_into_cpulists() -> None:
    value = {"a": CpuSet([0, 1, 2, 5]), "b": [CpuSet(), 3], "c": "x"}
    assert plain(value) == {"a": "0-2,5", "b": ["", 3], "c": "x"}


# -- config ------------------------------------------------------------------------


def test_missing_config_means_defaults(tmp_path: Path) -> None:
    config = load_config(tmp_path / "latencyd.conf")
    assert config == Config()
    assert config.default_profile == FALLBACK_PROFILE == "latency-performance"
    assert config.verify_interval_s == 10.0


def test_config_values(tmp_path: Path) -> None:
    path = tmp_path / "latencyd.conf"
    path.write_text(
        'default_profile = "network-latency"\nadmin_group = "tuning"\n'
        'verify_interval_s = 2\nprofile_dirs = ["/srv/profiles", "/opt/p"]\n'
        'poll_interval_s = 0.5\non_stop = "keep"\ntask_events = "none"\n'
    )
    assert load_config(path) == Config(
        default_profile="network-latency",
        admin_group="tuning",
        verify_interval_s=2.0,
        poll_interval_s=0.5,
        profile_dirs=(Path("/srv/profiles"), Path("/opt/p")),
        task_events="none",
        on_stop="keep",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 1\n", "3: unknown setting 'colour' (known: default_profile, admin_group, "),
        ("default_profile = 3\n", "3: default_profile has the wrong type (3)"),
        ("verify_interval_s = true\n", "3: verify_interval_s has the wrong type (True)"),
        ("verify_interval_s = '5'\n", "3: verify_interval_s has the wrong type ('5')"),
        ('profile_dirs = "/srv"\n', "3: profile_dirs has the wrong type ('/srv')"),
        ('on_stop = "flip"\n', "3: on_stop must be one of restore, keep (got 'flip')"),
        ("poll_interval_s = -1\n", "3: poll_interval_s cannot be negative (-1)"),
        ("profile_dirs = [1]\n", "3: profile_dirs must be a list of directory paths ([1])"),
        ("metrics_sources_per_cpu = 0\n", "3: metrics_sources_per_cpu must be 1 to 100 (got 0)"),
        (
            "metrics_sources_per_cpu = 101\n",
            "3: metrics_sources_per_cpu must be 1 to 100 (got 101)",
        ),
        ("metrics_sources_per_cpu = 2.5\n", "3: metrics_sources_per_cpu has the wrong type (2.5)"),
        ("default_profile = \n", " Invalid value (at line 3, column 19)"),  # tomllib's own
    ],
)
def test_config_errors_name_the_file_and_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "latencyd.conf"
    path.write_text(f"# latencyd.conf\n\n{text}")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:{message}")


def test_search_path_order(tmp_path: Path) -> None:
    config = Config(profile_dirs=(Path("/from/config"),))
    assert search_path([Path("/cli/a"), Path("/cli/b")], config) == [
        Path("/cli/a"),
        Path("/cli/b"),
        Path("/from/config"),
        ETC_PROFILES,
        shipped_profiles_dir(),
    ]
    assert (shipped_profiles_dir() / "latency-performance.toml").is_file()


def test_the_shipped_example_config_loads_with_every_setting_uncommented(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "systemd" / "latencyd.conf"
    assert load_config(example).default_profile == "latency-performance"
    uncommented = "\n".join(
        line[2:] if line.startswith("# ") and " = " in line else line
        for line in example.read_text().splitlines()
    )
    path = tmp_path / "latencyd.conf"
    path.write_text(uncommented)
    config = load_config(path)
    assert config.admin_group == "latency"
    assert config.verify_interval_s == 10
    assert config.profile_dirs == (Path("/srv/latency/profiles"),)
    assert config.task_events == "auto"
    assert (config.metrics_listen, config.metrics_allow_remote) == (("127.0.0.1", 9477), False)
    assert config.metrics_sources_per_cpu == 10
    assert config.cluster_profiles == Path("/run/latencyd-cluster/profiles")
    assert config.cluster_allow_root == ("bootloader",)
    assert {n: {o: f.value for o, f in t.items()} for n, t in config.plugin.items()} == {
        "bootloader": {"write": False}
    }
