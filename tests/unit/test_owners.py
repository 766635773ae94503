"""The other owners of every setting (latencyd.kernel.owners), on fake roots: sysctl.d in
systemd-sysctl's order, udev rules, systemd's CPUs, the kubelet, irqbalance and TuneD;
and what status, explain, drift and the start-up say of them."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.irq import IrqAffinity
from latencyd.plugins.shield import UnitCpus
from latencyd.plugins.sysctl import Sysctl
from latencyd.plugins.writeback import DirtyLimit, VmKnob

from latencyd.core.plugin import in_one_go
from latencyd.kernel.cgroups import systemd_unit
from latencyd.kernel.owners import (
    CPUS,
    IRQS,
    SYSCTL,
    Claim,
    Tuner,
    overlap,
    owners_of,
    parse_sysctl_d,
    read_owners,
    running_tuners,
    sysctl_key,
)
from latencyd.kernel.system import Machine, System, Writer
from latencyd.service.main import say_other_tuners
from latencyd.text import printable
from latencyd.tools.cli import format_explain, format_plan, format_status
from latencyd.tools.explain import other_owners
from tests.unit.fakesys import add_task, make_fake_root
from tests.unit.pluginrig import swap_daemon

SWAP = Claim(SYSCTL, "vm/swappiness")


def put(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_sysctl_keys_are_normalized_as_systemd_does() -> None:
    assert sysctl_key("vm.swappiness") == "vm/swappiness"
    assert sysctl_key("/vm/swappiness") == "vm/swappiness"
    # The first separator decides: a dot-first key's slashes are literal dots.
    assert sysctl_key("net.ipv4.conf.eth0/100.rp_filter") == "net/ipv4/conf/eth0.100/rp_filter"
    assert sysctl_key("net/ipv4/conf/eth0.100/rp_filter") == "net/ipv4/conf/eth0.100/rp_filter"


def test_a_fragment_is_read_with_its_lines() -> None:
    text = (
        "# comment\n; also\n\nvm.swappiness = 60\n-kernel.numa_balancing=0\n"
        "-net.ipv4.conf.lo.x\nbad\n"
    )
    lines = parse_sysctl_d("/etc/sysctl.d/a.conf", text)
    assert [(line.where, line.key, line.value, line.optional) for line in lines] == [
        ("/etc/sysctl.d/a.conf:4", "vm/swappiness", "60", False),
        ("/etc/sysctl.d/a.conf:5", "kernel/numa_balancing", "0", True),
        ("/etc/sysctl.d/a.conf:6", "net/ipv4/conf/lo/x", None, False),
    ]


def test_sysctl_d_in_systemd_sysctls_order_the_last_line_wins(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    put(root, "usr/lib/sysctl.d/10-vendor.conf", "vm.swappiness = 30\n")
    put(root, "usr/local/lib/sysctl.d/20-local.conf", "\nvm.swappiness = 40\n")
    put(root, "run/sysctl.d/30-run.conf", "vm.swappiness = 50\n")
    put(root, "etc/sysctl.d/90-admin.conf", "# the admin's\nvm.swappiness = 60\n")
    owners = read_owners(System(root)).of([SWAP])
    assert [(o.where, o.value, o.overridden_by) for o in owners] == [
        ("/usr/lib/sysctl.d/10-vendor.conf:1", "30", "/etc/sysctl.d/90-admin.conf:2"),
        ("/usr/local/lib/sysctl.d/20-local.conf:2", "40", "/etc/sysctl.d/90-admin.conf:2"),
        ("/run/sysctl.d/30-run.conf:1", "50", "/etc/sysctl.d/90-admin.conf:2"),
        ("/etc/sysctl.d/90-admin.conf:2", "60", None),
    ]
    assert all(o.who == "systemd-sysctl" and "at boot" in o.when for o in owners)
    assert owners[-1].sets == "vm.swappiness = 60"


def test_a_file_of_the_same_name_earlier_on_the_path_replaces_the_later(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    put(root, "usr/lib/sysctl.d/50-x.conf", "vm.swappiness = 30\n")
    put(root, "lib/sysctl.d/50-x.conf", "vm.swappiness = 35\n")
    put(root, "etc/sysctl.d/50-x.conf", "vm.swappiness = 60\n")
    put(root, "usr/lib/sysctl.d/60-masked.conf", "vm.swappiness = 99\n")
    (root / "etc/sysctl.d/60-masked.conf").symlink_to("/dev/null")
    owners = read_owners(System(root)).of([SWAP])
    assert [(o.where, o.value) for o in owners] == [("/etc/sysctl.d/50-x.conf:1", "60")]


def test_sysctl_conf_last_and_once_when_a_fragment_links_to_it(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    put(root, "etc/sysctl.conf", "vm.swappiness = 20\n")
    put(root, "etc/sysctl.d/10-a.conf", "vm.swappiness = 60\n")
    owners = read_owners(System(root)).of([SWAP])
    assert [(o.where, o.overridden_by) for o in owners] == [
        ("/etc/sysctl.d/10-a.conf:1", "/etc/sysctl.conf:1"),
        ("/etc/sysctl.conf:1", None),
    ]
    # Debian's link: systemd-sysctl reads it as 99-sysctl.conf, named as the real file.
    (root / "etc/sysctl.d/99-sysctl.conf").symlink_to("../sysctl.conf")
    owners = read_owners(System(root)).of([SWAP])
    assert [o.where for o in owners] == ["/etc/sysctl.d/10-a.conf:1", "/etc/sysctl.conf:1"]


def test_globs_set_what_no_line_names_and_not_what_is_excluded(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    put(
        root,
        "etc/sysctl.d/50-rp.conf",
        "net.ipv4.conf.*.rp_filter = 2\nnet.ipv4.conf.eth0.rp_filter = 1\n"
        "-net.ipv4.conf.lo.rp_filter\n",
    )
    index = read_owners(System(root))

    def owners(nic: str) -> list[tuple[str, str | None, str | None]]:
        claim = Claim(SYSCTL, f"net/ipv4/conf/{nic}/rp_filter")
        return [(o.where, o.value, o.overridden_by) for o in index.of([claim])]

    glob, eth0 = "/etc/sysctl.d/50-rp.conf:1", "/etc/sysctl.d/50-rp.conf:2"
    assert owners("eth1") == [(glob, "2", None)]
    assert owners("eth0") == [(glob, "2", eth0), (eth0, "1", None)]
    assert owners("lo") == []
    assert index.of([Claim(SYSCTL, "net/ipv4/conf/eth1/rp_filter/x")]) == []


def test_udev_reapplies_interface_keys_when_an_interface_appears(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    put(
        root,
        "usr/lib/udev/rules.d/99-systemd.rules",
        '# x\nACTION=="add", SUBSYSTEM=="net", KERNEL!="lo", RUN+="/lib/systemd/systemd-sysctl'
        ' --prefix=/net/ipv4/conf/$name --prefix=/net/ipv6/conf/$name"\n',
    )
    put(
        root,
        "etc/udev/rules.d/80-x.rules",
        'ACTION=="add", RUN+="/sbin/sysctl -w vm.swappiness=5"\n',
    )
    put(root, "etc/sysctl.d/50.conf", "net.ipv4.conf.all.forwarding = 1\nvm.swappiness = 60\n")
    index = read_owners(System(root))
    (fwd,) = index.of([Claim(SYSCTL, "net/ipv4/conf/all/forwarding")])
    assert "when a network interface appears (/usr/lib/udev/rules.d/99-systemd.rules:2)" in fwd.when
    swap = index.of([SWAP])
    assert [(o.who, o.where, o.value) for o in swap] == [
        ("systemd-sysctl", "/etc/sysctl.d/50.conf:2", "60"),
        ("udev", "/etc/udev/rules.d/80-x.rules:1", "5"),
    ]
    assert "interface" not in swap[0].when


def test_the_drifted_value_names_the_fragment_that_holds_it(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    put(root, "usr/lib/sysctl.d/10.conf", "vm.swappiness = 60\n")
    put(root, "etc/sysctl.d/90.conf", "vm.swappiness =   60\n")
    index = read_owners(System(root))
    by = index.changed_by([SWAP], 60)
    assert by is not None and by.where == "/etc/sysctl.d/90.conf:1"  # the one in effect
    assert index.changed_by([SWAP], 61) is None
    assert index.changed_by([Claim(SYSCTL, "vm/other")], 60) is None


def test_systemd_kubelet_and_irqbalance_own_cpus_and_irqs(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    put(root, "etc/systemd/system.conf", "[Manager]\n#CPUAffinity=\nCPUAffinity=0-1\n")
    put(root, "etc/systemd/system/db.service", "[Service]\nExecStart=/x\nCPUAffinity=1\n")
    put(root, "usr/lib/systemd/system/system.slice.d/10.conf", "[Slice]\nAllowedCPUs=0\n")
    put(
        root, "var/lib/kubelet/config.yaml", 'kind: KubeletConfiguration\nreservedSystemCPUs: "0"\n'
    )
    put(root, "usr/sbin/irqbalance", "")
    put(root, "etc/default/irqbalance", "#x\nIRQBALANCE_BANNED_CPULIST=1-3\n")
    index = read_owners(System(root))
    wheres = [o.where for o in index.of([Claim(CPUS, "system.slice")])]
    assert wheres == [
        "/etc/systemd/system.conf:3",
        "/usr/lib/systemd/system/system.slice.d/10.conf:2",
        "/var/lib/kubelet/config.yaml:2",
    ]
    (slice_,) = [o for o in index.of([Claim(CPUS, "system.slice")]) if "slice" in o.where]
    assert slice_.sets == "AllowedCPUs=0" and "whenever system.slice starts" in slice_.when
    assert "/etc/systemd/system/db.service:3" in [o.where for o in index.of([Claim(CPUS)])]
    (irqbalance,) = index.of([Claim(IRQS)])
    assert irqbalance.where == "/etc/default/irqbalance:2"
    assert irqbalance.sets == "IRQs onto every CPU but IRQBALANCE_BANNED_CPULIST=1-3"
    assert "not running now" in irqbalance.when


def tuned_profile(root: Path) -> None:
    put(root, "etc/tuned/active_profile", "mine\n")
    put(root, "usr/lib/tuned/base/tuned.conf", "[main]\nsummary=x\n\n[sysctl]\nvm.swappiness=10\n")
    put(
        root,
        "etc/tuned/mine/tuned.conf",
        "[main]\ninclude=base\n[my_irqs]\ntype=irqbalance\nbanned_cpus=1\n[vm]\n"
        "dirty_ratio=10\ntransparent_hugepages=never\n",
    )


def test_tuneds_active_profile_and_its_includes_with_file_and_line(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    tuned_profile(root)
    index = read_owners(System(root))
    (swap,) = index.of([SWAP])
    assert (swap.who, swap.where, swap.value) == ("TuneD", "/usr/lib/tuned/base/tuned.conf:5", "10")
    assert "not running now" in swap.when and "(profile mine)" in swap.sets
    (irqs,) = index.of([Claim(IRQS)])
    assert irqs.where == "/etc/tuned/mine/tuned.conf:5"
    assert [o.where for o in index.of(DirtyLimit("dirty").claims())] == [
        "/etc/tuned/mine/tuned.conf:7"
    ]


def test_a_running_tuned_is_found_with_what_both_would_set(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    tuned_profile(root)
    system = System(root)
    assert running_tuners(system, 1) == []
    add_task(root, 812, "tuned")
    add_task(root, 900, "tuned", uid=1000)  # anyone may call a process so: not TuneD
    add_task(root, 950, "latencyd")
    add_task(root, 951, "latencyd")  # ourselves
    put(root, "run/tuned/tuned.pid", "812\n")
    found = running_tuners(system, 951)
    assert [(t.name, t.pid, t.profile) for t in found] == [
        ("TuneD", 812, "mine"),
        ("another latencyd", 950, ""),
    ]
    ours = [c for t in (Sysctl("vm.swappiness"), IrqAffinity(5)) for c in t.claims()]
    assert overlap(found[0], ours) == [
        "sysctl vm.swappiness (/usr/lib/tuned/base/tuned.conf:5 [sysctl] vm.swappiness)",
        "irq affinity (/etc/tuned/mine/tuned.conf:5 [irqbalance] banned_cpus)",
    ]
    assert overlap(found[1], ours) == ["every setting latencyd applies"]
    assert overlap(Tuner("TuneD", 1, "x", ((SWAP, "f:1"),)), [Claim(CPUS)]) == []
    (swap,) = read_owners(system).of([SWAP])
    assert "running: pid 812" in swap.when


def test_owners_of_answers_for_a_batch_of_targets(tmp_path: Path) -> None:
    """The one function `plan` calls: owners for the targets that have some."""
    root = make_fake_root(tmp_path)
    put(root, "etc/sysctl.d/90.conf", "vm.swappiness = 60\nvm.stat_interval = 3\n")
    asked = [
        Sysctl("vm.swappiness"),
        VmKnob("stat_interval"),
        Sysctl("kernel.timer_migration"),
        UnitCpus("system.slice"),
    ]
    found = owners_of(System(root), asked)
    assert {t: [o.where for o in owners] for t, owners in found.items()} == {
        Sysctl("vm.swappiness"): ["/etc/sysctl.d/90.conf:1"],
        VmKnob("stat_interval"): ["/etc/sysctl.d/90.conf:2"],
    }


def test_status_names_each_settings_other_owners(tmp_path: Path, machine: Machine) -> None:
    root, daemon = swap_daemon(tmp_path, machine)
    put(root, "etc/sysctl.d/90-swap\x1b[2J.conf", "vm.swappiness = 60\n")
    daemon.start("swap")
    sysctl = daemon.status()["plugins"]["sysctl"]
    (row,) = sysctl["applied"]
    assert [
        (o["who"], o["where"], o["value"]) for o in map(sysctl["owners"].__getitem__, row["owners"])
    ] == [("systemd-sysctl", "/etc/sysctl.d/90-swap\x1b[2J.conf:1", "60")]
    lines = format_status(daemon.status())
    (line,) = [line for line in lines if "also set by" in line]
    assert "systemd-sysctl /etc/sysctl.d/90-swap\x1b[2J.conf:1: vm.swappiness = 60" in line
    assert "\x1b" not in printable(line)  # what latencyctl prints (each line through it)


def test_drift_repair_names_the_fragment_whose_value_it_was(
    tmp_path: Path, machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    root, daemon = swap_daemon(tmp_path, machine)
    put(root, "etc/sysctl.d/90-swap.conf", "vm.swappiness = 60\n")
    daemon.start("swap")
    told: list[list[dict[str, Any]]] = []
    daemon.on_drift.append(told.append)
    (root / "proc/sys/vm/swappiness").write_text("60\n")  # as systemd-sysctl would
    with caplog.at_level(logging.WARNING):
        (record,) = daemon.check_drift(None)
    assert record["action"] == "reapplied"
    assert record["changed_by"]["where"] == "/etc/sysctl.d/90-swap.conf:1"
    assert told == [[record]]
    assert "the value systemd-sysctl sets from /etc/sysctl.d/90-swap.conf:1" in caplog.text
    assert (root / "proc/sys/vm/swappiness").read_text().strip() == "10"
    # A value no owner sets names no one.
    (root / "proc/sys/vm/swappiness").write_text("77\n")
    (record,) = daemon.check_drift(None)
    assert "changed_by" not in record


def test_the_start_says_a_running_tuned_and_what_both_set(
    tmp_path: Path, machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    root, daemon = swap_daemon(tmp_path, machine)
    tuned_profile(root)
    add_task(root, 812, "tuned")
    put(root, "run/tuned/tuned.pid", "812\n")  # as TuneD writes it
    daemon.start("swap")
    with caplog.at_level(logging.WARNING):
        say_other_tuners(daemon)
    assert (
        "TuneD is running (pid 812, profile mine): it and latencyd both set sysctl "
        "vm.swappiness (/usr/lib/tuned/base/tuned.conf:5 [sysctl] vm.swappiness)" in caplog.text
    )
    status = daemon.status()
    assert [t["pid"] for t in status["other_tuners"]] == [812]
    (row,) = status["plugins"]["sysctl"]["applied"]
    (owner,) = [status["plugins"]["sysctl"]["owners"][i] for i in row["owners"]]
    assert owner["who"] == "TuneD" and "running: pid 812" in owner["when"]
    assert any("also running at start: TuneD (pid 812" in line for line in format_status(status))


def test_explain_names_the_other_owners(tmp_path: Path, machine: Machine) -> None:
    root, daemon = swap_daemon(tmp_path, machine)
    put(root, "etc/sysctl.d/90-swap.conf", "vm.swappiness = 60\n")
    profile = daemon.library.load("swap")
    found = other_owners(profile, daemon.system)
    assert [(r["setting"], [o["where"] for o in r["owners"]]) for r in found["sysctl"]] == [
        ("sysctl vm.swappiness", ["/etc/sysctl.d/90-swap.conf:1"])
    ]
    data = {"name": "swap", "summary": "", "files": [], "variables": {},
            "sections": {"sysctl": []}, "owners": found}  # fmt: skip
    assert (
        "      also set by systemd-sysctl /etc/sysctl.d/90-swap.conf:1: vm.swappiness = 60"
        ", at boot (systemd-sysctl.service), and whenever that service is restarted"
        in format_explain(data)
    )


def test_status_names_an_owner_of_many_settings_once(tmp_path: Path, machine: Machine) -> None:
    """Server size: an owner of many settings (one irqbalance for 4,096 IRQs; here a
    glob) is one entry of the plugin's owners, each row an index into it, and named once
    by latencyctl's status."""
    root, daemon = swap_daemon(tmp_path, machine)
    (tmp_path / "profiles/two.toml").write_text(
        '[sysctl]\n"vm.swappiness" = 10\n"vm.stat_interval" = 2\n'
    )
    put(root, "etc/sysctl.d/90.conf", "vm.* = 1\n")
    daemon.start("two")
    status = daemon.status()
    sysctl = status["plugins"]["sysctl"]
    assert [r["owners"] for r in sysctl["applied"]] == [[0], [0]]
    assert [(o["where"], o["sets"]) for o in sysctl["owners"]] == [
        ("/etc/sysctl.d/90.conf:1", "vm.* = 1")
    ]
    lines = format_status(status)
    assert sum("also set by" in line for line in lines) == 1
    assert "  (the other owners named above also set 1 more of these)" in lines


