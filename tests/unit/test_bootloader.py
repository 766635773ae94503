"""[bootloader]: kernel arguments for the next boot, written through each mechanism on a
staged root, then taken back by off: the staged files byte-identical to before. The real
tool where Debian has it: kernel-install, and GRUB's update-grub and grub-mkconfig (run
in a mount namespace of their own, see real_update_grub); stand-ins only for grubby and
rpm-ostree, which Debian lacks (and for update-grub in one test of the logic where GRUB
is not installed). The machine's own boot configuration is never touched: every System
here has a staged root."""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.bootloader import NOT_WRITTEN, BootArguments, BootloaderPlugin
from latencyd.plugins.sysctl import SysctlPlugin

from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import Plugin
from latencyd.core.profile import Profile, ProfileLibrary
from latencyd.core.schema import SchemaError, validate
from latencyd.cpuset import CpuSet
from latencyd.errors import KernelRefused, PermissionDenied
from latencyd.kernel.bootloaders import (
    GRUB_DROP_IN,
    KERNEL_CMDLINE,
    RECORD,
    DebianGrub,
    Grubby,
    KernelInstall,
    PlainFile,
    Record,
    RpmOstree,
    detect,
    in_effect,
    read_record,
    write_boot,
)
from latencyd.kernel.cmdline import Change, rewritten, unsafe
from latencyd.kernel.system import Machine, System
from latencyd.service.daemon import Caller, Daemon
from latencyd.service.sdnotify import FdStore
from tests.fdstore import FdStoreStandIn
from tests.harness import wait_for
from tests.unit.fakesys import make_fake_root

VERSION = "0.0.0-latencyd-test"  # a kernel no host has: kernel-install's plugins skip it
MACHINE = Machine(CpuSet.from_list("0-3"), 8 << 30)


