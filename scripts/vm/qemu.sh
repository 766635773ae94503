#!/usr/bin/env bash
# The emulator the VM tier runs its guests in: QEMU 10.0 from Debian's bookworm-backports,
# pinned, extracted into the VM cache (not installed: the machine's own qemu-system-x86
# stays as apt left it), with the SeaBIOS it was built against.
#
# Why not Debian 12's QEMU 7.2: speed. The tier runs TCG single-threaded (tests/qemu.py's
# TCG_THREADS says why), and so 10.0 booted the tier's machine in 33 s against 7.2's 40 s,
# and ran tests/flake.py's 400 rounds in 78-81 s against 170-190 s (2026-11-30).
#
# Out: $CACHE/qemu -> qemu-<version>/, in which
#   root/                 the packages' files (dpkg-deb -x)
#   qemu-system-x86_64    runs root's binary with root's modules and firmware, and the
#                         machine's iPXE ROMs (ipxe-qemu, which the apt QEMU brings)
# apt checks what it fetches against Debian's signed Release file (the archive keyring), as
# it does for any install. Backports keep only their newest upload: when the pinned one is
# no longer served, this says so loudly and $CACHE/qemu -> qemu-debian/, whose wrapper runs
# the machine's own QEMU (slower, as correct), until the pin moves.
set -euo pipefail
CACHE=${LATENCYD_VM_CACHE:-/var/cache/latencyd-test/vm}
[[ $CACHE != *\'* ]] || { echo "vm-qemu: a quote in $CACHE: not used" >&2; exit 1; }
QEMU_VERSION=1:10.0.2+ds-2+deb13u1~bpo12+1
SEABIOS_VERSION=1.16.3-2~bpo12+1
PACKAGES=(
    "qemu-system-x86=$QEMU_VERSION" "qemu-system-common=$QEMU_VERSION"
    "qemu-system-data=$QEMU_VERSION" "seabios=$SEABIOS_VERSION"
)
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
say() { echo "vm-qemu: $*"; }
die() {
    echo "vm-qemu: $*" >&2
    exit 1
}

((EUID == 0)) || die "run as root (the VM cache is root's)"
[[ -s $KEYRING ]] || die "no $KEYRING (apt-get install debian-archive-keyring)"
mkdir -p "$CACHE"
[[ $(stat -c %u "$CACHE") == 0 ]] || die "$CACHE belongs to another user: not used"
chmod 700 "$CACHE"

version=${QEMU_VERSION#*:}
dir=$CACHE/qemu-$version
if [[ -x $dir/qemu-system-x86_64 ]]; then
    ln -sfn "$(basename "$dir")" "$CACHE/qemu"
    say "ready: $dir"
    exit 0
fi

say "fetching QEMU $version from bookworm-backports (extracted, not installed)"
work=$(mktemp -d "$CACHE/qemu-fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
cat >"$work/backports.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: $KEYRING
EOF
# Only this source, in lists and caches of its own: the machine's apt state is not touched.
apt_private=(
    -o "Dir::Etc::SourceList=$work/backports.sources" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache"
    -o APT::Sandbox::User=root -q
)
# The machine's own QEMU, when the pinned one cannot be had: the tier runs, slower.
fall_back() {
    echo "vm-qemu: WARNING: $*
vm-qemu: the tier runs on this machine's own QEMU (slower); move the pin in $0" >&2
    mkdir -p "$CACHE/qemu-debian"
    printf '#!/bin/sh\nexec /usr/bin/qemu-system-x86_64 "$@"\n' >"$CACHE/qemu-debian/qemu-system-x86_64"
    chmod 755 "$CACHE/qemu-debian/qemu-system-x86_64"
    ln -sfn qemu-debian "$CACHE/qemu"
    exit 0
}
apt-get "${apt_private[@]}" update >"$work/update.log" 2>&1 </dev/null ||
    fall_back "apt-get update of bookworm-backports failed: $(tail -3 "$work/update.log")"
if ! (cd "$work/debs" && apt-get "${apt_private[@]}" download "${PACKAGES[@]}") \
    >"$work/download.log" 2>&1 </dev/null; then
    fall_back "the pinned packages are not served (any more?):
$(grep -E '^E:' "$work/download.log")
    pinned: ${PACKAGES[*]}; what bookworm-backports has now:
$(apt-cache "${apt_private[@]}" policy qemu-system-x86 seabios 2>&1 | grep -E '^\S|Candidate')"
fi

rm -rf "$dir" "$dir.new" && mkdir -p "$dir.new/root"
for deb in "$work"/debs/*.deb; do
    dpkg-deb -x "$deb" "$dir.new/root"
done
binary=$dir/root/usr/bin/qemu-system-x86_64
missing=$(ldd "$dir.new/root/usr/bin/qemu-system-x86_64" | grep 'not found' || true)
if [[ -n $missing ]]; then
    rm -rf "$dir.new"
    fall_back "QEMU $version needs libraries this machine lacks:
$missing"
fi
# The wrapper: exec keeps the pid, so the tests' Popen is QEMU itself. QEMU looks for its
# modules and firmware where the package would be installed; both are pointed at root.
cat >"$dir.new/qemu-system-x86_64" <<EOF
#!/bin/sh
export QEMU_MODULE_DIR='$dir/root/usr/lib/x86_64-linux-gnu/qemu'
exec '$binary' -L '$dir/root/usr/share/qemu' -L '$dir/root/usr/share/seabios' \\
    -L /usr/lib/ipxe/qemu "\$@"
EOF
chmod 755 "$dir.new/qemu-system-x86_64"
mv "$dir.new" "$dir"
"$dir/qemu-system-x86_64" --version | head -1 | grep -qF "${version%%+*}" ||
    die "$dir/qemu-system-x86_64 --version: $("$dir/qemu-system-x86_64" --version | head -1)"
ln -sfn "$(basename "$dir")" "$CACHE/qemu"
say "ready: $dir ($("$dir/qemu-system-x86_64" --version | head -1))"
