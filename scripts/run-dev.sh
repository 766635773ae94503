#!/usr/bin/env bash
# Run latencyd in the foreground on a private system-like D-Bus (`make run`).
#
# The real system bus is never used. The bus address is printed and written to
# /run/latencyd-dev/bus-address, so a second terminal can do:
#     export DBUS_SYSTEM_BUS_ADDRESS=$(cat /run/latencyd-dev/bus-address)
#     .venv/bin/latencyctl status
#
# Ctrl-C or SIGTERM is forwarded to latencyd (which restores every original value);
# once it has exited, the bus is stopped. The journal lives in the stable
# /run/latencyd-dev/state, so after a crash the next run restores from it.
#
# The directory (LATENCYD_DEV_DIR to choose another) is root's alone: a root daemon's
# lock, bus address and journal in a directory another user could change would let them
# plant a symlink (lock -> /etc/shadow) or a journal whose "originals" a restore writes.
# One that exists as anything else (a symlink, another owner, a looser mode, a directory
# above it others may write to) is refused, never repaired.
#
# Extra arguments go to latencyd. LATENCYD=/path/to/cmd runs another command in
# its place (e.g. to try this script before the daemon exists).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PYTHON=$ROOT/.venv/bin/python
LATENCYD=${LATENCYD:-$ROOT/.venv/bin/latencyd}
DEV_DIR=${LATENCYD_DEV_DIR:-/run/latencyd-dev}
ADDRESS_FILE=$DEV_DIR/bus-address

[[ -x $PYTHON ]] || {
    echo "run-dev: $PYTHON missing: run 'make setup' first" >&2
    exit 1
}

umask 077
"$PYTHON" -m scripts.private_dir "$DEV_DIR" || {
    echo "run-dev: not started" >&2
    exit 1
}

# One dev daemon at a time: both would tune the same machine.
exec 9>"$DEV_DIR/lock"
flock -n 9 || {
    echo "run-dev: another run-dev.sh is running (lock $DEV_DIR/lock)" >&2
    exit 1
}

# Job control puts each background child in its own process group: a Ctrl-C then
# reaches only this script, which forwards it to latencyd and stops the bus only
# after latencyd has restored everything. (It also keeps the children's SIGINT at
# its default instead of ignored, as it would be for `&` without job control.)
set -m

bus_pid=
daemon_pid=
trap 'exit 130' INT
trap 'exit 143' TERM HUP
bus_out=$(mktemp "$DEV_DIR/bus-out.XXXXXX")

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    trap - INT TERM HUP
    [[ -z ${status_pid:-} ]] || kill "$status_pid" 2>/dev/null || true
    if [[ -n $daemon_pid ]] && kill -0 "$daemon_pid" 2>/dev/null; then
        kill -TERM "$daemon_pid" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    if [[ -n $bus_pid ]] && kill -0 "$bus_pid" 2>/dev/null; then
        kill -TERM "$bus_pid" 2>/dev/null || true
        wait "$bus_pid" 2>/dev/null || true
    fi
    rm -f "$ADDRESS_FILE" "$bus_out"
}
trap cleanup EXIT

"$PYTHON" "$ROOT/scripts/private_bus.py" --policy "$ROOT/systemd/org.latencyd.Daemon1.conf" \
    </dev/null >"$bus_out" &
bus_pid=$!

address=
for _ in $(seq 100); do
    line=$(head -n1 "$bus_out")
    if [[ $line == DBUS_SYSTEM_BUS_ADDRESS=* ]]; then
        address=${line#DBUS_SYSTEM_BUS_ADDRESS=}
        break
    fi
    kill -0 "$bus_pid" 2>/dev/null || break
    sleep 0.1
done
[[ -n $address ]] || {
    echo "run-dev: the private bus did not start" >&2
    exit 1
}
printf '%s\n' "$address" >"$ADDRESS_FILE"
export DBUS_SYSTEM_BUS_ADDRESS=$address

cat <<EOF
latencyd dev run, on a private system bus (the real one is untouched):
    DBUS_SYSTEM_BUS_ADDRESS=$address
In a second terminal:
    export DBUS_SYSTEM_BUS_ADDRESS=\$(cat $ADDRESS_FILE)
    $ROOT/.venv/bin/latencyctl status
Ctrl-C stops latencyd (it restores everything first), then the bus.

EOF

"$LATENCYD" --state-dir "$DEV_DIR/state" --keep-dir "$DEV_DIR/keep" --profile-dir "$ROOT/profiles" "$@" </dev/null &
daemon_pid=$!

# Once latencyd answers on the bus (its profile is applied by then), show its status.
(
    exec 9>&- # the dev-run lock belongs to this script alone
    trap - INT TERM HUP EXIT
    for _ in $(seq 200); do
        kill -0 "$daemon_pid" 2>/dev/null || break
        if "$ROOT/.venv/bin/latencyctl" active >/dev/null 2>&1; then
            printf '\n== latencyctl status ==\n'
            "$ROOT/.venv/bin/latencyctl" status || true
            printf '\n'
            break
        fi
        sleep 0.05
    done
) </dev/null &
status_pid=$!

# A hang-up (terminal closed) stops the daemon too: latencyd's SIGHUP means reload.
got_signal=0
trap 'got_signal=1; kill -INT "$daemon_pid" 2>/dev/null || true' INT
trap 'got_signal=1; kill -TERM "$daemon_pid" 2>/dev/null || true' TERM HUP

# `wait` also returns (>128) when a trapped signal arrives: wait on until latencyd
# has really exited, and exit with its status.
status=
while [[ -z $status ]]; do
    got_signal=0
    wait "$daemon_pid" && rc=0 || rc=$?
    if ((!got_signal)); then
        status=$rc
    elif ! kill -0 "$daemon_pid" 2>/dev/null; then # it exited around the signal
        wait "$daemon_pid" 2>/dev/null && status=0 || status=$?
        ((status != 127)) || status=$rc
    fi
done
daemon_pid=
exit "$status"
