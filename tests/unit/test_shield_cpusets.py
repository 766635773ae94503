"""The shield's cpuset mechanisms through the engine, on a fake cgroupfs (CgroupLikeSystem):
the cgroup v2 isolated partition cannot run on this VM (its v1 cpuset hierarchy is held
busy, so cpuset never reaches v2), and both versions are checked here against what the
kernel would show; tests/kernel/test_shield_cpuset.py runs v1 on the real kernel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.shield import Cgroup, ShieldPlugin, TaskAffinity, TaskCgroup

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import Plugin, TaskEvent, decode_target, run_to_end, target_kinds
from latencyd.core.profile import ProfileLibrary
from latencyd.core.schema import validate
from latencyd.cpuset import CpuSet
from latencyd.errors import NotApplicable
from latencyd.kernel.cgroups import v1_groups
from latencyd.kernel.system import PF_EXITING, Machine
from latencyd.service.daemon import Daemon
from latencyd.tools.cli import format_status
from tests.unit.fakesys import CgroupLikeSystem, add_cgroups, add_task, tree_values
from tests.unit.taskrig import Machinery

V1 = "sys/fs/cgroup/cpuset"
V2 = "sys/fs/cgroup/unified"
USER_TASKS = (1, 300, 400)  # systemd, sshd, myapp (Machinery)


def rig(tmp_path: Path, v1: bool, v2: bool) -> tuple[Machinery, CgroupLikeSystem, Engine]:
    m = Machinery(tmp_path, ShieldPlugin)
    add_cgroups(m.root, "0-3", v1_cpuset=v1, v2_cpuset=v2)
    system = CgroupLikeSystem(m.root, sched=m.sched)
    for pid in USER_TASKS:
        system.place(pid, V1 if v1 else V2)
    m.system, m.plugin = system, ShieldPlugin(system)
    return m, system, Engine({"shield": m.plugin}, Journal(tmp_path / "state"))


def switch(m: Machinery, engine: Engine, machine: Machine, section: dict[str, object]) -> None:
    options = m.plugin.options_of(validate(m.plugin.schema, section, machine))
    expansion = m.plugin.expand(options, {})
    engine.switch({("shield", t): v for t, v in expansion.settings.items()}, "p")


def cgroup(system: CgroupLikeSystem, pid: int) -> str | None:
    return system.task_cgroup(pid)


def test_v2_one_partition_write_and_only_the_application_moves(
    tmp_path: Path, machine: Machine
) -> None:
    m, system, engine = rig(tmp_path, v1=False, v2=True)
    before = tree_values(m.root)
    switch(m, engine, machine, {"cpus": "1", "apps": ["myapp"]})
    assert system.read(f"{V2}/cgroup.subtree_control") == "cpuset"
    assert system.read(f"{V2}/latencyd-shield/cpuset.cpus") == "1"
    assert system.read(f"{V2}/latencyd-shield/cpuset.cpus.partition") == "isolated"
    assert [cgroup(system, p) for p in USER_TASKS] == ["/", "/", "/latencyd-shield"]
    moves = [w for w in system.writes if w[0].endswith("cgroup.procs")]
    assert moves == [(f"{V2}/latencyd-shield/cgroup.procs", "400")]  # no per-task chase
    assert engine.verify() == []
    assert engine.off() == []
    assert tree_values(m.root) == before  # every file as found, the cgroup gone


def test_apps_are_matched_by_what_their_user_cannot_forge(tmp_path: Path, machine: Machine) -> None:
    """A bare name matches the file name of an executable only root may have put there;
    a pattern with a `/`, the executable's path. A process named like the application, or
    a copy of it anyone may write, is not moved into the shield (issue 50)."""
    m, system, engine = rig(tmp_path, v1=False, v2=True)
    forged = {
        500: ("myapp", "/usr/bin/bash"),  # renamed itself (prctl PR_SET_NAME)
        501: ("copy", "/home/u/myapp"),  # a copy under the application's name...
        502: ("x", "/opt/md/bin/feed"),
        503: ("y", "/usr/bin/myapp"),  # the installed application, whatever its comm
    }
    for pid, (comm, exe) in forged.items():
        add_task(m.root, pid, comm, start_time=2000, exe=exe)
        m.sched.add(pid, {0, 1, 2, 3})
        system.place(pid, V2)
    (m.root / "home/u/myapp").chmod(0o777)  # ...that another user may write
    (m.root / "opt/md/bin/feed").chmod(0o777)  # a path named in apps: the admin's choice
    switch(m, engine, machine, {"cpus": "1", "apps": ["myapp", "/opt/md/bin/*"]})
    placed = {pid for pid in (*USER_TASKS, *forged) if cgroup(system, pid) == "/latencyd-shield"}
    assert placed == {400, 502, 503}
    assert engine.off() == []


def test_v2_a_partition_the_kernel_refuses_is_not_applicable_with_its_reason(
    tmp_path: Path, machine: Machine
) -> None:
    m, system, engine = rig(tmp_path, v1=False, v2=True)
    system.write(f"{V2}/cgroup.subtree_control", "+cpuset")
    system.make_cgroup(f"{V2}/theirs")
    system.write(f"{V2}/theirs/cpuset.cpus", "1")  # another manager's claim on CPU 1
    before = tree_values(m.root)
    switch(m, engine, machine, {"cpus": "1"})
    reasons = [r.reason for s, r in engine.not_applicable.items() if isinstance(s[1], Cgroup)]
    assert reasons and "Cpu list in cpuset.cpus not exclusive" in reasons[0]
    assert not (m.root / V2 / "latencyd-shield").exists()  # not left half-made
    engine.off()
    assert tree_values(m.root) == before


def test_v2_allow_cannot_act_and_says_why(tmp_path: Path, machine: Machine) -> None:
    m, _, _ = rig(tmp_path, v1=False, v2=True)
    expansion = m.expand(machine, {"cpus": "1", "allow": ["sshd"]})
    assert "takes its CPUs from every cgroup outside it" in expansion.refused["allow"]


def test_v1_housekeeping_takes_the_root_tasks_and_off_gives_them_back(
    tmp_path: Path, machine: Machine
) -> None:
    m, system, engine = rig(tmp_path, v1=True, v2=False)
    before = tree_values(m.root)
    switch(m, engine, machine, {"cpus": "1", "allow": ["sshd"], "apps": ["myapp"]})
    assert [cgroup(system, p) for p in USER_TASKS] == [
        "/latencyd-housekeeping",
        "/",  # allowed: it keeps every CPU
        "/latencyd-shield",
    ]
    assert system.read(f"{V1}/cpuset.sched_load_balance") == "0"
    assert system.read(f"{V1}/latencyd-housekeeping/cpuset.cpus") == "0,2-3"
    assert system.read(f"{V1}/latencyd-shield/cpuset.cpu_exclusive") == "1"
    assert engine.off() == []
    assert tree_values(m.root) == before


def test_a_killed_run_is_adopted_and_put_back(tmp_path: Path, machine: Machine) -> None:
    m, system, engine = rig(tmp_path, v1=True, v2=False)
    before = tree_values(m.root)
    switch(m, engine, machine, {"cpus": "1"})
    add_task(m.root, 500, "born-later", start_time=2000)  # forked in housekeeping
    system.place(500, V1, "/latencyd-housekeeping")
    again = Engine({"shield": ShieldPlugin(system)}, Journal(tmp_path / "state"))
    assert again.adopt() is not None  # as after kill -9
    assert again.off() == []
    assert cgroup(system, 500) == "/"  # moved out with the cgroup it was born in
    assert_as_found_but_task_500(m, before)


def assert_as_found_but_task_500(m: Machinery, before: dict[str, str]) -> None:
    """The v1 tree as `before`, but for task 500, started since, and the root cpuset's
    tasks, which now list it too: every cpuset made gone, every task back."""
    after = tree_values(m.root)
    assert after.pop(f"{V1}/cgroup.procs") == "1\n300\n400\n500"
    assert {k: v for k, v in after.items() if "proc/500/" not in k} == {
        k: v for k, v in before.items() if k != f"{V1}/cgroup.procs"
    }


def test_tasks_in_another_managers_cgroup_stay_and_are_listed(
    tmp_path: Path, machine: Machine
) -> None:
    m, system, _ = rig(tmp_path, v1=True, v2=False)
    system.make_cgroup(f"{V1}/docker")
    system.write(f"{V1}/docker/cgroup.procs", "300")
    expansion = m.expand(machine, {"cpus": "1"})
    assert TaskCgroup(V1, 300, 900) not in expansion.settings
    others = m.plugin.keeper(expansion.rules).others(expansion.rules)
    assert [row[:3] for row in others.rows] == [(300, "sshd", "/docker")]
    assert others.rows[0][3].startswith("docker")


@pytest.mark.parametrize(
    "target",
    [
        {"kind": "cgroup", "hierarchy": V1, "name": "docker"},
        {"kind": "cgroup", "hierarchy": V1, "name": "latencyd-x/../../y"},
        {"kind": "cgroup", "hierarchy": "etc", "name": "latencyd-shield"},
        {"kind": "cgroup_root_file", "hierarchy": V1, "file": "release_agent"},
        {"kind": "cgroup_controller", "hierarchy": V2, "name": "memory"},
    ],
)
def test_a_journal_cannot_name_a_cgroup_latencyd_did_not_make(
    tmp_path: Path, target: dict[str, object]
) -> None:
    plugin = ShieldPlugin(CgroupLikeSystem(tmp_path))
    with pytest.raises(ValueError, match="not a"):
        decode_target(target_kinds(plugin), json.loads(json.dumps(target)))


def test_a_task_being_torn_down_is_gone_not_back_in_the_root(tmp_path: Path) -> None:
    """A dying task already shows the root cgroup: read as its original, it would look
    like a setting flipped back (a kill -9'd daemon's own process did)."""
    m, _, _ = rig(tmp_path, v1=True, v2=False)
    target = TaskCgroup(V1, 400, 1000)
    assert m.plugin.read(target) == "/" and m.plugin.exists(target)
    add_task(m.root, 400, "myapp", start_time=1000, flags=0x00400100 | PF_EXITING)
    with pytest.raises(NotApplicable, match="pid 400 has exited"):
        m.plugin.read(target)
    assert not m.plugin.exists(target)


def test_from_a_cpuset_to_the_chase_the_tasks_are_judged_once_out_of_it(
    tmp_path: Path, machine: Machine
) -> None:
    """The kernel gives a task its own CPUs back only once it leaves the cpuset: judged
    before (inside housekeeping, on CPU 0 only), the chase would leave it alone and find
    it back on the shielded CPU after the move. So the cpusets are given back in a step
    of their own first (SharesWithUser.starts_afresh), and the chase reads what that left."""
    m, system, engine = rig(tmp_path, v1=True, v2=False)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "cpuset.toml").write_text('[shield]\ncpus = "1"\nmechanism = "cpuset"\n')
    (profiles / "chase.toml").write_text('[shield]\ncpus = "1"\nmechanism = "affinity"\n')
    library = ProfileLibrary([profiles], section_schemas(engine.plugins), machine)
    engine.apply(library.load("cpuset"))
    assert cgroup(system, 1) == "/latencyd-housekeeping"
    assert m.sched.affinity[1] == {0, 2, 3}  # the kernel's doing, inside housekeeping
    engine.apply(library.load("chase"))
    assert cgroup(system, 1) == "/"
    assert m.sched.affinity[1] == {0, 2, 3}  # narrowed by the chase, judged in the root
    assert engine.originals[("shield", TaskAffinity(1, 5, 1))] == "0-3"  # as in the root
    assert not (m.root / V1 / "latencyd-shield").exists()
    assert engine.off() == []


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_cpuset_shield_is_found_owned_by_what_it_makes_first(
    tmp_path: Path, machine: Machine, version: str
) -> None:
    """starts_afresh looks up the setting each cpuset mechanism makes first (v1: the
    root's load balancing, v2: the root's cpuset controller), not every owned setting:
    from either to the chase, the cpusets are given back first; to a shield on the same
    CPUs again, nothing is."""
    m, _, engine = rig(tmp_path, v1=version == "v1", v2=version == "v2")
    chase = m.plugin.options_of(
        validate(m.plugin.schema, {"cpus": "1", "mechanism": "affinity"}, machine)
    )
    assert not m.plugin.starts_afresh(chase, {})
    switch(m, engine, machine, {"cpus": "1", "apps": ["myapp"]})
    owned = engine.owned("shield")
    assert m.plugin.starts_afresh(chase, owned)
    same = m.plugin.options_of(
        validate(m.plugin.schema, {"cpus": "1", "mechanism": "cpuset"}, machine)
    )
    assert not m.plugin.starts_afresh(same, owned)
    assert engine.off() == []


@pytest.mark.parametrize(
    ("v1", "asked", "used"),
    [(True, "cpuset", "cpuset-v1"), (False, "cpuset", "cpuset-v2"), (True, "affinity", "affinity")],
)
def test_status_says_how_to_start_the_application_where_a_cpuset_keeps_the_shield(
    tmp_path: Path, machine: Machine, v1: bool, asked: str, used: str
) -> None:
    """Inside a cpuset the kernel refuses `taskset -c` to CPUs outside it: status says to
    start the application with latencyctl run; under the chase, taskset works as ever."""
    m, _, _ = rig(tmp_path, v1=v1, v2=not v1)
    rules = m.expand(machine, {"cpus": "1", "mechanism": asked}).rules
    chosen = m.plugin.monitor(rules).tables[0]
    assert chosen.rows[0] == (
        used,
        f"in use{'' if used == 'affinity' else ' on /' + (V1 if v1 else V2)}",
    )
    if used == "affinity":
        assert chosen.title == "Shield mechanism"
    else:
        assert "inside a cpuset the kernel refuses" in chosen.title
        assert "start the application with `latencyctl run`" in chosen.title


def test_from_the_chase_to_a_cpuset_a_task_is_judged_by_its_users_cpus(
    tmp_path: Path, machine: Machine
) -> None:
    """What the chase narrowed is latencyd's doing: moving to a cpuset shield on the very
    CPUs it narrowed a task to, the task goes to housekeeping (its user gave it every
    CPU), not inside the shield as one its user had confined there. bench latency's
    mis-tuned scenario, after the chase's, had the load in the shield so."""
    m, system, engine = rig(tmp_path, v1=True, v2=False)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "chase.toml").write_text('[shield]\ncpus = "1"\nmechanism = "affinity"\n')
    (profiles / "other.toml").write_text('[shield]\ncpus = "0,2-3"\nmechanism = "cpuset"\n')
    library = ProfileLibrary([profiles], section_schemas(engine.plugins), machine)
    engine.apply(library.load("chase"))
    assert m.sched.affinity[300] == {0, 2, 3}  # narrowed by the chase
    engine.apply(library.load("other"))
    assert cgroup(system, 300) == "/latencyd-housekeeping"
    assert engine.off() == []
    assert cgroup(system, 300) == "/" and m.sched.affinity[300] == {0, 1, 2, 3}


