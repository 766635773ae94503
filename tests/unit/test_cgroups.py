"""The shield's cgroup facts, decided from what the kernel shows (recorded text)."""

from __future__ import annotations

import pytest

from latencyd.cpuset import CpuSet
from latencyd.kernel.cgroups import (
    APP_SLICE,
    HOUSEKEEPING,
    SHIELD,
    CgroupFacts,
    CgroupMount,
    choose,
    kernel_version,
    owner,
    parse_mountinfo,
    placement,
    systemd_placement,
    task_cgroup,
    unit_of,
    v1_groups,
)

# This VM's, in part: v1 hierarchies, the unified one, and a bind of a sub-cgroup.
MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
77 31 0:31 /docker/abc /mnt/in\\040ctr rw,relatime - cgroup cgroup rw,cpuset
"""
# What a container (systemd-nspawn) sees of the host's hierarchies: mounted read-only.
IN_CONTAINER = "34 31 0:31 / /sys/fs/cgroup/cpuset ro,nosuid - cgroup cgroup rw,cpuset\n"
V1 = CgroupMount("sys/fs/cgroup/cpuset", 1, frozenset({"rw", "cpuset"}))
UNIFIED = CgroupMount("sys/fs/cgroup/unified", 2)


def facts(v2: frozenset[str] = frozenset(), systemd: bool = False, v1: bool = True) -> CgroupFacts:
    return CgroupFacts((UNIFIED, *((V1,) if v1 else ())), v2, (6, 18), systemd)


def test_mountinfo_gives_the_hierarchies_mounted_at_their_root() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert [m.path for m in mounts] == [
        "sys/fs/cgroup/cpu",
        "sys/fs/cgroup/cpuset",
        "sys/fs/cgroup/systemd",
        "sys/fs/cgroup/unified",
    ]
    assert mounts[1] == V1 and mounts[3] == UNIFIED
    got = CgroupFacts(tuple(mounts), frozenset(), (6, 18), False)
    assert got.v1_cpuset == "sys/fs/cgroup/cpuset" and got.unified == "sys/fs/cgroup/unified"


def test_a_tasks_cpuset_cgroup_in_either_version() -> None:
    text = "9:name=systemd:/\n3:cpuset:/latencyd-shield\n4:memory:/x\n0::/payload\n"
    assert task_cgroup(text) == "/latencyd-shield"
    assert task_cgroup("9:name=systemd:/\n0::/payload\n") == "/payload"  # cpuset in v2
    assert task_cgroup("3:cpu,cpuset:/a\n") == "/a"
    assert task_cgroup("") is None


@pytest.mark.parametrize(
    ("path", "who"),
    [
        ("/", None),
        ("/latencyd-housekeeping", None),
        ("/kubepods.slice/kubepods-pod1.slice/crio-ab.scope", "kubelet"),
        ("/system.slice/docker-12ab.scope", "docker"),
        ("/docker/12ab", "docker"),
        ("/machine.slice/libpod-1.scope", "podman"),
        ("/machine.slice/machine-qemu.scope", "systemd-machined"),
        ("/system.slice/app.service", "systemd (app.service)"),
        ("/mine", "another manager (cgroup /mine)"),
    ],
)
def test_whose_a_cgroup_is(path: str, who: str | None) -> None:
    got = owner(path)
    assert (got is None) if who is None else (got is not None and got.startswith(who))


def test_auto_takes_the_v2_partition_where_cpuset_is_in_v2() -> None:
    got = choose(facts(frozenset({"cpuset", "cpu"}), v1=False), "auto")
    assert (got.mechanism, got.hierarchy) == ("cpuset-v2", "sys/fs/cgroup/unified")
    assert "no cgroup v1 hierarchy has the cpuset controller" in got.why_not["cpuset-v1"]
    assert "cpuset-v2 runs here" in got.why_not["affinity"]


def test_auto_takes_v1_where_a_v1_hierarchy_holds_cpuset_and_says_why_not_v2() -> None:
    got = choose(facts(), "auto")
    assert (got.mechanism, got.hierarchy) == ("cpuset-v1", "sys/fs/cgroup/cpuset")
    assert "a v1 hierarchy holds it at /sys/fs/cgroup/cpuset" in got.why_not["cpuset-v2"]


def test_under_systemd_v2_goes_through_systemd_not_behind_its_back() -> None:
    got = choose(facts(frozenset({"cpuset"}), systemd=True, v1=False), "auto")
    assert (got.mechanism, got.hierarchy) == ("cpuset-systemd", "sys/fs/cgroup/unified")
    assert "systemd owns the cgroup v2 tree" in got.why_not["cpuset-v2"]
    assert "cpuset-systemd runs here" in got.why_not["affinity"]
    # Without systemd, the partition; with systemd but cpuset held by v1, v1 (systemd
    # never manages v1's cpuset), and systemd's way says why not.
    assert (
        "systemd does not run"
        in choose(facts(frozenset({"cpuset"})), "auto").why_not["cpuset-systemd"]
    )
    hybrid = choose(facts(systemd=True), "auto")
    assert hybrid.mechanism == "cpuset-v1"
    assert "not available in cgroup v2" in hybrid.why_not["cpuset-systemd"]


def test_the_unit_a_cgroup_belongs_to() -> None:
    assert unit_of("/user.slice/user-0.slice/session-3.scope") == ("session-3.scope", "")
    assert unit_of("/system.slice/app.service/worker/a") == ("app.service", "worker/a")
    assert unit_of("/system.slice") is None and unit_of("/") is None
    user = "/user.slice/user-0.slice/user@0.service/app.slice/term.scope"
    assert unit_of(user) == ("user@0.service", "app.slice/term.scope")  # the user manager's


def test_where_a_task_goes_under_systemd() -> None:
    shield, both = CpuSet({1}), CpuSet({0, 1})
    session = "/user.slice/user-0.slice/session-3.scope"
    assert systemd_placement(session, both, shield, True, False) == (APP_SLICE, None)
    assert systemd_placement(session, shield, shield, False, False) == (APP_SLICE, None)
    assert systemd_placement(session, shield, shield, False, True) == (None, None)  # allowed
    assert systemd_placement(session, both, shield, False, False) == (None, None)
    where, why = systemd_placement("/system.slice/app.service", both, shield, True, False)
    assert where is None and why is not None and f"Slice={APP_SLICE}" in why
    where, why = systemd_placement("/system.slice/docker-1.scope", shield, shield, True, False)
    assert where is None and why is not None and why.startswith("docker")
    assert "system.slice's AllowedCPUs" in why
    where, why = systemd_placement("/machine.slice/machine-vm.scope", both, shield, True, False)
    assert where is None and why is not None and why.startswith("systemd-machined")
    assert systemd_placement(f"/{APP_SLICE}/x.scope", both, shield, True, False) == (None, None)
    assert systemd_placement("/", both, shield, True, False) == (None, None)


def test_old_kernels_have_no_isolated_partition() -> None:
    old = CgroupFacts((UNIFIED,), frozenset({"cpuset"}), kernel_version("5.15.0-91-generic"), False)
    assert "Linux >= 6.1" in choose(old, "auto").why_not["cpuset-v2"]
    assert kernel_version("garbage") == (0, 0)


def test_a_hierarchy_mounted_read_only_is_not_used() -> None:
    (mount,) = parse_mountinfo(IN_CONTAINER)
    assert mount.read_only
    got = choose(CgroupFacts((mount,), frozenset(), (6, 18), False), "auto")
    assert got.mechanism == "affinity"
    assert "/sys/fs/cgroup/cpuset is mounted read-only here" in got.why_not["cpuset-v1"]


def test_cpuset_asked_where_there_is_none_is_no_mechanism_with_the_reasons() -> None:
    got = choose(facts(v1=False), "cpuset")
    assert got.mechanism is None
    assert set(got.why_not) == {"cpuset-v1", "cpuset-v2", "cpuset-systemd"}
    assert choose(facts(), "affinity").mechanism == "affinity"


def test_v1_groups_split_the_cpus_and_keep_the_shield_out_of_balancing() -> None:
    groups = v1_groups(CpuSet({1}), CpuSet({0, 1}), "0")
    assert groups[HOUSEKEEPING] == {"cpuset.cpus": "0", "cpuset.mems": "0"}
    assert groups[SHIELD]["cpuset.cpu_exclusive"] == "1"
    assert list(groups[SHIELD])[:2] == ["cpuset.cpus", "cpuset.mems"]  # before tasks come


def test_where_a_task_goes() -> None:
    shield, both = CpuSet({1}), CpuSet({0, 1})
    assert placement("cpuset-v1", "/", both, shield, False, False) == HOUSEKEEPING
    assert placement("cpuset-v1", "/", both, shield, False, True) is None  # allowed
    assert placement("cpuset-v1", "/", shield, shield, False, True) is None  # wherever it runs
    assert placement("cpuset-v1", "/", shield, shield, False, False) == SHIELD  # taskset -c 1
    assert placement("cpuset-v1", "/", both, shield, True, False) == SHIELD  # the app
    assert placement("cpuset-v1", "/docker/1", both, shield, True, False) is None  # theirs
    assert placement("cpuset-v1", f"/{HOUSEKEEPING}", both, shield, True, False) == SHIELD
    assert placement("cpuset-v1", f"/{HOUSEKEEPING}", both, shield, False, False) is None
    assert placement("cpuset-v2", "/", both, shield, False, False) is None  # the kernel's job
    assert placement("cpuset-v2", "/", shield, shield, False, False) == SHIELD
