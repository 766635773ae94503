"""The plugin contract, and how plugins are found.

A plugin is one file: its option schema, the typed targets it tunes, a pure
`expand` from its profile section to wanted settings, and how to read and write
one target — which most target kinds know themselves (a FileTarget is one file under
the System's root). The engine owns everything else — journal, diffing, rollback, drift
policy (`on_drift`), turning refusals into "not applicable, with the reason",
hot-plug dispatch and the status tables — so every plugin gets it for free.

Targets are frozen dataclasses of JSON scalars: they key the engine's state and
round-trip through the journal, so no code ever parses a string key.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    ParamSpec,
    TypeVar,
    cast,
    final,
)

from latencyd.core.schema import Schema
from latencyd.cpuset import CpuSet
from latencyd.errors import NotApplicable
from latencyd.kernel.owners import Claim
from latencyd.kernel.system import System


# What a plugin following tasks (latencyd.core.capabilities.FollowsTasks) is told: the
# daemon reads these from the kernel (latencyd.service.taskevents) and hands each to on_task.
@dataclass(frozen=True)
class TaskEvent:
    kind: str  # "fork" | "comm" | "exit" | "lost"
    pid: int  # thread group (process) id
    tid: int  # the thread itself
    ppid: int = 0  # fork: the parent process (2 for kernel threads, made by kthreadd)
    time_ns: int = 0  # kernel timestamp (CLOCK_MONOTONIC scale), 0 when unknown
    lost: bool = False  # the source dropped events: consumers should rescan


log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "latencyd.plugins"

# What the journal and status hold: what a plugin hands the engine and reports is checked to
# be one, where a CpuSet or a target would reach the journal or a D-Bus reply unconverted.
Json = str | int | float | bool | None | Sequence["Json"] | Mapping[str, "Json"]
# What a target is set to, as the engine holds (and journals) every kind's side by side: a
# kind's own verbs take its type (Target[V]), a plugin's verbs this.
Value = Json
# One validated profile section as the engine holds it (each option's type: its schema's).
# A plugin reads it as its options class, Opt (Schema.section, Plugin.options_of), or as
# this mapping where its section has free keys ([sysctl]).
Options = Mapping[str, Any]

# A target kind's own value type (Target[str]: a CPU list, a sysctl's text): its verbs are
# typed by it, while the engine, which holds every kind's values side by side, sees Value.
# A bare `Target` is any kind's (Target[Any]).
if TYPE_CHECKING:
    from typing_extensions import TypeVar as DefaultedTypeVar

    V = DefaultedTypeVar("V", default=Any)
else:
    V = TypeVar("V")


@dataclass(frozen=True)
class Target(Generic[V]):
    """Where one setting lives (an IRQ, a thread, a NIC and option, a CPU and idle state).

    Subclasses are frozen dataclasses whose fields are int, str or bool, and name their
    `kind` (unique within the plugin). `refusal_means` declares what the kernel refusing
    this kind of setting means when that is "not applicable here" (a kernel-managed IRQ,
    a driver without the feature): it opens the reason shown in status. None: a refusal
    fails the profile (and the step is rolled back).

    A target with a `pid` field is a task's (names_a_task): Status shows it to root and
    the admin group only, as hidepid would.

    `kept_at_stop`: a setting that acts only from the next boot on (a kernel argument) is
    left as it is when the daemon stops (SIGTERM, a shutdown): only `off` or a switch to a
    profile without it takes it back. Undoing it while the machine shuts down would undo
    what the reboot is for.

    A kind that can reach its setting through the System alone says how, with the verbs
    below (FileTarget: one file, as most settings are): the plugin's verbs of the same
    names ask the target (Plugin.read is target.read(self.system)), so a plugin whose
    kinds all do has none of its own. A kind that needs what only its plugin knows (which
    task a pid is within a step, a NIC's name now, the boot loader found) leaves them to
    its plugin, which overrides its verbs for that kind.
    """

    kind: ClassVar[str] = ""
    refusal_means: ClassVar[str | None] = None
    kept_at_stop: ClassVar[bool] = False

    # -- the setting, for a kind that reaches it through the System ------------------------
    def read(self, system: System) -> V:
        """The setting's current value (to save the original, and to verify)."""
        raise NotImplementedError(f"{type(self).__name__} targets are read by their plugin")

    def write(self, system: System, value: V) -> None:
        """Set it; raise KernelRefused (or NotApplicable) when the kernel says no."""
        raise NotImplementedError(f"{type(self).__name__} targets are written by their plugin")

    def same(self, system: System, wanted: V, actual: V) -> bool:
        """Whether the kernel's value is what was wanted: equal, unless the kind says what
        else is alike (a CPU list however spelt, words however spaced)."""
        return bool(wanted == actual)

    def exists(self, system: System) -> bool:
        """Whether the setting is still there; vanished ones are dropped without error."""
        return True

    def watch_files(self, system: System) -> tuple[str, ...]:
        """Files (under the System root) whose modification can change the setting: a
        write to any of them makes the engine check it at once. None: polled instead."""
        return ()

    def describe(self, value: V) -> str:
        """The setting at `value`, in words (status, logs, errors)."""
        raise NotImplementedError(f"{type(self).__name__} targets are described by their plugin")

    def problem(self) -> str | None:
        """Why this target, decoded from outside (a journal), names something its plugin
        must not touch (a sysctl key spelling a way out of /proc/sys); None when it is
        sound. `expand` makes sound targets only; decode_target asks every one."""
        return None

    def claims(self) -> tuple[Claim, ...]:
        """What this setting is to the other programs that may set it (a sysctl key, the
        IRQs' affinity, a unit's CPUs: latencyd.kernel.owners), so status, explain and plan
        name them and a drift names who set it. (): no other owner is looked for."""
        return ()

    def device(self) -> str | None:
        """The device this setting belongs to (a NIC's identity), by which the engine
        indexes what a plugin owns: a device event then finds the device's settings
        without a scan of every other device's. None: no one device's."""
        return None


@dataclass(frozen=True)
class FileTarget(Target[V]):
    """A setting that is one file under the System's root (a sysctl, a sysfs file, a CPU's
    or an IRQ's), and reads, writes, compares and watches itself through the System. A
    kind names its file (`rel`) and declares what its text means: `parse` makes a value of
    what is read (by default the text itself), `text` the text written for a value (by
    default str(value)), and `same` says which values are alike where that is not
    equality. `lacking` says why a machine without the file cannot have the setting (not
    applicable, before the file is touched). A write to the file by anyone is seen at
    once (watch_files)."""

    # The file comes and goes with what it belongs to (a CPU, an IRQ, a disk): missing, the
    # setting is gone and dropped without error. Otherwise a missing file is for `read` to
    # explain (an error, or not applicable with the reason).
    transient: ClassVar[bool] = False

    @property
    def rel(self) -> str:
        """The file, relative to the System's root ("proc/sys/vm/swappiness")."""
        raise NotImplementedError

    def parse(self, text: str) -> V:
        """The value the file's text (as System.read gives it) stands for: by default the
        text itself (a FileTarget[str]); a kind of another value type says how."""
        return cast(V, text)

    def text(self, system: System, value: V) -> str:
        """What is written to the file to set `value` (NotApplicable: this machine cannot
        take it)."""
        return str(value)

    def lacking(self, system: System) -> str | None:
        """Why this machine cannot have the setting at all (a kernel without the facility),
        asked before the file is read or written; None: go ahead (and a missing file is
        the kernel's to refuse, or gone if transient)."""
        return None

    def _available(self, system: System) -> None:
        why = self.lacking(system)
        if why is not None:
            raise NotApplicable(why)

    def read(self, system: System) -> V:
        self._available(system)
        return self.parse(system.read(self.rel))

    def write(self, system: System, value: V) -> None:
        self._available(system)
        system.write(self.rel, self.text(system, value))

    def exists(self, system: System) -> bool:
        return not self.transient or system.exists(self.rel)

    def watch_files(self, system: System) -> tuple[str, ...]:
        return (self.rel,)


def same_cpus(wanted: object, actual: object) -> bool:
    """Whether two CPU lists name the same CPUs, however spelt ("0-2" and "0,1,2")."""
    return CpuSet.from_list(str(wanted)) == CpuSet.from_list(str(actual))


@dataclass(frozen=True)
class CpuListFile(FileTarget[str]):
    """A file holding a CPU list ("0-3,8"); its value is a CPU list, alike to every other
    spelling of the same CPUs."""

    def parse(self, text: str) -> str:
        return CpuSet.from_list(text).to_list()

    def same(self, system: System, wanted: str, actual: str) -> bool:
        return same_cpus(wanted, actual)


@dataclass(frozen=True)
class CpuMaskFile(CpuListFile):
    """A file holding a CPU mask ("f" or "00000000,0000000f"); its value is a CPU list,
    written as a mask as wide as the online CPUs need."""

    def parse(self, text: str) -> str:
        return CpuSet.from_mask(text).to_list()

    def text(self, system: System, value: str) -> str:
        return CpuSet.from_list(str(value)).to_mask(max(system.online_cpus()) + 1)


def plain_path(text: str, parts: int | None = None) -> bool:
    """Whether `text` is a relative path of plain components (none empty, "." or "..",
    no NUL), and of `parts` components when given: what a target may name below its
    plugin's directory."""
    names = text.split("/")
    if parts is not None and len(names) != parts:
        return False
    return not any(n in ("", ".", "..") or "\0" in n for n in names)


Settings = dict[Target, Value]
T = TypeVar("T", bound=Target)
R = TypeVar("R")  # a plugin's rules: what its expansion keeps for later (Expansion.rules)
Opt = TypeVar("Opt")  # a plugin's options: its section as it reads it (Plugin.options_of)


class OwnedSettings(Mapping[Target, Value]):
    """What `expand` and the event hooks get as `owned`: a plugin's applied settings,
    and for each the original it will be given back (what its user had asked for)."""

    def original(self, target: Target) -> Value | None:
        """The value `target` had before latencyd first changed it; None if not owned."""
        raise NotImplementedError

    def of_device(self, device: str) -> set[Target]:
        """The owned settings of one device (Target.device), at the cost of their number."""
        raise NotImplementedError


def of_device(owned: Mapping[Target, Value], device: str) -> set[Target]:
    """`owned`'s settings of one device: the engine's index, or a scan of a plain mapping
    (a unit test's)."""
    if isinstance(owned, OwnedSettings):
        return owned.of_device(device)
    return {t for t in owned if t.device() == device}


def original_of(owned: Mapping[Target, Value], target: Target) -> Value | None:
    """The original of one of `owned`'s settings (OwnedSettings.original), or None: not
    owned, or a plain mapping (a unit test's) that keeps none."""
    return owned.original(target) if isinstance(owned, OwnedSettings) else None


def encode_target(target: Target) -> dict[str, str | int | bool]:
    """{"kind": ..., field: value, ...}: the journal's and the D-Bus API's form of a target."""
    encoded: dict[str, str | int | bool] = {"kind": type(target).kind}
    for name in _field_names(type(target)):
        encoded[name] = getattr(target, name)
    return encoded


def names_a_task(target: Target) -> bool:
    """Whether the target is a task's (a thread's or a process's): it has a pid."""
    return "pid" in _field_names(type(target))


_FIELD_NAMES: dict[type[Target], tuple[str, ...]] = {}


def _field_names(cls: type[Target]) -> tuple[str, ...]:
    """A target class's fields, looked up once (not per target of 20,000)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def decode_target(kinds: Mapping[str, type[Target]], data: object) -> Target:
    """The inverse of encode_target; ValueError when `data` is not one of `kinds`."""
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("kind"), str)
        or (data["kind"] not in kinds)
    ):
        raise ValueError(f"not a known target: {data!r}")
    cls = kinds[data["kind"]]
    values = {}
    for f in dataclasses.fields(cls):
        value = data.get(f.name)
        type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        want = {"int": int, "str": str, "bool": bool}.get(type_name, object)
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise ValueError(f"target {data!r}: {f.name} is not a {f.type}")
        values[f.name] = value
    target = cls(**values)
    why = target.problem()
    if why:
        raise ValueError(why)
    return target


@dataclass(frozen=True)
class Expansion(Generic[R]):
    """What a profile section wants on this machine, computed without changing anything.

    `rules` (of the plugin's own type: its Plugin's R) is whatever the plugin needs later
    to tune targets that appear after the profile was applied (new threads, hot-plugged
    NICs); the engine keeps it with the applied profile, so a rejected switch leaves no
    trace, and hands it to the plugin's hooks. `notes` explain a setting in
    `status` ("resolved from 'poll'"). `refused` lists parts of the section that cannot
    apply on this machine, with the reason; the rest of the profile still applies.
    `current` holds values expand had to read anyway (a thread's CPUs): the engine takes
    them as what is there now instead of reading each target again.
    """

    settings: Settings = field(default_factory=dict)
    rules: R | None = None
    notes: dict[Target, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    current: dict[Target, Value] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceEvent:
    """One udev event: `old_name` is set for a rename (action "move"); `devpath` is the
    kernel's DEVPATH (/devices/.../net/eth0/queues/rx-1: whose queue it is)."""

    subsystem: str
    action: str
    name: str
    old_name: str = ""
    devpath: str = ""


@dataclass(frozen=True)
class Follows:
    """The udev events a plugin hears (subsystem -> actions): the watchers' filter is
    derived from these, only for plugins whose section is in the active profile. A "cpu"
    event re-resolves the whole profile (its CPU lists); any other goes to the plugin's
    on_device (latencyd.core.capabilities.FollowsDevices). Task events are a capability
    of their own (FollowsTasks)."""

    udev: Mapping[str, frozenset[str]] = field(default_factory=dict)  # subsystem -> actions


DEVICE_ACTIONS = frozenset({"add", "remove", "bind", "unbind", "move", "change"})
CPU_ACTIONS = frozenset({"online", "offline", "add", "remove"})


Row = tuple[Json, ...]


@dataclass(frozen=True)
class Table:
    """One monitoring table; `latencyctl status` and `--json` render the same structure.

    `hide_tasks` says how a row shows to a caller who may not see other users' tasks
    (Status: anyone but root and the admin group): the row with its tasks' pids and names
    taken out, or None to leave the row out. Unset: no row names a task."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[Row, ...]
    hide_tasks: Callable[[Row], Row | None] | None = field(default=None, compare=False)

    def as_json(self, sees_tasks: bool = True) -> dict[str, Json]:
        """The table as Status shows it; rows left out for a caller who may not see
        tasks are counted in "hidden"."""
        rows = self.rows
        if not sees_tasks and self.hide_tasks is not None:
            rows = tuple(row for row in map(self.hide_tasks, self.rows) if row is not None)
        out: dict[str, Json] = {
            "title": self.title,
            "columns": list(self.columns),
            "rows": [*map(list, rows)],
        }
        if len(rows) < len(self.rows):
            out["hidden"] = len(self.rows) - len(rows)
        return out


@dataclass(frozen=True)
class Monitor:
    """What a plugin measured: tables, and named facts (JSON values) for everything else."""

    tables: tuple[Table, ...] = ()
    facts: Mapping[str, Json] = field(default_factory=dict)


class Plugin(Generic[T, R, Opt]):
    """Base of every plugin, generic in its target type(s) T, its rules R (what its
    expansions keep, Expansion.rules: None for a plugin that keeps none) and its options Opt
    (its section as its hooks get it: the options class its schema declares,
    Schema.section, or Options where the section has free keys). Required: `name`,
    `summary`, `schema`, `targets`, `example` and `expand`; `read`, `write` and `describe`
    too unless the target kinds do them (Target.read, ...: every FileTarget does); the rest
    has defaults. What only some plugins do (follow tasks or devices, share a setting with
    its user, report grouped, provide the noise watch, act at boot, place the application,
    keep what a step read, start afresh, name a device's files, take over another's kinds, hold
    resources to release) is a capability the plugin declares among its bases
    (latencyd.core.capabilities).

    The hooks that take `rules` get the applied section's (the Expansion.rules of its last
    expansion), or None where there are none: the section was refused whole
    (NotApplicable), or its plugin keeps none."""

    name: ClassVar[str]
    summary: ClassVar[str]
    schema: Schema = Schema()  # an instance may refine it when checks need the machine
    targets: ClassVar[tuple[type[Target], ...]] = ()
    follows: ClassVar[Follows] = Follows()
    # A section that exercises the plugin: the contract test (tests/unit/test_contract.py)
    # applies it on a fake machine, verifies it and restores it, for every plugin found.
    example: ClassVar[dict[str, Any]] = {}

    def __init__(self, system: System) -> None:
        self.system = system
        # For plugins that follow events: how often `changed` should ask for a full
        # rescan. The daemon sets it to 0 (every tick) when no event source is open.
        self.rescan_interval_s = 60.0

    # -- what a section wants (pure: reads the machine, changes nothing, stores nothing) --
    @final
    def options_of(self, section: Options) -> Opt:
        """A validated section as this plugin's hooks get it (Schema.typed): what the
        engine and the daemon hand `expand`, `root_only` and the capabilities' hooks."""
        return cast(Opt, self.schema.typed(section))

    def expand(self, options: Opt, owned: Mapping[Target, Value]) -> Expansion[R]:
        """The section's wanted settings. `owned` are this plugin's settings currently
        applied by the engine (a plugin that moves tasks must keep owning what it moved).
        Raise NotApplicable when the whole section cannot apply on this machine."""
        raise NotImplementedError

    def expand_steps(
        self, options: Opt, owned: Mapping[Target, Value]
    ) -> Generator[None, None, Expansion[R]]:
        """`expand`, for a plugin whose expansion can take long (tens of thousands of
        threads): a generator that yields between pieces of its work, so the daemon keeps
        answering meanwhile, and returns the Expansion. Such a plugin defines `expand` as
        `run_to_end(self.expand_steps(...))`; the others need not know of it."""
        return self.expand(options, owned)
        yield  # a generator function

    # -- one target: by default the target's own (Target.read, ..., FileTarget) -----------
    def read(self, target: T) -> Value:
        """The target's current value (to save the original, and to verify)."""
        value: Value = target.read(self.system)  # its kind's, a JSON value
        return value

    def write(self, target: T, value: Value) -> None:
        """Set one target; raise KernelRefused (or NotApplicable) when the kernel says no."""
        target.write(self.system, value)

    def original(
        self, target: T, current: Value, owned: Callable[[Target], tuple[Value, Value] | None]
    ) -> Value:
        """What to restore for a target first tuned now, given its current value. `owned`
        gives (original, applied) of one of this plugin's applied targets, or None. By
        default the current value; a plugin whose new targets are born with a value the
        profile set elsewhere (a new IRQ takes the default affinity) gives what it would
        have had without the profile."""
        return current

    @final
    def same(self, target: T, wanted: Value, actual: Value) -> bool:
        """Whether the kernel's value is what was wanted, as its kind compares them
        (Target.same): not a hook, a kind says it."""
        return target.same(self.system, wanted, actual)

    def exists(self, target: T) -> bool:
        """Whether the target is still there; vanished ones are dropped without error."""
        return target.exists(self.system)

    def describe(self, target: T, value: Value) -> str:
        """The setting in words (status, logs, errors)."""
        return target.describe(value)

    # -- who may apply it, and targets that appear later -------------------------------------
    def root_only(self, options: Opt) -> str | None:
        """Why this section may be applied only for root, not for admin_group members (it
        could hand out root, e.g. sysctl kernel.core_pattern), or None."""
        return None

    def changed(self, rules: R | None) -> bool:
        """Cheap check on the monitor tick: must the section be expanded again (new
        IRQs, a rescan due)? The event sources do the real work; this is the safety net."""
        return False

    # -- monitoring -------------------------------------------------------------------------
    def on_applied(self, rules: R | None) -> None:
        """The section was just applied: reset monitoring baselines ("since applied")."""

    def monitor(self, rules: R | None) -> Monitor:
        return Monitor()


def target_kinds(plugin: Plugin[Any, Any, Any]) -> dict[str, type[Target]]:
    return {cls.kind: cls for cls in plugin.targets}


def entry_point_specs(group: str, path: list[str] | None = None) -> dict[str, str]:
    """name -> "module:attr" for an entry-point group, read from installed metadata.

    Reads each distribution's entry_points.txt directly: importing importlib.metadata
    (email, zipfile, csv, ...) cost 17 ms and 2.9 MiB of the daemon's start-up here.
    The first distribution on the path to define a name wins, as with importlib.
    """
    found: dict[str, str] = {}
    for entry in sys.path if path is None else path:
        try:
            names = sorted(os.listdir(entry or "."))
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                text = Path(entry or ".", name, "entry_points.txt").read_text()
            except OSError:
                continue
            section = ""
            for raw in text.splitlines():
                line = raw.strip()
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1].strip()
                elif section == group and "=" in line and not line.startswith(("#", ";")):
                    key, _, value = line.partition("=")
                    found.setdefault(key.strip(), value.strip())
    return found