@pytest.mark.parametrize("mechanism", ["cpuset-v1", "cpuset-v2", "affinity"])
def test_two_holds_each_application_on_its_own_cpus_and_a_release_moves_not_the_other(
    tmp_path: Path, mechanism: str
) -> None:
    """Issue 52: holds on CPUs 1 and 2 (HoldAndPlaceOn) of 4 compose: the shield is
    both, each holder runs on its own CPU only (v1: in a cpuset of its own inside the
    shield's, its hold's CPU; v2: inside the partition, by its affinity), and releasing
    one gives its CPU back to housekeeping without moving the other (no write to its
    cgroup or its CPUs; the shield changes in place; v1: the released one's cpuset gone)."""
    m, system, _ = rig(tmp_path, v1=mechanism == "cpuset-v1", v2=mechanism == "cpuset-v2")
    hierarchy = V1 if mechanism == "cpuset-v1" else V2
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "app.toml").write_text(
        '[variables]\nisolated_cores = "1"\n[shield]\ncpus = "${isolated_cores}"\n'
        + ('mechanism = "affinity"\n' if mechanism == "affinity" else "")
    )
    plugins: dict[str, Plugin[Any, Any, Any]] = {"shield": m.plugin}
    library = ProfileLibrary([pdir], section_schemas(plugins), system.machine())
    daemon = Daemon(system, plugins, library, Engine(plugins, Journal(m.state_dir)))
    one = CpuSet.from_list("1")
    run_to_end(daemon.hold_steps("app", "md", ":1.1", pid=300, placed=True, cpus=one))
    cookie, _ = run_to_end(
        daemon.hold_steps("app", "gw", ":1.2", pid=400, placed=True, cpus=CpuSet.from_list("2"))
    )
    assert [h["cpus"] for h in daemon.status()["holds"]] == ["1", "2"]
    assert m.sched.affinity[300] == {1} and m.sched.affinity[400] == {2}
    if mechanism == "affinity":
        assert m.sched.affinity[1] == {0, 3}  # every other task off both
    if mechanism == "cpuset-v1":
        assert system.read(f"{V1}/latencyd-housekeeping/cpuset.cpus") == "0,3"
    if mechanism == "cpuset-v1":
        for pid, cpu in ((300, "1"), (400, "2")):
            assert cgroup(system, pid) == f"/latencyd-shield/latencyd-app-{pid}"
            assert system.read(f"{V1}/latencyd-shield/latencyd-app-{pid}/cpuset.cpus") == cpu
            assert system.read(f"{V1}/latencyd-shield/latencyd-app-{pid}/cpuset.mems") == "0"
    if mechanism == "cpuset-v2":
        assert cgroup(system, 300) == cgroup(system, 400) == "/latencyd-shield"
    if mechanism != "affinity":
        assert system.read(f"{hierarchy}/latencyd-shield/cpuset.cpus") == "1-2"
        # status: each hold's tasks with the cgroup each runs in, and the shield's tasks
        status = daemon.status()
        assert [h["cgroups"] for h in status["holds"]] == [
            {str(pid): cgroup(system, pid)} for pid in (300, 400)
        ]
        shown = "\n".join(format_status(status))
        assert f"CPUs 1, tasks 300 in {cgroup(system, 300)}" in shown
        inside = status["plugins"]["shield"]["tables"][1]
        assert inside["columns"][2] == "cgroup"
        assert sorted(inside["rows"]) == [
            [p, c, cgroup(system, p)] for p, c in ((300, "sshd"), (400, "myapp"))
        ]
    system.writes.clear()
    run_to_end(daemon.release_steps(cookie))
    assert m.sched.affinity[300] == {1}
    mine = [w for w in system.writes if w[1] == "300" or "latencyd-app-300" in w[0]]
    assert mine == []  # not moved, not even for a moment; its cpuset untouched
    if mechanism == "cpuset-v1":
        assert cgroup(system, 300) == "/latencyd-shield/latencyd-app-300"
        assert system.read(f"{V1}/latencyd-shield/latencyd-app-300/cpuset.cpus") == "1"
        assert not (m.root / V1 / "latencyd-shield/latencyd-app-400").exists()
    if mechanism == "cpuset-v2":
        assert cgroup(system, 300) == "/latencyd-shield"
    if mechanism != "affinity":
        assert system.read(f"{hierarchy}/latencyd-shield/cpuset.cpus") == "1"
        assert not cgroup(system, 400).startswith("/latencyd-shield")
    if mechanism == "cpuset-v1":
        assert system.read(f"{V1}/latencyd-housekeeping/cpuset.cpus") == "0,2-3"
    else:
        assert 2 in m.sched.affinity[400]
    assert daemon.engine.off() == []
    if mechanism == "cpuset-v1":
        assert cgroup(system, 300) == "/" and not (m.root / V1 / "latencyd-shield").exists()


