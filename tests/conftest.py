"""Suite-wide fixtures: a guard that the machine is left as found, and a private D-Bus."""

from __future__ import annotations

import os
import signal
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.machine_state import differences, snapshot

IS_ROOT = os.geteuid() == 0


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background by a non-interactive shell (`.ci/run &` in a script)
    # inherits SIGINT ignored, and so would every process the tests start: the tests that
    # send Ctrl-C to measure or check a held command's SIGINT need it delivered.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reverse",
        action="store_true",
        help="run the tests in reverse order (a test must not depend on what ran before it)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--reverse"):
        items.reverse()
    # The VM tier (tests/vm) boots QEMU for minutes: it runs only when asked for by its
    # marker (`-m vm`, `make test-vm`; `make test` runs it beside the host suites).
    if "vm" not in (config.getoption("markexpr") or ""):
        tier = [item for item in items if in_vm_tier(item)]
        if tier:
            config.hook.pytest_deselected(items=tier)
            items[:] = [item for item in items if not in_vm_tier(item)]
    for item in items:
        path = Path(str(item.fspath))
        if in_vm_tier(item):
            item.add_marker(pytest.mark.vm)
            if not IS_ROOT:
                item.add_marker(pytest.mark.skip(reason="the VM's image cache is root's"))
        if "kernel" in path.parts:
            item.add_marker(pytest.mark.kernel)
        if "e2e" in path.parts:
            item.add_marker(pytest.mark.e2e)
        if ("kernel" in path.parts or "e2e" in path.parts) and not IS_ROOT:
            item.add_marker(pytest.mark.skip(reason="needs root for real kernel interfaces"))


def in_vm_tier(item: pytest.Item) -> bool:
    return Path(str(item.fspath)).parts[-3:-1] == ("tests", "vm")


@pytest.fixture(scope="session", autouse=True)
def machine_left_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the run if any IRQ mask, sysctl, cpuidle setting, QoS holder... differs at the end.
    What earlier runs killed outright left (their daemons' settings, measure's namespaces and
    files) is put back first, said so, and not counted against this run.
    A run of the VM tier alone has no guard: it writes nothing of this machine's kernel,
    and runs without the shared lock while other runs may hold it and change what the
    guard reads."""
    if all(in_vm_tier(item) for item in request.session.items):
        yield
        return
    if IS_ROOT:
        put_back_what_killed_runs_left()
    before = snapshot()
    yield
    diffs = differences(before, snapshot())
    assert not diffs, "the test suite changed the machine:\n" + "\n".join(diffs)


def put_back_what_killed_runs_left() -> None:
    from latencyd.kernel.system import System
    from latencyd.tools.measure.scratch import remove_what_dead_runs_left
    from scripts.private_bus import PrivateBus
    from tests.harness import POLICY, STARTED_DAEMONS, recover_killed_runs

    if STARTED_DAEMONS.exists() and any(STARTED_DAEMONS.iterdir()):
        with PrivateBus(POLICY) as bus:
            for state in recover_killed_runs(bus.address):
                warnings.warn(f"restored what a killed run's daemon left applied ({state})",
                              stacklevel=1)  # fmt: skip
    for name in remove_what_dead_runs_left(System("/")):
        warnings.warn(f"removed what a killed measure run left: {name}", stacklevel=1)


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
