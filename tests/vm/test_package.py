"""The Debian package on a machine like our users' (issue 54), from install to purge, on a
VM as the image boots (no `make install`):

- `apt install ./latencyd_*.deb` beside a running tuned.service says so, and stops it;
- it pulls only Debian's packages: the guest has no network,
  so its apt reads a copy of Debian's signed index and the files the install needs are
  fetched on the host (tests/qemu.py: serve_debian_index, serve_pool_files);
- after a reboot the service is active with the default profile before multi-user.target,
  and `latencyctl status` answers root and a plain user;
- an upgrade (`dpkg -i`) to a higher version under cpu-partitioning beside a running
  application (a service in latencyd.slice): sampled through the upgrade, none of the
  application's affinity samples off the shield and no setting the profile made seen with
  another value;
- `apt remove latencyd`: the service stopped, the kernel's settings and cgroups as before
  the install; installed again, the service resumes the profile in force before;
- `apt purge latencyd`: the service stopped, the kernel's settings and cgroups as
  tests/machine_state.py reads them identical to before the install, no file of latencyd
  left; and once `apt autoremove --purge` has taken the Debian packages the install pulled
  in, /etc, /boot and the file list (of / and /run) as before the install.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.machine_state import differences
from tests.qemu import (
    BOOT_TIMEOUT,
    GUEST_MIRROR,
    REPO,
    Vm,
    guest_profile,
    pool_files,
    serve_debian_index,
    serve_pool_files,
)
from tests.vm.profiles import DEFAULT_PROFILE, PARTITIONING

CHANGELOG = REPO / "debian/changelog"
VERSION = subprocess.run(["dpkg-parsechangelog", "-l", str(CHANGELOG), "-S", "Version"],
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
UPGRADE = f"{VERSION}+vmtest1"  # dpkg orders it after VERSION
WORK = "/root/pkgtest"  # the test's own files in the guest, left out of every comparison
# Where apt and dpkg keep their own records (what they installed, logs, caches): these
# change with any install and are not latencyd's.
BOOKKEEPING = ("/var/lib/dpkg/", "/var/lib/apt/", "/var/cache/apt/", "/var/log/",
               "/var/cache/debconf/", "/var/cache/ldconfig/")  # fmt: skip
# What differences() reports that is no kernel setting here: a pid's cgroup (pids are
# reused in the guest), and /run/systemd's entries by name (kept for the host without
# systemd, where they are nspawn's and systemd-analyze's leftovers; on the guest they are
# systemd's own runtime directories, made on demand: what is in them is checked file by
# file against the file list from before, after the purge).
NOT_SETTINGS = ("pid ", "run_systemd: ")
TUNED = "/run/systemd/system/tuned.service"  # a stand-in for TuneD's unit
DAEMONS_CGROUP = "/sys/fs/cgroup/system.slice/latencyd.service/"
APP = "vm-app"  # the application, a service in latencyd.slice
APP_COMMAND = "python3 -c 'import time\nwhile True: time.sleep(0.01)'"
ISOLATED = "2,3"  # PARTITIONING's isolated_cores, as an affinity reads


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """latencyd's package at debian/changelog's version and at a higher one (`make deb`)."""
    built = {}
    for version in (VERSION, UPGRADE):
        out = tmp_path_factory.mktemp("deb")
        done = subprocess.run(["make", "--no-print-directory", "deb", f"DEB_VERSION={version}"],
                              cwd=REPO, env={**os.environ, "DEB_OUT": str(out)},
                              capture_output=True, text=True, timeout=1800)  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
        built[version] = out / f"latencyd_{version}_all.deb"
    return built


def guest_tools() -> bytes:
    """tests/machine_state.py (with what it imports: the latencyd code it reads tracefs
    with, tests/qemu.py's CACHE and so tests/harness.py) and the sampler, for the guest's
    python3."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in ("tests/__init__.py", "tests/machine_state.py", "tests/qemu.py",
                    "tests/harness.py", "tests/vm/guest_sampler.py"):  # fmt: skip
            tar.add(REPO / rel, arcname=rel)
        tar.add(REPO / "latencyd", arcname="latencyd",
                filter=lambda t: None if "__pycache__" in t.name else t)  # fmt: skip
    return buf.getvalue()


def snapshot(vm: Vm) -> dict[str, object]:
    """tests/machine_state.py's snapshot, taken in the guest."""
    code = "import json; from tests.machine_state import snapshot; print(json.dumps(snapshot()))"
    out = vm.ssh(f"cd {WORK} && python3 -c {shlex.quote(code)}", timeout=BOOT_TIMEOUT).stdout
    found: dict[str, object] = json.loads(out)
    return found


