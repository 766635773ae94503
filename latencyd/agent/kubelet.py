"""Whether the kubelet and the profile agree on the CPUs: the profile's isolated CPUs are
for the application (guaranteed pods, under the static CPU manager), the kubelet's
reserved CPUs for the system. Pure: the kubelet's config (its KubeletConfiguration, as
YAML or JSON already parsed) in, disagreements out. The
shield never moves a pod's tasks (its coexistence rule): a disagreement is reported as a
condition, not mended behind the kubelet's back."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from latencyd.cpuset import CpuSet, CpuSetError


@dataclass(frozen=True)
class KubeletCpus:
    policy: str  # cpuManagerPolicy: "none" (the kubelet's default) or "static"
    reserved: CpuSet | None  # reservedSystemCPUs, if set


def kubelet_cpus(config: Mapping[str, object]) -> KubeletCpus:
    policy = str(config.get("cpuManagerPolicy") or "none")
    reserved_text = config.get("reservedSystemCPUs")
    try:
        reserved = CpuSet.from_list(str(reserved_text)) if reserved_text else None
    except CpuSetError:
        reserved = None
    return KubeletCpus(policy, reserved)


def disagreements(isolated: CpuSet, kubelet: KubeletCpus) -> list[str]:
    """Why the kubelet would put other work on `isolated` (empty: they agree)."""
    if not isolated:
        return []
    found = []
    if kubelet.policy != "static":
        found.append(
            f"the kubelet's cpuManagerPolicy is {kubelet.policy!r}: every pod may run on the "
            f"isolated CPUs {isolated} (set it to 'static' to give them to guaranteed pods only)"
        )
    if kubelet.reserved is not None and kubelet.reserved & isolated:
        found.append(
            f"the kubelet reserves CPUs {kubelet.reserved & isolated} for system daemons, "
            f"and the profile isolates them (reservedSystemCPUs={kubelet.reserved})"
        )
    return found
