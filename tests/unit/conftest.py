from __future__ import annotations

from pathlib import Path

import pytest

from latencyd.cpuset import CpuSet
from latencyd.kernel.system import Machine
from tests.unit.fakesys import MACHINE_KINDS, FakeMachine, make_fake_root, make_machine_kind


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--shard",
        metavar="I/N",
        help="run every Nth test from the Ith (0 to N-1) only: `make check` runs N side by side",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--shard I/N: test by test rather than file by file, so the slow files (those that
    start shells and man) are shared out too."""
    shard = config.getoption("--shard", default=None)
    if shard is None:
        return
    try:
        i, n = (int(x) for x in shard.split("/"))
        if not 0 <= i < n:
            raise ValueError(shard)
    except ValueError:
        raise pytest.UsageError(f"--shard {shard!r}: expected I/N with 0 <= I < N") from None
    config.hook.pytest_deselected(items=[t for k, t in enumerate(items) if k % n != i])
    items[:] = items[i::n]


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """A fake /proc + /sys: CPUs 0-3 online, 8 GiB RAM, the default sysctls."""
    return make_fake_root(tmp_path)


@pytest.fixture
def pdir(tmp_path: Path) -> Path:
    """An empty profile directory of the test's own."""
    d = tmp_path / "profiles"
    d.mkdir()
    return d


@pytest.fixture
def machine() -> Machine:
    return Machine(CpuSet.from_list("0-3"), 8 << 30)


@pytest.fixture(params=MACHINE_KINDS)
def machine_kind(request: pytest.FixtureRequest, tmp_path: Path) -> FakeMachine:
    """One fake machine of each kind latencyd has met (tests/unit/fakesys.py): a test that
    takes it runs on a haltpoll guest, a guest without a cpuidle driver and bare metal."""
    return make_machine_kind(tmp_path, str(request.param))
