"""The shipped manifests as files: the alert rules are a rules file Prometheus accepts
(promtool) over metrics latencyd exposes; the DaemonSet runs the agent with what it
needs of the host. (Each manifest is also checked by the real API server: the fleet
e2e tests' server-side dry run.)"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from latencyd.paths import CLUSTER_PROFILES, KUBELET_CONFIG
from latencyd.service.metrics import NAMES

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def test_the_alert_rules_pass_promtool_and_name_only_metrics_latencyd_exposes(
    tmp_path: Path,
) -> None:
    (config_map,) = documents("20-alerts.yaml")
    rules_text = config_map["data"]["latencyd.rules.yaml"]
    rules = tmp_path / "latencyd.rules.yaml"
    rules.write_text(rules_text)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool missing (Debian's prometheus package: make setup installs it)")
    out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    exposed = {n.split("{")[0] for n in NAMES.values()}
    alerts = yaml.safe_load(rules_text)["groups"][0]["rules"]
    assert {a["alert"] for a in alerts} >= {
        "LatencydNoiseBudgetExceeded",
        "LatencydDriftRepaired",
        "LatencydRebootPending",
    }
    for alert in alerts:
        named = set(re.findall(r"latencyd_[a-z_]+", alert["expr"]))
        assert named and named <= exposed, (alert["alert"], named - exposed)
    pending = next(a for a in alerts if a["alert"] == "LatencydRebootPending")
    assert pending["for"] == "1d"


def test_the_daemonset_gives_the_agent_no_more_than_it_needs() -> None:
    """Least privilege, as docs/fleet.md says it: no privileged container, no host PID
    namespace, no capability, and exactly three host paths: the bus socket, the
    cluster-profile directory's parent, the kubelet's config file (read only)."""
    (ds,) = documents("03-daemonset.yaml")
    pod = ds["spec"]["template"]["spec"]
    (agent,) = pod["containers"]
    security = agent["securityContext"]
    assert not pod.get("hostPID") and not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]} and security["readOnlyRootFilesystem"]
    hosts = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert hosts == {
        "cluster-profiles": str(CLUSTER_PROFILES.parent),
        "dbus": "/run/dbus/system_bus_socket",
        "kubelet-config": str(KUBELET_CONFIG),
    }
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["kubelet-config"]["readOnly"] is True
    assert mounts["cluster-profiles"]["mountPath"] == str(CLUSTER_PROFILES.parent)
    assert mounts["kubelet-config"]["mountPath"] == str(KUBELET_CONFIG)
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["DBUS_SYSTEM_BUS_ADDRESS"]["value"].endswith("system_bus_socket")
    assert pod["tolerations"] and pod["nodeSelector"]
