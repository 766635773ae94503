"""Issue 52: two applications, each held on its own CPUs, on a machine with more than two
(the VM tier's 4 vCPUs, systemd as PID 1 on cgroup v2: the shield is `cpuset-systemd`).

Each application reports, every 10 ms, the CPU it runs on, its affinity and its cgroup
(from its own /proc). A on CPU 1 and B on CPU 2 (`latencyctl run --cpus`, each started in
a scope of its own from a shell of ssh.service, as the README says) hold the same
profile; every sample of each is on its own CPU, none on the other's or on housekeeping
(0 and 3); a hold asking one sysctl otherwise is refused with the reason and changes
nothing; A's end releases its hold: B is not moved (its samples unchanged through it) and
CPU 2 is still isolated, read from the kernel (the cgroups' effective CPUs, the unbound
workqueues' mask, the default IRQ affinity), CPU 1 back to housekeeping. Each runs in a
scope of its own whose AllowedCPUs= (systemd's) and effective CPUs (the kernel's) are its
hold's CPU, through the other's hold starting and ending.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.qemu import Vm, guest_profile
from tests.vm.profiles import DEFAULT_PROFILE

APP = """\
[main]
summary = "cpu-partitioning, the CPUs named by each hold (the VM tier)"
include = ["cpu-partitioning"]
"""
# One sysctl asked otherwise than the holds' (latency-performance's vm.swappiness = 10).
CONFLICT = APP + '\n[sysctl]\n"vm.swappiness" = 30\n'

# The application: every 10 ms a line "monotonic cpu affinity cgroup", read from its own
# /proc, flushed; it stops once it has reported for `seconds` and its stop file exists.
REPORTER = r"""
import os, sys, time
out, seconds, stop = sys.argv[1], float(sys.argv[2]), sys.argv[3]
start = time.monotonic()
with open(out, "w") as f:
    while True:
        now = time.monotonic()
        with open("/proc/thread-self/stat") as s:
            cpu = int(s.read().rsplit(")", 1)[1].split()[36])
        with open("/proc/self/cgroup") as c:
            cgroup = c.read().strip().split("::", 1)[1]
        affinity = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        f.write(f"{now:.4f} {cpu} {affinity} {cgroup}\n")
        f.flush()
        if now - start >= seconds and os.path.exists(stop):
            break
        time.sleep(0.01)
"""
SECONDS = 30
EVERY_CPU = {0, 1, 2, 3}
UNITS = ("init.scope", "system.slice", "user.slice", "latencyd.slice")


@dataclass(frozen=True)
class Sample:
    at: float
    cpu: int
    affinity: str
    cgroup: str


def samples(vm: Vm, name: str) -> list[Sample]:
    text = vm.ssh(f"cat /root/{name}.samples 2>/dev/null || true").stdout
    out = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4:  # a line being written as it was read is left out
            out.append(Sample(float(parts[0]), int(parts[1]), parts[2], parts[3]))
    return out


def start_app(vm: Vm, name: str, cpus: str) -> None:
    """`latencyctl run --cpus` from a shell of a service (ssh), in a scope of its own as
    the README says (`systemd-run --scope`): the daemon moves it into a scope of its own
    in latencyd's slice, and its command is born there."""
    vm.ssh(
        f"rm -f /root/{name}.samples /root/{name}.stop; setsid systemd-run --scope "
        f"--unit=latencyd-test-{name} latencyctl run --profile vm-app --cpus {cpus} "
        f"--reason app-{name} -- python3 /root/reporter.py /root/{name}.samples {SECONDS} "
        f"/root/{name}.stop > /root/{name}.out 2>&1 < /dev/null &"
    )


def said(vm: Vm, name: str) -> str:
    return vm.ssh(f"cat /root/{name}.out", check=False).stdout


def holds(vm: Vm) -> list[tuple[str, str]] | None:
    """Each hold's reason and CPUs, once the daemon has applied what they ask (None while
    a change is in progress: a released hold leaves the list before its release's steps
    have given its settings back, and status says so in `in_progress`)."""
    status = json.loads(vm.ssh("latencyctl status --json").stdout)
    if status["in_progress"]:
        return None
    return [(h["reason"], h["cpus"]) for h in status["holds"]]


def own_cpus(vm: Vm, cgroup: str) -> tuple[str, str]:
    """An application's own scope (its cgroup, from its samples): its effective CPUs as
    the kernel reads them, and its AllowedCPUs= as systemd was told."""
    unit = cgroup.rsplit("/", 1)[-1]
    out = vm.ssh(
        f"cat /sys/fs/cgroup{cgroup}/cpuset.cpus.effective; systemctl show -P AllowedCPUs {unit}"
    ).stdout.split("\n")
    return out[0].strip(), out[1].strip()


def wait_until(
    what: str, done: Callable[[], bool], timeout: float, why: Callable[[], str] = str
) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"not in {timeout:.0f} s: {what}\n{why()}"
        time.sleep(1)