def made_by_profile(
    untuned: dict[str, object], tuned: dict[str, object]
) -> tuple[list[str], list[int]]:
    """The settings a profile made, from two snapshots: the files (cgroups among them) it
    changed or made, and the kernel threads (pids) whose affinity or policy it changed.
    Not the daemon's own cgroup's files: systemd makes that cgroup when it starts the
    service and removes it when it stops (a restart's gap), as for any service."""
    files_before, files_tuned = untuned["files"], tuned["files"]
    threads_before, threads_tuned = untuned["kthreads"], tuned["kthreads"]
    assert isinstance(files_before, dict) and isinstance(files_tuned, dict)
    assert isinstance(threads_before, dict) and isinstance(threads_tuned, dict)
    files = [k for k, v in files_tuned.items()
             if files_before.get(k) != v and not k.startswith(DAEMONS_CGROUP)]  # fmt: skip
    threads = [int(k.split(":")[0]) for k, v in threads_tuned.items()
               if k in threads_before and threads_before[k] != v]  # fmt: skip
    return files, threads


def changed(before: dict[str, object], now: dict[str, object]) -> list[str]:
    """What differs between two snapshots in kernel settings and cgroups (NOT_SETTINGS aside)."""
    return [d for d in differences(before, now) if not d.startswith(NOT_SETTINGS)]


def etc_and_boot(vm: Vm) -> dict[str, str]:
    """Every path under /etc and /boot -> its type, mode, owner, link target and content hash."""
    listing = vm.ssh("find /etc /boot -printf '%p\\t%M %u %g %l\\n'").stdout
    hashes = vm.ssh("find /etc /boot -type f -exec sha256sum {} +").stdout
    found = dict(line.split("\t", 1) for line in listing.splitlines())
    for line in hashes.splitlines():
        digest, path = line.split(None, 1)
        found[path] += f" {digest}"
    return found


def every_path(vm: Vm) -> set[str]:
    """Every path on / and /run but the test's own (its files, the Debian mirror it serves
    the guest's apt from) and the journal."""
    out = vm.ssh(f"find / /run -xdev \\( -path {WORK} -o -path {GUEST_MIRROR} "
                 "-o -path /var/log/journal \\) -prune -o -print",
                 timeout=BOOT_TIMEOUT).stdout  # fmt: skip
    return set(out.splitlines())


def packages(vm: Vm) -> set[str]:
    return set(vm.ssh("dpkg-query -W -f '${Package}=${Version}\\n'").stdout.split())


def owners(vm: Vm, paths: list[str]) -> dict[str, str]:
    """Each path (the first 50) -> what `dpkg -S` says of it, for a failure's message."""
    return {p: vm.ssh(f"dpkg-query -S {shlex.quote(p)} 2>&1; true").stdout.strip()
            for p in paths[:50]}  # fmt: skip


def owned(vm: Vm, paths: list[str]) -> dict[str, str]:
    """path -> the installed packages `dpkg -S` names for it (paths it names none for left out)."""
    if not paths:
        return {}
    out = vm.ssh("xargs -0 dpkg-query -S 2>/dev/null; true",
                 stdin="\0".join(paths).encode()).stdout  # fmt: skip
    found = {}
    for line in out.splitlines():
        names, _, path = line.partition(": ")
        found[path] = names
    return found


def monotonic_active(vm: Vm, unit: str) -> int:
    return int(vm.ssh(f"systemctl show -P ActiveEnterTimestampMonotonic {unit}").stdout)


def main_pid(vm: Vm, unit: str) -> int:
    return int(vm.ssh(f"systemctl show -P MainPID {unit}").stdout)


@contextmanager
def guest_logs_on_failure(vm: Vm) -> Iterator[None]:
    """On a failure, what the guest's dpkg and latencyd said (its journal is kept across
    the reboot), printed before the VM is powered off and its disk with it."""
    try:
        yield
    except BaseException:
        logs = vm.ssh("tail -n 150 /var/log/apt/term.log; "
                      "journalctl -o short-monotonic -u latencyd --no-pager | tail -n 250",
                      check=False, lost_ok=True)  # fmt: skip
        print(f"-- the guest's apt term.log and latencyd's journal:\n{logs.stdout}{logs.stderr}")
        raise


def test_the_package_from_install_through_upgrade_to_purge(
    debs: dict[str, Path], fresh_vm: Vm
) -> None:
    with guest_logs_on_failure(fresh_vm):
        from_install_to_purge(debs, fresh_vm)


