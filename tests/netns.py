"""Network namespaces a test owns: its devices live and die there, the host's NICs are
never touched. `ip netns exec` runs a process inside, with /sys showing that namespace's
devices and udev events of that namespace only."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
_counter = itertools.count()


class NetNs:
    def __init__(self, name: str) -> None:
        self.name = name

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", "-n", self.name, *args], check=True, capture_output=True)

    def argv(self, *argv: str) -> list[str]:
        """A command line that runs inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, *argv: str) -> str:
        return subprocess.run(self.argv(*argv), check=True, capture_output=True, text=True).stdout

    def read(self, ifname: str, rel: str) -> str:
        return self.run("cat", f"/sys/class/net/{ifname}/{rel}").strip()

    def python(self, code: str, *args: str) -> Any:
        """Run Python inside the namespace (with the repo importable); its last stdout
        line, as JSON."""
        env = dict(os.environ, PYTHONPATH=str(REPO))
        out = subprocess.run(
            self.argv(sys.executable, "-c", code, *args),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise RuntimeError(f"child failed ({out.returncode}):\n{out.stderr}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    def links(self) -> list[str]:
        return [
            line.split(":")[1].strip().split("@")[0]
            for line in self.run("ip", "-o", "link").splitlines()
        ]


@contextmanager
def netns() -> Iterator[NetNs]:
    """A fresh namespace (removed, with every device in it, afterwards)."""
    name = f"ltd-{os.getpid()}-{next(_counter)}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        ns = NetNs(name)
        ns.ip("link", "set", "lo", "up")
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
