"""irq:irq_handler_entry counted per CPU by perf, where tracefs is mounted.

tracefs is not mounted on these machines, and the suite must not change the host's
mounts: the check runs in a child with a private mount namespace (unshare -m), which
mounts tracefs for itself and loses it on exit.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("kernel_guard")
REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from latencyd.kernel.system import System
from latencyd.kernel.procstat import parse_interrupts
from latencyd.plugins.irq import IrqPlugin

system = System("/")
plugin = IrqPlugin(system)
rules = plugin.expand(plugin.options_of({}), {}).rules
plugin.on_applied(rules)
before = {i.number: sum(i.counts) for i in plugin.inventory(with_counts=True)[1]}
# Make the disk interrupt: write and fsync a file (virtio-blk completion IRQs).
with open(sys.argv[2], "wb") as f:
    for _ in range(20):
        f.write(os.urandom(65536)); f.flush(); os.fsync(f.fileno())
time.sleep(0.1)
after = {i.number: sum(i.counts) for i in plugin.inventory(with_counts=True)[1]}
status = dict(plugin.monitor(rules).facts)
plugin.close()
print(json.dumps({"status": status, "proc_delta": sum(after[n] - before.get(n, 0) for n in after)}))
"""


def test_handler_counts_per_cpu_with_tracefs(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is needed for a private mount namespace")
    script = f'mount -t tracefs nodev /sys/kernel/tracing && exec {sys.executable} -c "$0" "$@"'
    out = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            CHILD,
            str(REPO),
            str(tmp_path / "io.bin"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    counts = result["status"]["perf_irq_handler_entry_per_cpu_since_apply"]
    assert set(counts) == {"CPU0", "CPU1"}
    total = sum(counts.values())
    assert total > 0
    # perf sees every handler run that /proc/interrupts counted (and the ones after it).
    assert total >= result["proc_delta"] * 0.9


def test_without_tracefs_status_says_why() -> None:
    from latencyd.plugins.irq import IrqPlugin

    from latencyd.kernel.system import System

    if System("/").tracepoint_id("irq", "irq_handler_entry") is not None:
        pytest.skip("tracefs is mounted on this machine")
    plugin = IrqPlugin(System("/"))
    rules = plugin.expand(plugin.options_of({}), {}).rules
    plugin.on_applied(rules)
    facts = plugin.monitor(rules).facts
    assert facts["perf_irq_handler_counts"] == "unavailable: tracefs is not mounted"
    plugin.close()
