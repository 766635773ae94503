"""vm_ticks benchmark: the tick on an isolated CPU that runs a busy loop, booted without and
with `nohz_full` (issue 51), in the VM tier's Debian VM (tests/qemu.py: Debian's kernel
6.12, built with NO_HZ_FULL, which the development machines' kernel is not).

One VM, one loop (`sh -c 'while :; do :; done'` pinned to CPU 3 with taskset), two boots:
first as the image boots, then with `nohz_full=2-3` added to GRUB's kernel line (nothing
else: `nohz_full` implies `rcu_nocbs` for those CPUs). For each boot, over `--seconds` of
the guest's clock, the per-second rate of /proc/interrupts' lines:

- LOC, local timer interrupts (the tick, and any hrtimer that fires);
- RES, rescheduling IPIs, and CAL, function-call IPIs;

on CPU 3 (the loop's), CPU 2 (idle, the other nohz_full CPU) and CPU 0 (housekeeping).
QEMU emulates the guest with TCG, so durations inside mean nothing: counts only, never
microseconds (docs/measurements.md).

    /work/wt/vm-slot .venv/bin/python -m bench.vm_ticks [--seconds 30] [--json]

`python -m bench` runs it with the others only where the VM image is built (`make
vm-image`), and otherwise says it skipped it: it boots a VM, a few minutes (on the
development machines under the VM slot). Benchmarks print, never judge.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

from bench import arguments, not_root
from tests.qemu import NotBuilt, Shape, Vm

BUSY_CPU, IDLE_CPU, HOUSEKEEPING_CPU = 3, 2, 0
NOHZ_FULL = "2-3"
LINES = ("LOC", "RES", "CAL")
# The loop, started in the guest; its pid on stdout.
START_LOOP = f"nohup taskset -c {BUSY_CPU} sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!"
SAMPLE = "cat /proc/uptime; cat /proc/interrupts"


@dataclass(frozen=True)
class Rates:
    """Per-second rates of LOC, RES and CAL on each CPU looked at, over `seconds`."""

    boot: str  # "without nohz_full" or "nohz_full=2-3"
    cmdline: str
    nohz_full: str  # what /sys/devices/system/cpu/nohz_full read
    seconds: float
    per_second: dict[str, dict[int, float]]  # line -> CPU -> count per second


def counts(sample: str) -> tuple[float, dict[str, list[int]]]:
    """The guest's uptime and each /proc/interrupts line's per-CPU counts, from SAMPLE's output."""
    lines = sample.splitlines()
    uptime = float(lines[0].split()[0])
    ncpus = len(lines[1].split())  # the header: CPU0 CPU1 ...
    found: dict[str, list[int]] = {}
    for line in lines[2:]:
        name, _, rest = line.partition(":")
        if name.strip() in LINES:
            found[name.strip()] = [int(v) for v in rest.split()[:ncpus]]
    return uptime, found


def rates(before: str, after: str) -> tuple[float, dict[str, dict[int, float]]]:
    t0, c0 = counts(before)
    t1, c1 = counts(after)
    seconds = t1 - t0
    cpus = (BUSY_CPU, IDLE_CPU, HOUSEKEEPING_CPU)
    return seconds, {
        line: {cpu: round((c1[line][cpu] - c0[line][cpu]) / seconds, 1) for cpu in cpus}
        for line in LINES
    }


def measure(vm: Vm, boot: str, seconds: float) -> Rates:
    pid = vm.ssh(START_LOOP).stdout.strip()
    try:
        vm.ssh("sleep 3")  # the loop settled on its CPU, the tick stopped if it will
        before = vm.ssh(SAMPLE).stdout
        vm.ssh(f"sleep {seconds}")
        after = vm.ssh(SAMPLE).stdout
    finally:
        vm.ssh(f"kill {pid}", check=False)
    span, per_second = rates(before, after)
    return Rates(
        boot=boot,
        cmdline=vm.ssh("cat /proc/cmdline").stdout.strip(),
        nohz_full=vm.ssh("cat /sys/devices/system/cpu/nohz_full").stdout.strip(),
        seconds=round(span, 1),
        per_second=per_second,
    )


def main(argv: list[str]) -> int:
    parser = arguments("vm_ticks", __doc__, "10 s a boot instead of --seconds")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    if not_root("vm_ticks", "the VM image cache is root's"):
        return 1
    seconds = 10.0 if args.quick else args.seconds
    try:
        vm = Vm(Shape(cpus=4))
    except NotBuilt as exc:
        print(f"bench vm_ticks: {exc}", file=sys.stderr)
        return 1
    results: list[Rates] = []
    try:
        vm.boot()
        results.append(measure(vm, "without nohz_full", seconds))
        # GRUB's kernel lines as the image has them (no update-grub has run on this overlay)
        vm.ssh(f"sed -i -E 's/^(\\s*linux\\s.*)$/\\1 nohz_full={NOHZ_FULL}/' /boot/grub/grub.cfg")
        vm.reboot()
        results.append(measure(vm, f"nohz_full={NOHZ_FULL}", seconds))
    finally:
        vm.stop()
    if args.json:
        print(json.dumps({"benchmark": "vm_ticks", "boots": [asdict(r) for r in results]}))
        return 0
    print(f"vm_ticks: {vm.shape.cpus} vCPUs under TCG; busy loop on CPU {BUSY_CPU}; "
          f"counts per second of the guest's clock")  # fmt: skip
    for r in results:
        print(f"\n{r.boot}: nohz_full reads {r.nohz_full!r} ({r.seconds} s)")
        print(f"  /proc/cmdline: {r.cmdline}")
        for line in LINES:
            cells = ", ".join(f"CPU {cpu} {rate}" for cpu, rate in r.per_second[line].items())
            print(f"  {line}/s: {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
