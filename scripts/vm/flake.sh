#!/usr/bin/env bash
# The VM tier's emulator flake reproduced, without latencyd (tests/flake.py says how):
#
#   scripts/vm/flake.sh [--rounds 400] [--threads multi] [--qemu /usr/bin/qemu-system-x86_64]
#
# The defaults are the tier's QEMU and threading; `--threads multi` shows the flake, and
# `--qemu` compares another QEMU, such as Debian 12's own. One VM at a time on 2 CPUs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
((EUID == 0)) || {
    echo "vm-flake: run as root (the image cache is root's)" >&2
    exit 1
}
exec .venv/bin/python -m tests.flake "$@"
