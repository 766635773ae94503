#!/bin/sh
# What an isolated cpuset partition changes on its CPUs, in counts (never microseconds: the
# VM tier runs under TCG). In a VM of the tier (systemd 252, cgroup v2), as root:
#   scripts/vm/ssh PORT sh -s [SECONDS] < scripts/vm/partition-counts.sh
# The shield as latencyd's cpuset-systemd mechanism makes it, by hand (latencyd itself left
# on a profile without a shield): init.scope, system.slice, user.slice AllowedCPUs=0-1,
# a slice with AllowedCPUs=2-3 running three busy loops (one more than its CPUs, so a
# balancer has something to even out) and one busy loop in system.slice. The same slice is
# measured as a `member` cpuset, then as an `isolated` partition: over SECONDS each, the
# loops' migrations (/proc/PID/sched se.nr_migrations), and on CPUs 2 and 3 the
# rescheduling and function-call IPIs and local timer interrupts (/proc/interrupts), and
# the load-balancing passes of their scheduler domains (/proc/schedstat).
set -eu
seconds=${1:-30}
slice=benchpart.slice  # no dash: a dash nests a slice in another
cg=/sys/fs/cgroup/$slice

schedstats=$(cat /proc/sys/kernel/sched_schedstats)
cleanup() {
    echo "$schedstats" > /proc/sys/kernel/sched_schedstats
    systemctl stop 'bench-partition-loop-*.service' bench-partition-hk.service 2>/dev/null || true
    [ -e "$cg/cpuset.cpus.partition" ] && echo member > "$cg/cpuset.cpus.partition" || true
    for u in init.scope system.slice user.slice "$slice"; do
        systemctl set-property --runtime "$u" AllowedCPUs= 2>/dev/null || true
    done
    systemctl stop "$slice" 2>/dev/null || true
    rm -rf "/run/systemd/system.control/$slice.d" && systemctl daemon-reload
    rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT

echo 1 > /proc/sys/kernel/sched_schedstats # the balancing counts, for this run only
for u in init.scope system.slice user.slice; do
    systemctl set-property --runtime "$u" AllowedCPUs=0-1
done
systemctl set-property --runtime "$slice" AllowedCPUs=2-3
for i in 1 2 3; do
    systemd-run --quiet --unit="bench-partition-loop-$i" --slice="$slice" sh -c 'while :; do :; done'
done
systemd-run --quiet --unit=bench-partition-hk sh -c 'while :; do :; done'

irq() { # $1: the /proc/interrupts row (RES, CAL, LOC); $2: the CPU's column
    awk -v row="$1:" -v col="$2" '$1 == row {print $(col + 2)}' /proc/interrupts
}
migrations() {
    n=0
    for i in 1 2 3; do
        pid=$(systemctl show -P MainPID "bench-partition-loop-$i")
        m=$(awk '/^se.nr_migrations/ {print $3}' "/proc/$pid/sched")
        n=$((n + m))
    done
    echo "$n"
}
balancing() { # load-balance passes (lb_count, each of 3 idle types) of CPU $1's domains:
    # 8 fields per type up to schedstat version 15, 11 from 16 (lb_imbalance split in 4)
    awk -v cpu="cpu$1" '/^version/ {w = $2 >= 16 ? 11 : 8}
        /^cpu/ {c = $1} /^domain/ && c == cpu {n += $3 + $(3 + w) + $(3 + 2 * w)}
        END {print n + 0}' /proc/schedstat
}
snapshot() {
    echo "$(migrations) $(irq RES 2) $(irq CAL 2) $(irq LOC 2) $(irq RES 3) $(irq CAL 3) $(irq LOC 3) $(balancing 2) $(balancing 3)"
}
measure() { # $1: member or isolated
    echo "$1" > "$cg/cpuset.cpus.partition"
    state=$(cat "$cg/cpuset.cpus.partition")
    sleep 2
    set -- "$state" $(snapshot)
    sleep "$seconds"
    set -- "$@" $(snapshot)
    echo "$1 | $((${11} - $2)) | $((${12} - $3)) / $((${15} - $6)) | $((${13} - $4)) / $((${16} - $7)) | $((${14} - $5)) / $((${17} - $8)) | $((${18} - $9)) / $((${19} - ${10}))"
}

echo "$(uname -r), $(nproc --all) CPUs, cpuidle $(cat /sys/devices/system/cpu/cpuidle/current_driver), ${seconds} s each"
echo "partition | loops' migrations | RES IPIs CPU 2 / 3 | CAL IPIs CPU 2 / 3 | LOC CPU 2 / 3 | balancing passes CPU 2 / 3"
measure member
measure isolated
measure member
measure isolated
