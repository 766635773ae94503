"""What the agent writes on its Node: only what changed, and a condition's transition time
kept while its status stays."""

from __future__ import annotations

from latencyd.agent.conditions import (
    DIGEST_ANNOTATION,
    PROFILE_ANNOTATION,
    QUIET_S,
    TUNED,
    Breach,
    Condition,
    annotations_patch,
    conditions_patch,
    cpus_condition,
    reboot_condition,
    shield_condition,
)
from latencyd.agent.kubelet import disagreements, kubelet_cpus
from latencyd.cpuset import CpuSet

T0, T1 = "2026-11-28T10:00:00Z", "2026-11-28T11:00:00Z"


def test_an_unchanged_condition_is_not_sent_again() -> None:
    tuned = Condition(TUNED, True, "Applied", "profile vdu verified")
    first = conditions_patch([tuned], [], T0)
    assert first[0]["lastTransitionTime"] == T0 and first[0]["status"] == "True"
    assert conditions_patch([tuned], first, T1) == []


def test_a_new_message_keeps_the_transition_time_and_a_new_status_moves_it() -> None:
    before = conditions_patch([Condition(TUNED, True, "Applied", "vdu")], [], T0)
    reworded = conditions_patch([Condition(TUNED, True, "Applied", "rt")], before, T1)
    assert reworded[0]["lastTransitionTime"] == T0
    refused = conditions_patch([Condition(TUNED, False, "ProfileRefused", "x")], before, T1)
    assert refused[0]["lastTransitionTime"] == T1 and refused[0]["status"] == "False"


def test_only_latencyds_annotations_that_differ_are_sent() -> None:
    current = {PROFILE_ANNOTATION: "vdu", "other.io/x": "1"}
    wanted = {PROFILE_ANNOTATION: "vdu", DIGEST_ANNOTATION: "abc", "other.io/x": None}
    assert annotations_patch(wanted, current) == {DIGEST_ANNOTATION: "abc"}


def test_the_kubelet_and_the_profile_disagreeing_on_cpus_is_said() -> None:
    isolated = CpuSet.from_list("2-7")
    agreeing = kubelet_cpus({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0-1"})
    assert disagreements(isolated, agreeing) == []
    found = disagreements(isolated, kubelet_cpus({"reservedSystemCPUs": "0-3"}))
    assert len(found) == 2
    assert "cpuManagerPolicy is 'none'" in found[0]
    assert "reserves CPUs 2-3" in found[1]
    assert disagreements(CpuSet.from_list(""), kubelet_cpus({})) == []


def test_the_other_conditions_say_what_the_daemon_and_the_kubelet_said() -> None:
    pending = reboot_condition(("bootloader: nohz_full=2-7",))
    assert pending.status is True and "nohz_full=2-7" in pending.message
    assert reboot_condition(()).status is False
    breach = Breach(at=1_000.0, cpu=3, sources="irq 24 virtio0 x40, task kworker x2")
    said = shield_condition(breach, now=1_000.0 + QUIET_S - 1)
    assert said.status is True and "CPU 3" in said.message and "irq 24" in said.message
    assert shield_condition(breach, now=1_000.0 + QUIET_S).status is False  # quiet since
    assert shield_condition(None, now=0.0).status is False
    conflict = cpus_condition(CpuSet.from_list("2-7"), {"cpuManagerPolicy": "none"})
    assert conflict.status is True and conflict.reason == "KubeletDisagrees"
    agreed = cpus_condition(CpuSet.from_list("2-7"), {"cpuManagerPolicy": "static"})
    assert agreed.status is False
