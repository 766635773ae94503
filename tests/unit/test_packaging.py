"""The Debian package's facts, checked without building it (tests/package/test_deb.py
builds it):

- each run-time dependency in pyproject.toml (shtab aside, see NOT_FROM_DEBIAN) is a
  Depends of debian/control, at the same
  lowest version as requirements-lowest.txt pins (what `make test-lowest` runs) and as
  pyproject.toml's lower bound, and apt's cache here has every Depends at that version
  or later (Debian's own packages, no pip);
- the config is the only file under /etc, so the only conffile;
- each maintainer script passes `sh -n` and shellcheck, and holds #DEBHELPER# once, as
  a line of its own (debhelper replaces it wherever it stands, comments included);
- the prerm, on remove, stops the service (under systemd) and then has `latencyd
  --restore` put back what is left, never `latencyctl off` (which would note "no profile"
  for a later install to resume); on upgrade it runs nothing of latencyd's; the option it
  calls exists; under dpkg --root (DPKG_ROOT) it runs nothing;
- the postrm, on remove, takes out the shield's runtime drop-ins that only unset; on purge,
  latencyd's state, an empty /etc/latencyd and a boot change a failed restore left
  (GRUB's drop-in, update-grub run), each at latencyd's own paths under DPKG_ROOT.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from latencyd.kernel.bootloaders import GRUB_DROP_IN
from latencyd.paths import BOOT_RECORD, DEFAULT_STATE_DIR, ETC_PROFILES
from latencyd.service.main import arg_parser
from tests.harness import REPO
from tests.unit.test_dependencies import canonical

DEBIAN = REPO / "debian"
# PyPI's name of each run-time dependency -> Debian's package of it.
DEBIAN_NAMES = {
    "dbus-python": "python3-dbus",
    "pyudev": "python3-pyudev",
    "prometheus-client": "python3-prometheus-client",
}
# Run-time dependencies Debian 12 has no working version of, and why.
NOT_FROM_DEBIAN = {
    "shtab": "1.5.5 completes only the first choice in bash: the package ships its scripts",
}
SCRIPTS = ("postinst", "prerm", "postrm")


def lowest() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements-lowest.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonical(name)] = version
    return pins


def runtime_lower_bounds() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    bounds = {}
    for dep in project["dependencies"]:
        name, _, version = dep.partition(">=")
        bounds[canonical(name)] = version
    return bounds


def control_depends(package: str = "latencyd") -> dict[str, str]:
    """The package's Depends: name -> its lowest version ("" when unversioned)."""
    stanzas = (DEBIAN / "control").read_text().split("\n\n")
    stanza = next(s for s in stanzas if re.search(rf"^Package: {package}$", s, re.M))
    field = re.search(r"^Depends:(.*(?:\n .*)*)", stanza, re.M)
    assert field
    depends = {}
    for item in field.group(1).split(","):
        match = re.fullmatch(r"\s*([\w.+-]+|\$\{[\w:]+\})\s*(?:\(>= ([^)]+)\))?\s*", item)
        assert match or not item.strip(), f"not a Depends item this test reads: {item!r}"
        if match:
            depends[match.group(1)] = match.group(2) or ""
    return depends


def test_every_runtime_dependency_is_a_debian_depends_at_the_lowest_tested_version() -> None:
    bounds, pins, depends = runtime_lower_bounds(), lowest(), control_depends()
    assert set(bounds) == set(DEBIAN_NAMES) | set(NOT_FROM_DEBIAN), "name its Debian package"
    assert not {n for n in depends if "shtab" in n}
    for name, version in bounds.items():
        if name in NOT_FROM_DEBIAN:
            continue
        assert pins[name] == version, f"{name}: pyproject >= {version}, lowest tested {pins[name]}"
        assert depends[DEBIAN_NAMES[name]] == version, f"{name}: debian/control"


