"""The shield under systemd through the engine: every change made by systemd's bus API
(AllowedCPUs= on init.scope, system.slice and user.slice; latencyd.slice for the
application; its process moved by a transient scope and back by AttachProcessesToUnit),
no cgroup file written by latencyd itself. systemd with cpuset in cgroup v2 cannot run on
this VM (tests/fakesystemd.py says why): its manager is faked on a real peer-to-peer
D-Bus socket under the rig's root, keeping the rig's cgroupfs as systemd would.
tests/e2e/test_boot.py runs the same client against the real systemd in a container."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.shield import ShieldPlugin, SlicePartition, TaskAffinity, TaskUnit, UnitCpus

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import Plugin, run_to_end
from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import validate
from latencyd.cpuset import CpuSet
from latencyd.errors import NotPlaced
from latencyd.kernel.cgroups import PARTITION_FILE, partition_says
from latencyd.kernel.system import Machine
from latencyd.service.daemon import Daemon
from tests.harness import wait_for
from tests.unit.fakesys import CgroupLikeSystem, add_cgroups, add_task, put, tree_values
from tests.unit.taskrig import Machinery

V2 = "sys/fs/cgroup/unified"
SESSION = "user.slice/user-0.slice/session-3.scope"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=[True], ids=["delegated session"])
def systemd_rig(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Machinery, CgroupLikeSystem]]:
    m = Machinery(tmp_path, ShieldPlugin)
    add_cgroups(m.root, "0-3", v1_cpuset=False, v2_cpuset=True)
    put(m.root, f"{V2}/cgroup.subtree_control", "cpuset")  # systemd enables what it uses
    system = CgroupLikeSystem(m.root, sched=m.sched)
    for unit in ("init.scope", "system.slice/ssh.service", SESSION, "machine.slice/vm.scope"):
        parts = unit.split("/")
        for depth in range(1, len(parts) + 1):
            system.make_cgroup(f"{V2}/{'/'.join(parts[:depth])}")
            put(m.root, f"{V2}/{'/'.join(parts[:depth])}/cgroup.subtree_control", "cpuset")
    if request.param:  # Delegate=yes (the fake's mark): systemd moves processes back in
        put(m.root, f"{V2}/{SESSION}/cgroup.delegated", "")
    for pid, unit in ((1, "init.scope"), (300, "system.slice/ssh.service"), (400, SESSION)):
        system.place(pid, V2, f"/{unit}")
    add_task(m.root, 600, "qemu", start_time=600)
    system.place(600, V2, "/machine.slice/vm.scope")
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.fakesystemd", str(m.root)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        wait_for(lambda: (m.root / "run/systemd/private").exists(), timeout=10)
        m.system, m.plugin = system, ShieldPlugin(system)
        yield m, system
    finally:
        server.terminate()
        server.wait(10)


def calls(m: Machinery) -> list[list[object]]:
    path = m.root / "run/systemd/calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wanted(m: Machinery, machine: Machine, section: dict[str, object]) -> dict[object, object]:
    options = m.plugin.options_of(validate(m.plugin.schema, section, machine))
    return {("shield", t): v for t, v in m.plugin.expand(options, {}).settings.items()}


def files(m: Machinery) -> dict[str, str]:
    return {k: v for k, v in tree_values(m.root).items() if not k.startswith("run/")}


def test_the_shield_is_set_through_systemd_and_off_gives_every_unit_back(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine, tmp_path: Path
) -> None:
    m, system = systemd_rig
    before = files(m)
    engine = Engine({"shield": m.plugin}, Journal(tmp_path / "state"))
    options = m.plugin.options_of(
        validate(m.plugin.schema, {"cpus": "1", "apps": ["myapp"]}, machine)
    )
    assert m.plugin.mechanism(options).mechanism == "cpuset-systemd"
    engine.switch(wanted(m, machine, {"cpus": "1", "apps": ["myapp"]}), "p")
    assert [c[:2] for c in calls(m)][:4] == [
        ["StartTransientUnit", "latencyd.slice"],
        ["SetUnitProperties", "init.scope"],
        ["SetUnitProperties", "system.slice"],
        ["SetUnitProperties", "user.slice"],
    ]
    assert system.read(f"{V2}/system.slice/cpuset.cpus") == "0,2-3"
    assert system.read(f"{V2}/latencyd.slice/cpuset.cpus") == "1"
    assert system.task_cgroup(400) == "/latencyd.slice/latencyd-app-400.scope"
    assert system.task_cgroup(300) == "/system.slice/ssh.service"  # confined, not moved
    # The one file of a unit's latencyd writes: its own slice's partition (cgroups.py, why).
    partition = f"{V2}/latencyd.slice/cpuset.cpus.partition"
    assert [w for w in system.writes if w[0].startswith("sys/fs/cgroup")] == [
        (partition, "isolated")
    ]
    rules = m.plugin.expand(options, engine.owned("shield")).rules
    said = dict(m.plugin.keeper(rules).partition(rules).rows)
    assert said[f"/latencyd.slice {PARTITION_FILE}"] == "isolated"
    assert "start the application with `latencyctl run`" in m.plugin.monitor(rules).tables[0].title
    assert said["adds here"].startswith("CPUs 1 isolated by the kernel")
    others = m.plugin.keeper(rules).others(rules)
    assert [row[:3] for row in others.rows] == [(600, "qemu", "/machine.slice/vm.scope")]
    inside = m.plugin.keeper(rules).inside(rules)
    assert [row[0] for row in inside.rows] == [400]
    assert engine.verify() == []
    # The application starts a helper in its scope: off takes it back along.
    add_task(m.root, 401, "helper", start_time=401)
    system.place(401, V2, "/latencyd.slice/latencyd-app-400.scope")
    assert engine.off() == []
    assert ["AttachProcessesToUnit", "session-3.scope", "", [400, 401]] in calls(m)
    assert calls(m)[-1][:2] == ["StopUnit", "latencyd.slice"]
    assert system.task_cgroup(401) == f"/{SESSION}"
    after = files(m)
    assert after.pop(f"{V2}/{SESSION}/cgroup.procs") == "400\n401"
    before.pop(f"{V2}/{SESSION}/cgroup.procs")
    assert {k: v for k, v in after.items() if not k.startswith("proc/401/")} == before


def test_a_killed_run_is_adopted_and_put_back_through_systemd(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine, tmp_path: Path
) -> None:
    m, system = systemd_rig
    before = files(m)
    engine = Engine({"shield": m.plugin}, Journal(tmp_path / "state"))
    m.plugin.holders(frozenset(), {400: CpuSet.from_list("1-3")})  # a holder asked to be placed
    engine.switch(wanted(m, machine, {"cpus": "1-3"}), "p")
    assert system.task_cgroup(400) == "/latencyd.slice/latencyd-app-400.scope"
    again = Engine({"shield": ShieldPlugin(system)}, Journal(tmp_path / "state"))
    assert again.adopt() is not None  # as after kill -9
    assert again.off() == []
    assert files(m) == before


def test_a_unit_given_the_slice_keeps_it_and_the_refusal_says_so(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine, tmp_path: Path
) -> None:
    m, system = systemd_rig
    engine = Engine({"shield": m.plugin}, Journal(tmp_path / "state"))
    engine.switch(wanted(m, machine, {"cpus": "1"}), "p")
    put(m.root, f"{V2}/latencyd.slice/cgroup.subtree_control", "cpuset")
    system.make_cgroup(f"{V2}/latencyd.slice/app.service")  # Slice=latencyd.slice
    system.place(300, V2, "/latencyd.slice/app.service")
    failed = engine.off()
    assert failed and "1 processes run in it" in str(failed[0])
    assert system.read(f"{V2}/latencyd.slice/cpuset.cpus") == ""  # AllowedCPUs= unset
    assert system.read(f"{V2}/system.slice/cpuset.cpus") == ""
    assert system.task_cgroup(300) == "/latencyd.slice/app.service"  # not killed


def test_from_systemds_shield_to_the_chase_its_units_are_given_back_first(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine, tmp_path: Path
) -> None:
    """The tasks have their own CPUs back only once out of latencyd.slice's scopes and the
    units' AllowedCPUs=: the chase must judge them after that (starts_afresh), found by
    the application's slice, the setting systemd's shield makes first; a shield through
    systemd on the same CPUs again changes in place."""
    m, _ = systemd_rig
    engine = Engine({"shield": m.plugin}, Journal(tmp_path / "state"))
    assert not m.plugin.starts_afresh(
        m.plugin.options_of(validate(m.plugin.schema, {"cpus": "1"}, machine)), {}
    )
    engine.switch(wanted(m, machine, {"cpus": "1", "apps": ["myapp"]}), "p")
    owned = engine.owned("shield")
    chase = m.plugin.options_of(
        validate(m.plugin.schema, {"cpus": "1", "mechanism": "affinity"}, machine)
    )
    assert m.plugin.starts_afresh(chase, owned)
    again = m.plugin.options_of(validate(m.plugin.schema, {"cpus": "1"}, machine))
    assert not m.plugin.starts_afresh(again, owned)
    assert engine.off() == []


def test_allow_cannot_act_under_systemd_and_a_service_is_not_moved(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine
) -> None:
    m, _ = systemd_rig
    expansion = m.expand(machine, {"cpus": "1", "allow": ["sshd"], "apps": ["sshd"]})
    assert "AllowedCPUs= of init.scope, system.slice, user.slice" in expansion.refused["allow"]
    assert TaskUnit(V2, 300, 900) not in expansion.settings
    others = m.plugin.keeper(expansion.rules).others(expansion.rules)
    assert [row[0] for row in others.rows] == [300, 600]
    assert "Slice=latencyd.slice" in others.rows[0][3]
    assert expansion.settings[UnitCpus("user.slice")] == "0,2-3"


@pytest.mark.parametrize("systemd_rig", [False], indirect=True, ids=["login session"])
def test_systemd_moves_nothing_back_into_a_login_session_and_off_says_so(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine, tmp_path: Path
) -> None:
    """A login session's scope is not delegated: systemd refuses AttachProcessesToUnit
    into it (systemd 252's words, seen in the boot test), and its cgroup.procs is not
    latencyd's to write. The application stays in its scope; the slice's CPUs are
    unset, every other unit given back, and off says so."""
    m, system = systemd_rig
    engine = Engine({"shield": m.plugin}, Journal(tmp_path / "state"))
    engine.switch(wanted(m, machine, {"cpus": "1", "apps": ["myapp"]}), "p")
    failed = "\n".join(map(str, engine.off()))
    assert "non-delegated units" in failed and "it stays in /latencyd.slice/" in failed
    assert system.task_cgroup(400) == "/latencyd.slice/latencyd-app-400.scope"
    assert system.read(f"{V2}/latencyd.slice/cpuset.cpus") == ""
    assert system.read(f"{V2}/user.slice/cpuset.cpus") == ""


def iso_daemon(m: Machinery, system: CgroupLikeSystem, machine: Machine, tmp_path: Path) -> Daemon:
    """A daemon of the rig's shield with one profile, iso: the shield on CPU 1."""
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "iso.toml").write_text('[shield]\ncpus = "1"\n')
    plugins: dict[str, Plugin[Any, Any, Any]] = {"shield": m.plugin}
    library = ProfileLibrary([pdir], section_schemas(plugins), machine)
    return Daemon(system, plugins, library, Engine(plugins, Journal(tmp_path / "state")))


