from __future__ import annotations

from pathlib import Path

import pytest

from latencyd.core.cpuset import CpuSet
from latencyd.core.schema import Machine
from tests.unit.fakesys import MACHINE_KINDS, FakeMachine, make_fake_root, make_machine_kind


@pytest.fixture
def fake_root(tmp_path: Path) -> Path:
    """A fake /proc + /sys: CPUs 0-3 online, 8 GiB RAM, the default sysctls."""
    return make_fake_root(tmp_path)


@pytest.fixture
def machine() -> Machine:
    return Machine(CpuSet.from_list("0-3"), 8 << 30)


@pytest.fixture(params=MACHINE_KINDS)
def machine_kind(request: pytest.FixtureRequest, tmp_path: Path) -> FakeMachine:
    """One fake machine of each kind latencyd has met (tests/unit/fakesys.py): a test that
    takes it runs on a haltpoll guest, a guest without a cpuidle driver and bare metal."""
    return make_machine_kind(tmp_path, str(request.param))
