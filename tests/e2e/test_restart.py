"""A restart is not a revert: through `kill -9` and a restart, and through SIGTERM with
on_stop = "keep" and a restart, a sampler reading every owned setting at well over
1 kHz never sees an original value. The PM QoS request dies with its fd, except where
a file-descriptor store keeps it (systemd's; here a stand-in speaking its protocol)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from latencyd.plugins.irq import parse_interrupts

from tests.fdstore import FdStoreStandIn
from tests.harness import Latencyd, wait_for
from tests.machine_state import pm_qos_holders
from tests.sampler import SETTINGS, Sampler, all_tuned, finish, pm_qos_us, profile_for
from tests.sampler import sampling as sampler_running


@pytest.fixture
def originals() -> dict[str, object]:
    if not Path("/sys/devices/system/cpu/cpu1").exists():
        pytest.skip("needs two CPUs")
    return {name: reader() for name, reader in SETTINGS.items()}


@pytest.fixture
def sampling(originals: dict[str, object]) -> Iterator[Callable[[], Sampler]]:
    with contextlib.ExitStack() as stack:
        yield lambda: stack.enter_context(sampler_running(originals))


def test_kill9_and_restart_flips_nothing_back(
    start_daemon: Callable[..., Latencyd],
    profiles: Path,
    originals: dict[str, object],
    sampling: Callable[[], Sampler],
) -> None:
    (profiles / "restart.toml").write_text(profile_for(originals))
    d = start_daemon("restart")
    assert all_tuned(originals)
    sampler = sampling()
    d.kill9()
    d.start()
    wait_for(lambda: pm_qos_us() == 50, timeout=5)
    finish(sampler)
    # Without a file-descriptor store the PM QoS request died with the process.
    assert set(sampler.flips) <= {"PM QoS"}, sampler.flips
    assert "profile restart active: 1 applied, 0 restored, 7 unchanged" in d.log()


def test_sigterm_with_on_stop_keep_and_restart_flips_nothing_back(
    start_daemon: Callable[..., Latencyd],
    profiles: Path,
    originals: dict[str, object],
    sampling: Callable[[], Sampler],
) -> None:
    (profiles / "restart.toml").write_text(profile_for(originals))
    d = start_daemon("restart", config='on_stop = "keep"\n')
    sampler = sampling()
    assert d.stop() == 0
    assert "keeping the tuning in place" in d.log()
    assert (d.state_dir / "journal.jsonl").exists()
    d.start()
    wait_for(lambda: pm_qos_us() == 50, timeout=5)
    finish(sampler)
    assert set(sampler.flips) <= {"PM QoS"}, sampler.flips
    # `latencyctl off` still restores everything the kept run changed.
    assert d.ctl("off").returncode == 0
    assert {n: r() for n, r in SETTINGS.items()} == originals


def test_the_fd_store_keeps_the_pm_qos_request_through_a_crash(
    start_daemon: Callable[..., Latencyd],
    profiles: Path,
    originals: dict[str, object],
    sampling: Callable[[], Sampler],
    tmp_path: Path,
) -> None:
    store = FdStoreStandIn(tmp_path)
    try:
        (profiles / "restart.toml").write_text(profile_for(originals))
        d = start_daemon("restart", environment=store.environment())
        wait_for(lambda: list(store.stored().values()) == [1], timeout=5)
        (name,) = store.stored()
        assert name.startswith("pmqos-50-")
        sampler = sampling()
        d.kill9()
        assert pm_qos_us() == 50  # the store's copy of the fd holds the request
        d.launcher = store.wrap
        d.start()
        finish(sampler)
        assert sampler.flips == {}, sampler.flips  # not even the PM QoS request
        assert d.proc is not None and d.proc.pid in pm_qos_holders()
        assert "profile restart active: 0 applied, 0 restored, 8 unchanged" in d.log()
        # Switching the request away makes before it breaks, and the store follows.
        (profiles / "other.toml").write_text(profile_for(originals).replace("= 50", "= 40"))
        assert d.ctl("switch", "other").returncode == 0
        wait_for(lambda: [n.split("-")[1] for n in store.stored()] == ["40"], timeout=5)
        assert pm_qos_us() == 40
        d.stop()
        wait_for(lambda: store.stored() == {}, timeout=5)  # FDSTOREREMOVE on restore
        assert pm_qos_us() == originals["PM QoS"]
    finally:
        store.close()


def test_irq_affinity_kept_through_a_restart(
    start_daemon: Callable[..., Latencyd], profiles: Path
) -> None:
    """Owned IRQ masks too: a kill -9 and restart rewrite none of them."""
    _, irqs = parse_interrupts(Path("/proc/interrupts").read_text())
    rng = [i.number for i in irqs if any(a.startswith("virtio4-") for a in i.actions)]
    if not rng:
        pytest.skip("needs the virtio4 (virtio-rng) IRQs of these VMs")
    (profiles / "rng.toml").write_text('[[irq.rule]]\nmatch = "virtio4-*"\ncpus = "1"\n')
    d = start_daemon("rng")
    masks = [Path(f"/proc/irq/{n}/smp_affinity_list") for n in rng]
    assert all(m.read_text().strip() == "1" for m in masks)
    stop = threading.Event()
    seen: set[str] = set()

    def sample() -> None:
        while not stop.is_set():
            seen.update(m.read_text().strip() for m in masks)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        d.kill9()
        d.start()
    finally:
        stop.set()
        thread.join()
    assert seen == {"1"}
