from __future__ import annotations

from pathlib import Path

import pytest

from latencyd.cpuset import CpuSet
from latencyd.schema import Machine
from tests.unit.fakesys import make_fake_root


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """A fake /proc + /sys: CPUs 0-3 online, 8 GiB RAM, the default sysctls."""
    return make_fake_root(tmp_path)


@pytest.fixture
def machine() -> Machine:
    return Machine(CpuSet.from_list("0-3"), 8 << 30)
