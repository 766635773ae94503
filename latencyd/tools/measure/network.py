"""The network sockperf runs over: two network namespaces and a veth pair between them,
made for this run (named after its PID) and removed after it."""

from __future__ import annotations

import os
import subprocess

from latencyd.cpuset import CpuSet
from latencyd.tools.measure import MeasureError
from latencyd.tools.measure.processes import Processes

SERVER_IP, CLIENT_IP = "10.231.0.1", "10.231.0.2"


class Network:
    def __init__(self, procs: Processes) -> None:
        self.procs = procs
        tag = f"ltdm-{os.getpid()}"
        self.server_ns, self.client_ns = f"{tag}-s", f"{tag}-c"
        self.made: list[str] = []

    def __enter__(self) -> Network:
        try:
            for ns in (self.server_ns, self.client_ns):
                _ip("netns", "add", ns)
                self.made.append(ns)
                self.procs.guard.netns(ns)
            _ip("link", "add", "ltdm-s", "netns", self.server_ns, "type", "veth", "peer",
                "name", "ltdm-c", "netns", self.client_ns)  # fmt: skip
            for ns, dev, addr in (
                (self.server_ns, "ltdm-s", SERVER_IP),
                (self.client_ns, "ltdm-c", CLIENT_IP),
            ):
                _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        self.made.clear()

    def inside(self, ns: str, cpus: CpuSet, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", ns, "taskset", "-c", cpus.to_list(), *argv]


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise MeasureError(f"ip {' '.join(args)}: {result.stderr.strip()}")