def tree(root: Path, copied_from: Path | None = None) -> dict[str, bytes]:
    """Every file below `root`, the root's own path in them (and that of the root it is a
    copy of) said as <root>: kernel-install's entries name their image by it, so staged
    roots compare."""

    def text(data: bytes) -> bytes:
        for at in (root, copied_from):
            data = data.replace(str(at).encode(), b"<root>") if at else data
        return data

    return {str(p.relative_to(root)): text(p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def tool(root: Path, name: str, body: str) -> None:
    """A stand-in for a tool Debian does not have, in the staged root's /usr/sbin (where
    latencyd looks for a staged root's tools: never the host's)."""
    path = root / "usr/sbin" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_the_pure_rewrite_gives_a_file_back_byte_for_byte() -> None:
    text = "root=/dev/vda1 ro  quiet\n"
    new, change = rewritten(text, Change(), ["nohz_full=1", "rcu_nocbs=1"], [])
    assert new == "root=/dev/vda1 ro  quiet nohz_full=1 rcu_nocbs=1\n"
    assert rewritten(new, change, [], [])[0] == text
    new, change = rewritten(text, Change(), ["skew_tick=1"], ["quiet"])
    assert (new, change.removed) == ("root=/dev/vda1 ro  skew_tick=1\n", ("quiet",))
    assert rewritten(new, change, [], [])[0] == "root=/dev/vda1 ro  quiet\n"
    with pytest.raises(ValueError, match="has nohz_full=3 already, not latencyd's"):
        rewritten("nohz_full=3\n", Change(), ["nohz_full=1"], [])
    assert unsafe("x=$(reboot)") and unsafe("a b") and unsafe('a="b"') and not unsafe("a=1,2")


def test_kernel_install_on_a_staged_root(tmp_path: Path) -> None:
    if shutil.which("kernel-install") is None:
        pytest.skip("kernel-install is not installed")
    root = tmp_path / "root"
    (root / "etc/kernel").mkdir(parents=True)
    (root / "etc/kernel/cmdline").write_text("root=/dev/vda1 ro quiet\n")
    (root / "etc/kernel/install.conf").write_text("layout=bls\n")
    (root / "boot/loader/entries").mkdir(parents=True)
    (root / f"usr/lib/modules/{VERSION}").mkdir(parents=True)
    (root / f"usr/lib/modules/{VERSION}/vmlinuz").write_bytes(b"not a kernel")
    system = System(root)
    loader = detect(system)
    assert isinstance(loader, KernelInstall)
    before = (root / "etc/kernel/cmdline").read_bytes()
    change = write_boot(system, loader, ["nohz_full=1", "rcu_nocbs=1"], ["quiet"])
    assert (
        root / "etc/kernel/cmdline"
    ).read_text() == "root=/dev/vda1 ro nohz_full=1 rcu_nocbs=1\n"
    entry = next((root / "boot/loader/entries").glob(f"*-{VERSION}.conf")).read_text()
    options = next(ln for ln in entry.splitlines() if ln.startswith("options"))
    assert "nohz_full=1 rcu_nocbs=1" in options and "quiet" not in options.split()
    assert read_record(system) == Record(change, ("quiet",))
    write_boot(system, loader, [], [])
    assert (root / "etc/kernel/cmdline").read_bytes() == before
    entry = next((root / "boot/loader/entries").glob(f"*-{VERSION}.conf")).read_text()
    assert "nohz_full" not in entry and "quiet" in entry


GRUBBY = """
state = os.environ["FAKE_GRUBBY"]
args = open(state).read().strip()
if "--info=DEFAULT" in sys.argv:
    print(f'index=0\\nkernel="/boot/vmlinuz"\\nargs="{args}"')
    sys.exit(0)
words = args.split()
for a in sys.argv[1:]:
    if a.startswith("--remove-args="):
        gone = a.split("=", 1)[1].split()
        words = [w for w in words if w not in gone and w.split("=")[0] not in gone]
    elif a.startswith("--args="):
        words += a.split("=", 1)[1].split()
open(state, "w").write(" ".join(words) + "\\n")
"""

RPM_OSTREE = """
state = os.environ["FAKE_RPM_OSTREE"]
words = open(state).read().split()
if sys.argv[1:] == ["kargs"]:
    print(" ".join(words))
    sys.exit(0)
for a in sys.argv[2:]:
    if a.startswith("--delete="):
        words.remove(a.split("=", 1)[1])
    elif a.startswith("--append="):
        words.append(a.split("=", 1)[1])
open(state, "w").write(" ".join(words) + "\\n")
"""


@pytest.mark.parametrize("kind", ["grubby", "rpm-ostree"])
def test_grubby_and_rpm_ostree_take_back_exactly_what_they_were_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    state = tmp_path / "state"
    state.write_text("root=/dev/vda1 ro quiet rhgb\n")
    if kind == "grubby":
        tool(root, "grubby", GRUBBY)
        monkeypatch.setenv("FAKE_GRUBBY", str(state))
    else:
        tool(root, "rpm-ostree", RPM_OSTREE)
        monkeypatch.setenv("FAKE_RPM_OSTREE", str(state))
        (root / "run/ostree-booted").write_text("")
    system = System(root)
    loader = detect(system)
    assert isinstance(loader, Grubby if kind == "grubby" else RpmOstree)
    assert loader.tool == str(root / "usr/sbin" / kind)
    before = state.read_bytes()
    change = write_boot(system, loader, ["nohz_full=1", "skew_tick=1"], ["rhgb"])
    assert state.read_text().split() == ["root=/dev/vda1", "ro", "quiet", "nohz_full=1",
                                         "skew_tick=1"]  # fmt: skip
    assert change == Change(("nohz_full=1", "skew_tick=1"), ("rhgb",))
    write_boot(system, loader, [], [])
    assert sorted(state.read_bytes().split()) == sorted(before.split())


def test_debian_grub_gets_a_drop_in_of_its_own_and_update_grub(tmp_path: Path) -> None:
    """The backend's logic with a stand-in update-grub, where GRUB is not installed (with
    the real one: test_debian_grub_with_the_real_update_grub_...)."""
    root = tmp_path / "root"
    (root / "etc/default/grub.d").mkdir(parents=True)
    (root / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    ran = tmp_path / "ran"
    tool(root, "update-grub", f"open({str(ran)!r}, 'a').write('ran\\n')\n")
    system = System(root)
    loader = detect(system)
    assert isinstance(loader, DebianGrub)
    before = tree(root)
    write_boot(system, loader, ["nohz_full=1"], [])
    drop_in = (root / "etc/default/grub.d/latencyd.cfg").read_text()
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT nohz_full=1"' in drop_in
    write_boot(system, loader, [], [])
    assert tree(root) == before and ran.read_text() == "ran\nran\n"
    with pytest.raises(KernelRefused, match="can only add arguments"):
        write_boot(system, loader, [], ["quiet"])


def rig(tmp_path: Path, cmdline: str = "root=/dev/vda1 ro", nohz_full: bool = True) -> System:
    """A staged root with no bootloader tool: the plain file."""
    root = tmp_path / "root"
    cpu = root / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    for name, text in (("possible", "0-3"), ("online", "0-3"), ("isolated", "")):
        (cpu / name).write_text(text + "\n")
    if nohz_full:
        (cpu / "nohz_full").write_text("(null)\n")
    rcutree = root / "sys/module/rcutree/parameters"
    rcutree.mkdir(parents=True)
    (rcutree / "rcu_nocb_gp_stride").write_text("-1\n")  # built with RCU_NOCB_CPU
    (root / "proc").mkdir()
    (root / "proc/cmdline").write_text(cmdline + "\n")
    return System(root)


def profile(system: System, plugin: BootloaderPlugin, section: dict[str, object]) -> Profile:
    options = validate(section_schemas({"bootloader": plugin})["bootloader"], section, MACHINE)
    return Profile("boot", Path("boot.toml"), "", {"bootloader": options}, {})


UPDATE_GRUB = Path("/usr/sbin/update-grub")
GRUB_PROBE_PATH = "/usr/sbin/grub-probe"  # where grub-mkconfig runs it from
GRUB_PATHS = ("etc/default", "etc/grub.d", "boot")  # grub-mkconfig has them built in


def real_update_grub(root: Path) -> None:
    """The real update-grub for a staged root, in its /usr/sbin (where latencyd looks for
    a staged root's tools): it runs /usr/sbin/update-grub in a mount namespace of its own
    in which the staged etc/default, etc/grub.d and boot are bound over /etc/default,
    /etc/grub.d and /boot, so the real grub-mkconfig reads the staged configuration and
    writes the staged boot/grub/grub.cfg. The namespace is private (unshare's default
    propagation, said anyway): the host never sees those mounts."""
    binds = "; ".join(f'mount --bind "$1/{p}" /{p}' for p in GRUB_PATHS)
    probe = root.parent / "grub-probe"
    if subprocess.run([GRUB_PROBE_PATH, "--target=device", str(root)],
                      capture_output=True).returncode != 0:  # fmt: skip
        # The one stand-in: grub-probe finds no disk under a tmpfs (a /tmp in RAM) or a
        # container's overlay, and grub-mkconfig stops without the root's device name.
        probe.write_text(GRUB_PROBE_STAND_IN)
        probe.chmod(0o755)
        binds += f'; mount --bind "$2" {GRUB_PROBE_PATH}'
    path = root / "usr/sbin/update-grub"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\nexport PATH=/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"exec unshare --mount --propagation private sh -ec '{binds}; exec {UPDATE_GRUB}' "
        f"sh {shlex.quote(str(root))} {shlex.quote(str(probe))}\n"
    )
    path.chmod(0o755)
    # GRUB's own scripts as grub-common ships them (not the host's whole /etc/grub.d:
    # TuneD's 00_tuned there would read the host's /etc/tuned).
    shipped = subprocess.run(["dpkg-query", "-L", "grub-common"], capture_output=True,
                             text=True, check=True).stdout.split()  # fmt: skip
    (root / "etc/grub.d").mkdir(parents=True)
    for script in (Path(p) for p in shipped if p.startswith("/etc/grub.d/")):
        if script.is_file():
            shutil.copy2(script, root / "etc/grub.d" / script.name)


GRUB_PROBE_STAND_IN = """#!/bin/sh
case " $* " in
*" --target=device "*) echo /dev/latencyd-test ;;
*) echo "stand-in grub-probe: no $*" >&2; exit 1 ;;
esac
"""


def host_files(*dirs: str) -> dict[str, tuple[int, int]]:
    """Size and modification time of every file below the host's `dirs` (its kernels
    can be large: not their bytes)."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns)
            for d in dirs for p in sorted(Path(d).rglob("*")) if p.is_file()}  # fmt: skip


def test_debian_grub_with_the_real_update_grub_and_off_gives_every_file_back(
    tmp_path: Path,
) -> None:
    if not UPDATE_GRUB.exists():
        pytest.skip(f"{UPDATE_GRUB} is not installed (grub2-common)")
    tried = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True)
    if tried.returncode != 0:
        pytest.skip(f"unshare --mount is not permitted here: {tried.stderr.strip()}")
    host = host_files("/etc/default", "/etc/grub.d", "/boot")
    system = rig(tmp_path)
    root = system.root
    (root / "etc/default/grub.d").mkdir(parents=True)
    (root / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
    (root / "boot/grub").mkdir(parents=True)
    (root / "boot/vmlinuz-6.18.0-test").write_bytes(b"not a kernel")  # 10_linux's entry
    real_update_grub(root)
    system.run_tool([str(root / "usr/sbin/update-grub")])  # grub.cfg before latencyd
    plugin = BootloaderPlugin(system)
    assert isinstance(plugin.loader, DebianGrub)
    before = tree(root)
    # Every character the allow-list lets through, in the drop-in grub-mkconfig sources.
    odd = "latencyd.test=a_b.c,d:e=f+g/h@i%j-k"
    engine = Engine({"bootloader": plugin}, Journal(tmp_path / "journal"))
    engine.apply(profile(system, plugin, {"cmdline": ["nohz_full=1", "skew_tick=1", odd],
                                          "write": True}))  # fmt: skip
    cfg = (root / "boot/grub/grub.cfg").read_text()
    linux = [ln.split() for ln in cfg.splitlines() if ln.split()[:1] == ["linux"]]
    normal = [words for words in linux if "single" not in words]
    assert len(normal) == 2 and len(linux) == 3, cfg  # the default entry, the advanced one
    for words in normal:
        # (The image's path on its filesystem: grub-mkrelpath sees through the bind mount.)
        assert words[1].endswith("/boot/vmlinuz-6.18.0-test")
        assert words[-4:] == ["quiet", "nohz_full=1", "skew_tick=1", odd], cfg
    [recovery] = [words for words in linux if "single" in words]
    assert "nohz_full=1" not in recovery  # it has GRUB_CMDLINE_LINUX only, by Debian's design
    assert engine.off() == []
    assert tree(root) == before  # the drop-in gone, grub.cfg regenerated as it was
    assert host_files("/etc/default", "/etc/grub.d", "/boot") == host
    assert str(root) not in Path("/proc/self/mountinfo").read_text()


def test_the_plugin_writes_only_when_asked_and_off_takes_it_back(tmp_path: Path) -> None:
    system = rig(tmp_path)
    plugin = BootloaderPlugin(system)
    assert isinstance(plugin.loader, PlainFile)
    engine = Engine({"bootloader": plugin}, Journal(tmp_path / "state"))
    asked = {"cmdline": ["nohz_full=all - 0", "rcu_nocbs=1-3", "nosoftlockup"]}
    engine.apply(profile(system, plugin, asked))
    refused = engine.sections["bootloader"].expansion.refused
    assert refused == dict.fromkeys(["nohz_full=1-3", "rcu_nocbs=1-3", "nosoftlockup"], NOT_WRITTEN)
    assert not (system.root / RECORD).exists() and engine.pending() == []
    before = tree(system.root)
    engine.apply(profile(system, plugin, {**asked, "write": True}))
    assert (system.root / RECORD).read_text() == "nohz_full=1-3 rcu_nocbs=1-3 nosoftlockup\n"
    assert engine.verify() == []
    [(sid, _, why)] = engine.pending()
    assert sid == ("bootloader", BootArguments())
    assert why.startswith("the next boot brings nohz_full=1-3 rcu_nocbs=1-3 nosoftlockup")
    # Booted with them: nothing pending.
    (system.root / "proc/cmdline").write_text("root=/dev/vda1 nohz_full=1-3 rcu_nocbs=1-3 "
                                              "nosoftlockup\n")  # fmt: skip
    assert engine.pending() == []
    assert engine.off() == []
    (system.root / "proc/cmdline").write_text("root=/dev/vda1 ro\n")
    assert tree(system.root) == before and read_record(system) == Record()


def test_a_plan_says_which_kernel_arguments_a_reboot_would_need(tmp_path: Path) -> None:
    """Issue 52 part 2: `latencyctl plan` says which kernel arguments a reboot would need
    (those the running kernel did not boot with, written or not), in its JSON and as the
    table's last line, writing nothing itself; from a kernel booted with them, none."""
    from latencyd.tools.cli import format_plan

    system = rig(tmp_path)
    plugin = BootloaderPlugin(system)
    engine = Engine({"bootloader": plugin}, Journal(tmp_path / "state"))
    asked = profile(system, plugin, {"cmdline": ["nohz_full=all - 0", "rcu_nocbs=1-3"]})
    before = tree(system.root)
    switch_plan = engine.plan_profile(asked)
    assert tree(system.root) == before and not (tmp_path / "state/journal.jsonl").exists()
    shown = switch_plan.as_json(engine.plugins)
    assert shown["needs_boot"] == [
        {"plugin": "bootloader", "arguments": ["nohz_full=1-3", "rcu_nocbs=1-3"]}
    ]
    assert format_plan(shown)[-1] == (
        "a reboot would need ([bootloader]): nohz_full=1-3 rcu_nocbs=1-3"
    )
    (system.root / "proc/cmdline").write_text("root=/dev/vda1 nohz_full=1-3 rcu_nocbs=1-3\n")
    booted = engine.plan_profile(asked).as_json(engine.plugins)
    assert booted["needs_boot"] == []
    assert not any(line.startswith("a reboot") for line in format_plan(booted))


def test_what_this_kernel_ignores_is_not_applicable_and_never_written(tmp_path: Path) -> None:
    system = rig(tmp_path, nohz_full=False)
    plugin = BootloaderPlugin(system)
    engine = Engine({"bootloader": plugin}, Journal(tmp_path / "state"))
    engine.apply(profile(system, plugin, {"cmdline": ["nohz_full=1", "skew_tick=1"],
                                          "write": True}))  # fmt: skip
    refused = engine.sections["bootloader"].expansion.refused
    assert list(refused) == ["nohz_full=1"] and "CONFIG_NO_HZ_FULL" in refused["nohz_full=1"]
    assert (system.root / RECORD).read_text() == "skew_tick=1\n"
    assert in_effect(read_record(system).done, "root=/dev/vda1 skew_tick=1") == []
    assert engine.off() == []


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"cmdline": ["a=$(reboot)"]}, "only letters, digits"),
        ({"cmdline": ['x="1 2"']}, "only letters, digits"),
        ({"cmdline": ["nohz_full=9"]}, "nohz_full"),
        ({"cmdline": [1]}, "expected a kernel argument"),
        # What the machine boots into is not latency tuning, and a root shell at the next
        # boot for whoever may write a profile (issue 50).
        ({"cmdline": ["init=/bin/sh"]}, "init chooses what the machine boots into"),
        ({"cmdline": ["rdinit=/bin/sh"]}, "rdinit chooses"),
        ({"cmdline": ["root=/dev/sdb1"]}, "root chooses"),
        ({"remove": ["root"]}, "root chooses"),
        ({"cmdline": ["systemd.unit=emergency.target"]}, "systemd.unit chooses"),
        ({"cmdline": ["systemd.debug-shell"]}, "systemd.debug-shell chooses"),
        ({"cmdline": ["systemd.run=/bin/sh"]}, "systemd.run chooses"),
        ({"cmdline": ["rd.break"]}, "rd.break chooses"),
        ({"cmdline": ["single"]}, "single chooses"),
        ({"cmdline": ["1"]}, "1 chooses"),
        ({"cmdline": ["module_blacklist=nvme"]}, "module_blacklist chooses"),
        ({"cmdline": ["module-blacklist=nvme"]}, "module-blacklist chooses"),
        ({"cmdline": ["apparmor=0"]}, "apparmor chooses"),
        ({"cmdline": ["Init=/bin/sh"]}, "Init chooses"),
    ],
)
def test_bad_arguments_are_refused_at_load(
    tmp_path: Path, section: dict[str, object], message: str
) -> None:
    plugin = BootloaderPlugin(rig(tmp_path))
    with pytest.raises(SchemaError, match=message):
        validate(section_schemas({"bootloader": plugin})["bootloader"], section, MACHINE)


