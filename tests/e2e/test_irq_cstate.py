"""cstate and irq through the real daemon: drift put back, IRQs that reappear, status tables."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from latencyd.plugins.cstate import WITHOUT_DRIVER

from latencyd.kernel.idle import NO_DRIVER, read_driver
from latencyd.kernel.procstat import parse_interrupts
from latencyd.kernel.system import System
from tests.harness import Latencyd, signal_listener, wait_for
from tests.hotplug import cpu_offline

PROFILE = """
[main]
summary = "isolate CPU 1"

[variables]
isolated_cores = "1"

[cstate]
force_latency_us = "poll"

[[cstate.cpus]]
cpus = "${isolated_cores}"
resume_latency_us = 0
disable_states = ["haltpoll"]

[irq]
isolate = "${isolated_cores}"
on_drift = "reapply"

[[irq.rule]]
match = "virtio4-*"
cpus = "1"
"""

RNG = Path("/sys/bus/virtio/drivers/virtio_rng")


def virtio4_irqs() -> list[int]:
    _, irqs = parse_interrupts(Path("/proc/interrupts").read_text())
    return [i.number for i in irqs if any(a.startswith("virtio4-") for a in i.actions)]


def mask(n: int) -> str:
    return Path(f"/proc/irq/{n}/smp_affinity_list").read_text().strip()


@pytest.fixture
def isolated(
    start_daemon: Callable[..., Latencyd], profiles: Path, request: pytest.FixtureRequest
) -> Latencyd:
    if not virtio4_irqs():
        pytest.skip("needs the virtio4 (virtio-rng) IRQs of these VMs")
    (profiles / "isolate.toml").write_text(PROFILE)
    interval = getattr(request, "param", 0)  # no tick: drift and devices are events
    return start_daemon("isolate", config=f"verify_interval_s = {interval}\n")


def test_another_process_rewriting_an_owned_mask_is_put_back_naming_it(
    isolated: Latencyd,
) -> None:
    """The writer is named (issue 52): fanotify gave the daemon its pid, and its comm and
    command line were read while it ran (it waits on its stdin until the mask is back)."""
    irq = virtio4_irqs()[-1]
    assert mask(irq) == "1"
    monitor = signal_listener(isolated.address, "Drift")
    try:
        script = f"echo 0 > /proc/irq/{irq}/smp_affinity_list; echo written; read x"
        writer = subprocess.Popen(
            ["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert writer.stdout is not None and writer.stdout.readline() == b"written\n"
            wait_for(lambda: mask(irq) == "1")
        finally:
            writer.communicate(b"\n", timeout=5)
        wait_for(lambda: "reapplied" in monitor.heard())
    finally:
        out = monitor.stop()
    assert "member=Drift" in out and f'"irq": {irq}' in out and "reapplied" in out
    by = json.dumps({"pid": writer.pid, "comm": "sh", "cmdline": f"sh -c {script}"})
    assert f'"written_by": {by}' in out
    line = f"drift: [irq] IRQ {irq} affinity = 1, but it is '0', written by {writer.pid} (sh)"
    line += ": reapplied"
    wait_for(lambda: line in isolated.log())


def test_irqs_that_reappear_get_the_rule_at_once(isolated: Latencyd) -> None:
    """Unbind and rebind virtio-rng: its IRQs vanish and come back with the default mask."""
    numbers = virtio4_irqs()
    (RNG / "unbind").write_text("virtio4")
    try:
        wait_for(lambda: not virtio4_irqs())
    finally:
        (RNG / "bind").write_text("virtio4")
    took = wait_for(lambda: bool(virtio4_irqs()) and all(mask(n) == "1" for n in virtio4_irqs()))
    assert virtio4_irqs() == numbers
    # At once: logged after applying, a virtio4 event (the bind, or the unbind if the IRQs
    # were back by the time it was handled) made the irq section expand again, no poll.
    # How soon is a figure the machine's load moves: bench drift prints it.
    print(f"virtio4's IRQs steered {took:.3f} s after the rebind")
    line = r"\[irq\] .*virtio virtio4 (un)?bind.*: [1-9]\d* applied"
    wait_for(lambda: re.search(line, isolated.log()) is not None)


@pytest.mark.machine_kind
def test_status_shows_cstate_table_and_irq_distribution(isolated: Latencyd) -> None:
    """What this machine can do: with a cpuidle driver the PM QoS request is held and the
    residency table has the driver's states; without one (a guest whose idle loop halts
    whatever PM QoS says) every idle option is not applicable, with the reason, and no
    residency is claimed. Either way status says how idle CPUs wait here."""
    time.sleep(0.3)
    status = json.loads(isolated.ctl("status", "--json").stdout)
    cstate = status["plugins"]["cstate"]
    tables = {t["title"].split(" (")[0]: t for t in cstate["tables"]}
    waiting = tables["How idle CPUs wait here"]
    assert waiting["columns"] == [
        "CPU",
        "an idle CPU",
        "wake-up limit",
        "cstate options that act here",
    ]
    assert {r[0] for r in waiting["rows"]} == {0, 1}
    text = isolated.ctl("status").stdout
    if read_driver(System()):
        # PM QoS 0 µs held: whatever the driver, no idle CPU may go deeper than polling.
        assert all(r[1].startswith("poll, no deeper state allowed") for r in waiting["rows"])
        assert [r[2] for r in waiting["rows"]] == ["0 µs", "0 µs"]
        assert cstate["facts"]["pm_qos_requested_us"] == 0
        assert cstate["facts"]["pm_qos_resolved_from"] == "poll"
        table = cstate["tables"][0]
        assert table["columns"][:3] == ["CPU", "busy%", "POLL %"]
        assert {r[0] for r in table["rows"]} == {0, 1}
        assert "C-state residency since the profile was applied" in text
        assert "PM QoS CPU latency request held at 0 µs (resolved from 'poll')" in text
    else:
        refused = {i["text"]: i["reason"] for i in cstate["not_applicable"]}
        assert refused == {
            "force_latency_us": f"force_latency_us = 'poll': {NO_DRIVER}",
            "resume_latency_us for CPUs 1": NO_DRIVER,
            "disable_states for CPUs 1": WITHOUT_DRIVER["disable_states"],
        }
        assert cstate["applied"] == [] and "pm_qos_requested_us" not in cstate["facts"]
        halt = "halt (no cpuidle driver): halted until the next interrupt"
        assert waiting["rows"] == [[c, halt, "ignored", f"none ({NO_DRIVER})"] for c in (0, 1)]
        assert [t["title"] for t in cstate["tables"]] == [waiting["title"]]  # no residency
        assert f"not applicable: force_latency_us: force_latency_us = 'poll': {NO_DRIVER}" in text
    irq = status["plugins"]["irq"]
    assert irq["facts"]["isolated_cpus"] == "1"
    assert "irqs_on_isolated_cpus_since_apply" in irq["facts"]
    refused = {i["text"]: i["reason"] for i in irq["not_applicable"]}
    assert any("kernel-managed" in r for r in refused.values())
    assert "interrupts per CPU since the profile was applied" in text
    assert "How idle CPUs wait here" in text
    assert "not applicable: IRQ " in text


@pytest.mark.machine_kind
def test_stop_releases_qos_and_restores_masks(isolated: Latencyd) -> None:
    """The PM QoS request is held while the profile is (without a cpuidle driver it is
    not applicable and never taken), and released on stop (the masks: kernel_guard)."""
    from tests.machine_state import pm_qos_holders

    assert isolated.proc is not None
    assert (isolated.proc.pid in pm_qos_holders()) is bool(read_driver(System()))
    isolated.stop()
    assert isolated.proc.pid not in pm_qos_holders()


CPU1_ONLINE = Path("/sys/devices/system/cpu/cpu1/online")
ALL_CPUS = """
[main]
summary = "every CPU: polling only"

