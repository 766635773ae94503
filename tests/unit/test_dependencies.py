"""The venv holds exactly what requirements.lock pins: a fresh machine runs the suite
against the versions this one did. (In .venv-lowest, what scripts/test-lowest.sh pins
instead, the file PIP_CONSTRAINT names.)"""

from __future__ import annotations

import os
import re
import tomllib
from importlib import metadata
from pathlib import Path

from tests.harness import REPO

# Installed with the interpreter's venv (ensurepip), not by our set-up.
BUNDLED = {"pip", "setuptools"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    pins = {}
    lock = os.environ.get("PIP_CONSTRAINT") or REPO / "requirements.lock"
    for line in Path(lock).read_text().splitlines():
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


IMPORT_LINE = re.compile(r"^\s*(?:from\s+(\w+)[\w.]*\s+import|import\s+(\w+))", re.M)


def imported_names(*folders: str) -> set[str]:
    """Top-level names the .py files under the folders import, wherever the import stands
    (a function's lazy import, a script run with `python -c` held in a string)."""
    names = set()
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for match in IMPORT_LINE.finditer(path.read_text()):
                names.add(match.group(1) or match.group(2))
    return names


def distributions_imported(*folders: str) -> set[str]:
    providers = metadata.packages_distributions()
    return {
        canonical(dist) for name in imported_names(*folders) for dist in providers.get(name, [])
    }


def test_every_declared_dependency_is_used() -> None:
    """A runtime dependency is imported by the daemon or its tools; a development one by
    the tests, benches or scripts, or run as a command by the build (ruff, mypy, pytest)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(declared: list[str]) -> set[str]:
        return {canonical(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in declared}

    runtime = names(project["dependencies"])
    assert runtime - distributions_imported("latencyd", "plugins") == set()
    extras = names([d for extra in project["optional-dependencies"].values() for d in extra])
    commands = (REPO / "Makefile").read_text() + (REPO / ".ci" / "run").read_text()
    unused = {
        d
        for d in extras - distributions_imported("latencyd", "plugins", "tests", "bench", "scripts")
        if not re.search(rf"\b{re.escape(d)}\b", commands)
    }
    assert unused == set()