def test_a_holder_systemd_keeps_in_its_service_is_refused_with_what_to_do(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine, tmp_path: Path
) -> None:
    """`latencyctl run` from a shell of ssh.service (no login session): the daemon may not
    take the process out of its service, so the hold is refused and undone, saying why
    and what to do instead, and status lists it (issue 51: it printed `holding` and the
    command ran on the housekeeping CPUs)."""
    m, system = systemd_rig
    daemon = iso_daemon(m, system, machine, tmp_path)
    with pytest.raises(NotPlaced) as refused:
        run_to_end(daemon.hold_steps("iso", "sleep 60", ":1.9", pid=300, placed=True))
    why = str(refused.value)
    assert "process 300" in why and "/system.slice/ssh.service" in why
    assert "Slice=latencyd.slice" in why and "systemd-run --scope latencyctl run" in why
    assert daemon.holds == {} and daemon.active is None  # undone: nothing in force
    (listed,) = daemon.status()["not_placed"]
    assert (listed["pid"], listed["profile"], listed["why"]) == (300, "iso", why.split(": ", 1)[1])
    assert daemon.status(sees_tasks=False)["not_placed"][0]["pid"] is None
    # from a scope of its own (systemd-run --scope, a login session), the same hold places it
    system.place(300, V2, f"/{SESSION}")
    run_to_end(daemon.hold_steps("iso", "sleep 60", ":1.9", pid=300, placed=True))
    assert system.task_cgroup(300) == "/latencyd.slice/latencyd-app-300.scope"
    assert daemon.engine.off() == []


