#!/usr/bin/env bash
# Development/CI setup for latencyd (run by `make setup`, and by `make check`).
#
# Idempotent and quiet: a re-run with nothing to do prints nothing. Works
# non-interactively (CI=true, no stdin, no terminal) on a fresh Debian 12 machine, as
# root or as any user: only step 1 needs root (or sudo without a password), and only when
# a package is missing; a user is told which, and the rest (the .venv, owned by them)
# needs no root.
#
#   1. Debian packages (only when dpkg-query reports some missing)
#   2. .venv with `pip install -e '.[dev]'`, every version pinned by requirements.lock
#      (only when pyproject.toml, setup.py or requirements.lock changed)
#   3. the perf python bindings, built from Debian's linux-source-6.1 (only when
#      `import perf` fails in the venv). A failed build is a warning, not an error:
#      the daemon falls back to the proc connector and periodic rescans.
#
# Environment: LATENCYD_PYTHON=/path/to/python3.11 overrides the interpreter search;
# LATENCYD_SKIP_PERF=1 skips the perf bindings.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
VENV=$ROOT/.venv
STAMP=$VENV/.setup-stamp
PERF_DIR=$ROOT/.perf-build
LINUX_TARBALL=/usr/src/linux-source-6.1.tar.xz

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_PROGRESS_BAR=off
# Exact versions for everything pip installs, build back-ends included (the variable
# reaches the pip that fills each isolated build environment; -c would not).
export PIP_CONSTRAINT=$ROOT/requirements.lock

say() { printf 'setup: %s\n' "$*"; }
die() {
    printf 'setup: error: %s\n' "$*" >&2
    exit 1
}

