"""The venv holds exactly what requirements.lock pins: a fresh machine runs the suite
against the versions this one did."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

from tests.harness import REPO

# Installed with the interpreter's venv (ensurepip), not by our set-up.
BUNDLED = {"pip", "setuptools"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"not an exact pin: {line!r}"
            pins[canonical(name)] = version
    return pins


def test_every_installed_package_is_pinned_at_its_version() -> None:
    pins = locked()
    installed = {
        canonical(d.metadata["Name"]): d.version
        for d in metadata.distributions()
        if canonical(d.metadata["Name"]) not in BUNDLED | {"latencyd"}
    }
    unpinned = sorted(set(installed) - set(pins))
    assert unpinned == [], f"installed but not in requirements.lock: {unpinned}"
    wrong = {n: (v, pins[n]) for n, v in installed.items() if pins[n] != v}
    assert wrong == {}, f"installed version differs from the lock: {wrong}"


def test_every_declared_dependency_is_in_the_lock() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [
        d for extra in project["optional-dependencies"].values() for d in extra
    ]
    names = {canonical(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in declared}
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    names |= {canonical(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in build}
    assert names - set(locked()) == set()
