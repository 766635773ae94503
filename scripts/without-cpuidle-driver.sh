#!/bin/bash
# Run a command as on a guest without a cpuidle driver, from a machine with one, to check
# the suite's expectations for that kind (`make test` runs the tests marked machine_kind
# this way). In a private mount namespace current_driver reads "none", the governor
# "menu", and no cpuN/cpuidle exists (each cpuN is a tmpfs with binds of its other entries),
# which is all latencyd reads to tell the kinds apart. What it does not change: PM QoS
# still acts on the real CPUs (so no latency measured under it stands for that kind), and a
# container booted by systemd-nspawn mounts sysfs afresh and sees the real driver.
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
k=$(mktemp -d /tmp/latencyd-without-cpuidle-XXXXXX)  # the mounts' sources; gone afterwards
trap 'rm -rf "$k"' EXIT
K=$k unshare --mount --propagation private bash -c '
set -euo pipefail
cpu=/sys/devices/system/cpu k=$K
echo none >"$k/current_driver"
echo menu >"$k/current_governor"
mount --bind "$k/current_driver" "$cpu/cpuidle/current_driver"
for f in current_governor current_governor_ro; do
    [ -e "$cpu/cpuidle/$f" ] && mount --bind "$k/current_governor" "$cpu/cpuidle/$f"
done
for c in "$cpu"/cpu[0-9]*; do
    real=$k/real/${c##*/}
    mkdir -p "$real" && mount --bind "$c" "$real" && mount -t tmpfs -o mode=755 none "$c"
    for e in "$real"/*; do
        n=${e##*/}
        if [ "$n" = cpuidle ]; then continue
        elif [ -L "$e" ]; then ln -s "$(readlink "$e")" "$c/$n"
        elif [ -d "$e" ]; then mkdir "$c/$n" && mount --bind "$e" "$c/$n"
        else touch "$c/$n" && mount --bind "$e" "$c/$n"
        fi
    done
done
"$@"' bash "$@"
