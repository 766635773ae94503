"""What the agent says on its Node: conditions (by type, as the Node's status holds them),
and annotations. Pure: the agent's view in, a strategic-merge patch out. A condition's
lastTransitionTime moves only when its status does (as the kubelet's do), so a watcher
sees how long a node has been tuned, or pending a reboot."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from latencyd.agent.kubelet import disagreements, kubelet_cpus
from latencyd.cpuset import CpuSet

TUNED = "LatencyTuned"
REBOOT_PENDING = "LatencyRebootPending"
SHIELD_BREACHED = "LatencyShieldBreached"
CPUS_CONFLICT = "LatencyCpusConflict"
OURS = (TUNED, REBOOT_PENDING, SHIELD_BREACHED, CPUS_CONFLICT)

PREFIX = "latencyd.org/"
PROFILE_ANNOTATION = PREFIX + "profile"
DIGEST_ANNOTATION = PREFIX + "digest"
KERNEL_ARGS_ANNOTATION = PREFIX + "kernel-args"

QUIET_S = 600.0  # LatencyShieldBreached clears after this long without a breach


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool | None  # None: Unknown
    reason: str  # CamelCase, as Kubernetes conditions
    message: str

    @property
    def status_text(self) -> str:
        return "Unknown" if self.status is None else str(self.status)


def conditions_patch(
    wanted: Sequence[Condition], current: Sequence[Mapping[str, object]], now: str
) -> list[dict[str, str]]:
    """The conditions to send for `wanted`, given the Node's `current` ones: only ours, and
    only those that differ (a heartbeat is not sent: it would write etcd on every node at
    every interval for nothing)."""
    by_type = {str(c.get("type")): c for c in current}
    out = []
    for cond in wanted:
        before = by_type.get(cond.type, {})
        same_status = before.get("status") == cond.status_text
        if (
            same_status
            and before.get("reason") == cond.reason
            and before.get("message") == cond.message
        ):
            continue
        since = before.get("lastTransitionTime") if same_status else None
        out.append(
            {
                "type": cond.type,
                "status": cond.status_text,
                "reason": cond.reason,
                "message": cond.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": str(since) if since else now,
            }
        )
    return out


def annotations_patch(
    wanted: Mapping[str, str | None], current: Mapping[str, str]
) -> dict[str, str | None]:
    """The annotations that differ (None removes one), only under latencyd.org/."""
    return {k: v for k, v in wanted.items() if k.startswith(PREFIX) and current.get(k) != v}


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def reboot_condition(pending: Sequence[str]) -> Condition:
    """From the daemon's settings that take effect at the next boot (said)."""
    if pending:
        message = "takes effect at the next boot: " + "; ".join(pending)
        return Condition(REBOOT_PENDING, True, "BootSettingsPending", message)
    return Condition(REBOOT_PENDING, False, "AsBooted", "every setting is in force now")


@dataclass(frozen=True)
class Breach:
    """The daemon's last NoiseExceeded: when, on which CPU, its top sources (said)."""

    at: float
    cpu: int
    sources: str


def shield_condition(breach: Breach | None, now: float) -> Condition:
    if breach is not None and now - breach.at < QUIET_S:
        return Condition(
            SHIELD_BREACHED, True, "NoiseBudgetExceeded",
            f"CPU {breach.cpu} took more noise than its budget at {iso(breach.at)}: "
            f"{breach.sources}",
        )  # fmt: skip
    return Condition(
        SHIELD_BREACHED, False, "WithinBudget",
        f"no noise-budget breach reported in the last {QUIET_S:.0f} s",
    )  # fmt: skip


def cpus_condition(isolated: CpuSet, kubelet_config: Mapping[str, object]) -> Condition:
    """The profile's isolated CPUs against the kubelet's KubeletConfiguration."""
    found = disagreements(isolated, kubelet_cpus(kubelet_config))
    if found:
        return Condition(CPUS_CONFLICT, True, "KubeletDisagrees", "; ".join(found))
    return Condition(
        CPUS_CONFLICT, False, "KubeletAgrees",
        "the kubelet leaves the isolated CPUs to guaranteed pods",
    )  # fmt: skip
