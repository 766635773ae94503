from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import Latencyd, unlike_machine
from tests.kube import DEPLOY, ControlPlane

MANIFESTS_APPLIED = ("00-namespace.yaml", "01-crds.yaml", "02-rbac.yaml")

PROFILE_A = """
[main]
summary = "test profile A"

[writeback]
dirty_bytes = "64M"
dirty_expire_centisecs = 1500

[sysctl]
"vm.swappiness" = 11
"vm.stat_interval" = 7
"""

PROFILE_B = """
[main]
summary = "test profile B: shares swappiness with A"

[writeback]
dirty_ratio = 15
dirty_expire_centisecs = 1600

[sysctl]
"vm.swappiness" = 11
"kernel.timer_migration" = {timer_migration}
"""

BAD_PROFILE = """
[main]
summary = "broken on purpose"

[writeback]
dirty_ratio = 12
no_such_option = 1
"""


@pytest.fixture
def profiles(tmp_path: Path) -> Path:
    d = tmp_path / "profiles"
    d.mkdir()
    (d / "test-a.toml").write_text(PROFILE_A)
    timer_migration = unlike_machine("kernel.timer_migration", "0", "1")
    (d / "test-b.toml").write_text(PROFILE_B.format(timer_migration=timer_migration))
    (d / "test-bad.toml").write_text(BAD_PROFILE)
    return d


@pytest.fixture
def start_daemon(
    private_bus: str, tmp_path: Path, profiles: Path, kernel_guard: None
) -> Iterator[Callable[..., Latencyd]]:
    """Start latencyd processes; all are stopped (SIGTERM, restoring everything) afterwards."""
    started: list[Latencyd] = []

    def start(profile: str | None = "test-a", launch: bool = True, **kwargs: object) -> Latencyd:
        """A latencyd (started unless `launch` is false, to set it up further first)."""
        workdir = tmp_path / f"daemon{len(started)}"
        workdir.mkdir(exist_ok=True)
        kwargs.setdefault("profile_dirs", [profiles])
        extra = list(kwargs.pop("extra", []))  # type: ignore[call-overload]
        if profile is None:
            extra.append("--no-profile")
        d = Latencyd(private_bus, workdir, profile=profile, extra=extra, **kwargs)  # type: ignore[arg-type]
        started.append(d)
        return d.start() if launch else d

    yield start
    for d in started:
        d.stop()
    for d in started:  # a test that failed after kill -9 must not leave its settings
        d.recover()


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd and kube-apiserver on free loopback ports, with latencyd's CRDs, namespace and
    the agent's RBAC applied from deploy/ as shipped (scripts/control-plane.sh builds them)."""
    plane = ControlPlane().start()
    try:
        for manifest in MANIFESTS_APPLIED:
            plane.kubectl("apply", "-f", str(DEPLOY / manifest))
        yield plane
    finally:
        plane.stop()
