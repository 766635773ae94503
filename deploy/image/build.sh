#!/usr/bin/env bash
# Build the agent image's root file system (deploy/image/rootfs.tar, for the Containerfile)
# with Debian's mmdebstrap, and install latencyd into it from this checkout.
#   deploy/image/build.sh          the tree and rootfs.tar
#   deploy/image/build.sh --run    then run `latencyd-agent --help` from it in systemd-nspawn
# Needs root (mmdebstrap's root mode), Debian's apt sources, PyPI; ~3 min, ~250 MB.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
say() { echo "image: $*"; }
command -v mmdebstrap >/dev/null || apt-get install -y -qq --no-install-recommends mmdebstrap </dev/null >/dev/null
WORK=$(mktemp -d /var/tmp/latencyd-image.XXXXXX)
# nspawn leaves its runtime directories on the host's /run: removed after if it made them
LEFT=()
for d in /run/systemd/nspawn /run/systemd/nspawn-root; do [[ -e $d ]] || LEFT+=("$d"); done
trap 'rm -rf "$WORK" "${LEFT[@]}"' EXIT
# no systemd as PID 1 on the build machines: nothing to register with, no unit to move to
NSPAWN=(systemd-nspawn --quiet --register=no --keep-unit --as-pid2)
ROOT=$WORK/root
say "Debian 12 minbase with python3 and python3-dbus (mmdebstrap)"
mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python3-dbus,ca-certificates,libglib2.0-0 \
    bookworm "$ROOT" </dev/null
say "latencyd and its agent's dependencies, as requirements.lock pins them"
"$REPO/.venv/bin/python" -m pip wheel -q --no-deps -w "$WORK/dist" "$REPO" </dev/null
mkdir -p "$ROOT/opt/install"
cp "$WORK"/dist/latencyd-*.whl "$REPO/requirements.lock" "$ROOT/opt/install/"
# dbus-python comes from Debian (python3-dbus: no compiler in the image); the rest from PyPI
grep -E '^(lightkube|lightkube-models|httpx2|httpcore2|anyio|h11|h2|hpack|hyperframe|idna|msgspec|PyYAML|truststore|wsproto|typing_extensions|pyudev|prometheus_client|shtab)==' \
    "$REPO/requirements.lock" > "$ROOT/opt/install/agent.lock"
# fetched here, with this machine's pip and its trust settings; installed without network
# (this machine's Python is 3.11 as Debian 12's: the wheels built or fetched here fit)
PIP_CONSTRAINT="$REPO/requirements.lock" "$REPO/.venv/bin/python" -m pip wheel -q --no-deps \
    -w "$ROOT/opt/install" -r "$ROOT/opt/install/agent.lock" </dev/null
"${NSPAWN[@]}" --private-network -D "$ROOT" /bin/sh -c '
    python3 -m venv --system-site-packages /opt/latencyd &&
    /opt/latencyd/bin/pip install -q --no-index --find-links /opt/install -r /opt/install/agent.lock &&
    /opt/latencyd/bin/pip install -q --no-index --no-deps /opt/install/latencyd-*.whl &&
    rm -rf /opt/install' </dev/null
say "rootfs.tar"
tar -C "$ROOT" --numeric-owner -cf "$HERE/rootfs.tar" .
du -sh "$HERE/rootfs.tar"
if [[ ${1:-} == --run ]]; then
    "${NSPAWN[@]}" -D "$ROOT" /opt/latencyd/bin/latencyd-agent --help </dev/null
fi
