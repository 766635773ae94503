#!/usr/bin/env bash
# The Kubernetes control plane the fleet tests run against, built once per machine and
# kept in a cache: kube-apiserver v1.37.2 built from the Go module proxy (the module in
# tests/k8s/apiserver pins every version) and Debian's etcd 3.4, extracted from its .deb
# (fetched, never installed: no maintainer scripts, no system service).
# First run ~12 min (2 cores) and ~3.5 GB of Go caches; then seconds.
# Cache: $LATENCYD_K8S_CACHE, default /var/cache/latencyd-test/k8s (root's, 0700).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${LATENCYD_K8S_CACHE:-/var/cache/latencyd-test/k8s}
K8S_VERSION=v1.37.2
say() { echo "control-plane: $*"; }
die() { echo "control-plane: $*" >&2; exit 1; }

mkdir -p "$CACHE"
[ "$(stat -c %u "$CACHE")" = "$(id -u)" ] || die "$CACHE belongs to another user: not used"
chmod 700 "$(dirname "$CACHE")" "$CACHE" 2>/dev/null || true

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[ -x "$GO" ] || die "no Go toolchain (go on PATH or /usr/local/go/bin/go): kube-apiserver is built from source"
export GOPATH=$CACHE/gopath GOMODCACHE=$CACHE/gomodcache GOCACHE=$CACHE/gocache GOFLAGS=-buildvcs=false

stamp=$(cat "$REPO"/tests/k8s/apiserver/go.mod "$REPO"/tests/k8s/apiserver/go.sum | sha256sum | cut -c1-16)
bin=$CACHE/bin/kube-apiserver-$stamp
if [ ! -x "$bin" ]; then
    say "building kube-apiserver $K8S_VERSION (first time on this machine: ~12 min)"
    mkdir -p "$CACHE/src" "$CACHE/bin"
    cp "$REPO"/tests/k8s/apiserver/{go.mod,go.sum,tools.go} "$CACHE/src/"
    V=k8s.io/component-base/version
    LDF="-s -w -X $V.gitVersion=$K8S_VERSION -X $V.gitMajor=1 -X $V.gitMinor=37 -X $V.gitTreeState=clean"
    (cd "$CACHE/src" && CGO_ENABLED=0 nice -n 10 "$GO" build -trimpath -ldflags "$LDF" \
        -o "$bin.new" k8s.io/kubernetes/cmd/kube-apiserver) </dev/null
    mv "$bin.new" "$bin"
fi
ln -sfn "$(basename "$bin")" "$CACHE/bin/kube-apiserver"

etcd=$CACHE/etcd34/usr/bin/etcd
if [ ! -x "$etcd" ]; then
    say "fetching Debian's etcd-server (extracted, not installed)"
    tmp=$(mktemp -d) && chmod 755 "$tmp"  # apt downloads as _apt
    (cd "$tmp" && apt-get download -q etcd-server >/dev/null) </dev/null
    rm -rf "$CACHE/etcd34" && dpkg-deb -x "$tmp"/etcd-server_*.deb "$CACHE/etcd34"
    rm -rf "$tmp"
fi
command -v kubectl >/dev/null || say "note: no kubectl on PATH (the manifests' dry-run test needs it)"
say "ready: $CACHE/bin/kube-apiserver, $etcd"