# --- 1. Debian packages -------------------------------------------------------------
APT_PACKAGES=(
    # D-Bus: dbus-daemon for the private test bus, dbus-send; headers for dbus-python.
    dbus libdbus-1-dev
    # dbus-python builds from source; its GLib main-loop integration needs GLib headers.
    # (The daemon drives the GLib loop through ctypes: no PyGObject, see latencyd/service/mainloop.py.)
    libglib2.0-dev pkg-config
    # Toolchain for the C extensions and the perf python bindings (perf's build stops
    # without flex and bison; python/perf.so needs no libelf-dev).
    gcc make flex bison xz-utils
    # Kernel source the perf python bindings are built from.
    linux-source-6.1
    # Measurement and test tools.
    rt-tests sockperf stress-ng ethtool iproute2 e2fsprogs util-linux
    # systemd-analyze (unit file lint) and busctl; systemd need not be PID 1.
    systemd
    # systemd-nspawn: the boot test runs the service under a real systemd as PID 1, in a
    # container on the host's own root (tests/e2e/test_boot.py).
    systemd-container
    # man (man-db, with groff) renders the generated man pages in the tests; zsh for the
    # completion tests.
    man-db zsh
    # TuneD: its profiles (/usr/lib/tuned) for import-tuned's tests, and TuneD itself for
    # side-by-side benchmarks only (latencyd never needs it). No systemd as PID 1 here, so
    # installing it starts nothing.
    tuned
    # Prometheus: the metrics test scrapes the daemon with a real server, started by the
    # test on a free port (installing it starts nothing: no systemd as PID 1, and
    # policy-rc.d forbids service starts on these images).
    prometheus
    # update-grub, grub-mkconfig: the bootloader test runs the real ones on a staged root.
    grub-common grub2-common
    # The Debian package (make deb: debian/control's Build-Depends), what checks it, and its
    # run-time dependencies (tests/package runs its commands on Debian's python3 with them).
    debhelper dh-python pybuild-plugin-pyproject python3-all python3-setuptools
    lintian shellcheck python3-dbus python3-pyudev python3-prometheus-client
    # The fleet tests' control plane (scripts/control-plane.sh): its certificates, and
    # apt-get download of etcd-server (extracted, not installed).
    openssl
    # The VM tier (tests/vm): the Debian image built with mmdebstrap, partitioned with
    # sfdisk, GRUB's i386-pc core written into it (scripts/vm/build-image.sh); QEMU runs it
    # (TCG: nested KVM does not run on these guests) over copy-on-write overlays (qemu-img);
    # the tests reach it with ssh and scp.
    mmdebstrap fdisk grub-pc-bin qemu-system-x86 qemu-utils openssh-client
)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    [[ $status == installed ]] || missing+=("$pkg")
done
if ((${#missing[@]})); then
    SUDO=()
    # Any user may set up: what is below needs no root once these packages are there.
    if ((EUID != 0)); then
        sudo -n true 2>/dev/null || die "these Debian packages are missing, and installing them \
needs root: ${missing[*]}
    as root:  apt-get install --no-install-recommends ${missing[*]}
    then, as yourself, make setup (or make check) again: the rest needs no root"
        SUDO=(sudo -n)
    fi
    say "installing Debian packages: ${missing[*]}"
    apt_log=$(mktemp)
    apt_opts=(-o DPkg::Lock::Timeout=300 -o Dpkg::Options::=--force-confdef
        -o Dpkg::Options::=--force-confold)
    if ! { "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update -qq &&
        "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y -qq \
            --no-install-recommends "${missing[@]}"; } </dev/null >"$apt_log" 2>&1; then
        tail -n 30 "$apt_log" >&2
        die "apt-get failed (full log: $apt_log)"
    fi
    rm -f "$apt_log"
fi

# --- 2. Python virtualenv -----------------------------------------------------------
# Prints the real path of a CPython >= 3.11, 3.11 first (resolves pyenv shims).
find_python() {
    local cand exe
    for cand in "${LATENCYD_PYTHON:-}" python3.11 \
        "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.11*/bin/python3.11 /usr/bin/python3.11 python3; do
        [[ -n $cand ]] || continue
        exe=$("$cand" -c 'import sys
if sys.version_info[:2] >= (3, 11):
    print(sys.executable)' 2>/dev/null) || continue
        [[ -n $exe ]] && {
            printf '%s\n' "$exe"
            return 0
        }
    done
    return 1
}

venv_ok() {
    [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1
}

if ! venv_ok; then
    BASE_PYTHON=$(find_python) || die "no Python >= 3.11 found (python3.11 on PATH or pyenv)"
    say "creating .venv with $BASE_PYTHON"
    rm -rf "$VENV"
    "$BASE_PYTHON" -m venv "$VENV"
fi
# The interpreter the venv was made from (its python3.11-config is needed for perf).
BASE_PYTHON=$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')

want_stamp=$({
    cat pyproject.toml setup.py requirements.lock 2>/dev/null
    "$VENV/bin/python" -c 'import sys; print(sys.version)'
} | sha256sum | cut -d' ' -f1)
have_stamp=$(cat "$STAMP" 2>/dev/null || true)

deps_ok() {
    "$VENV/bin/python" -c 'import dbus, dbus.mainloop.glib, pyudev' >/dev/null 2>&1
}

if [[ $want_stamp != "$have_stamp" ]] || ! deps_ok; then
    [[ -w $VENV ]] || die "$VENV is out of date and not yours (owner: $(stat -c %U "$VENV")): \
run make setup as its owner, or check out the repository as yourself"
    say "installing latencyd and its dependencies into .venv (pip install -e '.[dev]')"
    rm -f "$STAMP"
    "$VENV/bin/python" -m pip install -q -e '.[dev]' </dev/null
    if ! err=$("$VENV/bin/python" -c 'import dbus, dbus.mainloop.glib, pyudev' 2>&1); then
        die "dbus-python or pyudev do not import in .venv: $err"
    fi
    printf '%s\n' "$want_stamp" >"$STAMP"
fi

# --- 3. perf python bindings --------------------------------------------------------
perf_ok() { "$VENV/bin/python" -c 'import perf' >/dev/null 2>&1; }

build_perf() {
    local log=$PERF_DIR/build.log src=$PERF_DIR/src out=$PERF_DIR/out
    local py_config site so
    py_config=$(dirname "$BASE_PYTHON")/python3.11-config
    [[ -x $py_config ]] || py_config=$(command -v python3.11-config) || {
        echo "no python3.11-config next to $BASE_PYTHON"
        return 1
    }
    [[ -r $LINUX_TARBALL ]] || {
        echo "$LINUX_TARBALL missing (package linux-source-6.1)"
        return 1
    }
    mkdir -p "$src" "$out"
    # Extract only what tools/perf needs; re-extract when the tarball changes.
    if [[ ! -f $src/.extracted || $LINUX_TARBALL -nt $src/.extracted ]]; then
        rm -rf "$src" && mkdir -p "$src"
        local top
        top=$(tar -tf "$LINUX_TARBALL" 2>/dev/null | head -n1 | cut -d/ -f1) || true
        [[ -n $top ]] || {
            echo "cannot list $LINUX_TARBALL"
            return 1
        }
        tar -xJf "$LINUX_TARBALL" -C "$src" --strip-components=1 "$top/Makefile" \
            "$top/tools/perf" "$top/tools/lib" "$top/tools/include" "$top/tools/build" \
            "$top/tools/scripts" "$top/tools/arch" >"$log" 2>&1 || {
            echo "extracting $LINUX_TARBALL failed (see $log)"
            return 1
        }
        touch "$src/.extracted"
    fi
    rm -f "$out"/python/perf*.so
    if ! make -C "$src/tools/perf" -j"$(nproc)" O="$out" \
        PYTHON="$VENV/bin/python" PYTHON_CONFIG="$py_config" \
        NO_LIBPERL=1 NO_LIBBPF=1 NO_JEVENTS=1 python/perf.so </dev/null >>"$log" 2>&1; then
        echo "make python/perf.so failed (see $log)"
        return 1
    fi
    so=$(find "$out/python" -maxdepth 1 -name 'perf*.so' -print -quit)
    [[ -n $so ]] || {
        echo "build produced no perf*.so (see $log)"
        return 1
    }
    site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("platlib"))')
    cp "$so" "$site/"
    perf_ok || {
        echo "perf.so built but 'import perf' fails"
        return 1
    }
}

# A failed build is not retried on every run (it costs ~30 s) until the kernel source
# or this script changes, or .perf-build/failed is removed.
PERF_FAILED=$PERF_DIR/failed
if [[ ${LATENCYD_SKIP_PERF:-} != 1 ]] && ! perf_ok; then
    if [[ -f $PERF_FAILED && ! $LINUX_TARBALL -nt $PERF_FAILED &&
        ! $ROOT/scripts/setup.sh -nt $PERF_FAILED ]]; then
        say "warning: no perf python bindings ($(head -c 200 "$PERF_FAILED")); rm $PERF_FAILED to retry"
    else
        say "building the perf python bindings from $LINUX_TARBALL (log: .perf-build/build.log)"
        start=$SECONDS
        if msg=$(build_perf 2>&1); then
            rm -f "$PERF_FAILED"
            say "perf python bindings installed into .venv ($((SECONDS - start)) s)"
        else
            mkdir -p "$PERF_DIR"
            printf '%s\n' "${msg//$'\n'/; }" >"$PERF_FAILED"
            say "warning: perf python bindings not built (${msg//$'\n'/; }); latencyd falls back to the proc connector"
        fi
    fi
fi

# --- 4. bytecode ----------------------------------------------------------------------
# PYTHONDONTWRITEBYTECODE may be set (it is on these machines): compile the project's
# own modules explicitly so latencyd and latencyctl do not recompile them on every start.
# Not in a tree another user owns (root's checkout, run by `make check` as another user):
# its modules run as they are.
if [[ -w latencyd && -w plugins ]]; then
    "$VENV/bin/python" -m compileall -q -j0 latencyd plugins >/dev/null
fi