def test_a_staged_root_never_runs_the_hosts_tools(tmp_path: Path) -> None:
    """The host's grubby would change the host's boot configuration, whatever root it was
    meant for: a staged root's tools are its own (kernel-install alone is told the root)."""
    root = tmp_path / "root"
    (root / "etc/default").mkdir(parents=True)
    (root / "etc/default/grub").write_text("")
    assert shutil.which("sh") is not None and System(root).which("sh") is None
    assert isinstance(detect(System(root)), PlainFile)  # update-grub: only its own


def test_removing_what_is_not_there_verifies_and_off_gives_everything_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = rig(tmp_path)
    tool(system.root, "grubby", GRUBBY)
    state = tmp_path / "grubby-state"
    state.write_text("root=/dev/vda1 ro quiet\n")
    monkeypatch.setenv("FAKE_GRUBBY", str(state))
    plugin = BootloaderPlugin(system)
    assert isinstance(plugin.loader, Grubby)
    engine = Engine({"bootloader": plugin}, Journal(tmp_path / "journal"))
    section = {"cmdline": ["skew_tick=1"], "remove": ["quiet", "nope"], "write": True}
    engine.apply(profile(system, plugin, section))
    assert state.read_text() == "root=/dev/vda1 ro skew_tick=1\n"
    assert engine.verify() == []  # "nope" was not there: nothing to take out, no drift
    assert engine.off() == []
    assert state.read_text().split() == ["root=/dev/vda1", "ro", "quiet"]
    assert not (system.root / RECORD).exists()