class Findings:
    """What the test found wrong, each said as it is found (with the seconds since the
    start), the run going on where the next steps still mean something: a VM run costs
    many minutes, and one run should show every problem it can."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.problems: list[str] = []

    def step(self, name: str) -> None:
        print(f"[{time.monotonic() - self.started:4.0f} s] {name}")

    def check(self, ok: bool, problem: str) -> None:
        if not ok:
            self.step(f"FOUND: {problem}")
            self.problems.append(problem)


def from_install_to_purge(debs: dict[str, Path], vm: Vm) -> None:
    found = Findings()
    found.step("the guest's tools, the packages and Debian's index in; snapshots")
    vm.put_tree(guest_tools(), WORK)
    for deb in debs.values():
        vm.ssh(f"cat > {WORK}/{deb.name}", stdin=deb.read_bytes())
    serve_debian_index(vm)
    before = snapshot(vm)
    etc_boot_before = etc_and_boot(vm)
    paths_before = every_path(vm)
    packages_before = packages(vm)

    # -- install: only Debian's packages -------------------------------------------------
    found.step("install")
    install = f"{WORK}/latencyd_{VERSION}_all.deb"
    needed = pool_files(vm, install)
    assert needed, "nothing to fetch: the image already has latencyd's dependencies"
    for f in needed:
        assert f.uri.startswith(f"file:{GUEST_MIRROR}/deb.debian.org/debian"), f
    serve_pool_files(vm, needed)
    # Beside a running tuned.service (a stand-in: Debian's TuneD is not in the image, and
    # the postinst asks systemd only about the unit): the install says so, and latencyd's
    # start stops it (Conflicts=). Gone again before anything is compared.
    vm.ssh(f"printf '[Service]\\nExecStart=/bin/sleep infinity\\n' >{TUNED} && "
           "systemctl daemon-reload && systemctl start tuned")  # fmt: skip
    done = vm.ssh(f"apt install -y {install}", timeout=BOOT_TIMEOUT)
    assert "cannot be authenticated" not in done.stdout + done.stderr
    said = done.stdout + done.stderr
    found.check("tuned.service is running" in said, f"the install did not name TuneD:\n{said}")
    tuned = vm.ssh("systemctl is-active tuned", check=False).stdout.strip()
    found.check(tuned == "inactive", f"tuned.service {tuned} beside latencyd")
    vm.ssh(f"rm {TUNED} && systemctl daemon-reload")
    added = packages(vm) - packages_before
    from_debian = {"=".join(map(unquote, f.name.split("_")[:2])) for f in needed}
    assert added == {f"latencyd={VERSION}"} | from_debian, done.stdout
    files_of_latencyd = vm.ssh("dpkg -L latencyd").stdout.splitlines()
    assert vm.ssh("systemctl is-active latencyd").stdout.strip() == "active"

    # -- a reboot: started before multi-user.target, with the default profile -------------
    found.step("reboot")
    vm.reboot()
    assert vm.ssh("systemctl is-enabled latencyd").stdout.strip() == "enabled"
    assert vm.ssh("systemctl is-active latencyd").stdout.strip() == "active"
    ready, multi_user = monotonic_active(vm, "latencyd"), monotonic_active(vm, "multi-user.target")
    assert 0 < ready <= multi_user, f"latencyd ready at {ready} µs, multi-user.target {multi_user}"
    assert vm.ssh("latencyctl active").stdout.strip() == DEFAULT_PROFILE
    for out in (vm.ssh("latencyctl status").stdout,
                vm.as_user("alice", "latencyctl status").stdout):  # fmt: skip
        assert f"active profile: {DEFAULT_PROFILE}" in out

    # -- an upgrade under cpu-partitioning beside a running application -------------------
    found.step("cpu-partitioning, the application, the sampler")
    guest_profile(vm, "vm-partitioning", PARTITIONING)
    vm.ssh("latencyctl switch vm-partitioning")
    vm.ssh(f"systemd-run --quiet --unit={APP} --slice=latencyd.slice {APP_COMMAND}")
    app = main_pid(vm, APP)
    assert vm.ssh(f"taskset -pc {app}").stdout.strip().endswith(f": {ISOLATED}")
    files, kthreads = made_by_profile(before, snapshot(vm))
    assert files and kthreads, "cpu-partitioning changed nothing to watch"
    vm.ssh(f"cat > {WORK}/settings.json",
           stdin=json.dumps({"files": files, "kthreads": kthreads}).encode())  # fmt: skip
    vm.ssh(f"cd {WORK} && nohup python3 tests/vm/guest_sampler.py samples.json stop {app} "
           "<settings.json >sampler.log 2>&1 &")  # fmt: skip
    old_daemon = main_pid(vm, "latencyd")
    found.step("upgrade")
    # By `dpkg -i` (the maintainer scripts are the same as apt's; the install and the
    # install after the remove go through apt).
    upgrade = vm.ssh(f"dpkg -i {WORK}/latencyd_{UPGRADE}_all.deb", timeout=BOOT_TIMEOUT)
    assert vm.ssh("dpkg-query -W -f '${Version}' latencyd").stdout == UPGRADE
    assert main_pid(vm, "latencyd") not in (0, old_daemon), "the upgrade did not restart it"
    assert vm.ssh("latencyctl active").stdout.strip() == "vm-partitioning"
    time.sleep(5)  # samples after the new daemon's start, too
    vm.ssh(f"touch {WORK}/stop; while [ ! -s {WORK}/samples.json ]; do sleep 0.2; done")
    sampled = json.loads(vm.ssh(f"cat {WORK}/samples.json").stdout)
    seen: dict[str, dict[str, int]] = sampled["seen"]
    print(f"upgrade sampled {sampled['samples']} times: app {seen['app']}")
    found.check(set(seen["app"]) == {ISOLATED}, f"the application's affinity: {seen['app']}")
    flipped = {k: v for k, v in seen.items() if k != "app" and len(v) > 1}
    found.check(not flipped, f"settings flipped during the upgrade:\n{upgrade.stdout}\n{flipped}")

    # -- remove: every original back, the service stopped; installed again, the profile
    # in force before the remove resumes (the package chose no profile) ----------------
    found.step("remove")
    vm.ssh(f"systemctl stop {APP}")
    vm.ssh("apt remove -y latencyd", timeout=BOOT_TIMEOUT)
    state = vm.ssh("systemctl is-active latencyd", check=False).stdout.strip()
    found.check(state == "inactive", f"latencyd.service {state} after the remove")
    diffs = changed(before, snapshot(vm))
    found.check(not diffs, "the remove left the machine changed:\n" + "\n".join(diffs))
    found.step("installed again")
    vm.ssh(f"apt install -y {WORK}/latencyd_{UPGRADE}_all.deb", timeout=BOOT_TIMEOUT)
    active = vm.ssh("latencyctl active").stdout.strip()
    found.check(active == "vm-partitioning", f"installed again, latencyd resumed {active!r}")

    # -- purge: the machine as before the install ----------------------------------------
    found.step("purge")
    vm.ssh("rm /etc/latencyd/profiles/vm-partitioning.toml")
    vm.ssh("apt purge -y latencyd", timeout=BOOT_TIMEOUT)
    assert vm.ssh("dpkg-query -W latencyd", check=False).returncode != 0
    state = vm.ssh("systemctl is-active latencyd", check=False).stdout.strip()
    found.check(state == "inactive", f"latencyd.service {state} after the purge")
    diffs = changed(before, snapshot(vm))
    found.check(not diffs, "the purge left the machine changed:\n" + "\n".join(diffs))
    still = [p for p in files_of_latencyd if p not in paths_before and p in every_path(vm)]
    found.check(not still, f"latencyd's files left: {still}")
    claimed = [p for p, names in owned(vm, files_of_latencyd).items() if "latencyd" in names]
    found.check(not claimed, f"dpkg -S still names latencyd for {claimed}")
    # The Debian packages the install pulled in stay (apt marks them as installed
    # automatically) and hold files of their own (/etc/ld.so.cache lists their libraries):
    # the machine reads as before the install once they go too, as `apt autoremove` takes
    # them. Their files are theirs, so what is left after it is latencyd's.
    found.step("autoremove")
    vm.ssh("apt autoremove --purge -y", timeout=BOOT_TIMEOUT)
    now = packages(vm)
    found.check(now == packages_before, f"packages: {now ^ packages_before}")
    etc_boot_after = etc_and_boot(vm)
    differ = {
        p: (etc_boot_before.get(p), etc_boot_after.get(p))
        for p in set(etc_boot_before) | set(etc_boot_after)
        if etc_boot_before.get(p) != etc_boot_after.get(p)
    }
    found.check(not differ, f"/etc and /boot changed: {differ}")
    left = [p for p in sorted(every_path(vm) - paths_before) if not p.startswith(BOOKKEEPING)]
    found.check(not left, f"left after the purge: {owners(vm, left) if left else ''}")
    found.step(f"done; boots to ssh {[round(s) for s in vm.boot_seconds]} s")
    assert not found.problems, "\n\n".join(found.problems)