def test_plan_names_each_settings_other_owners_and_when_they_act(
    tmp_path: Path, machine: Machine
) -> None:
    """`latencyctl plan` beside each setting: what else sets it and when (the owners'
    table of the plan, each row's indices into it), an owner of many settings named once;
    a setting the switch would give back (restore) keeps its owners too."""
    root, daemon = swap_daemon(tmp_path, machine)
    (tmp_path / "profiles/two.toml").write_text(
        '[sysctl]\n"vm.swappiness" = 10\n"vm.stat_interval" = 2\n'
    )
    put(root, "etc/sysctl.d/90-swap.conf", "vm.swappiness = 60\n")
    put(root, "etc/sysctl.d/95-vm.conf", "vm.stat_interval = 1\nvm.dirty_ratio = 5\n")
    put(root, "etc/udev/rules.d/99-vm.rules",
        'SUBSYSTEM=="net", RUN+="/lib/systemd/systemd-sysctl --prefix=/vm"\n')  # fmt: skip
    data = daemon.plan_json(in_one_go(daemon.plan_steps)("two"))
    by_key = {r["target"]["key"]: [data["owners"][i] for i in r["owners"]]
              for r in data["settings"]}  # fmt: skip
    assert {k: [(o["who"], o["where"], o["value"]) for o in v] for k, v in by_key.items()} == {
        "vm.swappiness": [("systemd-sysctl", "/etc/sysctl.d/90-swap.conf:1", "60")],
        "vm.stat_interval": [("systemd-sysctl", "/etc/sysctl.d/95-vm.conf:1", "1")],
    }
    when = by_key["vm.swappiness"][0]["when"]
    assert when.startswith("at boot (systemd-sysctl.service)")
    assert "when a network interface appears (/etc/udev/rules.d/99-vm.rules:1)" in when
    lines = format_plan(data)
    assert (
        "      also set by systemd-sysctl /etc/sysctl.d/90-swap.conf:1: vm.swappiness = 60, " + when
    ) in lines
    assert sum("also set by" in line for line in lines) == 2
    # From a profile applied: the plan of a switch to `swap` gives vm.stat_interval back,
    # and says who else sets it.
    daemon.start("two")
    data = daemon.plan_json(in_one_go(daemon.plan_steps)("swap"))
    (restore,) = [r for r in data["settings"] if r["step"] == "restore"]
    assert [data["owners"][i]["where"] for i in restore["owners"]] == ["/etc/sysctl.d/95-vm.conf:1"]


