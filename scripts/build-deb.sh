#!/usr/bin/env bash
# `make deb`: the Debian package, built with Debian's own tools (dpkg-buildpackage, debhelper,
# pybuild; debian/), from a copy of the work tree (its tracked and new files, as `git status`
# sees them) under build/deb/, so nothing is written beside the repository. What it makes
# lands in build/: build/latencyd_VERSION_all.deb, beside the source package (.dsc,
# .tar.xz) and the .changes and .buildinfo (`lintian build/latencyd_*.changes` checks all).
# A previous build's files there are removed first.
#
#   DEB_VERSION=0.1.1   build that version instead of debian/changelog's (a changelog entry
#                       is added to the copy): a higher version to test an upgrade with.
#   DEB_OUT=DIR         put it all in DIR instead of build/ (tests/package/test_deb.py).
#
# The build dependencies (debian/control's Build-Depends) are Debian packages that
# `make setup` installs; dpkg-checkbuilddeps names any missing.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT=${DEB_OUT:-$ROOT/build}
WORK=$OUT/deb
say() { printf 'deb: %s\n' "$*"; }

version=${DEB_VERSION:-$(dpkg-parsechangelog -l debian/changelog -S Version)}
[[ $version =~ ^[0-9][A-Za-z0-9.+~]*$ ]] ||
    { echo "deb: DEB_VERSION=$version is not a native package's version (like 0.1.1)" >&2; exit 2; }
src=$WORK/latencyd-$version
rm -rf "$WORK"
mkdir -p "$src"
# The tree as git sees it (no .venv, build/ or caches): tracked files that exist, and new
# ones not ignored.
git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [[ -e $f || -L $f ]] && printf '%s\0' "$f"; done |
    tar --null -T - -cf - | tar -xf - -C "$src"

# The completion scripts, by the shtab requirements.lock pins (Debian 12's 1.5.5 writes
# broken ones: latencyd/tools/manpages.py SHTAB_MIN); debian/rules hands them to the build.
[[ -x $ROOT/.venv/bin/python ]] || { echo "deb: no .venv: run make setup first" >&2; exit 1; }
"$ROOT/.venv/bin/python" - "$src/debian/completions" <<'PY'
import sys
from pathlib import Path

from latencyd.tools.manpages import SCRIPTS, completion

for rel, shell in SCRIPTS.items():
    path = Path(sys.argv[1], rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(completion(shell))
PY

if [[ -n ${DEB_VERSION:-} ]]; then
    maintainer=$(sed -n 's/^Maintainer: //p' debian/control)
    {
        printf 'latencyd (%s) unstable; urgency=medium\n\n' "$version"
        printf '  * Built by make deb DEB_VERSION=%s.\n\n' "$version"
        printf ' -- %s  %s\n\n' "$maintainer" "$(date -R)"
        cat debian/changelog
    } >"$src/debian/changelog"
fi

say "dpkg-buildpackage -us -uc in $src"
start=$SECONDS
# Debian's python3 builds it, not one earlier on PATH (pyenv's shims, a venv's).
(cd "$src" && env PATH=/usr/sbin:/usr/bin:/sbin:/bin dpkg-buildpackage -us -uc) \
    >"$WORK/build.log" 2>&1 || {
    tail -n 40 "$WORK/build.log" >&2
    echo "deb: dpkg-buildpackage failed (full log: $WORK/build.log)" >&2
    exit 1
}
rm -f "$OUT"/latencyd_*
mv "$WORK"/latencyd_"$version"[._]* "$OUT/"
say "built $OUT/latencyd_${version}_all.deb in $((SECONDS - start)) s (log: $WORK/build.log)"
