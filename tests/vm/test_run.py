"""`latencyctl run` where production applications run: a command a systemd service starts
(here a shell of ssh.service, on a server without libpam-systemd), and the two ways the
refusal names instead: a scope of its own (`systemd-run --scope`), and a service given
`Slice=latencyd.slice`. Issue 51, finding 2.

The tier's first run once saw the ssh after the refused `run` exit 255. Nothing of sshd's
changes with the refusal (its cgroup, CPUs and unit read the same; the test checks it), and
repeated by hand on a VM of this tier the sequence never lost ssh: ssh's 255 was the guest
itself gone silent, as the emulator flake or a host too loaded to run it for ssh's 60 s
keep-alive do. Vm.ssh now says which when it happens (tests/qemu.py, why_lost).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.qemu import Vm, guest_profile
from tests.vm.profiles import DEFAULT_PROFILE, PARTITIONING

RAN = "/root/run-ran"
SHOW = "grep Cpus_allowed_list /proc/self/status; cat /proc/self/cgroup"
# What ssh runs as: sshd's cgroup and CPUs, and its unit's AllowedCPUs=.
SSHD = (
    "p=$(systemctl show -P MainPID ssh.service); cat /proc/$p/cgroup; "
    "grep Cpus_allowed_list /proc/$p/status; systemctl show -p AllowedCPUs ssh.service"
)
APP_SERVICE = "vm-app"


@pytest.fixture
def shielded(vm: Vm) -> Iterator[Vm]:
    """The VM with cpu-partitioning in force on CPUs 2-3, the default profile after."""
    guest_profile(vm, "vm-partitioning", PARTITIONING)
    vm.ssh("latencyctl switch vm-partitioning")
    yield vm
    vm.ssh(f"latencyctl switch {DEFAULT_PROFILE}")


def cpus_and_cgroup(out: str) -> tuple[str, str]:
    cpus = re.search(r"Cpus_allowed_list:\s+(\S+)", out)
    cgroup = re.search(r"^0::(\S+)", out, re.M)
    assert cpus and cgroup, out
    return cpus.group(1), cgroup.group(1)


def test_run_from_a_services_shell_is_refused_saying_what_to_do(shielded: Vm) -> None:
    vm = shielded
    assert vm.ssh("cat /proc/self/cgroup").stdout.strip() == "0::/system.slice/ssh.service"
    sshd = vm.ssh(SSHD).stdout
    run = vm.ssh(f"rm -f {RAN}; latencyctl run -- touch {RAN}", check=False)
    assert run.returncode != 0, f"run placed nothing and said nothing:\n{run.stdout}"
    assert vm.ssh(f"test -e {RAN}", check=False).returncode == 1, "refused, yet the command ran"
    for said in ("ssh.service", "Slice=latencyd.slice", "systemd-run --scope"):
        assert said in run.stderr, f"the refusal does not say {said!r}: {run.stderr}"
    pid = re.search(r"process (\d+) runs on CPUs", run.stderr)
    assert pid, run.stderr
    status = vm.ssh("latencyctl status").stdout
    assert f"not placed: process {pid.group(1)} holding vm-partitioning" in status, status
    # the refused run changed nothing of what ssh runs as, and ssh still answers
    assert vm.ssh(SSHD).stdout == sshd


def test_a_shells_command_in_a_scope_of_its_own_is_placed(shielded: Vm) -> None:
    out = shielded.ssh(f"systemd-run --scope --quiet latencyctl run -- sh -c '{SHOW}'").stdout
    cpus, cgroup = cpus_and_cgroup(out)
    assert cpus == "2-3", out
    assert re.fullmatch(r"/latencyd\.slice/latencyd-app-\d+\.scope", cgroup), out


def test_a_service_given_the_slice_runs_on_the_shielded_cpus(shielded: Vm) -> None:
    vm = shielded
    out = f"/run/{APP_SERVICE}.out"
    vm.ssh(
        f"systemd-run --quiet --unit={APP_SERVICE} -p Slice=latencyd.slice "
        f"sh -c '({SHOW}) > {out}.new && mv {out}.new {out} && exec sleep 600'"
    )
    try:
        shown = vm.ssh(f"for i in $(seq 120); do test -e {out} && break; sleep 1; done; cat {out}")
        cpus, cgroup = cpus_and_cgroup(shown.stdout)
        assert (cpus, cgroup) == ("2-3", f"/latencyd.slice/{APP_SERVICE}.service"), shown.stdout
    finally:
        vm.ssh(f"systemctl stop {APP_SERVICE}; rm -f {out}")


def test_a_scopes_run_ends_without_an_error(shielded: Vm) -> None:
    shielded.ssh("systemd-run --scope --quiet latencyctl run -- true")
    status = shielded.ssh("latencyctl status").stdout
    assert "last error" not in status, status
