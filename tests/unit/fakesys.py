"""A fake /proc + /sys tree for unit tests: the System facade rooted at a temp dir.

`make_fake_root` writes the few files latencyd reads (online CPUs, MemTotal) and
the sysctls its plugins touch, each as one value with a trailing newline like the
kernel prints. `KernelLikeSystem` adds the one piece of kernel behaviour plain
files cannot show: writing vm.dirty_ratio zeroes vm.dirty_bytes and vice versa
(and likewise for the background pair), as mm/page-writeback.c does.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from latencyd.system import System

GiB_KB = 1 << 20  # one GiB in /proc/meminfo's kB

DEFAULT_SYSCTLS: dict[str, str] = {
    "vm/dirty_ratio": "20",
    "vm/dirty_bytes": "0",
    "vm/dirty_background_ratio": "10",
    "vm/dirty_background_bytes": "0",
    "vm/dirty_expire_centisecs": "3000",
    "vm/dirty_writeback_centisecs": "500",
    "vm/swappiness": "60",
    "vm/stat_interval": "1",
    "kernel/timer_migration": "1",
    "net/core/busy_read": "0",
    "net/core/busy_poll": "0",
    "net/ipv4/tcp_fastopen": "1",
    "net/ipv4/tcp_rmem": "4096\t131072\t6291456",
}


def make_fake_root(
    tmp_path: Path,
    cpus: str = "0-3",
    mem_kb: int = 8 * GiB_KB,
    sysctls: Mapping[str, str] | None = None,
    defaults: bool = True,
) -> Path:
    """Create `tmp_path/root` with proc/sys/..., proc/meminfo and the online CPU list.

    `sysctls` maps paths under /proc/sys (``vm/swappiness``) to contents; they are
    added to (or override) DEFAULT_SYSCTLS unless `defaults` is false.
    """
    root = tmp_path / "root"
    values = {**(DEFAULT_SYSCTLS if defaults else {}), **(sysctls or {})}
    for rel, value in values.items():
        f = root / "proc/sys" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"{value}\n")
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/meminfo").write_text(
        f"MemTotal:       {mem_kb} kB\nMemFree:        {mem_kb // 2} kB\n"
    )
    online = root / "sys/devices/system/cpu/online"
    online.parent.mkdir(parents=True, exist_ok=True)
    online.write_text(f"{cpus}\n")
    return root


def sysctl_values(root: Path) -> dict[str, str]:
    """Every file under the fake /proc/sys, by relative path, stripped: a snapshot to compare."""
    base = root / "proc/sys"
    return {
        str(p.relative_to(base)): p.read_text().strip()
        for p in sorted(base.rglob("*"))
        if p.is_file()
    }


def read_sysctl(root: Path, rel: str) -> str:
    return (root / "proc/sys" / rel).read_text().strip()


def write_sysctl(root: Path, rel: str, value: str) -> None:
    """Change a value behind latencyd's back (what another tool or admin would do)."""
    (root / "proc/sys" / rel).write_text(f"{value}\n")


_PARTNER = {
    "proc/sys/vm/dirty_ratio": "proc/sys/vm/dirty_bytes",
    "proc/sys/vm/dirty_bytes": "proc/sys/vm/dirty_ratio",
    "proc/sys/vm/dirty_background_ratio": "proc/sys/vm/dirty_background_bytes",
    "proc/sys/vm/dirty_background_bytes": "proc/sys/vm/dirty_background_ratio",
}


class KernelLikeSystem(System):
    """A fake tree that keeps the kernel's dirty_ratio/dirty_bytes exclusivity.

    As in dirty_ratio_handler()/dirty_bytes_handler(): a write that changes one of
    a pair sets the other to 0. It also logs every write, so tests can tell what
    was touched and what was left alone.
    """

    def __init__(self, root: Path | str = "/") -> None:
        super().__init__(root)
        self.writes: list[tuple[str, str]] = []  # every write, as (path under root, value)

    def write(self, rel: str, value: str) -> None:
        rel = rel.lstrip("/")
        self.writes.append((rel, value))
        partner = _PARTNER.get(rel)
        old = self.read(rel) if partner else None
        super().write(rel, value)
        if partner and old != value.strip():
            super().write(partner, "0")