# -- the lifecycle: a failed or killed write, a reboot, a stop ----------------------------------

W = {"cmdline": ["nohz_full=1-3", "rcu_nocbs=1-3"], "remove": ["quiet"], "write": True}
W2 = {"cmdline": ["skew_tick=1", "nohz_full=2-3"], "write": True}
AWAY = {"cmdline": ["skew_tick=1"]}  # a profile with none written: a switch away
# The user's own command line: `quiet`, which W removes, comes back at the end (where a
# removed argument is put back), so it is there already for off to give the same bytes.
USERS = "root=/dev/vda1 ro mitigations=off quiet\n"

KERNEL_INSTALL_WRAPPER = """#!/bin/sh
# kernel-install as on the staged root's PATH: the real one, unless told to fail (by a
# file beside the root, where it also notes each run).
beside="$(dirname "$0")/../../.."
if [ -e "$beside/fail-always" ] || [ -e "$beside/fail-once" ]; then
    rm -f "$beside/fail-once"
    echo "kernel-install: No space left on device (a full ESP)" >&2
    exit 1
fi
echo "$*" >> "$beside/ran"
exec {real} "$@"
"""

# Stand-ins whose state lives in the staged root (boot/args), so a copied root is whole.
IN_ROOT = 'os.path.join(os.path.dirname(sys.argv[0]), "../../boot/args")'
GRUBBY_IN_ROOT = GRUBBY.replace('os.environ["FAKE_GRUBBY"]', IN_ROOT)
RPM_OSTREE_IN_ROOT = RPM_OSTREE.replace('os.environ["FAKE_RPM_OSTREE"]', IN_ROOT)
UPDATE_GRUB_IN_ROOT = """
here = os.path.dirname(sys.argv[0])
drop_in = os.path.join(here, "../../etc/default/grub.d/latencyd.cfg")
text = open(drop_in).read() if os.path.exists(drop_in) else ""
open(os.path.join(here, "../../boot/grub.cfg"), "w").write("linux /vmlinuz quiet " + text)
"""


