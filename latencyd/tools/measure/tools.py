"""The latency tools a run measures with: what each needs installed, how it is run on
the measured CPUs, and how its output is read into a histogram."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from latencyd.tools.latency import Histogram
from latencyd.tools.measure.network import SERVER_IP, Network
from latencyd.tools.measure.plan import Plan
from latencyd.tools.measure.processes import Processes

TOOLS = {  # tool -> (the command, the Debian package)
    "sockperf": ("sockperf", "sockperf"),
    "cyclictest": ("cyclictest", "rt-tests"),
    "oslat": ("oslat", "rt-tests"),
}
UNITS = {
    "sockperf": "µs, UDP RTT/2",
    "cyclictest": "µs, timer wake-up",
    "oslat": "µs, busy-loop noise",
}
CYCLICTEST_RANGE_US = 20000  # histogram range; beyond it samples are counted as overflow
OSLAT_BUCKETS = 1024  # µs; the last bucket holds everything above


def missing_tools(tools: list[str]) -> list[str]:
    return [f"{t} (apt-get install {TOOLS[t][1]})" for t in tools if not shutil.which(TOOLS[t][0])]


def parse_sockperf_log(text: str) -> Histogram:
    """sockperf --full-log: "packet, txTime(sec), rxTime(sec), latency(usec)" per packet."""
    values = []
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) == 4 and fields[0].strip().isdigit():
            values.append(float(fields[3]))
    return Histogram.of(values)


def parse_cyclictest(text: str) -> Histogram:
    """cyclictest -h: "BUCKET COUNT [COUNT...]" lines (µs, one column per thread), then
    "# Histogram Overflows: N [N...]"."""
    hist = Histogram(ceiling=CYCLICTEST_RANGE_US)
    for line in text.splitlines():
        if line.startswith("# Histogram Overflows:"):
            hist.overflow += sum(int(x) for x in line.split(":", 1)[1].split())
        elif re.fullmatch(r"\d+(\s+\d+)+", line.strip()):
            bucket, *counts = (int(x) for x in line.split())
            total = sum(counts)
            if total:
                hist.counts[float(bucket)] += total
    return hist


def parse_oslat(text: str) -> Histogram:
    """oslat: "NNN (us): COUNT" lines per core; the last bucket includes the overflows."""
    hist = Histogram(ceiling=OSLAT_BUCKETS)
    for line in text.splitlines():
        m = re.match(r"\s*(\d+) \(us\):\s*(\d+)( \(including overflows\))?", line)
        if m:
            value, count = float(m.group(1)), int(m.group(2))
            if m.group(3):
                hist.overflow += count
            elif count:
                hist.counts[value] += count
    return hist


def run_tool(tool: str, plan: Plan, procs: Processes, net: Network, workdir: Path) -> Histogram:
    limit = plan.seconds + 20
    if tool == "cyclictest":
        out = procs.run(
            ["cyclictest", "-q", "-m", "-p", "95", "-t", str(len(plan.app_cpus)),
             "-a", plan.app_cpus.to_list(), "-i", "200", "-D", f"{plan.seconds:g}",
             "-h", str(CYCLICTEST_RANGE_US), "--default-system"],
            timeout=limit,
        )  # fmt: skip
        return parse_cyclictest(out)
    if tool == "oslat":
        out = procs.run(
            ["oslat", "-c", plan.app_cpus.to_list(), "-C", str(min(plan.housekeeping)),
             "-D", f"{max(1, round(plan.seconds))}", "-b", str(OSLAT_BUCKETS)],
            timeout=limit + 2,
        )  # fmt: skip
        return parse_oslat(out)
    # sockperf: a server per round (a fresh socket), the client on housekeeping CPUs. The
    # server is the application: started as a user would, `taskset -c APP_CPUS` from a
    # shell, outside the hold's exemption, so the shield treats it as it treats theirs.
    log = workdir / "sockperf.csv"
    server = procs.detach(
        net.inside(net.server_ns, plan.app_cpus, "sockperf", "server", "-i", SERVER_IP,
                   "-p", "11111"),
        workdir, "sockperf-server",
    )  # fmt: skip
    try:
        time.sleep(0.2)
        procs.run(
            net.inside(net.client_ns, plan.housekeeping, "chrt", "-f", "1", "sockperf", "ping-pong",
                       "-i", SERVER_IP, "-p", "11111", "-t", f"{max(1, round(plan.seconds))}",
                       "--full-log", str(log)),
            timeout=limit,
        )  # fmt: skip
        return parse_sockperf_log(log.read_text())
    finally:
        procs.end_group(server)