def kernel_view(vm: Vm) -> dict[str, object]:
    """What the kernel keeps, read in the guest: each unit's effective CPUs, the unbound
    workqueues' CPUs, the default IRQ affinity, and what systemd was told (AllowedCPUs=)."""
    script = (
        "for u in " + " ".join(UNITS) + "; do "
        "printf '%s %s %s\\n' $u $(cat /sys/fs/cgroup/$u/cpuset.cpus.effective) "
        "$(systemctl show -P AllowedCPUs $u); done; "
        "echo workqueue $(cat /sys/devices/virtual/workqueue/cpumask); "
        "echo irq $(cat /proc/irq/default_smp_affinity); "
        "echo swappiness $(cat /proc/sys/vm/swappiness)"
    )
    out: dict[str, object] = {}
    for line in vm.ssh(script).stdout.splitlines():
        key, *values = line.split()
        if key in ("workqueue", "irq"):
            mask = int(values[0].replace(",", ""), 16)
            out[key] = {cpu for cpu in EVERY_CPU if mask >> cpu & 1}
        else:
            out[key] = tuple(values)
    return out


def test_two_applications_each_on_its_own_cpu_and_a_release_moves_not_the_other(
    vm: Vm,
) -> None:
    guest_profile(vm, "vm-app", APP)
    guest_profile(vm, "vm-swap30", CONFLICT)
    vm.ssh("cat > /root/reporter.py", stdin=REPORTER.encode())
    try:
        start_app(vm, "a", "1")
        wait_until("A placed and reporting", lambda: len(samples(vm, "a")) > 10, 300,
                   lambda: said(vm, "a"))  # fmt: skip
        start_app(vm, "b", "2")
        wait_until("B placed and reporting", lambda: len(samples(vm, "b")) > 10, 300,
                   lambda: said(vm, "b"))  # fmt: skip
        assert holds(vm) == [("app-a", "1"), ("app-b", "2")]
        both = kernel_view(vm)
        assert both["latencyd.slice"][0] == "1-2"  # type: ignore[index]
        a_scope, b_scope = samples(vm, "a")[-1].cgroup, samples(vm, "b")[-1].cgroup
        assert own_cpus(vm, a_scope) == ("1", "1") and own_cpus(vm, b_scope) == ("2", "2")
        status = json.loads(vm.ssh("latencyctl status --json").stdout)
        assert [set(h["cgroups"].values()) for h in status["holds"]] == [{a_scope}, {b_scope}]
        assert both["system.slice"][0] == "0,3"  # type: ignore[index]
        assert both["workqueue"] == both["irq"] == {0, 3}, both

        # A hold asking vm.swappiness otherwise: refused at once, saying why; nothing moves.
        refused = vm.ssh("latencyctl hold vm-swap30 --cpus 3 -- true", check=False)
        assert refused.returncode == 1, refused
        assert "(vm-swap30) is refused" in refused.stderr, refused.stderr
        assert "[sysctl] vm.swappiness: 30" in refused.stderr, refused.stderr
        assert "against 10" in refused.stderr, refused.stderr
        assert kernel_view(vm) == both
        assert holds(vm) == [("app-a", "1"), ("app-b", "2")]

        # A ends after its 30 s: its hold is released; B runs on.
        wait_until("A reported 30 s", lambda: samples(vm, "a")[-1].at - samples(vm, "a")[0].at
                   >= SECONDS, 120)  # fmt: skip
        vm.ssh("touch /root/a.stop")
        wait_until("A's hold released", lambda: holds(vm) == [("app-b", "2")], 120)
        after = kernel_view(vm)
        assert after["latencyd.slice"][0] == "2", after  # type: ignore[index]
        assert after["system.slice"][0] == "0-1,3", after  # type: ignore[index]
        assert after["workqueue"] == after["irq"] == {0, 1, 3}, after
        assert after["swappiness"] == both["swappiness"]
        assert own_cpus(vm, b_scope) == ("2", "2")
        at_release = samples(vm, "b")[-1].at
        wait_until("B reported 30 s and 5 s after A's release",
                   lambda: (s := samples(vm, "b"))[-1].at - s[0].at >= SECONDS
                   and s[-1].at >= at_release + 5, 120)  # fmt: skip
        vm.ssh("touch /root/b.stop")
        wait_until("B's hold released", lambda: holds(vm) == [], 120)
    finally:
        vm.ssh("touch /root/a.stop /root/b.stop", check=False)
        wait_until("both holds ended", lambda: holds(vm) == [], 120)

    a, b = samples(vm, "a"), samples(vm, "b")
    print(f"A: {len(a)} samples over {a[-1].at - a[0].at:.1f} s; "
          f"B: {len(b)} samples over {b[-1].at - b[0].at:.1f} s")  # fmt: skip
    assert a[-1].at - a[0].at >= SECONDS and b[-1].at - b[0].at >= SECONDS
    assert {s.cpu for s in a} == {1}, sorted({s.cpu for s in a})  # 0 on CPU 2 or 0, 3
    assert {s.cpu for s in b} == {2}, sorted({s.cpu for s in b})  # 0 on CPU 1 or 0, 3
    # A through B's hold starting, B through A's ending: neither moved, not for a moment
    # (one affinity and one cgroup in every sample), each in a scope of its own.
    assert {s.affinity for s in a} == {"1"}
    assert {s.affinity for s in b} == {"2"}
    (a_cgroup,) = {s.cgroup for s in a}
    (b_cgroup,) = {s.cgroup for s in b}
    assert a_cgroup.startswith("/latencyd.slice/latencyd-app-"), a_cgroup
    assert b_cgroup.startswith("/latencyd.slice/latencyd-app-") and b_cgroup != a_cgroup
    status = json.loads(vm.ssh("latencyctl status --json").stdout)
    assert status["last_error"] is None, status["last_error"]  # the whole reason, not cut
    assert status["active_profile"] == DEFAULT_PROFILE
