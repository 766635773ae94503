"""What the agent says on its Node: conditions (by type, as the Node's status holds them),
and annotations. Pure: the agent's view in, a strategic-merge patch out. A condition's
lastTransitionTime moves only when its status does (as the kubelet's do), so a watcher
sees how long a node has been tuned, or pending a reboot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TUNED = "LatencyTuned"
REBOOT_PENDING = "LatencyRebootPending"
SHIELD_BREACHED = "LatencyShieldBreached"
CPUS_CONFLICT = "LatencyCpusConflict"
OURS = (TUNED, REBOOT_PENDING, SHIELD_BREACHED, CPUS_CONFLICT)

PREFIX = "latencyd.org/"
PROFILE_ANNOTATION = PREFIX + "profile"
DIGEST_ANNOTATION = PREFIX + "digest"
KERNEL_ARGS_ANNOTATION = PREFIX + "kernel-args"


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
