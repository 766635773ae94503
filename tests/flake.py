"""The VM tier's emulator flake, reproduced: a guest kernel dying of `Oops: int3` while it
patches its own code (tests/qemu.py's docstring). Boot the tier's machine (4 vCPUs), keep
three of its vCPUs busy, and flip kernel.sched_schedstats, a static key with call sites in
the scheduler's hot paths, on and off ROUNDS times. Each flip rewrites those call sites
while the busy vCPUs run through them. No latencyd is involved.

    .venv/bin/python -m tests.flake [--rounds 400] [--threads multi] [--qemu PATH]

as root (the VM cache is root's), one VM at a time on a 2-CPU machine. The defaults are
the tier's: QEMU and TCG_THREADS. Prints the rounds done, the time they took and the
oops line if the guest died of one (exit 1 then). On 2026-11-30 (docs/measurements.md),
400 rounds multi-threaded: the guest died in 2 of 2 runs under Debian 12's QEMU 7.2, 3 of
3 under 10.0 (bookworm-backports), 1 of 2 with `-cpu qemu64`; single-threaded, in 0 of
4, but see TCG_THREADS for what that costs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tests.qemu import QEMU, TCG_THREADS, Shape, Vm, flake_in

BUSY_LOOPS = "for i in 1 2 3; do { nohup sh -c 'while :; do :; done' >/dev/null 2>&1 & }; done"
FLIP = "sysctl -qw kernel.sched_schedstats=1; sysctl -qw kernel.sched_schedstats=0"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--threads", choices=["single", "multi"], default=TCG_THREADS)
    parser.add_argument("--qemu", type=Path, default=QEMU, help=f"default: {QEMU}")
    args = parser.parse_args()
    started = time.monotonic()
    vm = Vm(Shape(cpus=4), emulator=args.qemu, threads=args.threads).boot()
    try:
        up = time.monotonic() - started
        vm.ssh(BUSY_LOOPS)
        started = time.monotonic()
        flips = f"for i in $(seq {args.rounds}); do {FLIP}; done; echo done"
        ran = vm.ssh(flips, check=False, lost_ok=True, timeout=1800)
        took = time.monotonic() - started
        oops = flake_in(vm.serial.read_text(errors="replace"))
        rounds = args.rounds if ran.stdout.strip() == "done" else "not all"
        print(f"{args.qemu} ({args.threads}-threaded): up in {up:.0f} s; {rounds} rounds in "
              f"{took:.0f} s; oops: {oops or 'none'}")  # fmt: skip
        return 1 if oops else 0
    finally:
        vm.stop()


if __name__ == "__main__":
    sys.exit(main())
