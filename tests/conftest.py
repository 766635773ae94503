"""Suite-wide fixtures: a guard that the machine is left as found, and a private D-Bus."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.machine_state import differences, snapshot

IS_ROOT = os.geteuid() == 0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reverse",
        action="store_true",
        help="run the tests in reverse order (a test must not depend on what ran before it)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--reverse"):
        items.reverse()
    for item in items:
        path = Path(str(item.fspath))
        if "kernel" in path.parts:
            item.add_marker(pytest.mark.kernel)
        if "e2e" in path.parts:
            item.add_marker(pytest.mark.e2e)
        if ("kernel" in path.parts or "e2e" in path.parts) and not IS_ROOT:
            item.add_marker(pytest.mark.skip(reason="needs root for real kernel interfaces"))


@pytest.fixture(scope="session", autouse=True)
def machine_left_as_found() -> Iterator[None]:
    """Fails the run if any IRQ mask, sysctl, cpuidle setting, QoS holder... differs at the end."""
    before = snapshot()
    yield
    diffs = differences(before, snapshot())
    assert not diffs, "the test suite changed the machine:\n" + "\n".join(diffs)


@pytest.fixture
def kernel_guard() -> Iterator[None]:
    """Per-test version of the guard, so a leak is blamed on the test that caused it."""
    before = snapshot()
    yield
    diffs = differences(before, snapshot())
    assert not diffs, "this test changed the machine:\n" + "\n".join(diffs)


@pytest.fixture(scope="session")
def private_bus() -> Iterator[str]:
    from scripts.private_bus import PrivateBus
    from tests.harness import POLICY

    with PrivateBus(POLICY) as bus:
        yield bus.address