BUILT_IN_PACKAGE = "latencyd.plugins"  # the repository's plugins/, as installed


def built_in_plugin(module: object, name: str) -> type[Plugin[Any, Any, Any]] | None:
    """The plugin a module (or package) of `plugins/` is: the Plugin class it holds whose
    `name` is the module's name (`plugins/ksm.py` holds `class KsmPlugin(...): name = "ksm"`);
    None when it holds none (a helper module)."""
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, Plugin)
            and value is not Plugin
            and getattr(value, "name", None) == name
        ):
            return value
    return None


def built_in(package: str = BUILT_IN_PACKAGE) -> dict[str, type[Plugin[Any, Any, Any]]]:
    """The plugins in `package`, found by listing it: each module or subpackage whose
    Plugin class carries its name. A new file in plugins/ is a new plugin, with nothing
    else to edit (no entry point, no list)."""
    found: dict[str, type[Plugin[Any, Any, Any]]] = {}
    where = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(where.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{package}.{info.name}")
        except Exception as exc:  # one broken plugin must not stop the daemon
            log.error("plugin %s (%s) failed to load: %s", info.name, package, exc)
            continue
        cls = built_in_plugin(module, info.name)
        if cls is not None:
            found[info.name] = cls
    return found


def discover(
    path: list[str] | None = None, package: str = BUILT_IN_PACKAGE
) -> dict[str, type[Plugin[Any, Any, Any]]]:
    """Every plugin: the built-ins of `package` (latencyd's plugins/, listed), then those
    other installed packages register under the `latencyd.plugins` entry-point group on
    `path` (default: sys.path, where they are imported from). A registered plugin with a
    built-in's name is refused (logged, the built-in kept): a profile's [irq] means
    latencyd's irq whatever else is installed. One that names the built-in itself is the
    metadata of an install made when built-ins were registered so (an editable install
    not redone): nothing to say."""
    found = built_in(package)
    for name, spec in entry_point_specs(ENTRY_POINT_GROUP, path).items():
        if name in found and spec.partition(":")[0].strip() == f"{package}.{name}":
            continue
        if name in found:
            log.error(
                "plugin %s (%s) refused: %s is a built-in plugin's name; rename it",
                name,
                spec,
                name,
            )
            continue
        module, _, attr = spec.partition(":")
        try:
            cls = getattr(importlib.import_module(module.strip()), attr.strip())
        except Exception as exc:  # a broken third-party plugin must not stop the daemon
            log.error("plugin %s (%s) failed to load: %s", name, spec, exc)
            continue
        if not (isinstance(cls, type) and issubclass(cls, Plugin)):
            log.error("plugin %s (%s) is not a latencyd Plugin class", name, spec)
            continue
        found[name] = cls
    return found


Result = TypeVar("Result")
P = ParamSpec("P")


def run_to_end(steps: Generator[Any, None, Result]) -> Result:
    """Drives a stepwise operation (expand_steps, the engine's steps) to its end in one go;
    its result."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]


def in_one_go(steps: Callable[P, Generator[Any, None, Result]]) -> Callable[P, Result]:
    """The one-go form of a stepwise function: `expand = in_one_go(expand_steps)`."""

    @functools.wraps(steps)
    def run(*args: P.args, **kwargs: P.kwargs) -> Result:
        return run_to_end(steps(*args, **kwargs))

    return run


def load_plugins(system: System) -> dict[str, Plugin[Any, Any, Any]]:
    """One instance of every registered plugin, bound to `system`."""
    plugins: dict[str, Plugin[Any, Any, Any]] = {}
    for name, cls in discover().items():
        try:
            plugins[name] = cls(system)
        except Exception as exc:  # one plugin that cannot start must not stop the rest
            log.error("plugin %s failed to start: %s", name, exc)
    return plugins
