"""System: the only place latencyd touches the kernel.

Every read and write of /proc, /sys and /dev goes through here, rooted at a
path (default "/") so unit tests run the same plugin code against a fake tree.
Errors become `KernelRefused` with the errno spelled out, never a bare OSError.
"""

from __future__ import annotations

import errno
import os
import struct
from pathlib import Path

from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused


def describe_oserror(exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "")
    text = exc.strerror or str(exc)
    return f"{text} ({name})" if name else text


class PmQosRequest:
    """A CPU latency request on /dev/cpu_dma_latency; the kernel drops it when the fd closes."""

    def __init__(self, fd: int, value_us: int) -> None:
        self.fd = fd
        self.value_us = value_us

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class System:
    def __init__(self, root: Path | str = "/") -> None:
        self.root = Path(root)

    @property
    def is_real(self) -> bool:
        return self.root == Path("/")

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    # -- files ---------------------------------------------------------------
    def exists(self, rel: str) -> bool:
        return self.path(rel).exists()

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except FileNotFoundError:
            return []

    def read(self, rel: str) -> str:
        try:
            return self.path(rel).read_text().strip()
        except OSError as exc:
            raise KernelRefused(f"reading /{rel.lstrip('/')}", describe_oserror(exc)) from exc

    def write(self, rel: str, value: str) -> None:
        """Write one value in a single write(2), as the kernel expects for sysfs/procfs."""
        what = f"writing {value!r} to /{rel.lstrip('/')}"
        try:
            fd = os.open(self.path(rel), os.O_WRONLY | os.O_TRUNC)
        except OSError as exc:
            raise KernelRefused(what, describe_oserror(exc)) from exc
        try:
            os.write(fd, value.encode())
        except OSError as exc:
            raise KernelRefused(what, f"the kernel refused it: {describe_oserror(exc)}") from exc
        finally:
            os.close(fd)

    # -- machine facts ---------------------------------------------------------
    def online_cpus(self) -> CpuSet:
        return CpuSet.from_list(self.read("sys/devices/system/cpu/online"))

    def mem_total_bytes(self) -> int:
        for line in self.read("proc/meminfo").splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
        raise KernelRefused("reading /proc/meminfo", "no MemTotal line")

    # -- PM QoS ------------------------------------------------------------------
    def hold_pm_qos(self, value_us: int) -> PmQosRequest:
        dev = self.path("dev/cpu_dma_latency")
        try:
            fd = os.open(dev, os.O_WRONLY)
            # The kernel takes a binary s32 (a hex string also works, but binary is exact).
            os.write(fd, struct.pack("=i", value_us))
        except OSError as exc:
            raise KernelRefused(f"holding {value_us} µs on {dev}", describe_oserror(exc)) from exc
        return PmQosRequest(fd, value_us)

    def replace_file(self, rel: str, text: str) -> None:
        """Replace a config file atomically (for files like /etc/default/irqbalance)."""
        path = self.path(rel)
        tmp = path.with_name(f".{path.name}.latencyd-tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
            if path.exists():
                os.chmod(tmp, path.stat().st_mode & 0o7777)
            os.replace(tmp, path)
        except OSError as exc:
            raise KernelRefused(f"writing /{rel.lstrip('/')}", describe_oserror(exc)) from exc
