#!/usr/bin/env bash
# Boot the VM tier's machine by hand (tests/qemu.py does the work, as for the tests): a
# fresh copy-on-write overlay of the cached image (make vm-image), ssh on a free port of
# 127.0.0.1, the known emulator flake retried once. Prints the ssh command; Ctrl-C powers
# the VM off and removes the overlay. Only one VM at a time on a 2-CPU machine.
#
#   scripts/vm/boot.sh [--cpus 8 --numa-nodes 2] [--install]
#
# --install puts latencyd in as the tests do (make install + make install-system from HEAD).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
((EUID == 0)) || {
    echo "vm-boot: run as root (the image cache is root's)" >&2
    exit 1
}
exec .venv/bin/python -m tests.qemu "$@"