def test_a_partition_the_kernel_refuses_is_said_and_the_shield_holds_without_it(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine, tmp_path: Path
) -> None:
    m, system = systemd_rig
    put(m.root, f"{V2}/machine.slice/cpuset.cpus", "1-2")  # a VM's slice given CPU 1 too
    before = files(m)
    engine = Engine({"shield": m.plugin}, Journal(tmp_path / "state"))
    options = m.plugin.options_of(validate(m.plugin.schema, {"cpus": "1"}, machine))
    report = engine.switch(wanted(m, machine, {"cpus": "1"}), "p")
    refused = {sid[1]: r for sid, r in report.not_applicable.items()}
    assert list(refused) == [SlicePartition(V2)]
    assert "not exclusive" in refused[SlicePartition(V2)].reason, refused
    assert system.read(f"{V2}/latencyd.slice/cpuset.cpus.partition") == "member"
    assert system.read(f"{V2}/system.slice/cpuset.cpus") == "0,2-3"  # the shield holds
    rules = m.plugin.expand(options, engine.owned("shield")).rules
    said = dict(m.plugin.keeper(rules).partition(rules).rows)["adds here"]
    assert said.startswith("none: the kernel did not make latencyd.slice an isolated partition")
    assert engine.off() == []
    assert files(m) == before