def test_v1_a_held_applications_own_cpuset_is_journaled_and_a_killed_run_removes_it(
    tmp_path: Path, machine: Machine
) -> None:
    """A held application's own cpuset is a setting like the shield's: journaled before it
    is made, so the next start after a kill -9 moves the application and what it started
    there out and removes it, and the machine is as found."""
    m, system, engine = rig(tmp_path, v1=True, v2=False)
    before = tree_values(m.root)
    m.plugin.holders(frozenset({400}), {400: CpuSet.from_list("1")})
    switch(m, engine, machine, {"cpus": "1-2"})
    own = "/latencyd-shield/latencyd-app-400"
    assert cgroup(system, 400) == own and system.read(f"{V1}{own}/cpuset.cpus") == "1"
    assert system.read(f"{V1}{own}/cpuset.sched_load_balance") == "0"
    add_task(m.root, 500, "worker", ppid=400, start_time=2000)  # born in its cpuset
    system.place(500, V1, own)
    again = Engine({"shield": ShieldPlugin(system)}, Journal(tmp_path / "state"))
    assert again.adopt() is not None  # as after kill -9
    assert again.off() == []
    assert cgroup(system, 400) == cgroup(system, 500) == "/"
    assert_as_found_but_task_500(m, before)


def test_v1_a_holder_whose_hold_ends_leaves_for_housekeeping_not_the_shield(
    tmp_path: Path, machine: Machine
) -> None:
    """Two holds on CPU 1: the one released runs on CPU 1 because its own cpuset said so,
    not because its user confined it there: it goes to housekeeping, its cpuset goes,
    and the other's stays as it was."""
    m, system, engine = rig(tmp_path, v1=True, v2=False)
    one = CpuSet.from_list("1")
    m.plugin.holders(frozenset({300, 400}), {300: one, 400: one})
    options = m.plugin.options_of(validate(m.plugin.schema, {"cpus": "1"}, machine))
    wanted = m.plugin.expand(options, engine.owned("shield")).settings
    engine.switch({("shield", t): v for t, v in wanted.items()}, "p")
    assert m.sched.affinity[300] == m.sched.affinity[400] == {1}
    m.plugin.holders(frozenset({400}), {400: one})
    wanted = m.plugin.expand(options, engine.owned("shield")).settings
    engine.switch({("shield", t): v for t, v in wanted.items()}, "p")
    assert cgroup(system, 300) == "/latencyd-housekeeping"
    assert not (m.root / V1 / "latencyd-shield/latencyd-app-300").exists()
    assert cgroup(system, 400) == "/latencyd-shield/latencyd-app-400"
    assert engine.off() == []


