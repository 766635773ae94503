"""A restart is not a revert: through `kill -9` and a restart (under every shipped profile
too), and through SIGTERM with on_stop = "keep" and a restart, a sampler reading every
owned setting never sees an original value. The PM QoS request dies with its fd, except where
a file-descriptor store keeps it (systemd's; here a stand-in speaking its protocol)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from latencyd.core.journal import Journal
from latencyd.core.plugin import Plugin, Target, decode_target, load_plugins, target_kinds
from latencyd.errors import LatencydError
from latencyd.kernel.procstat import parse_interrupts
from latencyd.kernel.system import System
from latencyd.paths import shipped_profiles_dir
from latencyd.service.noisewatch import INSTANCE
from tests.fdstore import FdStoreStandIn
from tests.harness import Latencyd, idle_threads, wait_for
from tests.machine_state import pm_qos_holders, trace_instances
from tests.sampler import IDLE_ACTS, SETTINGS, Sampler, all_tuned, finish, pm_qos_us, profile_for
from tests.sampler import sampling as sampler_running

pytestmark = pytest.mark.machine_kind  # what a restart keeps includes the idle settings


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
    wait_for(lambda: all_tuned(originals))  # the PM QoS request taken again
    finish(sampler)
    # Without a file-descriptor store the PM QoS request died with the process.
    assert set(sampler.flips) <= {"PM QoS"}, sampler.flips
    retaken = int(IDLE_ACTS)  # the PM QoS request; every other setting kept its value
    unchanged = len(SETTINGS) - retaken
    assert f"restart active: {retaken} applied, 0 restored, {unchanged} unchanged" in d.log()


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
    wait_for(lambda: all_tuned(originals))
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
    if not IDLE_ACTS:
        pytest.skip("no cpuidle driver: no PM QoS request is taken here, so no fd to keep")
    store = FdStoreStandIn(tmp_path)
    try:
        (profiles / "restart.toml").write_text(profile_for(originals))
        d = start_daemon("restart", environment=store.environment())
        wait_for(lambda: list(store.stored().values()) == [1])
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
        wait_for(lambda: [n.split("-")[1] for n in store.stored()] == ["40"])
        assert pm_qos_us() == 40
        d.stop()
        wait_for(lambda: store.stored() == {})  # FDSTOREREMOVE on restore
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
    assert [m.read_text().strip() for m in masks] == ["1"] * len(masks), d.log()
    # x86 moves an MSI without interrupt remapping only at its next interrupt: until then
    # smp_affinity_list shows the mask written, and as that move completes a reader can
    # see the old mask for a moment (the pending flag is cleared before the new mask is
    # set, and the read takes no lock). No write makes that flip, so the moves finish
    # before the sampling: reading the device fires its interrupt.
    # (virtio4-config fires on a change of the device's configuration only.)
    effective = [
        Path(f"/proc/irq/{i.number}/effective_affinity_list")
        for i in irqs
        if any(a.startswith("virtio4-") and a != "virtio4-config" for a in i.actions)
    ]

    def moved() -> bool:
        with contextlib.suppress(OSError), open("/dev/hwrng", "rb") as hwrng:
            hwrng.read(16)
        return all(e.read_text().strip() == "1" for e in effective)

    wait_for(moved)
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
    journal = d.state_dir / "journal.jsonl"
    # What both runs logged and journaled say which one wrote what.
    assert seen == {"1"}, d.log() + (journal.read_text() if journal.exists() else "")


def test_a_restart_without_the_watch_removes_the_instance_a_killed_run_left(
    start_daemon: Callable[..., Latencyd],
) -> None:
    """kill -9 under cpu-partitioning leaves the noise watch's tracefs instance (its
    buffers) in the kernel; the next start, under a profile that watches nothing, removes it."""
    d = start_daemon("cpu-partitioning")
    assert INSTANCE in trace_instances(), d.log()
    d.kill9()
    assert INSTANCE in trace_instances()
    d.profile = "test-a"
    d.start()
    assert INSTANCE not in trace_instances(), d.log()
    assert f"removed the tracefs instance {INSTANCE} a killed run left" in d.log()


SHIPPED = sorted(p.stem for p in shipped_profiles_dir().glob("*.toml"))


@dataclass
class OwnedSampler:
    """Reads every setting a running daemon owns, through the plugins' own `read`, in a
    loop; counts each sample that shows the setting's original (where it differs from
    what the profile applied). The PM QoS request is left out: it lives on the daemon's
    fd and dies with it (test_the_fd_store_keeps_the_pm_qos_request_through_a_crash)."""

    owned: list[tuple[str, Plugin[Any, Any, Any], Target, object]]
    rounds: int = 0
    flips: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            for text, plugin, target, original in self.owned:
                try:
                    actual = plugin.read(target)
                except LatencydError:
                    continue  # a task that exited, an IRQ that went away
                if plugin.same(target, original, actual):
                    self.flips[text] = self.flips.get(text, 0) + 1
            self.rounds += 1


def owned_settings(d: Latencyd) -> list[tuple[str, Plugin[Any, Any, Any], Target, object]]:
    """Every setting the daemon has changed, from its journal (status shows the threads
    of one process as one row), with the original each must get back."""
    state = Journal(d.state_dir).load()
    if state is None:  # nothing changed (untuned): no journal
        return []
    plugins = load_plugins(System())
    owned = []
    for (name, key), original in state.originals.items():
        plugin = plugins[name]
        target = decode_target(target_kinds(plugin), json.loads(key))
        try:
            current = plugin.read(target)
        except LatencydError:
            continue  # gone meanwhile
        if target.kind == "pm_qos" or plugin.same(target, original, current):
            continue
        owned.append((f"[{name}] {plugin.describe(target, current)}", plugin, target, original))
    return owned


@pytest.mark.parametrize("profile", SHIPPED)
def test_kill9_and_restart_of_every_shipped_profile_starts_and_flips_nothing_back(
    start_daemon: Callable[..., Latencyd], profile: str
) -> None:
    """The issue-15 crash: a restart after kill -9 under a profile with [irq] isolate
    died in `_capture_originals` on the adopted-value placeholder, every time."""
    d = start_daemon(profile)
    owned = owned_settings(d)
    sampler = OwnedSampler(owned)
    thread = threading.Thread(target=sampler.run)
    thread.start()
    try:
        wait_for(lambda: sampler.rounds > 0)
        d.kill9()
        d.start()
        rounds = sampler.rounds
        wait_for(lambda: sampler.rounds >= rounds + 20)  # and a while after
    finally:
        sampler.stop.set()
        thread.join()
    assert sampler.flips == {}, sampler.flips
    log = d.log()
    assert "Traceback" not in log and ("adopted" in log or not owned), log
    status = json.loads(d.ctl("status", "--json").stdout)
    assert (status.get("active_profile"), status.get("last_error")) == (profile, None), d.log()
    assert d.stop() == 0
    for text, plugin, target, original in owned:
        with contextlib.suppress(LatencydError):  # gone meanwhile: nothing to restore
            assert plugin.same(target, original, plugin.read(target)), text


def test_kill9_in_the_middle_of_a_10000_thread_switch_then_restart_restores_them_all(
    start_daemon: Callable[..., Latencyd],
) -> None:
    """Issue 19: the journal is written before any thread is moved, so a kill -9 at any
    point of a big switch leaves nothing a restart cannot give back."""
    every = os.sched_getaffinity(0)
    if 1 not in every or len(every) < 2:
        pytest.skip("needs CPU 1 and another")
    with idle_threads(10000) as app:
        tids = [int(t) for t in os.listdir(f"/proc/{app.pid}/task")]
        d = start_daemon(None)
        switch = d.spawn_ctl("switch", "cpu-partitioning")

        def narrowed() -> int:
            return sum(1 for t in tids[::50] if os.sched_getaffinity(t) != every)

        wait_for(lambda: narrowed() > 0)  # the switch is moving threads
        d.kill9()
        switch.wait(30)
        moved = narrowed()
        d.start()  # no profile: what the journal holds is restored
        assert "adopted" in d.log() and "restored the originals" in d.log(), d.log()
        assert [t for t in tids if os.sched_getaffinity(t) != every] == [], moved