def staged(tmp_path: Path, kind: str) -> System:
    """A staged root whose boot configuration is `kind`'s, with the user's own command
    line; its state (the journal in /run) is tmp_path/state."""
    system = rig(tmp_path, cmdline=USERS.strip())
    root = system.root
    if kind == "kernel-install":
        real = shutil.which("kernel-install")
        if real is None:
            pytest.skip("kernel-install is not installed")
        (root / "etc/kernel").mkdir(parents=True)
        (root / "etc/kernel/cmdline").write_text(USERS)
        (root / "etc/kernel/install.conf").write_text("layout=bls\n")
        (root / "boot/loader/entries").mkdir(parents=True)
        (root / f"usr/lib/modules/{VERSION}").mkdir(parents=True)
        (root / f"usr/lib/modules/{VERSION}/vmlinuz").write_bytes(b"not a kernel")
        wrapper = root / "usr/sbin/kernel-install"
        wrapper.parent.mkdir(parents=True)
        wrapper.write_text(KERNEL_INSTALL_WRAPPER.format(real=shlex.quote(real)))
        wrapper.chmod(0o755)
        image = str(root / f"usr/lib/modules/{VERSION}/vmlinuz")
        system.run_tool([str(wrapper), "add", VERSION, image], KernelInstall(system, "").env)
    elif kind == "grub":
        (root / "etc/default/grub.d").mkdir(parents=True)
        (root / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n')
        (root / "boot").mkdir()
        tool(root, "update-grub", UPDATE_GRUB_IN_ROOT)
        system.run_tool([str(root / "usr/sbin/update-grub")])
    elif kind in ("grubby", "rpm-ostree"):
        (root / "boot").mkdir()
        (root / "boot/args").write_text(USERS)
        tool(root, kind, GRUBBY_IN_ROOT if kind == "grubby" else RPM_OSTREE_IN_ROOT)
        if kind == "rpm-ostree":
            (root / "run").mkdir(exist_ok=True)
            (root / "run/ostree-booted").write_text("")
    return system


def boot_engine(system: System, state: Path) -> tuple[Engine, BootloaderPlugin]:
    plugin = BootloaderPlugin(system)
    return Engine({"bootloader": plugin}, Journal(state)), plugin


def section(kind: str, options: dict[str, object]) -> dict[str, object]:
    """A profile's section as this backend can take it: GRUB's drop-in and the plain file
    can only add."""
    if kind in ("grub", "plain") and "remove" in options:
        return {k: v for k, v in options.items() if k != "remove"}
    return options


def test_kernel_install_failing_leaves_nothing_half_written(tmp_path: Path) -> None:
    """kernel-install fails once (a full ESP): the boot configuration is put back as it was,
    nothing of latencyd's is left without its record, and the next apply writes it."""
    system = staged(tmp_path, "kernel-install")
    root = system.root
    before = tree(root)
    (root.parent / "fail-once").write_text("")
    engine, _ = boot_engine(system, tmp_path / "state")
    engine.apply(profile(system, engine.plugins["bootloader"], W))  # type: ignore[arg-type]
    [refused] = engine.not_applicable.values()
    assert "No space left on device" in refused.reason
    assert tree(root) == before  # /etc/kernel/cmdline and the entries as they were, no record
    assert engine.applied == {} and engine.off() == []
    engine.apply(profile(system, engine.plugins["bootloader"], W))  # type: ignore[arg-type]
    assert engine.not_applicable == {} and engine.verify() == []
    assert (root / "etc/kernel/cmdline").read_text() == (
        "root=/dev/vda1 ro mitigations=off nohz_full=1-3 rcu_nocbs=1-3\n"
    )
    assert engine.off() == [] and tree(root) == before


def test_kernel_install_failing_to_the_end_keeps_its_intent_for_off(tmp_path: Path) -> None:
    """kernel-install fails for the write and for putting it back: the file is back, the
    intent stays in latencyd's record (never an argument without one), and off, once the
    tool works again, gives every file back; so does a start after a reboot."""
    for after in ("off", "reboot"):
        system = staged(tmp_path / after, "kernel-install")
        root = system.root
        before = tree(root)
        (root.parent / "fail-always").write_text("")
        engine, _ = boot_engine(system, tmp_path / after / "state")
        engine.apply(profile(system, engine.plugins["bootloader"], W))  # type: ignore[arg-type]
        [refused] = engine.not_applicable.values()
        assert "putting the boot configuration back failed too" in refused.reason
        assert (root / "etc/kernel/cmdline").read_text() == USERS  # never left changed
        assert read_record(system).writing == Change(("nohz_full=1-3", "rcu_nocbs=1-3"),
                                                     ("quiet",))  # fmt: skip
        (root.parent / "fail-always").unlink()
        if after == "reboot":
            shutil.rmtree(tmp_path / after / "state")
            engine, _ = boot_engine(system, tmp_path / after / "state")
            assert engine.adopt() is not None
        assert engine.off() == []
        assert tree(root) == before, after


def test_after_a_reboot_switch_away_and_off_take_out_exactly_latencyds_arguments(
    tmp_path: Path,
) -> None:
    """The journal of originals lives in /run, which a reboot empties; latencyd's record of
    the boot configuration does not. After a reboot (the run state wiped, the kernel booted
    with the arguments) the start owns them, never as the machine's originals, writes
    nothing to keep them, and a switch away or off takes exactly them out."""
    for leave in ("switch", "off"):
        system = staged(tmp_path / leave, "kernel-install")
        root, state = system.root, tmp_path / leave / "state"
        before = tree(root)
        engine, plugin = boot_engine(system, state)
        engine.apply(profile(system, plugin, W))
        # The reboot: /run empty, the kernel booted with them.
        shutil.rmtree(state)
        (root / "proc/cmdline").write_text("root=/dev/vda1 ro mitigations=off nohz_full=1-3 "
                                           "rcu_nocbs=1-3\n")  # fmt: skip
        written = tree(root)
        ran = (root.parent / "ran").read_text()
        engine, plugin = boot_engine(system, state)
        assert engine.adopt() is not None
        engine.apply(profile(system, plugin, W))
        sid = ("bootloader", BootArguments())
        assert engine.originals[sid] == "" and engine.verify() == [] and engine.pending() == []
        assert tree(root) == written and (root.parent / "ran").read_text() == ran
        if leave == "switch":
            engine.apply(profile(system, plugin, AWAY))
        else:
            assert engine.off() == []
        (root / "proc/cmdline").write_text(USERS)
        assert tree(root) == before, leave  # quiet back, mitigations=off never touched


KILLED_RUN = """
import os, signal, sys
from pathlib import Path
import json
from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.profile import Profile
from latencyd.core.schema import validate
from latencyd.cpuset import CpuSet
from latencyd.kernel.system import Machine, System
from latencyd.plugins.bootloader import BootloaderPlugin

root, state, at, sections = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])

class KilledAt(System):
    '''SIGKILL before the at-th change this process makes to the boot configuration (its
    files, its tools) in the last apply, or after the last one.'''
    armed, steps = False, 0

    def step(self) -> None:
        if self.armed:
            self.steps += 1
            if self.steps == at:
                os.kill(os.getpid(), signal.SIGKILL)

    def replace_file(self, rel, text):
        self.step()
        super().replace_file(rel, text)

    def remove_file(self, rel):
        self.step()
        super().remove_file(rel)

    def run_tool(self, argv, env=None, timeout_s=120.0):
        self.step()
        return super().run_tool(argv, env, timeout_s)

system = KilledAt(root)
plugin = BootloaderPlugin(system)
engine = Engine({"bootloader": plugin}, Journal(Path(state)))
schema = section_schemas({"bootloader": plugin})["bootloader"]
machine = Machine(CpuSet.from_list("0-3"), 8 << 30)
for number, options in enumerate(sections):
    system.armed = number == len(sections) - 1
    section = {"bootloader": validate(schema, options, machine)}
    engine.apply(Profile("boot", Path("boot.toml"), "", section, {}))
system.step()
print(system.steps)
"""


def killed_run(root: Path, state: Path, at: int, sections: list[dict[str, object]]) -> bool:
    """The sections applied in a real process SIGKILLed at step `at` of the last; whether
    it was killed (False: it ran to the end before step `at`)."""
    done = subprocess.run(
        [sys.executable, "-c", KILLED_RUN, str(root), str(state), str(at), json.dumps(sections)],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], timeout=120,
    )  # fmt: skip
    if done.returncode == -signal.SIGKILL:
        return True
    assert done.returncode == 0, done.stderr
    return False