def test_v1_a_shield_that_shrinks_is_written_before_housekeeping_takes_its_cpus() -> None:
    """An exclusive cpuset never overlaps its sibling (EINVAL): growing, housekeeping
    gives CPUs up first; shrinking, the shield does."""
    grow = v1_groups(CpuSet.from_list("1-2"), CpuSet.from_list("0-3"), "0", CpuSet.from_list("1"))
    shrink = v1_groups(CpuSet.from_list("1"), CpuSet.from_list("0-3"), "0", CpuSet.from_list("1-2"))
    assert list(grow) == ["latencyd-housekeeping", "latencyd-shield"]
    assert list(shrink) == ["latencyd-shield", "latencyd-housekeeping"]


def daemon_on(tmp_path: Path, m: Machinery, engine: Engine, match: str) -> Daemon:
    """A daemon with a profile that shields CPUs 1-2 and puts tasks `match` names on
    CPU 2 ([[shield.rule]]), switched to."""
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    rule = f'[[shield.rule]]\nmatch = {match}\ncpus = "2"\n'
    (pdir / "p.toml").write_text('[shield]\ncpus = "1-2"\n' + rule)
    plugins: dict[str, Plugin[Any, Any, Any]] = {"shield": m.plugin}
    library = ProfileLibrary([pdir], section_schemas(plugins), m.system.machine())
    daemon = Daemon(m.system, plugins, library, engine)
    daemon.switch("p")
    return daemon