def test_what_the_partition_adds_is_read_from_the_kernel() -> None:
    shield = CpuSet.from_list("2-3")
    assert partition_says("isolated", "2-3", shield).startswith("CPUs 2-3 isolated by the kernel")
    assert partition_says("isolated", None, shield).startswith("CPUs 2-3 isolated")  # < 6.7
    assert partition_says("isolated", "", shield) == "none: the kernel isolates CPUs none, not 2-3"
    assert "partition: it reads 'member'" in partition_says("member", "", shield)
    invalid = partition_says("isolated invalid (Parent is not a partition root)", "", shield)
    assert "partition: Parent is not a partition root" in invalid
    assert partition_says(None, "", shield) == "none: latencyd.slice is not there"


@pytest.mark.parametrize("systemd_rig", [False], indirect=True, ids=["scope not delegated"])
def test_a_run_in_a_scope_ends_without_an_error_its_holder_kept_in_the_slice(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine, tmp_path: Path
) -> None:
    """`systemd-run --scope latencyctl run -- CMD` (issue 51, seen in the VM): the holder
    runs in a scope systemd moves nothing back into, so at the release it stays in
    latencyd.slice, whose CPUs the kernel confines it to. Nothing of it is given back
    there that the kernel would refuse (its CPUs from before, user.slice's: EINVAL) and
    roll the release back: its scope's AllowedCPUs= kept it on the hold's CPUs (issue
    52), not an affinity, and given back (unset) it runs on the slice's until it exits."""
    m, system = systemd_rig
    daemon = iso_daemon(m, system, machine, tmp_path)
    run_to_end(daemon.switch_steps("iso"))
    m.sched.affinity[400] = frozenset({0, 2, 3})  # what user.slice's AllowedCPUs= leaves it
    cookie, _ = run_to_end(daemon.hold_steps("iso", "true", ":1.9", pid=400, placed=True))
    scope = "latencyd.slice/latencyd-app-400.scope"
    assert system.task_cgroup(400) == f"/{scope}"
    assert system.read(f"{V2}/{scope}/cpuset.cpus") == "1"
    assert TaskAffinity(400, 1000, 400) not in daemon.engine.owned("shield")
    run_to_end(daemon.release_steps(cookie))
    assert daemon.last_error is None
    assert daemon.status()["last_error"] is None
    assert system.task_cgroup(400) == f"/{scope}"
    assert system.read(f"{V2}/{scope}/cpuset.cpus") == ""  # AllowedCPUs= unset: the slice's
    assert system.read(f"{V2}/latencyd.slice/cpuset.cpus") == "1"
    assert daemon.engine.verify() == []