@pytest.mark.parametrize("kind", ["kernel-install", "grub", "grubby", "rpm-ostree", "plain"])
@pytest.mark.parametrize("scenario", ["write", "switch"])
def test_kill_9_at_every_step_of_a_write_leaves_what_the_next_start_finishes_or_undoes(
    tmp_path: Path, kind: str, scenario: str
) -> None:
    """A write of the boot configuration (from none, or a switch from other arguments) in a
    real process killed with SIGKILL before each of its steps, and after the last; then,
    from what it left: a restart that applies the same profile ends exactly as a write
    never interrupted; a restart that goes off, and a reboot (the run state wiped) that
    switches away or goes off, give every file back as before latencyd."""
    sections = [section(kind, W)] if scenario == "write" else [section(kind, W2), section(kind, W)]
    reference = staged(tmp_path / "reference", kind)
    before = tree(reference.root)
    engine, plugin = boot_engine(reference, tmp_path / "reference" / "state")
    for options in sections:
        engine.apply(profile(reference, plugin, options))
    assert engine.not_applicable == {}
    finished = tree(reference.root)
    at = 1
    while True:
        base = tmp_path / f"killed-{at}"
        system = staged(base, kind)
        if not killed_run(system.root, base / "state", at, sections):
            break
        for recovery in ("restart-finish", "restart-off", "reboot-finish", "reboot-away",
                         "reboot-off"):  # fmt: skip
            copy = tmp_path / f"killed-{at}-{recovery}"
            shutil.copytree(base, copy, symlinks=True)
            if recovery.startswith("reboot"):
                shutil.rmtree(copy / "state", ignore_errors=True)
            again = System(copy / "root")
            engine, plugin = boot_engine(again, copy / "state")
            engine.adopt()
            what = f"killed at step {at}, then {recovery}"
            if recovery.endswith("finish"):
                engine.apply(profile(again, plugin, sections[-1]))
                assert engine.not_applicable == {}, what
                assert engine.verify() == [], what
                assert tree(again.root, base / "root") == finished, what
            else:
                if recovery.endswith("away"):
                    engine.apply(profile(again, plugin, AWAY))
                assert engine.off() == [], what
                assert tree(again.root, base / "root") == before, what
        at += 1
    assert at > 2  # it was killed at least before and after its one write


