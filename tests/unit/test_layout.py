"""The folders are the architecture: imports flow one way (core <- service <- tools, and
plugins use core only), and no module reaches itself through its imports. Every import
counts, a function's lazy one and a type-checking one too: a wrong-way import that only
runs late is still a wrong-way dependency."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What each room may import (besides itself); "latencyd" is the top package's constants.
ALLOWED = {
    "latencyd": set(),
    "core": {"latencyd"},
    "plugins": {"latencyd", "core"},
    "service": {"latencyd", "core"},
    "tools": {"latencyd", "core", "service"},
}


def modules(repo: Path) -> dict[str, Path]:
    """Dotted module name -> file, for latencyd/ and plugins/ (installed as latencyd.plugins)."""
    found = {}
    for top, package in (("latencyd", "latencyd"), ("plugins", "latencyd.plugins")):
        for path in sorted((repo / top).rglob("*.py")):
            parts = path.relative_to(repo / top).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else "latencyd"


def imports(module: str, path: Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, imported latencyd module) for every import in the file, wherever it stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield node.lineno, sub if sub in known else base


def check(repo: Path) -> list[str]:
    """Every wrong-way import (file:line: what) and every circle of modules."""
    found = modules(repo)
    known = set(found)
    problems = []
    graph: dict[str, set[str]] = {m: set() for m in found}
    for module, path in found.items():
        for line, target in imports(module, path, known):
            if target not in known or target == module:
                continue
            graph[module].add(target)
            if room(target) != room(module) and room(target) not in ALLOWED[room(module)]:
                where = path.relative_to(repo)
                problems.append(f"{where}:{line}: {room(module)} imports {target} ({room(target)})")
    problems += [f"circle: {' -> '.join(c)}" for c in circles(graph)]
    return problems


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module, each as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_imports_flow_one_way_and_never_in_a_circle() -> None:
    assert check(REPO) == []


def test_the_rooms_are_what_the_folders_say() -> None:
    listing = {p.name for p in (REPO / "latencyd").iterdir() if p.name != "__pycache__"}
    assert listing == {"__init__.py", "py.typed", "core", "service", "tools"}


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_the_check_catches_a_wrong_way_import_and_a_circle(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "latencyd/__init__.py": "",
            "latencyd/core/__init__.py": "",
            "latencyd/core/engine.py": "def run():\n    from latencyd.service import dbus\n",
            "latencyd/service/__init__.py": "",
            "latencyd/service/dbus.py": "from latencyd.core import engine\n",
            "latencyd/tools/__init__.py": "",
            "latencyd/tools/a.py": "from . import b\n",
            "latencyd/tools/b.py": "import latencyd.tools.a\n",
            "plugins/__init__.py": "",
            "plugins/x.py": "from latencyd.tools.a import thing\n",
        },
    )
    assert check(tmp_path) == [
        "latencyd/core/engine.py:2: core imports latencyd.service.dbus (service)",
        "plugins/x.py:1: plugins imports latencyd.tools.a (tools)",
        "circle: latencyd.core.engine -> latencyd.service.dbus",
        "circle: latencyd.tools.a -> latencyd.tools.b",
    ]