def test_each_held_application_gets_a_scope_of_its_own_on_its_own_cpus(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine, tmp_path: Path
) -> None:
    """Issue 52 under systemd: two holds on CPUs 1 and 2 of 4, each holder moved by
    systemd into a scope of its own in latencyd.slice whose AllowedCPUs= (set through
    systemd, not in its cgroup's files) are its hold's CPU; releasing one asks nothing
    of the other's scope nor of its process, and off lets both scopes go."""
    m, system = systemd_rig
    add_task(m.root, 500, "gw", start_time=500)  # a second application of the session
    m.sched.add(500)
    system.place(500, V2, f"/{SESSION}")
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "app.toml").write_text(
        '[variables]\nisolated_cores = "1"\n[shield]\ncpus = "${isolated_cores}"\n'
    )
    plugins: dict[str, Plugin[Any, Any, Any]] = {"shield": m.plugin}
    library = ProfileLibrary([pdir], section_schemas(plugins), machine)
    daemon = Daemon(system, plugins, library, Engine(plugins, Journal(tmp_path / "state")))
    run_to_end(
        daemon.hold_steps("app", "md", ":1.1", pid=400, placed=True, cpus=CpuSet.from_list("1"))
    )
    cookie, _ = run_to_end(
        daemon.hold_steps("app", "gw", ":1.2", pid=500, placed=True, cpus=CpuSet.from_list("2"))
    )
    assert system.read(f"{V2}/latencyd.slice/cpuset.cpus") == "1-2"
    for pid, cpu in ((400, "1"), (500, "2")):
        scope = f"latencyd-app-{pid}.scope"
        assert system.task_cgroup(pid) == f"/latencyd.slice/{scope}"
        assert system.read(f"{V2}/latencyd.slice/{scope}/cpuset.cpus") == cpu
        assert ["SetUnitProperties", scope, "True", ["AllowedCPUs"]] in calls(m)
    owned = daemon.engine.owned("shield")
    assert owned[UnitCpus("latencyd-app-400.scope")] == "1"
    assert TaskAffinity(400, 1000, 400) not in owned  # its scope keeps it there, not an affinity
    assert [w for w in system.writes if "latencyd-app-" in w[0]] == []  # systemd's files
    assert daemon.engine.verify() == []
    seen = len(calls(m))
    run_to_end(daemon.release_steps(cookie))
    after = calls(m)[seen:]
    assert not [c for c in after if "latencyd-app-400.scope" in c or [400] in c], after
    assert system.task_cgroup(400) == "/latencyd.slice/latencyd-app-400.scope"
    assert system.read(f"{V2}/latencyd.slice/latencyd-app-400.scope/cpuset.cpus") == "1"
    assert system.read(f"{V2}/latencyd.slice/cpuset.cpus") == "1"
    # The released holder runs on in its scope until it exits, as before it had one of
    # its own: its scope's AllowedCPUs= given back (unset).
    assert UnitCpus("latencyd-app-500.scope") not in daemon.engine.owned("shield")
    assert system.read(f"{V2}/latencyd.slice/latencyd-app-500.scope/cpuset.cpus") == ""
    assert daemon.engine.off() == []
    assert system.task_cgroup(400) == system.task_cgroup(500) == f"/{SESSION}"
    assert not (m.root / V2 / "latencyd.slice").exists()


def test_a_task_whose_unit_ended_stays_and_the_rest_is_given_back(
    systemd_rig: tuple[Machinery, CgroupLikeSystem], machine: Machine, tmp_path: Path
) -> None:
    """`systemd-run --scope latencyctl run ...`: once latencyd moved the application into
    a scope of its own, the scope it came from was empty and systemd ended it. Giving
    back then has nowhere to move the application to: it stays (said, not applicable),
    and the step goes on. The VM tier's holds test found the last release rolled back
    ("Unit latencyd-test-b.scope not loaded"), the held profile in force with no hold."""
    m, system = systemd_rig
    engine = Engine({"shield": m.plugin}, Journal(tmp_path / "state"))
    engine.switch(wanted(m, machine, {"cpus": "1", "apps": ["myapp"]}), "p")
    assert system.task_cgroup(400) == "/latencyd.slice/latencyd-app-400.scope"
    system.systemd.stop("session-3.scope")  # empty: systemd ends it
    assert not (m.root / V2 / SESSION).exists()
    report = engine.switch({}, "nothing")  # raised ApplyFailed, the step rolled back
    assert report.restored >= 1
    assert system.task_cgroup(400) == "/latencyd.slice/latencyd-app-400.scope"
    assert system.read(f"{V2}/latencyd.slice/cpuset.cpus") == ""
    assert system.read(f"{V2}/system.slice/cpuset.cpus") == ""
    assert system.read(f"{V2}/user.slice/cpuset.cpus") == ""
    assert engine.owned("shield") == {}
