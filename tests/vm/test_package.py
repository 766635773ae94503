"""The Debian package on a machine like our users' (issue 54), from install to purge, on a
VM as the image boots (no `make install`), its grub.cfg update-grub's as on a user's:

- `apt install ./latencyd_*.deb` beside a running tuned.service says so, and stops it;
- it pulls only Debian's packages: the guest has no network,
  so its apt reads a copy of Debian's signed index and the files the install needs are
  fetched on the host (tests/qemu.py: serve_debian_index, serve_pool_files);
- after a reboot the service is active with the default profile before multi-user.target,
  and `latencyctl status` answers root and a plain user;
- two upgrades to a higher version, by apt and by `dpkg -i`, under cpu-partitioning (its
  boot arguments written to GRUB's configuration) beside a running application (a
  service in latencyd.slice): sampled through each upgrade, none of the application's
  affinity samples off the shield, the application kept in its cgroup, no setting the
  profile made seen with another value, the boot configuration as before;
- `apt remove latencyd`: the service stopped, the kernel's settings and cgroups as before
  the install, the boot configuration too (update-grub run) and no boot record left;
  installed again, the service resumes the profile in force before;
- `apt purge latencyd`: the service stopped, the kernel's settings and cgroups as
  tests/machine_state.py reads them identical to before the install, /etc and /boot too
  but for the files of the Debian packages the install pulled in (dpkg -S), and no file
  of latencyd's left (its file list, a directory another package holds aside); and once
  `apt autoremove --purge` has taken those packages (and those apt keeps because a package
  of the image recommends them, purged), /etc, /boot and the file list (of / and /run) as
  before the install;
- between the install and the remove the machine reboots: what the kernel sets anew at a
  boot (memory reserves, an IRQ thread's affinity, which follows its IRQ) is not compared.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

from latencyd.kernel import bootloaders
from latencyd.kernel.cgroups import APP_SLICE
from latencyd.paths import BOOT_RECORD
from tests.machine_state import differences
from tests.qemu import (
    BOOT_TIMEOUT,
    GUEST_MIRROR,
    REPO,
    Vm,
    as_a_debian_machine,
    guest_profile,
    pool_files,
    serve_debian_index,
    serve_pool_files,
)
from tests.vm.profiles import DEFAULT_PROFILE, PARTITIONING_WRITTEN

CHANGELOG = REPO / "debian/changelog"
VERSION = subprocess.run(["dpkg-parsechangelog", "-l", str(CHANGELOG), "-S", "Version"],
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
# The upgrades, each to a higher version (dpkg orders them after VERSION): apt's, then
# dpkg -i's.
UPGRADES = (f"{VERSION}+vmtest1", f"{VERSION}+vmtest2")
WORK = "/root/pkgtest"  # the test's own files in the guest, left out of every comparison
# Where apt and dpkg keep their own records (what they installed, logs, caches): these
# change with any install and are not latencyd's; nor are systemd's below.
BOOKKEEPING = ("/var/lib/dpkg/", "/var/lib/apt/", "/var/cache/apt/", "/var/log/",
               "/var/cache/debconf/", "/var/cache/ldconfig/",
               # systemd's own, named anew at each boot or connection (the install and
               # the purge are a reboot apart): journald's stream of each running
               # service, a service's PrivateTmp= directories (named with the boot id),
               # udev's device database (by device numbers, given in probe order: the
               # PC speaker's input event device was c13:66 in one boot, not the other),
               # and its watches of block devices, named by inotify watch descriptor, which
               # each boot and each change event hands out anew (a fresh-clone run of
               # 2026-11-30 found watch/13-20 after the purge, none listed before it).
               "/run/systemd/journal/streams/", "/tmp/systemd-private-",
               "/var/tmp/systemd-private-", "/run/udev/links/", "/run/udev/tags/",
               "/run/udev/data/", "/run/udev/watch/")  # fmt: skip
# What differences() reports that is no kernel setting here: a pid's cgroup (pids are
# reused in the guest), and /run/systemd's entries by name (kept for the host without
# systemd, where they are nspawn's and systemd-analyze's leftovers; on the guest they are
# systemd's own runtime directories, made on demand: what is in them is checked file by
# file against the file list from before, after the purge).
NOT_SETTINGS = ("pid ", "run_systemd: ")
TUNED = "/run/systemd/system/tuned.service"  # a stand-in for TuneD's unit
UNIFIED = "/sys/fs/cgroup/"
DAEMON_CGROUP = f"{UNIFIED}system.slice/latencyd.service/"
# A cgroup systemd makes for a unit running under its system or user slice.
UNIT_CGROUP = re.compile(r"/sys/fs/cgroup/(system|user)\.slice/(.+/)?[^/]+\.(service|scope)/")
APP = "vm-app"  # the application, a service in latencyd.slice
APP_COMMAND = "python3 -c 'import time\nwhile True: time.sleep(0.01)'"
ISOLATED = "2,3"  # PARTITIONING_WRITTEN's isolated_cores, as an affinity reads
PROFILE = "vm-partitioning"  # PARTITIONING_WRITTEN: cpu-partitioning, boot arguments written
GRUB_DROP_IN = f"/{bootloaders.GRUB_DROP_IN}"  # latencyd's arguments for GRUB


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """latencyd's package at debian/changelog's version and at the first upgrade's
    (`make deb`, ~2 min each), and the second upgrade's: the first's files at a higher
    version (dpkg-deb), an upgrade that changes no file."""
    built = {}
    for version, asked in ((VERSION, ""), (UPGRADES[0], UPGRADES[0])):  # "": the changelog's
        out = tmp_path_factory.mktemp("deb")
        done = subprocess.run(["make", "--no-print-directory", "deb", f"DEB_VERSION={asked}"],
                              cwd=REPO, env={**os.environ, "DEB_OUT": str(out)},
                              capture_output=True, text=True, timeout=1800)  # fmt: skip
        assert done.returncode == 0, done.stderr + done.stdout
        built[version] = out / f"latencyd_{version}_all.deb"
    tree = tmp_path_factory.mktemp("repack") / "tree"
    subprocess.run(["dpkg-deb", "--raw-extract", str(built[UPGRADES[0]]), str(tree)],
                   check=True, capture_output=True)  # fmt: skip
    control = tree / "DEBIAN/control"
    text = control.read_text()
    assert f"\nVersion: {UPGRADES[0]}\n" in text, text
    control.write_text(text.replace(f"\nVersion: {UPGRADES[0]}\n", f"\nVersion: {UPGRADES[1]}\n"))
    built[UPGRADES[1]] = tree.parent / f"latencyd_{UPGRADES[1]}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(tree),
                    str(built[UPGRADES[1]])], check=True, capture_output=True)  # fmt: skip
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
    """tests/machine_state.py's snapshot, taken in the guest, and each IRQ's handlers by
    name (latencyd's /proc/interrupts decoder, run there), for across_a_reboot."""
    code = ("import json; from tests.machine_state import snapshot; "
            "from latencyd.kernel.procstat import parse_interrupts; "
            "found = snapshot(); "
            "irqs = parse_interrupts(open('/proc/interrupts').read(), with_counts=False)[1]; "
            "found['irq_actions'] = {i.number: i.actions for i in irqs}; "
            "print(json.dumps(found))")  # fmt: skip
    out = vm.ssh(f"cd {WORK} && python3 -c {shlex.quote(code)}", timeout=BOOT_TIMEOUT).stdout
    found: dict[str, object] = json.loads(out)
    actions = found.pop("irq_actions")
    assert isinstance(actions, dict)
    found["irq_names"] = irq_names(actions)
    return found


def irq_names(actions: dict[str, list[str]]) -> dict[str, str]:
    """IRQ number -> its handlers' names, from each IRQ's actions (as /proc/interrupts
    lists them). IRQs without a handler are not named, nor those whose names another IRQ
    has too ("PCIe PME" on each root port): keyed by such a name, two masks would be one."""
    joined = {number: ",".join(sorted(names)) for number, names in actions.items() if names}
    seen = Counter(joined.values())
    return {number: names for number, names in joined.items() if seen[names] == 1}


def made_by_profile(
    untuned: dict[str, object], tuned: dict[str, object]
) -> tuple[list[str], list[int]]:
    """The settings a profile made, from two snapshots: the files it changed (cgroups'
    among them) and those of the cgroups it made (latencyd.slice's: the application's
    slice and the application's own), and the kernel threads (pids) whose affinity or
    policy it changed. Not other cgroups new since `untuned`: services systemd starts
    and stops (latencyd.service itself, for a restart's gap; a D-Bus-activated one),
    whose files come and go with them."""
    files_before, files_tuned = untuned["files"], tuned["files"]
    threads_before, threads_tuned = untuned["kthreads"], tuned["kthreads"]
    assert isinstance(files_before, dict) and isinstance(files_tuned, dict)
    assert isinstance(threads_before, dict) and isinstance(threads_tuned, dict)
    made = f"{UNIFIED}{APP_SLICE}/"
    files = [k for k, v in files_tuned.items()
             if (files_before[k] != v if k in files_before else k.startswith(made))]  # fmt: skip
    threads = [int(k.split(":")[0]) for k, v in threads_tuned.items()
               if k in threads_before and threads_before[k] != v]  # fmt: skip
    return files, threads


# What the kernel sets anew at each boot, so reads otherwise after the reboot between the
# install and the remove without a setting changing: the memory reserves, computed at boot
# from the memory free then (mm/util.c: a 32nd of it, at most 128 MB, for user_reserve).
BOOT_COMPUTED = ("/proc/sys/vm/user_reserve_kbytes", "/proc/sys/vm/admin_reserve_kbytes")
# An IRQ thread's affinity is its IRQ's effective affinity, which the kernel gives it the
# next time the IRQ fires (irq_thread_check_affinity): one that fired in one boot and not
# in the other reads otherwise. Its IRQ's smp_affinity_list is compared, and the thread's
# policy and priority.
IRQ_THREAD = re.compile(r"^\d+:irq/")
AFFINITY = re.compile(r"^\[[\d, ]*\] ")


def across_a_reboot(snapshot: dict[str, object]) -> dict[str, object]:
    """`snapshot` less what a reboot changes by itself (BOOT_COMPUTED, IRQ_THREAD), and
    each IRQ's mask keyed by its handlers' names, not its number: the numbers are given
    in probe order, which another boot may change (a fresh-clone run of 2026-11-30 saw
    virtio's seven MSI-X vectors three numbers apart after the reboot)."""
    files, kthreads = snapshot["files"], snapshot["kthreads"]
    names = snapshot.get("irq_names", {})
    assert isinstance(files, dict) and isinstance(kthreads, dict) and isinstance(names, dict)
    kept = {by_irq_name(k, names): v for k, v in files.items() if k not in BOOT_COMPUTED}
    threads = {k: AFFINITY.sub("", v) if IRQ_THREAD.match(k) else v for k, v in kthreads.items()}
    rest = {k: v for k, v in snapshot.items() if k != "irq_names"}
    return {**rest, "files": kept, "kthreads": threads}


IRQ_MASK = re.compile(r"^/proc/irq/(\d+)/smp_affinity_list$")


def by_irq_name(key: str, names: dict[str, str]) -> str:
    """/proc/irq/N/smp_affinity_list as `IRQ <its handlers' names> smp_affinity_list`
    where N has handlers; any other key as it is."""
    found = IRQ_MASK.match(key)
    if found is None or found[1] not in names:
        return key
    return f"IRQ {names[found[1]]} smp_affinity_list"


def changed(before: dict[str, object], now: dict[str, object]) -> list[str]:
    """What differs between two snapshots in kernel settings and cgroups (NOT_SETTINGS aside).
    A cgroup of a service or scope under system.slice or user.slice that is in only one of
    them is left out: systemd made it for a unit that started since (or removed it for one
    that ended), as on any machine; latencyd's own (latencyd.service after it stopped,
    latencyd.slice, the shield's unit settings) are compared."""
    files_before, files_now = before["files"], now["files"]
    assert isinstance(files_before, dict) and isinstance(files_now, dict)
    units = {k for k in files_before.keys() ^ files_now.keys()
             if UNIT_CGROUP.match(k) and not k.startswith(DAEMON_CGROUP)}  # fmt: skip
    kept_before = {k: v for k, v in files_before.items() if k not in units}
    kept_now = {k: v for k, v in files_now.items() if k not in units}
    diffs = differences(across_a_reboot({**before, "files": kept_before}),
                        across_a_reboot({**now, "files": kept_now}))  # fmt: skip
    return [d for d in diffs if not d.startswith(NOT_SETTINGS)]


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


def names(said: str) -> set[str]:
    """The package names in what `dpkg -S` says owns a path ("a, b:amd64"), arch left out."""
    return {name.split(":")[0] for name in said.split(", ") if name}


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


@dataclass
class Watched:
    """What an upgrade is sampled for: the application and the settings the profile made."""

    app: int  # the application's pid
    files: list[str]
    kthreads: list[int]


def boot_part(etc_boot: dict[str, str]) -> dict[str, str]:
    """etc_and_boot's boot configuration: /etc/default/grub, its drop-ins, and /boot."""
    return {p: v for p, v in etc_boot.items() if p.startswith(("/etc/default/grub", "/boot"))}


def differing(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple[str | None, ...]]:
    return {p: (before.get(p), after.get(p)) for p in sorted(set(before) | set(after))
            if before.get(p) != after.get(p)}  # fmt: skip


def sampled_upgrade(vm: Vm, found: Findings, command: str, version: str, watched: Watched) -> None:
    """`command` upgrades latencyd to `version` while the sampler (tests/vm/guest_sampler.py)
    runs, from before it starts until a few seconds after the new daemon's start: none of
    the application's affinity samples off the shield, the application kept in its cgroup,
    no setting seen with two values, the boot configuration as before; the new daemon
    runs the profile the old one did."""
    old_daemon = main_pid(vm, "latencyd")
    boot_before = boot_part(etc_and_boot(vm))
    # In braces, so only the sampler goes to the background: a list `a && b &` runs in a
    # subshell that holds ssh's output open until the sampler ends.
    vm.ssh(f"cd {WORK} && rm -f samples.json samples.json.started stop && "
           f"{{ nohup python3 tests/vm/guest_sampler.py samples.json stop {watched.app} "
           "<settings.json >sampler.log 2>&1 & }")  # fmt: skip
    started = vm.ssh(f"cd {WORK} && for i in $(seq 600); do [ -e samples.json.started ] && "
                     "exit 0; sleep 0.5; done; cat sampler.log; exit 1", check=False)  # fmt: skip
    assert started.returncode == 0, f"the sampler did not start: {started.stdout}"
    done = vm.ssh(command, timeout=BOOT_TIMEOUT)
    assert vm.ssh("dpkg-query -W -f '${Version}' latencyd").stdout == version
    assert main_pid(vm, "latencyd") not in (0, old_daemon), "the upgrade did not restart it"
    active = vm.ssh("latencyctl active").stdout.strip()
    found.check(active == PROFILE, f"after the upgrade to {version}, {active!r} in force")
    time.sleep(5)  # samples after the new daemon's start, too
    ended = vm.ssh(f"cd {WORK} && touch stop; for i in $(seq 600); do [ -s samples.json ] && "
                   "exit 0; sleep 0.5; done; cat sampler.log; exit 1", check=False)  # fmt: skip
    assert ended.returncode == 0, f"the sampler wrote nothing: {ended.stdout}"
    sampled = json.loads(vm.ssh(f"cat {WORK}/samples.json").stdout)
    seen: dict[str, dict[str, int]] = sampled["seen"]
    print(f"upgrade to {version} sampled {sampled['samples']} times: app {seen.get('app')}")
    assert sampled["samples"] > 0
    found.check(set(seen.get("app", {})) == {ISOLATED},
                f"upgrade to {version}: the application's affinity: {seen.get('app')}")  # fmt: skip
    cgroups = set(seen.get("app cgroup", {}))
    found.check(len(cgroups) == 1 and next(iter(cgroups)).startswith(f"0::/{APP_SLICE}/"),
                f"upgrade to {version}: the application's cgroup: {cgroups}")  # fmt: skip
    flipped = {k: v for k, v in seen.items() if k not in ("app", "app cgroup") and len(v) > 1}
    found.check(not flipped, f"settings flipped during the upgrade to {version}:\n"
                f"{done.stdout}{done.stderr}\n{flipped}")  # fmt: skip
    boot = differing(boot_before, boot_part(etc_and_boot(vm)))
    found.check(not boot, f"the upgrade to {version} changed the boot configuration: {boot}")


def from_install_to_purge(debs: dict[str, Path], vm: Vm) -> None:
    found = Findings()
    found.step("GRUB as on a user's machine (update-grub); the guest's tools, the packages")
    as_a_debian_machine(vm)  # so a restore's update-grub writes back the grub.cfg of before
    vm.put_tree(guest_tools(), WORK)
    for deb in debs.values():
        vm.ssh(f"cat > {WORK}/{deb.name}", stdin=deb.read_bytes())
    serve_debian_index(vm)
    found.step("snapshots")
    before = snapshot(vm)
    etc_boot_before = etc_and_boot(vm)
    paths_before = every_path(vm)
    packages_before = packages(vm)

    # -- install: only Debian's packages -------------------------------------------------
    found.step("install")
    install = f"latencyd_{VERSION}_all.deb"
    needed = pool_files(vm, f"{WORK}/{install}")
    assert needed, "nothing to fetch: the image already has latencyd's dependencies"
    for f in needed:
        assert f.uri.startswith(f"file:{GUEST_MIRROR}/deb.debian.org/debian"), f
    serve_pool_files(vm, needed)
    # Beside a running tuned.service (a stand-in: Debian's TuneD is not in the image, and
    # the postinst asks systemd only about the unit): the install says so, and latencyd's
    # start stops it (Conflicts=). Gone again before anything is compared.
    vm.ssh(f"printf '[Service]\\nExecStart=/bin/sleep infinity\\n' >{TUNED} && "
           "systemctl daemon-reload && systemctl start tuned")  # fmt: skip
    done = vm.ssh(f"cd {WORK} && apt install -y ./{install}", timeout=BOOT_TIMEOUT)  # as a user
    said = done.stdout + done.stderr
    assert "cannot be authenticated" not in said
    found.check("tuned.service is running" in said, f"the install did not name TuneD:\n{said}")
    tuned = vm.ssh("systemctl is-active tuned", check=False).stdout.strip()
    found.check(tuned == "inactive", f"tuned.service {tuned} beside latencyd")
    vm.ssh(f"rm {TUNED} && systemctl daemon-reload")
    added = packages(vm) - packages_before
    from_debian = {"=".join(map(unquote, f.name.split("_")[:2])) for f in needed}
    assert added == {f"latencyd={VERSION}"} | from_debian, done.stdout
    pulled_in = {p.split("=")[0] for p in from_debian}
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

    # -- upgrades under cpu-partitioning beside a running application -------------------
    found.step("cpu-partitioning (its boot arguments written), the application")
    guest_profile(vm, PROFILE, PARTITIONING_WRITTEN)
    vm.ssh(f"latencyctl switch {PROFILE}", timeout=BOOT_TIMEOUT)  # update-grub: minutes
    assert "nohz_full=2-3" in vm.ssh(f"cat {GRUB_DROP_IN} /boot/grub/grub.cfg").stdout
    vm.ssh(f"systemd-run --quiet --unit={APP} --slice={APP_SLICE} {APP_COMMAND}")
    app = main_pid(vm, APP)
    assert vm.ssh(f"taskset -pc {app}").stdout.strip().endswith(f": {ISOLATED}")
    files, kthreads = made_by_profile(before, snapshot(vm))
    assert files and kthreads, "cpu-partitioning changed nothing to watch"
    watched = Watched(app, [*files, GRUB_DROP_IN], kthreads)
    vm.ssh(f"cat > {WORK}/settings.json",
           stdin=json.dumps({"files": watched.files, "kthreads": kthreads}).encode())  # fmt: skip
    # By apt, as a user upgrades, then by `dpkg -i` (the "through dpkg -i too").
    found.step("upgrade by apt")
    sampled_upgrade(vm, found, f"cd {WORK} && apt install -y ./latencyd_{UPGRADES[0]}_all.deb",
                    UPGRADES[0], watched)  # fmt: skip
    found.step("upgrade by dpkg -i")
    sampled_upgrade(vm, found, f"dpkg -i {WORK}/latencyd_{UPGRADES[1]}_all.deb",
                    UPGRADES[1], watched)  # fmt: skip

    # -- remove: every original back (the boot configuration too), the service stopped;
    # installed again, the profile in force before the remove resumes (the package chose
    # no profile) -----------------------------------------------------------------------
    found.step("remove")
    vm.ssh(f"systemctl stop {APP}")
    vm.ssh("apt remove -y latencyd", timeout=BOOT_TIMEOUT)
    state = vm.ssh("systemctl is-active latencyd", check=False).stdout.strip()
    found.check(state == "inactive", f"latencyd.service {state} after the remove")
    diffs = changed(before, snapshot(vm))
    found.check(not diffs, "the remove left the machine changed:\n" + "\n".join(diffs))
    boot = differing(boot_part(etc_boot_before), boot_part(etc_and_boot(vm)))
    found.check(not boot, f"the remove left the boot configuration changed: {boot}")
    record = vm.ssh(f"cat {BOOT_RECORD}", check=False).stdout
    found.check(not record, f"the remove left latencyd's boot record: {record}")
    found.step("installed again")
    vm.ssh(f"cd {WORK} && apt install -y ./latencyd_{UPGRADES[1]}_all.deb", timeout=BOOT_TIMEOUT)
    active = vm.ssh("latencyctl active").stdout.strip()
    found.check(active == PROFILE, f"installed again, latencyd resumed {active!r}")
    written = vm.ssh(f"cat {GRUB_DROP_IN}", check=False).stdout
    found.check("nohz_full=2-3" in written, f"installed again, GRUB's drop-in: {written!r}")

    # -- purge: the machine as before the install ----------------------------------------
    found.step("purge")
    vm.ssh(f"rm /etc/latencyd/profiles/{PROFILE}.toml")  # the administrator's, not latencyd's
    vm.ssh("apt purge -y latencyd", timeout=BOOT_TIMEOUT)
    assert vm.ssh("dpkg-query -W latencyd", check=False).returncode != 0
    state = vm.ssh("systemctl is-active latencyd", check=False).stdout.strip()
    found.check(state == "inactive", f"latencyd.service {state} after the purge")
    diffs = changed(before, snapshot(vm))
    found.check(not diffs, "the purge left the machine changed:\n" + "\n".join(diffs))
    # /etc and /boot: what differs is the Debian packages' the install pulled in (dpkg -S),
    # or /etc/ld.so.cache, which lists their libraries.
    etc_boot = differing(etc_boot_before, etc_and_boot(vm))
    theirs = owned(vm, list(etc_boot))
    not_theirs = {p: v for p, v in etc_boot.items() if p != "/etc/ld.so.cache"
                  and not pulled_in & names(theirs.get(p, ""))}  # fmt: skip
    found.check(not not_theirs, f"the purge left /etc or /boot changed: {not_theirs}")
    # latencyd's files (its file list, dpkg -L) not there before: a directory another
    # package holds too (dpkg -S names it) stays, nothing else of latencyd's.
    now = every_path(vm)
    remaining = [p for p in files_of_latencyd if p not in paths_before and p in now]
    others = owned(vm, remaining)
    still = [p for p in remaining if p not in others]
    found.check(not still, f"latencyd's files left: {still}")
    # The Debian packages the install pulled in stay (apt marks them as installed
    # automatically) and hold files of their own (/etc/ld.so.cache lists their libraries):
    # the machine reads as before the install once they go too, as `apt autoremove` takes
    # them. Their files are theirs, so what is left after it is latencyd's.
    found.step("autoremove")
    vm.ssh("apt autoremove --purge -y", timeout=BOOT_TIMEOUT)
    # apt keeps an automatically installed package that a package installed before
    # recommends or suggests (APT::AutoRemove::RecommendsImportant, the default): python3-gi,
    # which python3-pyudev pulled in and the image's python3-dbus recommends. Keeping it is
    # apt's rule for every package, not latencyd's: each such package must be one the
    # install pulled in and kept for that reason alone (apt would autoremove it without
    # the rule); it is then purged, for the comparisons below.
    kept = {p.split("=")[0] for p in packages(vm) - packages_before}
    found.check(kept <= pulled_in, f"packages the install did not pull in: {kept - pulled_in}")
    if kept:
        would = vm.ssh("apt-get -s -o APT::AutoRemove::RecommendsImportant=false "
                       "-o APT::AutoRemove::SuggestsImportant=false autoremove").stdout  # fmt: skip
        only_wanted = {line.split()[1] for line in would.splitlines() if line.startswith("Remv ")}
        found.check(kept <= only_wanted, f"kept by apt for no recommendation: {kept - only_wanted}")
        found.step(f"purged, kept by apt for a package recommending them: {sorted(kept)}")
        vm.ssh(f"apt purge -y {' '.join(sorted(kept))}", timeout=BOOT_TIMEOUT)
    installed = packages(vm)
    found.check(installed == packages_before, f"packages: {installed ^ packages_before}")
    etc_boot = differing(etc_boot_before, etc_and_boot(vm))
    found.check(not etc_boot, f"/etc and /boot changed: {etc_boot}")
    left = [p for p in sorted(every_path(vm) - paths_before) if not p.startswith(BOOKKEEPING)]
    found.check(not left, f"left after the purge: {owners(vm, left) if left else ''}")
    found.step(f"done; boots to ssh {[round(s) for s in vm.boot_seconds]} s")
    assert not found.problems, "\n\n".join(found.problems)