def test_plan_names_an_owner_of_many_settings_once(tmp_path: Path, machine: Machine) -> None:
    root, daemon = swap_daemon(tmp_path, machine)
    (tmp_path / "profiles/two.toml").write_text(
        '[sysctl]\n"vm.swappiness" = 10\n"vm.stat_interval" = 2\n'
    )
    put(root, "etc/sysctl.d/90.conf", "vm.* = 1\n")
    data = daemon.plan_json(in_one_go(daemon.plan_steps)("two"))
    assert [r["owners"] for r in data["settings"]] == [[0], [0]]
    lines = format_plan(data)
    assert sum("also set by" in line for line in lines) == 1
    assert "  (the other owners named above also set 1 more of these)" in lines


def test_a_tuner_started_by_systemd_is_named_with_its_unit(
    tmp_path: Path, machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    """tuned.service running at latencyd's start: said with its unit, so the admin knows
    what to stop (or disable)."""
    root, daemon = swap_daemon(tmp_path, machine)
    tuned_profile(root)
    add_task(root, 812, "tuned")
    put(root, "proc/812/cgroup", "12:cpuset:/\n0::/system.slice/tuned.service\n")
    put(root, "run/tuned/tuned.pid", "812\n")
    daemon.start("swap")
    with caplog.at_level(logging.WARNING):
        say_other_tuners(daemon)
    assert "TuneD is running (pid 812, tuned.service, profile mine): it and latencyd" in (
        caplog.text
    )
    status = daemon.status()
    assert [(t["pid"], t["unit"]) for t in status["other_tuners"]] == [(812, "tuned.service")]
    assert any(line.startswith("also running at start: TuneD (pid 812, tuned.service, "
                               "profile mine)") for line in format_status(status))  # fmt: skip


@pytest.mark.parametrize(
    ("proc_cgroup", "unit"),
    [
        ("0::/system.slice/tuned.service\n", "tuned.service"),
        ("12:cpuset:/\n1:name=systemd:/system.slice/tuned.service\n", "tuned.service"),
        ("0::/user.slice/user-0.slice/session-3.scope\n", "session-3.scope"),
        ("0::/\n", None),
        ("0::/system.slice\n", None),
        ("", None),
    ],
)
def test_the_unit_a_task_runs_in(proc_cgroup: str, unit: str | None) -> None:
    assert systemd_unit(proc_cgroup) == unit


def test_drift_repair_names_the_process_seen_writing_it(
    tmp_path: Path, machine: Machine, caplog: pytest.LogCaptureFixture
) -> None:
    # The file watch saw who wrote (fanotify's pid, its comm and command line read then):
    # the record carries it as read, the log line says it escaped (a comm is anyone's).
    root, daemon = swap_daemon(tmp_path, machine)
    daemon.start("swap")
    (root / "proc/sys/vm/swappiness").write_text("77\n")
    writer = Writer(4321, "evil\x1b[2J", "sh -c echo 77 > /proc/sys/vm/swappiness")
    other = Writer(4322, "other")  # of a setting that did not drift: no record
    with caplog.at_level(logging.WARNING):
        (record,) = daemon.check_drift(
            None, {("sysctl", Sysctl("vm.swappiness")): writer, ("sysctl", Sysctl("x.y")): other}
        )
    assert record["written_by"] == {
        "pid": 4321,
        "comm": "evil\x1b[2J",
        "cmdline": "sh -c echo 77 > /proc/sys/vm/swappiness",
    }
    assert record["action"] == "reapplied"
    assert "but it is '77', written by 4321 (evil\\x1b[2J): reapplied" in caplog.text
    assert "\x1b" not in caplog.text
    # Drift no write was seen for (found by the tick) names no process.
    (root / "proc/sys/vm/swappiness").write_text("78\n")
    (record,) = daemon.check_drift(None)
    assert "written_by" not in record
