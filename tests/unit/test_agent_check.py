"""The agent's check of a cluster profile with latencyd's own loader, on a fake root:
a refusal is said as the LatencyProfile and the line of its spec.profile, and a profile
that would write the host's boot configuration is refused unless the agent allows it."""

from __future__ import annotations

from pathlib import Path

from latencyd.agent.check import check
from latencyd.agent.install import ProfileDir
from latencyd.agent.render import ProfileSet, profile_set
from tests.unit.fakesys import KernelLikeSystem


def cluster(**texts: str) -> list[dict[str, object]]:
    return [
        {"metadata": {"name": n.replace("_", "-"), "namespace": "tuning"}, "spec": {"profile": t}}
        for n, t in texts.items()
    ]


def staged(tmp_path: Path, profiles: ProfileSet) -> Path:
    """The set staged whole, as the agent stages it beside its profile directory."""
    (tmp_path / "cluster").mkdir(exist_ok=True)
    return ProfileDir(tmp_path / "cluster" / "profiles").stage(profiles.files())


GOOD = """[main]
summary = "rt"

[sysctl]
"vm.swappiness" = 10

[bootloader]
cmdline = ["nohz_full=1", "skew_tick=1"]
"""


def test_a_profile_that_loads_gives_its_kernel_arguments(fake_root: Path, tmp_path: Path) -> None:
    system = KernelLikeSystem(str(fake_root))
    checked = check("rt", (ps := profile_set(cluster(rt=GOOD))), staged(tmp_path, ps), system)
    assert checked.error is None
    assert checked.kernel_args == ("nohz_full=1", "skew_tick=1")


def test_a_refused_profile_names_the_latencyprofile_and_its_line(
    fake_root: Path, tmp_path: Path
) -> None:
    bad = GOOD + "\n[writeback]\nno_such_option = 1\n"
    base = '[main]\ninclude = ["rt-bad"]\n'
    checked = check(
        "site", (ps := profile_set(cluster(rt_bad=bad, site=base))), staged(tmp_path, ps),
        KernelLikeSystem(str(fake_root)),
    )  # fmt: skip
    assert checked.error is not None
    assert "LatencyProfile tuning/rt-bad: line 11" in checked.error, checked.error
    assert "no_such_option" in checked.error
    assert str(tmp_path) not in checked.error  # said in the cluster's terms


def test_boot_writes_from_the_cluster_are_refused_unless_allowed(
    fake_root: Path, tmp_path: Path
) -> None:
    writes = GOOD + "write = true\n"
    system = KernelLikeSystem(str(fake_root))
    refused = check("rt", (ps := profile_set(cluster(rt=writes))), staged(tmp_path, ps), system)
    assert refused.error is not None and "LatencyProfile tuning/rt: line 9" in refused.error
    assert "--allow-boot-writes" in refused.error
    allowed = check(
        "rt", (ps := profile_set(cluster(rt=writes))), staged(tmp_path, ps), system, True
    )
    assert allowed.error is None
