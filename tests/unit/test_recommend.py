"""`latencyctl recommend`: the facts it reads from a machine and the profile it proposes."""

from __future__ import annotations

from pathlib import Path

from latencyd.cpuset import CpuSet
from latencyd.kernel.boot import BootReadings, BootState, booted
from latencyd.kernel.cgroups import Chosen
from latencyd.kernel.cmdline import isolation, parse_cmdline
from latencyd.kernel.idle import IdleFacts, IdleState
from latencyd.kernel.system import System
from latencyd.paths import shipped_profiles_dir
from latencyd.tools.explain import explain
from latencyd.tools.recommend import Facts, Nic, read_facts, recommend, shield_reason
from tests.unit.fakesys import add_nic, make_fake_root, put

CPU = "sys/devices/system/cpu"


def cores(*pairs: str) -> tuple[CpuSet, ...]:
    return tuple(CpuSet.from_list(p) for p in pairs)


def states(*table: tuple[str, int]) -> dict[int, tuple[IdleState, ...]]:
    return {0: tuple(IdleState(i, name, lat) for i, (name, lat) in enumerate(table))}


# What this VM looks like: 2 vCPUs, haltpoll, one virtio NIC.
SMALL_VM = Facts(
    virtual="the cpuidle driver is haltpoll (KVM guests)",
    idle=IdleFacts("haltpoll", "haltpoll", states(("POLL", 0), ("haltpoll idle", 1)), 0),
    online=CpuSet.from_list("0-1"),
    cores=cores("0", "1"),
    nodes=cores("0-1"),
    nics=(Nic("eth0", "virtio_net", 1, -1),),
    irqbalance=False,
)

# 16 CPUs, 8 cores with SMT (siblings N and N+8), two NUMA nodes, the NIC on node 1.
BIG_METAL = Facts(
    virtual="",
    idle=IdleFacts("intel_idle", "menu", states(("POLL", 0), ("C1", 2), ("C6", 133))),
    online=CpuSet.from_list("0-15"),
    cores=tuple(CpuSet([c, c + 8]) for c in range(8)),
    nodes=cores("0-3,8-11", "4-7,12-15"),
    nics=(Nic("ens1f0", "ice", 8, 1),),
    irqbalance=True,
)


def test_a_small_vm_gets_network_latency_without_isolation() -> None:
    rec = recommend(SMALL_VM)
    assert rec.profile == "network-latency"
    assert not rec.isolated
    text = "\n".join(rec.reasons)
    assert "haltpoll" in text and "responsive" in text
    assert "Virtual machine" in text
    assert "too few" in text  # 2 cores: nothing set aside


def test_without_a_nic_latency_performance() -> None:
    rec = recommend(
        Facts(
            "",
            IdleFacts("acpi_idle", "menu"),
            CpuSet([0, 1]),
            cores("0", "1"),
            cores("0-1"),
            (),
            False,
        )
    )
    assert rec.profile == "latency-performance"
    assert "No physical NIC" in "\n".join(rec.reasons)
    assert "Virtual machine" not in "\n".join(rec.reasons)


def test_big_metal_isolates_whole_cores_on_the_nics_node() -> None:
    rec = recommend(BIG_METAL)
    assert rec.profile == "cpu-partitioning"
    # Node 1's cores are 4..7; its first (4,12) stays for housekeeping; half of the
    # other three, rounded up, from the top: cores 6 and 7 with both siblings.
    assert rec.isolated == CpuSet.from_list("6-7,14-15")
    node1 = BIG_METAL.nodes[1]
    assert rec.isolated.issubset(node1)
    for core in BIG_METAL.cores:
        assert core.issubset(rec.isolated) or not (core & rec.isolated)  # never half a core
    text = "\n".join(rec.reasons)
    assert "irqbalance" in text and "intel_idle" in text


def boot_of(cmdline: str, nohz_full: bool) -> BootState:
    """BIG_METAL booted with `cmdline`, on a kernel built with NO_HZ_FULL or without."""
    asked = isolation(parse_cmdline(cmdline), BIG_METAL.online)
    return booted(BootReadings(cmdline, BIG_METAL.online, asked.domain_isolated,
                               asked.tickless if nohz_full else None, True,
                               asked.rcu_nocbs or CpuSet()))  # fmt: skip