@pytest.mark.parametrize("v1", [True, False], ids=["cpuset-v1", "cpuset-v2"])
def test_a_rule_onto_shielded_cpus_moves_its_task_inside_first(
    tmp_path: Path, machine: Machine, v1: bool
) -> None:
    """A [[shield.rule]] whose CPUs are shielded ones: outside the shield's cpuset the
    kernel refuses them (EINVAL), so the task goes inside and then gets the rule's CPUs,
    those of the shield's it names, at the switch and as it execs later (the control hog
    of `measure --attribute --control` stayed on housekeeping under a v1 cpuset, unsaid)."""
    m, system, engine = rig(tmp_path, v1=v1, v2=not v1)
    hierarchy = V1 if v1 else V2
    before = tree_values(m.root)
    daemon = daemon_on(tmp_path, m, engine, '"^(myapp|ltdm-hog)$"')
    assert cgroup(system, 400) == "/latencyd-shield"
    assert m.sched.affinity[400] == m.sched.affinity[401] == {2}
    add_task(m.root, 500, "ltdm-hog", start_time=2000)  # execs in housekeeping
    m.sched.add(500, {0, 3})
    system.place(500, hierarchy, "/latencyd-housekeeping" if v1 else "/")
    daemon.on_task_events([TaskEvent("comm", 500, 500)])
    assert cgroup(system, 500) == "/latencyd-shield"
    assert m.sched.affinity[500] == {2}
    assert daemon.engine.not_applicable == {}
    assert engine.verify() == []
    assert engine.off() == []
    assert cgroup(system, 500) == "/"  # v1: with the housekeeping cpuset it was born in
    assert m.sched.affinity[400] == {0, 1, 2, 3}
    after = tree_values(m.root)
    procs = f"{hierarchy}/cgroup.procs"
    assert after.pop(procs).split() == [*before.pop(procs).split(), "500"]
    assert {k: v for k, v in after.items() if "proc/500/" not in k} == before