def test_write_is_for_root_alone() -> None:
    """The admin group may apply a profile that shows kernel arguments, not one that has
    root run update-grub or kernel-install (issue 50)."""
    plugin = BootloaderPlugin(System("/nonexistent"))
    for section in ({"cmdline": ["nohz_full=1"]}, {"cmdline": ["nohz_full=1"], "write": False}):
        assert plugin.root_only(plugin.options_of(section)) is None
    reason = plugin.root_only(plugin.options_of({"cmdline": ["nohz_full=1"], "write": True}))
    assert reason is not None and "update-grub" in reason and "kernel-install" in reason


def test_an_admin_cannot_have_root_write_the_boot_configuration(tmp_path: Path) -> None:
    system = staged(tmp_path, "grub")
    before = tree(system.root)
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    (pdir / "args.toml").write_text('[bootloader]\ncmdline = ["skew_tick=1"]\nwrite = true\n')
    (pdir / "shown.toml").write_text('[bootloader]\ncmdline = ["skew_tick=1"]\n')
    plugins: dict[str, Plugin[Any, Any, Any]] = {"bootloader": BootloaderPlugin(system)}
    library = ProfileLibrary([pdir], section_schemas(plugins), MACHINE)
    daemon = Daemon(system, plugins, library, Engine(plugins, Journal(tmp_path / "state")))
    admin = Caller(uid=1000, name="alice")
    with pytest.raises(PermissionDenied, match=r"\[bootloader\] write = true has root run"):
        daemon.switch("args", admin)
    daemon.switch("shown", admin)
    assert tree(system.root) == before
    daemon.switch("args")
    assert (system.root / GRUB_DROP_IN).exists()
    assert daemon.off() == [] and tree(system.root) == before


