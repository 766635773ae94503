"""`make deb` builds the Debian package with Debian's tools (~2 min), and the package holds
what a system daemon's package must, lintian finding nothing (tags overridden, each with
its reason, in debian/latencyd.lintian-overrides aside):

- the daemon and latencyctl in /usr/bin (the agent not: Debian 12 has no lightkube), the
  systemd unit, the D-Bus policy, the tmpfiles entry, the shipped profiles, the man pages
  and the bash and zsh completions, the config as the one conffile;
- nothing under /usr/local, no venv, no pip metadata of an install by hand;
- Depends only on Debian's packages (debian/control's, checked in tests/unit/test_packaging.py);
- DEB_VERSION=X builds version X (the upgrade test's higher version).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from latencyd.tools.manpages import SHARE
from tests.harness import REPO

pytestmark = pytest.mark.deb

VERSION = "0.1.0+test1"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shutil.which("dpkg-buildpackage"):
        pytest.skip("dpkg-buildpackage is not installed (make setup installs it)")
    out = tmp_path_factory.mktemp("deb")
    env = {**os.environ, "DEB_OUT": str(out)}
    done = subprocess.run(
        ["make", "--no-print-directory", "deb", f"DEB_VERSION={VERSION}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    print(done.stdout)  # the build's time, for the record
    return out


def contents(deb: Path) -> dict[str, str]:
    """Each path in the package (without its leading ./) -> its mode string."""
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    files = {}
    for line in listing.splitlines():
        mode, *_, path = line.split(None, 5)
        files[path.removeprefix("./").split(" -> ")[0]] = mode
    return files


def test_the_package_holds_what_a_system_daemon_needs(built: Path) -> None:
    deb = built / f"latencyd_{VERSION}_all.deb"
    assert deb.is_file(), sorted(p.name for p in built.iterdir())
    files = contents(deb)
    for path in (
        "usr/bin/latencyd",
        "usr/bin/latencyctl",
        "lib/systemd/system/latencyd.service",
        "usr/share/dbus-1/system.d/org.latencyd.Daemon1.conf",
        "usr/lib/tmpfiles.d/latencyd.conf",
        "etc/latencyd/latencyd.conf",
        "usr/share/doc/latencyd/README.md",
    ):
        assert path in files, path
    assert files["usr/bin/latencyd"].startswith("-rwx")
    for profile in (REPO / "profiles").glob("*.toml"):
        assert f"usr/share/latencyd/profiles/{profile.name}" in files
    for share in SHARE:  # man pages gzipped by dh_compress, completions as they are
        name = f"usr/share/{share}" + (".gz" if share.startswith("man/") else "")
        assert name in files, name
    assert "usr/bin/latencyd-agent" not in files
    assert not [f for f in files if "/agent/" in f or f.startswith("usr/local")]
    assert not [f for f in files if "venv" in f or f.endswith(("direct_url.json", ".pyc"))]
    conffiles = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True
    )
    assert conffiles.stdout.strip() == VERSION
    info = subprocess.run(
        ["dpkg-deb", "--info", str(deb), "conffiles"], capture_output=True, text=True, check=True
    )
    assert info.stdout.split() == ["/etc/latencyd/latencyd.conf"]


def test_lintian_finds_nothing(built: Path) -> None:
    if not shutil.which("lintian"):
        pytest.skip("lintian is not installed (make setup installs it)")
    changes = next(built.glob("latencyd_*.changes"))
    # Every hint shown, pedantic and info ones too; --fail-on info would also count the
    # hints lintian masks itself (M:, e.g. a Python package's dist-info), so the test
    # reads what is shown: only notes (N:) and overridden tags, which are not shown.
    command = ["lintian", "--allow-root", "--pedantic", "-I", "--fail-on", "error,warning"]
    done = subprocess.run([*command, str(changes)], capture_output=True, text=True, timeout=600)
    hints = [line for line in done.stdout.splitlines() if not line.startswith("N: ")]
    assert done.returncode == 0 and hints == [], done.stdout + done.stderr


def test_the_packaged_commands_run_on_debians_python_and_its_packages(
    built: Path, tmp_path: Path
) -> None:
    """The package's files, unpacked, with /usr/bin/python3 and Debian's python3-dbus,
    -pyudev and -prometheus-client (nothing of the .venv): the plugins are found in
    the package's latencyd.plugins, the man pages are written, D-Bus is reached (no daemon
    here: exit 3), and `latencyctl completion` refuses a shtab that writes broken scripts
    (or none) and names the package's."""
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(built / f"latencyd_{VERSION}_all.deb"), str(root)],
                   check=True)  # fmt: skip
    env = {
        "PATH": "/usr/bin:/bin",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": str(root / "usr/lib/python3/dist-packages"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={tmp_path}/no-bus",
    }

    def run(command: str, *args: str) -> subprocess.CompletedProcess[str]:
        script = root / "usr/bin" / command
        assert script.read_text().startswith("#!/usr/bin/python3\n")
        return subprocess.run(["/usr/bin/python3", str(script), *args], env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    plugins = run("latencyctl", "plugins")
    assert plugins.returncode == 0, plugins.stderr
    assert all(f"[{name}]" in plugins.stdout for name in ("sysctl", "irq", "shield", "cpu"))
    page = run("latencyctl", "man", "latencyd")
    assert page.returncode == 0 and ".SH OPTIONS" in page.stdout and "restore" in page.stdout
    assert run("latencyctl", "status").returncode == 3  # dbus-python imported, no daemon
    completion = run("latencyctl", "completion", "bash")
    assert completion.returncode == 1 and "/usr/share/bash-completion" in completion.stderr
    assert run("latencyd", "--help").returncode == 0
