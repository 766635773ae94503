"""The folders are the architecture. Rooms, from the bottom: the top package's vocabulary
(errors, the CPU-set type, escaping, where files are), `kernel` (the system facade and the
decoders of what the kernel reports), `core` (the framework: profiles, schema, engine,
journal, plugin contract), then `plugins` and `service`, and `tools` on top. Imports flow
one way, and no module reaches itself through its imports. Every import counts, a
function's lazy one and a type-checking one too: a wrong-way import that only runs late is
still a wrong-way dependency. Beyond imports: kernel files are opened only in `kernel`,
latencyd's own file locations are spelled only in `latencyd/paths.py`, `core` holds
only what more than one plugin uses (a helper of one plugin lives beside it), and the
rooms below the plugins name none of them, not even as a string (a Status section read
by a plugin's name belongs to `service` or `tools`)."""

from __future__ import annotations

import ast
import importlib.util
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What each room may import (besides itself); "latencyd" is the top package's vocabulary.
ALLOWED = {
    "latencyd": set(),
    "kernel": {"latencyd"},
    "core": {"latencyd", "kernel"},
    "plugins": {"latencyd", "kernel", "core"},
    "service": {"latencyd", "kernel", "core"},
    "tools": {"latencyd", "kernel", "core", "service"},
    # the node agent: latencyd's loader checks a cluster's profile before the daemon
    # sees it; the daemon's GLib loop binding runs its main thread
    "agent": {"latencyd", "kernel", "core", "service"},
}
# Calls that open, list or test a path: outside `kernel`, none of them may be given a
# kernel path (read it through latencyd.kernel.system.System) or one of latencyd's own
# locations (name it through latencyd.paths).
OPENERS = {"open", "Path", "PurePath"}  # called by their bare name
OPENING_MODULES = {"os", "glob", "pathlib", "shutil", "io"}  # any of their functions
KERNEL_PATHS = ("/sys", "/proc", "/dev/cpu", "/run/systemd")
OWN_PATHS = ("/etc/latencyd", "/run/latencyd", "/usr/share/latencyd", "/var/lib/latencyd")
PATHS_MODULE = "latencyd.paths"
# The rooms the plugins build on: none of them names a plugin (a module of plugins/).
BELOW_PLUGINS = {"latencyd", "kernel", "core"}
# Words a plugin is named for that are the kernel's own words too, and where the kernel
# layer says them as the kernel does: (module, word) -> what the kernel means by it.
KERNEL_WORDS = {
    ("latencyd.kernel.noise", "irq"): "tracefs's event system events/irq, and the irq field",
    ("latencyd.kernel.procstat", "cpu"): "the head of /proc/stat's and schedstat's CPU lines",
    ("latencyd.kernel.system", "sysfs"): "a file system's name (statfs's f_type)",
    ("latencyd.kernel.cmdline", "kthread"): "a housekeeping type nohz_full takes (HK_TYPE_KTHREAD)",
    # The other owners of a setting, in their own words: TuneD's plugins (its profiles'
    # sections), the sysctl tool and systemd-sysctl, sysfs paths.
    ("latencyd.kernel.owners", "sysctl"): "the sysctl tool, systemd-sysctl, TuneD's [sysctl]",
    ("latencyd.kernel.owners", "sysfs"): "TuneD's [sysfs] plugin",
    ("latencyd.kernel.owners", "cpu"): "TuneD's [cpu] plugin",
    ("latencyd.kernel.owners", "irq"): "TuneD's [irq] plugin",
    ("latencyd.kernel.owners", "net"): "TuneD's [net] plugin",
    ("latencyd.kernel.owners", "bootloader"): "TuneD's [bootloader] plugin",
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


def parsed(found: dict[str, Path]) -> dict[str, ast.Module]:
    """Every module's syntax tree, parsed once for all the checks."""
    return {module: ast.parse(path.read_text(), str(path)) for module, path in found.items()}


def imports(
    module: str, path: Path, tree: ast.Module, known: set[str]
) -> Iterator[tuple[int, str]]:
    """(line, imported latencyd module) for every import in the file, wherever it stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
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
    """Every wrong-way import (file:line: what), every circle of modules, and every fault
    of the rules beyond imports (opened_paths, helpers_of_one_plugin)."""
    found = modules(repo)
    trees = parsed(found)
    known = set(found)
    problems = []
    graph: dict[str, set[str]] = {m: set() for m in found}
    for module, path in found.items():
        for line, target in imports(module, path, trees[module], known):
            if target not in known or target == module:
                continue
            graph[module].add(target)
            if room(target) != room(module) and room(target) not in ALLOWED[room(module)]:
                where = path.relative_to(repo)
                problems.append(f"{where}:{line}: {room(module)} imports {target} ({room(target)})")
    problems += [f"circle: {' -> '.join(c)}" for c in circles(graph)]
    problems += opened_paths(repo, found, trees)
    problems += helpers_of_one_plugin(repo, found, graph)
    problems += plugins_named_below(repo, found, trees)
    return problems


def plugin_names(found: dict[str, Path]) -> set[str]:
    """The plugins' names: the modules (or packages) of plugins/."""
    return {m.split(".")[2] for m in found if m.startswith("latencyd.plugins.")}


def plugins_named_below(
    repo: Path, found: dict[str, Path], trees: dict[str, ast.Module]
) -> list[str]:
    """Every string in the rooms below the plugins that is a plugin's name (file:line:
    what), but for the kernel's own words (KERNEL_WORDS): an import of a plugin is caught
    as a wrong-way import, a plugin named in a string is caught here."""
    names = plugin_names(found)
    problems = []
    for module, path in found.items():
        if room(module) not in BELOW_PLUGINS:
            continue
        for node in sorted(ast.walk(trees[module]), key=lambda n: getattr(n, "lineno", 0)):
            if (
                isinstance(node, ast.Constant)
                and node.value in names
                and (module, node.value) not in KERNEL_WORDS
            ):
                where = f"{path.relative_to(repo)}:{node.lineno}"
                problems.append(f"{where}: names the plugin {node.value!r}")
    return problems


def literal_start(node: ast.expr) -> str:
    """The text a path argument begins with, when the source spells it (a string, or the
    constant head of an f-string)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return literal_start(node.values[0])
    return ""


def opens(func: ast.expr) -> bool:
    """Whether a call of `func` opens, lists or tests the path it is given."""
    if isinstance(func, ast.Name):
        return func.id in OPENERS
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id in OPENING_MODULES


def opened_paths(repo: Path, found: dict[str, Path], trees: dict[str, ast.Module]) -> list[str]:
    """Every call outside `kernel` that opens a kernel path, and every one outside
    latencyd.paths that opens latencyd's own location, as file:line: what."""
    problems = []
    for module, path in found.items():
        if room(module) == "kernel":
            continue
        for node in ast.walk(trees[module]):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            start = literal_start(node.args[0])
            if not start or not opens(node.func):
                continue
            where = f"{path.relative_to(repo)}:{node.lineno}"
            if start.startswith(KERNEL_PATHS):
                problems.append(f"{where}: opens {start!r} past the system facade")
            elif start.startswith(OWN_PATHS) and module != PATHS_MODULE:
                problems.append(f"{where}: spells {start!r} (see latencyd/paths.py)")
    return problems


def helpers_of_one_plugin(
    repo: Path, found: dict[str, Path], graph: dict[str, set[str]]
) -> list[str]:
    """Every module of `core` that, outside `core`, only one plugin imports: a helper of
    that plugin, which belongs beside it, not in the framework. A plugin is a module or a
    package of plugins/: its package's modules are that one plugin."""
    problems = []
    for module, path in found.items():
        if room(module) != "core" or path.name == "__init__.py":
            continue
        users = {
            owner(m) for m, targets in graph.items() if module in targets and room(m) != "core"
        }
        inside = any(module in graph[m] for m in found if room(m) == "core")
        if len(users) == 1 and room(next(iter(users))) == "plugins" and not inside:
            only = next(iter(users))
            problems.append(f"{path.relative_to(repo)}: a helper of {only} alone")
    return problems


def owner(module: str) -> str:
    """The plugin a module of plugins/ belongs to (latencyd.plugins.NAME, a package's
    modules too); any other module is its own."""
    parts = module.split(".")
    return ".".join(parts[:3]) if room(module) == "plugins" and len(parts) > 3 else module


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
    vocabulary = {"errors.py", "cpuset.py", "text.py", "paths.py"}
    assert (
        listing
        == {"__init__.py", "py.typed", "kernel", "core", "service", "tools", "agent"} | vocabulary
    )


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


def test_the_check_catches_kernel_files_opened_past_the_facade_and_a_plugins_helper(
    tmp_path: Path,
) -> None:
    write(
        tmp_path,
        {
            "latencyd/__init__.py": "",
            "latencyd/paths.py": 'from pathlib import Path\nCONFIG = Path("/etc/latencyd/x")\n',
            "latencyd/kernel/__init__.py": "",
            "latencyd/kernel/system.py": 'def online():\n    return open("/sys/x").read()\n',
            "latencyd/core/__init__.py": "",
            "latencyd/core/plugin.py": "",
            "latencyd/core/ethtool.py": "import os\n",
            "latencyd/core/movable.py": "",
            "latencyd/tools/__init__.py": "",
            "latencyd/tools/cli.py": """\
                import os
                from pathlib import Path
                from latencyd.kernel.system import System
                def cpus(cpu):
                    host.exists(f"/proc/sys/{cpu}")  # through a facade of its own: fine
                    System("/").read("/sys/devices/system/cpu/online")  # fine
                    os.path.exists(f"/sys/devices/system/cpu/cpu{cpu}")
                    return Path("/run/latencyd/bus-address")
                """,
            "plugins/__init__.py": "",
            "plugins/net.py": "from latencyd.core import ethtool, plugin\n",
            "plugins/irq.py": "from latencyd.core import plugin\n",
            # a plugin as a package: two of its modules are still one plugin
            "plugins/shield/__init__.py": "from latencyd.core import movable\n",
            "plugins/shield/chase.py": "from latencyd.core import movable, plugin\n",
        },
    )
    assert check(tmp_path) == [
        "latencyd/tools/cli.py:7: opens '/sys/devices/system/cpu/cpu' past the system facade",
        "latencyd/tools/cli.py:8: spells '/run/latencyd/bus-address' (see latencyd/paths.py)",
        "latencyd/core/ethtool.py: a helper of latencyd.plugins.net alone",
        "latencyd/core/movable.py: a helper of latencyd.plugins.shield alone",
    ]


def test_the_check_catches_a_plugin_named_below_the_plugins(tmp_path: Path) -> None:
    files = {
        "latencyd/__init__.py": "",
        "latencyd/core/__init__.py": "",
        "latencyd/core/engine.py": '''\
            """Shared ownership: the shield's, and any plugin's that shares a setting."""
            def apply(plugin):
                return plugin.write()
            ''',
        "latencyd/kernel/__init__.py": "",
        "latencyd/kernel/noise.py": 'EVENTS = (("irq", "irq_handler_entry"),)\n',  # the kernel's
        "latencyd/tools/__init__.py": "",
        "latencyd/tools/top.py": 'def moves(status):\n    return status["plugins"]["irq"]\n',
        "plugins/__init__.py": "",
        "plugins/irq.py": 'name = "irq"\n',
        "plugins/shield/__init__.py": 'name = "shield"\n',
        "plugins/shield/rules.py": "",
    }
    write(tmp_path, files)
    assert check(tmp_path) == []
    write(
        tmp_path,
        {
            "latencyd/core/engine.py": """\
                def apply(plugin):
                    if plugin.name == "shield":
                        return plugin.write_unless_changed()
                    return plugin.write()
                """,
            "latencyd/kernel/irqs.py": 'SOURCES = {"irq": "a hardware interrupt"}\n',
        },
    )
    assert check(tmp_path) == [
        "latencyd/core/engine.py:2: names the plugin 'shield'",
        "latencyd/kernel/irqs.py:1: names the plugin 'irq'",
    ]


def test_each_kernel_word_is_said_where_it_is_allowed() -> None:
    # An allowance nothing uses any more would let a plugin's name back in unseen.
    found = modules(REPO)
    names = plugin_names(found)
    trees = parsed({m: found[m] for m, _ in KERNEL_WORDS})
    said = {
        (m, node.value)
        for m, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names
    }
    assert set(KERNEL_WORDS) <= said


def test_every_package_in_the_tree_is_installed() -> None:
    # The editable install of a checkout finds any package; an installed latencyd has only
    # those setup.py's `packages` names (the boot test's unit once lacked
    # latencyd.tools.measure): found in the tree, plugins/' subpackages with no list to edit.
    spec = importlib.util.spec_from_file_location("setup_under_test", REPO / "setup.py")
    assert spec and spec.loader
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "packages" not in config  # else it, not setup.py's, is what is installed
    in_tree = {m for m, path in modules(REPO).items() if path.name == "__init__.py"}
    assert set(setup.packages()) == in_tree