def test_a_rule_the_kernel_refuses_for_a_new_task_is_said_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task of another manager's cpuset stays there, where the kernel refuses the CPUs
    a rule names (EINVAL): when it execs, that refusal is logged, not only listed."""
    m, system, engine = rig(tmp_path, v1=True, v2=False)
    system.make_cgroup(f"{V1}/docker")
    system.write(f"{V1}/docker/cpuset.cpus", "0,3")
    daemon = daemon_on(tmp_path, m, engine, '"^ltdm-hog$"')
    add_task(m.root, 500, "ltdm-hog", start_time=2000)
    m.sched.add(500, {0, 3})
    system.write(f"{V1}/docker/cgroup.procs", "500")
    with caplog.at_level("WARNING"):
        daemon.on_task_events([TaskEvent("comm", 500, 500)])
    assert cgroup(system, 500) == "/docker"
    (line,) = [r.getMessage() for r in caplog.records if "ltdm-hog" in r.getMessage()]
    assert line.startswith("[shield] user task ltdm-hog (pid 500, thread 500) CPUs = 2: ")
    assert "not applicable" in line and "EINVAL" in line, line
    assert any(sid[1] == TaskAffinity(500, 2000, 500) for sid in daemon.engine.not_applicable)
    assert engine.off() == []


def two_holds(
    tmp_path: Path,
    more: str,
    mechanism: str = "cpuset-v1",
    holds: tuple[tuple[int, str], ...] = ((300, "1"), (400, "2")),
) -> tuple[Machinery, CgroupLikeSystem, Daemon]:
    """A profile shielding its isolated_cores (with `more` in its [shield] section,
    TOML), held by 300 on CPU 1 and by 400 on CPU 2 (or `holds`, in that order), each
    holder placed (on v1 cpusets: each in its own cpuset)."""
    m, system, _ = rig(tmp_path, v1=mechanism == "cpuset-v1", v2=mechanism == "cpuset-v2")
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "app.toml").write_text(
        '[variables]\nisolated_cores = "1"\n[shield]\ncpus = "${isolated_cores}"\n' + more
    )
    plugins: dict[str, Plugin[Any, Any, Any]] = {"shield": m.plugin}
    library = ProfileLibrary([pdir], section_schemas(plugins), system.machine())
    daemon = Daemon(system, plugins, library, Engine(plugins, Journal(m.state_dir)))
    for pid, cpus in holds:
        run_to_end(
            daemon.hold_steps(
                "app", "x", f":1.{pid}", pid=pid, placed=True, cpus=CpuSet.from_list(cpus)
            )
        )
    return m, system, daemon


@pytest.mark.parametrize(
    ("more", "comm", "exe"),
    [
        ('[[shield.rule]]\nmatch = "^worker$"\ncpus = "2"\n', "worker", None),
        ('apps = ["/opt/md/bin/*"]\n', "feed", "/opt/md/bin/feed"),
    ],
    ids=["a rule onto the other hold's CPU", "apps"],
)
def test_a_task_placed_by_name_stays_in_its_held_applications_own_cpuset(
    tmp_path: Path, more: str, comm: str, exe: str | None
) -> None:
    """Holds on CPUs 1 and 2 (v1): a task the first holder started, born in its own
    cpuset (CPU 1), execs as a program `apps` names or under a name a [[shield.rule]]
    puts on CPU 2 (the other hold's). It is inside already, as in its scope under
    systemd: it stays in its application's cpuset on its hold's CPU, not moved into the
    shield's (where the kernel would give it both holds' CPUs: issue 52 wants each
    application on its own only); on shielded CPUs already, it is left as it is, as a
    task inside the shield's is (KeptInside): nothing refused, nothing of it owned, at
    its exec and at a rescan."""
    m, system, daemon = two_holds(tmp_path, more)
    own = "/latencyd-shield/latencyd-app-300"
    add_task(m.root, 500, comm, ppid=300, start_time=2000, exe=exe)  # born in its cpuset
    m.sched.add(500, {1})
    system.place(500, V1, own)
    system.writes.clear()
    daemon.on_task_events([TaskEvent("comm", 500, 500)])
    assert daemon.refresh(["shield"]) is not None  # a rescan: its expand judges it so too
    assert cgroup(system, 500) == own
    assert m.sched.affinity[500] == {1}
    assert [w for w in system.writes if w[1] == "500"] == []  # not moved, not for a moment
    assert TaskAffinity(500, 2000, 500) not in daemon.engine.owned("shield")
    assert TaskCgroup(V1, 500, 2000) not in daemon.engine.owned("shield")
    assert daemon.engine.not_applicable == {}
    assert daemon.engine.verify() == []


@pytest.mark.parametrize("mechanism", ["cpuset-v1", "cpuset-v2", "affinity"])
@pytest.mark.parametrize(
    "holds",
    [((400, "2"), (300, "1")), ((300, "1"), (400, "2"))],
    ids=["its hold second", "its hold first"],
)
def test_a_holders_hold_wins_over_a_rule_its_name_matches(
    tmp_path: Path, mechanism: str, holds: tuple[tuple[int, str], ...]
) -> None:
    """Holds on CPUs 1 (300, named sshd) and 2 (400), a [[shield.rule]] putting sshd on
    CPU 2: the hold names the CPUs of that very process, the rule any process of a name.
    On every mechanism the holder runs on its hold's CPU and its hold stands; the rule
    is said not applicable to it. (It moved the holder onto the other hold's CPU: on v2
    and the chase its hold was undone as not placed, or, held first, it was moved there
    when the other hold began; v1's own cpuset kept it, the rule refused unsaid.)"""
    m, system, daemon = two_holds(
        tmp_path, '[[shield.rule]]\nmatch = "^sshd$"\ncpus = "2"\n', mechanism, holds
    )
    assert len(daemon.holds) == 2
    assert m.sched.affinity[300] == {1} and m.sched.affinity[400] == {2}
    if mechanism == "cpuset-v1":
        assert cgroup(system, 300) == "/latencyd-shield/latencyd-app-300"
    (said,) = [n for n in daemon.status()["plugins"]["shield"]["not_applicable"]]
    assert said["target"] is None and said["text"] == "rule ^sshd$"
    assert "hold keeps it on its CPUs 1" in said["reason"], said
    assert daemon.engine.not_applicable == {}
    assert daemon.engine.verify() == []
    assert daemon.engine.off() == []
