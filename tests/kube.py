"""A real Kubernetes control plane for the fleet tests: Debian's etcd 3.4 and
kube-apiserver v1.37.2 (built by scripts/control-plane.sh into its cache), on free
loopback ports, in a private directory, torn down after. No kubelet and no
controller-manager: Nodes are registered by the tests, and ServiceAccount tokens are
made by TokenRequest, bound to Pods the tests create on those Nodes (so a token carries
its node's name, as in a real cluster)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.harness import free_port

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
CACHE = Path(os.environ.get("LATENCYD_K8S_CACHE", "/var/cache/latencyd-test/k8s"))
APISERVER = CACHE / "bin" / "kube-apiserver"
ETCD = CACHE / "etcd34" / "usr" / "bin" / "etcd"


class NotBuilt(RuntimeError):
    pass


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path) -> None:
    """A CA, the apiserver's serving certificate, an admin client (system:masters) and
    the ServiceAccount signing key."""
    d.mkdir(mode=0o700)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "2", "-subj", "/CN=latencyd-test-ca", cwd=d)  # fmt: skip
    (d / "srv.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
        "keyUsage=digitalSignature,keyEncipherment\n"
    )
    (d / "cli.ext").write_text(
        "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    for name, subject, ext in (
        ("apiserver", "/CN=kube-apiserver", "srv.ext"),
        ("admin", "/O=system:masters/CN=latencyd-test-admin", "cli.ext"),
    ):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
                 f"{name}.csr", "-subj", subject, cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", ext,
                 cwd=d)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


class ControlPlane:
    def __init__(self) -> None:
        for binary in (APISERVER, ETCD):
            if not os.access(binary, os.X_OK):
                raise NotBuilt(f"{binary} missing: run scripts/control-plane.sh (make test does)")
        self.dir = Path(tempfile.mkdtemp(prefix="latencyd-k8s-"))
        self.pki = self.dir / "pki"
        self.port = free_port()
        self.etcd_port, self.peer_port = free_port(), free_port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.apiserver: subprocess.Popen[bytes] | None = None
        self.kubeconfig = self.dir / "admin.kubeconfig"
        self.url = f"https://127.0.0.1:{self.port}"

    # -- processes -------------------------------------------------------------
    def start(self) -> ControlPlane:
        make_pki(self.pki)
        self._write_kubeconfig(
            self.kubeconfig,
            {
                "client-certificate": str(self.pki / "admin.crt"),
                "client-key": str(self.pki / "admin.key"),
            },
        )
        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        self.etcd = self._spawn(
            "etcd",
            [str(ETCD), "--name", "t", "--data-dir", str(self.dir / "etcd"),
             "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"t={peer_url}", "--listen-metrics-urls",
             f"http://127.0.0.1:{free_port()}"],
        )  # fmt: skip
        self.start_apiserver()
        return self

    def start_apiserver(self, timeout: float = 120.0) -> None:
        p = self.pki
        self.apiserver = self._spawn(
            "apiserver",
            [str(APISERVER), f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
             "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
             f"--secure-port={self.port}", f"--cert-dir={self.dir / 'certdir'}",
             f"--tls-cert-file={p / 'apiserver.crt'}",
             f"--tls-private-key-file={p / 'apiserver.key'}", f"--client-ca-file={p / 'ca.crt'}",
             f"--service-account-issuer={self.url}", f"--service-account-key-file={p / 'sa.pub'}",
             f"--service-account-signing-key-file={p / 'sa.key'}",
             "--service-cluster-ip-range=10.0.0.0/24", "--authorization-mode=RBAC",
             "--disable-admission-plugins=ServiceAccount", "--allow-privileged=true",
             # v1.37 refuses a loopback advertise address unless nothing reconciles it
             "--endpoint-reconciler-type=none"],
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.apiserver.poll() is not None:
                raise RuntimeError("kube-apiserver exited:\n" + self.log("apiserver")[-3000:])
            if self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0:
                return
            time.sleep(0.5)
        raise RuntimeError("kube-apiserver not ready:\n" + self.log("apiserver")[-3000:])

    def kill_apiserver(self) -> None:
        """As a crash: SIGKILL, no goodbye to the watchers."""
        assert self.apiserver is not None
        self.apiserver.kill()
        self.apiserver.wait()

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115 (the child holds it)
        try:
            return subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in (self.apiserver, self.etcd):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def pid(self) -> int:
        assert self.apiserver is not None
        return self.apiserver.pid

    # -- clients ---------------------------------------------------------------
    def kubeconfig_for(self, user: dict[str, str]) -> dict[str, Any]:
        """A kubeconfig (as data) for this API server and `user` (a token, a client cert)."""
        cluster = {"server": self.url, "certificate-authority": str(self.pki / "ca.crt")}
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "t", "cluster": cluster}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
            "current-context": "t",
        }

    def _write_kubeconfig(self, path: Path, user: dict[str, str]) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.kubeconfig_for(user), f)

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        stdin: str | None = None,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        env = os.environ | {
            "KUBECONFIG": str(kubeconfig or self.kubeconfig),
            "KUBECACHEDIR": str(self.dir / "kubecache"),
            "HOME": str(self.dir),
        }
        out = subprocess.run(["kubectl", *args], env=env, input=stdin, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
        return out

    def apply(self, objects: Sequence[dict[str, Any]], *extra: str) -> str:
        listed = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        return self.kubectl("apply", "-f", "-", *extra, stdin=json.dumps(listed)).stdout

    def get(self, *what: str) -> Any:
        return json.loads(self.kubectl("get", *what, "-o", "json").stdout)

    def add_node(self, name: str, labels: dict[str, str]) -> None:
        self.apply(
            [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}]
        )

    def agent_kubeconfig(
        self, node: str, namespace: str = "latencyd", account: str = "latencyd-agent"
    ) -> Path:
        """Credentials as the agent's pod on `node` has them: a token of its ServiceAccount
        bound to a Pod on that node (a Pod object only: nothing runs it)."""
        pod = f"latencyd-agent-{node}"
        self.apply([{
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace},
            "spec": {"nodeName": node, "serviceAccountName": account,
                     "containers": [{"name": "agent", "image": "localhost/latencyd-agent:test"}]},
        }])  # fmt: skip
        bound = ("--bound-object-kind", "Pod", "--bound-object-name", pod)
        token = self.kubectl("create", "token", account, "-n", namespace, "--duration", "2h",
                             *bound).stdout  # fmt: skip
        path = self.dir / f"agent-{node}.kubeconfig"
        self._write_kubeconfig(path, {"token": token.strip()})
        return path