def test_the_daemons_stop_leaves_kernel_arguments_and_restores_the_rest(tmp_path: Path) -> None:
    """SIGTERM (a shutdown) restores every setting but the next boot's kernel arguments:
    the reboot is what they were written for (issue 51, 4a). The next start owns them
    from latencyd's record; a switch away then takes exactly them out."""
    system = staged(tmp_path, "kernel-install")
    before = tree(system.root)
    make_fake_root(tmp_path, sysctls={"vm/swappiness": "60"})
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    plain = '[sysctl]\n"vm.swappiness" = 10\n'
    args = '[bootloader]\ncmdline = ["nohz_full=1-3"]\nwrite = true\n'
    (pdir / "rt.toml").write_text(args + plain)
    (pdir / "plain.toml").write_text(plain)

    def daemon() -> Daemon:
        plugins: dict[str, Plugin[Any, Any, Any]] = {
            "bootloader": BootloaderPlugin(system), "sysctl": SysctlPlugin(system)
        }  # fmt: skip
        library = ProfileLibrary([pdir], section_schemas(plugins), MACHINE)
        return Daemon(system, plugins, library, Engine(plugins, Journal(tmp_path / "state")))

    first = daemon()
    first.switch("rt")
    written = (system.root / KERNEL_CMDLINE).read_text()
    assert written == "root=/dev/vda1 ro mitigations=off quiet nohz_full=1-3\n"
    assert first.stop() == []
    assert system.read("proc/sys/vm/swappiness") == "60"
    assert (system.root / KERNEL_CMDLINE).read_text() == written
    assert not (tmp_path / "state/journal.jsonl").exists()
    again = daemon()
    again.start("plain")
    assert (system.root / KERNEL_CMDLINE).read_text() == USERS
    assert again.off() == []
    assert {k: v for k, v in tree(system.root).items() if not k.startswith(("proc/", "sys/"))} == {
        k: v for k, v in before.items() if not k.startswith(("proc/", "sys/"))
    }


def test_a_tool_run_under_systemd_asks_for_its_time_before_it_starts(tmp_path: Path) -> None:
    """A start that runs update-grub (taking out arguments, finishing a write kill -9 cut
    short) took longer than TimeoutStartSec= on the VM tier's machine: systemd killed it,
    the write was left unfinished for the next start, which it killed too. The daemon asks
    systemd (its notify socket, as with the fd store) for the tool's time before running
    it, and the tool runs only once asked."""
    stand_in = FdStoreStandIn(tmp_path)
    try:
        store = FdStore(str(stand_in.path), {})
        root = make_fake_root(tmp_path / "root")
        system = System(root, fdstore=store)
        seen = tmp_path / "seen-by-the-tool"
        tool(root, "update-grub", f"open({str(seen)!r}, 'w').write('ran')\n")
        system.run_tool([str(root / "usr/sbin/update-grub")], timeout_s=90)
        assert seen.read_text() == "ran"

        def asked() -> list[str]:
            return [m for m in stand_in.messages if m.startswith("EXTEND_TIMEOUT_USEC=")]

        wait_for(lambda: bool(asked()), timeout=10)  # the stand-in's thread receives it
        assert asked() == [f"EXTEND_TIMEOUT_USEC={(90 + 30) * 1_000_000}"]
    finally:
        stand_in.close()