[[cstate.cpus]]
cpus = "all"
resume_latency_us = 0
"""


@pytest.fixture
def cpu1_offline() -> Iterator[None]:
    if not CPU1_ONLINE.exists():
        pytest.skip("CPU 1 cannot be taken offline here")
    with cpu_offline(1):  # puts back the threads and IRQs the kernel moves off CPU 1
        yield


@pytest.mark.machine_kind
def test_cpu_coming_online_gets_the_per_cpu_settings(
    start_daemon: Callable[..., Latencyd], profiles: Path, cpu1_offline: None
) -> None:
    resume = [
        Path(f"/sys/devices/system/cpu/cpu{c}/power/pm_qos_resume_latency_us") for c in (0, 1)
    ]
    before = [p.read_text().strip() for p in resume]
    (profiles / "all-cpus.toml").write_text(ALL_CPUS)
    d = start_daemon("all-cpus", config="verify_interval_s = 3600\n")  # events only

    def refused() -> dict[str, str]:
        cstate = json.loads(d.ctl("status", "--json").stdout)["plugins"]["cstate"]
        return {i["text"]: i["reason"] for i in cstate["not_applicable"]}

    if not read_driver(System()):  # the limit cannot act: status says so for every CPU
        assert refused() == {"resume_latency_us for CPUs 0": NO_DRIVER}
        CPU1_ONLINE.write_text("1")
        wait_for(lambda: refused() == {"resume_latency_us for CPUs 0-1": NO_DRIVER})
        d.stop()
        assert [p.read_text().strip() for p in resume] == before  # never written
        return
    assert resume[0].read_text().strip() == "n/a"
    assert resume[1].read_text().strip() == before[1]  # offline: not part of "all" yet
    CPU1_ONLINE.write_text("1")
    wait_for(lambda: resume[1].read_text().strip() == "n/a")
    d.stop()
    assert [p.read_text().strip() for p in resume] == before