def test_apt_has_every_depends_at_the_lowest_version_or_later() -> None:
    if not shutil.which("apt-cache"):
        pytest.skip("no apt-cache: not a Debian machine")
    wanted = {n: v for n, v in control_depends().items() if not n.startswith("${")}
    policy = subprocess.run(
        ["apt-cache", "policy", *wanted], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    candidates = dict(re.findall(r"^(\S+):\n(?:.*\n)*?\s+Candidate: (\S+)", policy, re.M))
    for name, version in wanted.items():
        candidate = candidates.get(name, "(none)")
        assert candidate != "(none)", f"{name}: not in apt's cache (apt-get update?)"
        if version:
            ok = subprocess.run(["dpkg", "--compare-versions", candidate, "ge", version])
            assert ok.returncode == 0, f"{name}: Debian has {candidate}, latencyd needs {version}"


def test_the_config_is_the_only_file_under_etc() -> None:
    """debhelper makes every file under /etc a conffile: only the config goes there (the
    unit, the D-Bus policy and the tmpfiles entry go under /usr and /lib)."""
    installed = [line.split() for line in (DEBIAN / "latencyd.install").read_text().splitlines()]
    etc = [(source, target) for source, target in installed if target.startswith("etc/")]
    assert etc == [("systemd/latencyd.conf", "etc/latencyd/")]


@pytest.mark.parametrize("script", SCRIPTS)
def test_maintainer_script_is_sound_shell(script: str) -> None:
    path = DEBIAN / f"latencyd.{script}"
    text = path.read_text()
    assert text.startswith("#!/bin/sh\n") and "\nset -e\n" in text
    assert text.count("#DEBHELPER#") == 1 and "\n#DEBHELPER#\n" in text
    done = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    if shutil.which("shellcheck"):
        done = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


def run_prerm(tmp_path: Path, *args: str, active: bool, dpkg_root: str = "") -> list[str]:
    """debian/latencyd.prerm with stand-ins for latencyd, latencyctl, systemctl and
    deb-systemd-invoke first on PATH, each writing its command line down: what the script
    ran."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    calls.write_text("")
    for name in ("latencyd", "latencyctl", "systemctl", "deb-systemd-invoke"):
        status = 0 if name != "systemctl" or active else 3
        (bin_ / name).write_text(f'#!/bin/sh\necho "{name} $*" >>"{calls}"\nexit {status}\n')
        (bin_ / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "DPKG_ROOT": dpkg_root}
    done = subprocess.run(
        ["sh", str(DEBIAN / "latencyd.prerm"), *args], env=env, capture_output=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return [c for c in calls.read_text().splitlines() if not c.startswith("systemctl ")]


def test_prerm_restores_on_remove_and_leaves_the_tuning_on_upgrade(tmp_path: Path) -> None:
    systemd = Path("/run/systemd/system").is_dir()  # the script stops it only under systemd
    stop = ["deb-systemd-invoke stop latencyd.service"] if systemd else []
    for active in (True, False):
        assert run_prerm(tmp_path, "remove", active=active) == [*stop, "latencyd --restore"]
        assert run_prerm(tmp_path, "upgrade", "0.1.1", active=active) == []
    # Under dpkg --root the running machine's service and settings are not that root's.
    assert run_prerm(tmp_path, "remove", active=True, dpkg_root=str(tmp_path)) == []
    # What it calls exists.
    assert "--restore" in arg_parser()._option_string_actions


UNSET = (
    '# This is a drop-in unit file extension, created via "systemctl set-property"\n'
    "# or an equivalent operation. Do not edit.\n[Slice]\nAllowedCPUs=\nAllowedCPUs=\n"
)  # what systemd 252 writes when AllowedCPUs= is set to nothing at run time


def test_postrm_removes_the_shields_runtime_drop_ins_that_only_unset(tmp_path: Path) -> None:
    """On remove, the drop-ins systemd keeps of the shield's AllowedCPUs= (restored: unset)
    go, from system.control and, for a transient unit (init.scope), transient/, and their
    directories once empty; a drop-in that sets CPUs, another file in a unit's directory,
    another unit's and a transient unit's own file are kept. On upgrade nothing goes."""
    runtime = tmp_path / "run/systemd"
    files = {
        "transient/init.scope.d/50-AllowedCPUs.conf": UNSET.replace("[Slice]", "[Scope]"),
        "transient/run-u7.scope": "[Scope]\n",
        "system.control/system.slice.d/50-AllowedCPUs.conf": UNSET,
        "system.control/system.slice.d/50-MemoryMax.conf": "[Slice]\nMemoryMax=1G\n",
        "system.control/user.slice.d/50-AllowedCPUs.conf": UNSET.removesuffix("\n") + "0-1\n",
        "system.control/machine.slice.d/50-AllowedCPUs.conf": UNSET,
    }
    for rel, text in files.items():
        (runtime / rel).parent.mkdir(parents=True, exist_ok=True)
        (runtime / rel).write_text(text)
    for args in (("upgrade", "0.1.1"), ("remove",)):
        done = subprocess.run(["sh", str(DEBIAN / "latencyd.postrm"), *args],
                              env={**os.environ, "DPKG_ROOT": str(tmp_path)},
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert done.returncode == 0, done.stderr
        if args[0] == "upgrade":
            left = {str(p.relative_to(runtime)) for p in runtime.rglob("*") if p.is_file()}
            assert left == set(files)
    left = {str(p.relative_to(runtime)) for p in runtime.rglob("*")}
    assert left == {
        "transient", "transient/run-u7.scope",
        "system.control", "system.control/system.slice.d",
        "system.control/system.slice.d/50-MemoryMax.conf",
        "system.control/user.slice.d", "system.control/user.slice.d/50-AllowedCPUs.conf",
        "system.control/machine.slice.d", "system.control/machine.slice.d/50-AllowedCPUs.conf",
    }  # fmt: skip
    # Nothing but the shield's: once they are gone, the directories go too.
    (runtime / "transient/run-u7.scope").unlink()
    (runtime / "transient/init.scope.d").mkdir()
    (runtime / "transient/init.scope.d/50-AllowedCPUs.conf").write_text(UNSET)
    subprocess.run(["sh", str(DEBIAN / "latencyd.postrm"), "remove"], check=True,
                   env={**os.environ, "DPKG_ROOT": str(tmp_path)})  # fmt: skip
    assert not (runtime / "transient").exists()


def test_postrm_purge_removes_state_config_and_a_boot_change_left_behind(tmp_path: Path) -> None:
    """Purge after a remove whose restore failed (the boot record and GRUB's drop-in still
    there): the record is printed, the drop-in goes, the state directories and an empty
    /etc/latencyd go; an administrator's profile keeps /etc/latencyd, and says so. The
    paths are latencyd's own (latencyd.paths, latencyd.kernel.bootloaders), under
    DPKG_ROOT; update-grub, which would rewrite the running machine's grub.cfg, is named
    for the administrator instead of run. Remove and upgrade leave all of it alone."""
    root = tmp_path / "root"
    drop_in = root / GRUB_DROP_IN
    record = root / BOOT_RECORD.relative_to("/")
    state = root / DEFAULT_STATE_DIR.relative_to("/")
    profiles = root / ETC_PROFILES.relative_to("/")
    for path, text in ((drop_in, 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX nohz_full=2-3"\n'),
                       (record, "nohz_full=2-3\n"), (state / "journal", "{}\n")):  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    profiles.mkdir(parents=True)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "update-grub").write_text(f"#!/bin/sh\ntouch {tmp_path}/update-grub-ran\n")
    (bin_ / "update-grub").chmod(0o755)
    env = {**os.environ, "DPKG_ROOT": str(root), "PATH": f"{bin_}:{os.environ['PATH']}"}

    def postrm(*args: str) -> str:
        done = subprocess.run(["sh", str(DEBIAN / "latencyd.postrm"), *args], env=env,
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stderr

    for args in (("upgrade", "0.1.1"), ("remove",)):
        postrm(*args)
        assert drop_in.exists() and record.exists() and state.is_dir() and profiles.is_dir()
    said = postrm("purge")
    assert "latencyd:   nohz_full=2-3" in said and "run update-grub" in said, said
    assert not (tmp_path / "update-grub-ran").exists()
    assert not drop_in.exists() and drop_in.parent.is_dir()
    assert not record.parent.exists() and not state.exists()
    assert not profiles.parent.exists()
    # An administrator's profile: /etc/latencyd kept, and said.
    profiles.mkdir(parents=True)
    (profiles / "mine.toml").write_text("[main]\n")
    assert "kept" in postrm("purge")
    assert (profiles / "mine.toml").exists()