def test_the_boot_arguments_a_reboot_would_add_are_proposed_with_what_they_do() -> None:
    rec = recommend(Facts(**{**BIG_METAL.__dict__, "boot": boot_of("quiet", True)}))
    text = "\n".join(rec.reasons)
    assert (
        "Boot arguments for 6-7,14-15 (the next boot brings them, not latencyd): "
        "nohz_full=6-7,14-15 rcu_nocbs=6-7,14-15 isolcpus=managed_irq,6-7,14-15."
    ) in text
    assert "stops the scheduler tick" in text
    # Booted already for other CPUs, on a kernel without NO_HZ_FULL.
    boot = boot_of("isolcpus=managed_irq,domain,1-2 rcu_nocbs=6-7,14-15", False)
    text = "\n".join(recommend(Facts(**{**BIG_METAL.__dict__, "boot": boot})).reasons)
    assert "Not on this kernel: nohz_full=6-7,14-15: this kernel is built without" in text
    line = next(r for r in text.splitlines() if r.startswith("Boot arguments"))
    assert line.startswith(
        "Boot arguments for 6-7,14-15 (the next boot brings them, not "
        "latencyd): isolcpus=managed_irq,6-7,14-15. "
    )  # rcu_nocbs booted
    assert "Booted isolation the profile would not use: managed IRQs: booted for CPUs 1-2" in text
    assert "Boot arguments" not in "\n".join(recommend(SMALL_VM).reasons)  # nothing isolated


def test_a_nic_of_unknown_node_isolates_on_the_first_node() -> None:
    nics = (Nic("ens1f0", "ice", 8, -1),)
    rec = recommend(Facts(**{**BIG_METAL.__dict__, "nics": nics}))
    assert rec.isolated == CpuSet.from_list("2-3,10-11")


def test_the_proposal_loads_as_a_profile_with_its_isolated_cores(tmp_path: Path) -> None:
    rec = recommend(BIG_METAL)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "recommended.toml").write_text(rec.toml())
    root = make_fake_root(tmp_path, cpus="0-15")
    result = explain("recommended", [pdir, shipped_profiles_dir()], root=str(root))
    assert result["variables"]["isolated_cores"] == "6-7,14-15"
    assert str(shipped_profiles_dir() / "cpu-partitioning.toml") in result["files"]


def test_read_facts_from_sysfs(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path, cpus="0-3")
    put(root, "proc/cpuinfo", "processor\t: 0\nflags\t\t: fpu vme hypervisor sse\n")
    put(root, f"{CPU}/cpuidle/current_driver", "haltpoll")
    for cpu, siblings in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")):
        put(root, f"{CPU}/cpu{cpu}/topology/thread_siblings_list", siblings)
    put(root, "sys/devices/system/node/node0/cpulist", "0-3")
    put(root, "sys/devices/system/node/possible", "0")  # not a node directory
    add_nic(root, "eth0", 2, bus="0000:00:04.0", driver="virtio_net", queues=2)
    put(root, "sys/class/net/eth0/device/numa_node", "-1")
    add_nic(root, "veth0", 3)  # no device: virtual, not a NIC whose IRQs matter
    put(root, "proc/77/comm", "irqbalance")
    put(root, "proc/77/status", "Name:\tirqbalance\nUid:\t0\t0\t0\t0\n")  # root's
    facts = read_facts(System(str(root)))
    assert facts.virtual.startswith("the CPU flags say a hypervisor")
    assert facts.idle.driver == "haltpoll"
    assert facts.online == CpuSet.from_list("0-3")
    assert sorted(facts.cores, key=min) == list(cores("0,2", "1,3"))
    assert facts.nodes == cores("0-3")
    assert facts.nics == (Nic("eth0", "virtio_net", 2, -1),)
    assert facts.irqbalance


def test_recommend_says_how_the_shield_is_kept_here_and_so_how_to_start_the_app() -> None:
    v1 = Chosen("cpuset-v1", "sys/fs/cgroup/cpuset", {"cpuset-v2": "cpuset is held by v1"})
    text = shield_reason(CpuSet({1}), v1)
    assert "cpuset-v1 on /sys/fs/cgroup/cpuset; not cpuset-v2: cpuset is held by v1" in text
    assert "`taskset -c 1` from a shell is refused" in text and "latencyctl run" in text
    chase = shield_reason(CpuSet({1}), Chosen("affinity", None, {"cpuset-v1": "none"}))
    assert "affinity chase: not cpuset-v1: none" in chase and "`taskset -c 1 ./app`" in chase
