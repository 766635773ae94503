"""Daemon configuration (/etc/latencyd/latencyd.conf, TOML) and where profiles are looked up."""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from latencyd.core.profile import Fixed
from latencyd.core.schema import Schema
from latencyd.core.tomlpos import key_lines, nearest_line
from latencyd.errors import ConfigError, Location
from latencyd.kernel.system import Machine
from latencyd.paths import CLUSTER_PROFILES, CONFIG_FILE, ETC_PROFILES, shipped_profiles_dir

FALLBACK_PROFILE = "latency-performance"


@dataclass(frozen=True)
class Config:
    default_profile: str = FALLBACK_PROFILE
    admin_group: str | None = None  # members may change state, besides root
    verify_interval_s: float = 10.0  # the safety-net tick: verify everything owned
    poll_interval_s: float = (
        1.0  # settings no event reports (thread affinities) are read this often
    )
    profile_dirs: tuple[Path, ...] = field(default=())
    # Where a node agent installs the cluster's profiles: searched after every other
    # directory, its profiles held to the admin group's limits (Daemon.load)...
    cluster_profiles: Path | None = CLUSTER_PROFILES
    # ...except in the sections this node's admin names here (such as "bootloader").
    cluster_allow_root: tuple[str, ...] = ()
    task_events: str = "auto"  # auto | perf | proc-connector | none
    on_stop: str = "restore"  # restore | keep (leave the tuning; the next start adopts it)
    metrics_listen: tuple[str, int] | None = None  # Prometheus exposition: off by default
    metrics_allow_remote: bool = False  # metrics_listen may be an address other hosts reach
    # Noise sources named per watched CPU in the metrics, the rest together as "other".
    # The monitor's status shows 5, NoiseExceeded 3; a shielded CPU's steady sources (the
    # local timer, a few softirqs, an IPI kind or two, a steered IRQ) and a task or two fit
    # in 10. Two counters of 11 series a CPU: ~1,400 for a 64-CPU shield, however many
    # command names come and go.
    metrics_sources_per_cpu: int = 10
    # [plugin.NAME] option = value: fixed in that section of every profile that has it
    # (checked against the plugin's schema by fixed_options, once the plugins are known).
    plugin: dict[str, dict[str, Fixed]] = field(default_factory=dict)


KNOWN: dict[str, type | tuple[type, ...]] = {
    "default_profile": str,
    "admin_group": str,
    "verify_interval_s": (int, float),
    "poll_interval_s": (int, float),
    "profile_dirs": list,
    "cluster_profiles": str,
    "cluster_allow_root": list,
    "task_events": str,
    "on_stop": str,
    "metrics_listen": str,
    "metrics_allow_remote": bool,
    "metrics_sources_per_cpu": int,
    "plugin": dict,
}
SOURCES_PER_CPU_MAX = 100  # beyond it, the bound would no longer bound much
# What each setting does, for latencyd(8)'s CONFIGURATION (latencyd.tools.manpages).
DOCS = {
    "default_profile": "profile applied at start when --profile is not given",
    "admin_group": "members of this group may change state, besides root "
    "(they name profiles from the search path only)",
    "verify_interval_s": "seconds between checks of every owned setting (0: never)",
    "poll_interval_s": "seconds between read-backs of settings no event reports, "
    "such as thread affinities and NIC settings",
    "profile_dirs": "directories searched for profiles before /etc/latencyd/profiles",
    "cluster_profiles": "the directory a node agent installs the cluster's profiles into "
    f'(default {CLUSTER_PROFILES}; "" for none): searched after every other one, so a '
    "cluster profile never takes the place of one of the host's, and held to the limits of "
    "admin_group members whoever applies it: no section that can hand out root, no "
    "include by path",
    "cluster_allow_root": "sections in which cluster profiles may do what only root may "
    '(e.g. ["bootloader"] lets them write kernel arguments, ["sysctl"] set any sysctl): '
    "whoever may write the cluster's profiles is then root on this node",
    "task_events": "where new kernel threads are heard of: auto, perf, proc-connector "
    "or none (periodic rescan)",
    "on_stop": "on SIGTERM: restore every original value (kernel arguments for the next "
    "boot stay: only off or a switch away takes them out), or keep the tuning for the "
    "next start to adopt",
    "metrics_listen": "serve Prometheus metrics at http://ADDRESS:PORT/metrics, e.g. "
    '"127.0.0.1:9477" (see METRICS); off when unset. A loopback address only, unless '
    "metrics_allow_remote says otherwise",
    "metrics_allow_remote": "let metrics_listen be an address other hosts can reach "
    '(such as "0.0.0.0:9477"): the metrics name the tasks that interrupt the watched CPUs',
    "metrics_sources_per_cpu": "noise sources each watched CPU names in the metrics, those "
    f'with the most time lately (1 to {SOURCES_PER_CPU_MAX}); the rest are source="other"',
    "plugin": "options fixed in that plugin's section of every profile that has the section, "
    "whatever the profile says (a profile without it gains none); e.g. "
    "[plugin.bootloader] write = false: latencyd writes no boot configuration from any "
    "profile. Checked against the plugin's options at start; explain and status name "
    "the config's line for each",
}


def load_config(path: Path = CONFIG_FILE) -> Config:
    """The config file's settings; a missing file means defaults, a broken one is an error
    naming the file and, for a setting, its line (`latencyd.conf:3: ...`)."""
    try:
        text = path.read_text()
        data = tomllib.loads(text)
    except FileNotFoundError:
        return Config()
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    lines = key_lines(text)

    def at(key: str) -> Location:
        return Location(path, lines.get((key,)))

    def at_path(*keys: str) -> Location:
        return Location(path, nearest_line(lines, keys))

    for key, value in data.items():
        want = KNOWN.get(key)
        if want is None:
            raise ConfigError(f"{at(key)}: unknown setting {key!r} (known: {', '.join(KNOWN)})")
        if not isinstance(value, want) or (isinstance(value, bool) and want is not bool):
            raise ConfigError(f"{at(key)}: {key} has the wrong type ({value!r})")
    for key in ("verify_interval_s", "poll_interval_s"):
        if data.get(key, 0) < 0:
            raise ConfigError(f"{at(key)}: {key} cannot be negative ({data[key]!r})")
    sources = data.get("metrics_sources_per_cpu", Config.metrics_sources_per_cpu)
    if not 1 <= sources <= SOURCES_PER_CPU_MAX:
        raise ConfigError(
            f"{at('metrics_sources_per_cpu')}: metrics_sources_per_cpu must be 1 to "
            f"{SOURCES_PER_CPU_MAX} (got {sources!r})"
        )
    dirs = data.get("profile_dirs", [])
    if not all(isinstance(d, str) for d in dirs):
        raise ConfigError(
            f"{at('profile_dirs')}: profile_dirs must be a list of directory paths ({dirs!r})"
        )
    allow_root = data.get("cluster_allow_root", [])
    if not all(isinstance(name, str) for name in allow_root):
        raise ConfigError(
            f"{at('cluster_allow_root')}: cluster_allow_root must be a list of section "
            f"names ({allow_root!r})"
        )
    cluster = data.get("cluster_profiles", str(CLUSTER_PROFILES))
    remote = bool(data.get("metrics_allow_remote", Config.metrics_allow_remote))
    listen = None
    if "metrics_listen" in data:
        from latencyd.service.metrics import parse_listen

        try:
            listen = parse_listen(data["metrics_listen"])
        except ValueError as exc:
            raise ConfigError(f"{at('metrics_listen')}: metrics_listen: {exc}") from exc
        if not remote and not ipaddress.ip_address(listen[0]).is_loopback:
            raise ConfigError(
                f"{at('metrics_listen')}: metrics_listen: {listen[0]} is not a loopback "
                "address: other hosts could read the metrics, which name the tasks that "
                "interrupt the watched CPUs. Listen on 127.0.0.1 or [::1], or set "
                "metrics_allow_remote = true to mean it"
            )
    return Config(
        plugin=_plugin_tables(at_path, data.get("plugin", {})),
        default_profile=data.get("default_profile", FALLBACK_PROFILE),
        admin_group=data.get("admin_group"),
        verify_interval_s=float(data.get("verify_interval_s", Config.verify_interval_s)),
        poll_interval_s=float(data.get("poll_interval_s", Config.poll_interval_s)),
        profile_dirs=tuple(Path(p) for p in data.get("profile_dirs", [])),
        cluster_profiles=Path(cluster) if cluster else None,
        cluster_allow_root=tuple(allow_root),
        task_events=_choice(at, data, "task_events", ("auto", "perf", "proc-connector", "none")),
        on_stop=_choice(at, data, "on_stop", ("restore", "keep")),
        metrics_listen=listen,
        metrics_allow_remote=remote,
        metrics_sources_per_cpu=sources,
    )


def _plugin_tables(
    at: Callable[..., Location], tables: dict[str, Any]
) -> dict[str, dict[str, Fixed]]:
    """[plugin.NAME] tables as they are written (their options are checked against the
    plugins' schemas by fixed_options)."""
    fixed: dict[str, dict[str, Fixed]] = {}
    for name, options in tables.items():
        if not isinstance(options, dict):
            raise ConfigError(
                f"{at('plugin', name)}: plugin.{name} must be a table of the plugin's "
                f"options, like [plugin.{name}] (got {options!r})"
            )
        if options:  # an empty table fixes nothing
            fixed[name] = {o: Fixed(value, at("plugin", name, o)) for o, value in options.items()}
    return fixed


def fixed_options(
    config: Config, schemas: Mapping[str, Schema], machine: Machine
) -> dict[str, dict[str, Fixed]]:
    """The config's [plugin.NAME] options, each checked against its plugin's schema
    (`schemas`: the installed plugins', engine options included): an unknown plugin or
    option, or a value the option does not take, is the config's error at its line."""
    for name, options in config.plugin.items():
        schema = schemas.get(name)
        if schema is None:
            where = next(iter(options.values())).where  # an empty table was left out
            known = ", ".join(sorted(schemas)) or "none installed"
            raise ConfigError(f"{where}: unknown plugin {name!r} in [plugin.{name}] "
                              f"(plugins: {known})")  # fmt: skip
        for opt, fixed in options.items():
            option = schema.option(opt)
            if option is None:
                known = ", ".join(o.name for o in schema.options)
                raise ConfigError(f"{fixed.where}: [plugin.{name}] has no option {opt!r} "
                                  f"to fix (options: {known})")  # fmt: skip
            try:
                option.kind.parse(fixed.value, machine)
            except ValueError as exc:
                raise ConfigError(f"{fixed.where}: [plugin.{name}] {opt}: {exc}") from exc
    return config.plugin


def cluster_allowed(config: Config, plugins: Iterable[str], path: Path) -> frozenset[str]:
    """The config's cluster_allow_root (read from `path`), each a section of an installed
    plugin: a misspelt one is the config's error at its line, not a silent no."""
    unknown = sorted(set(config.cluster_allow_root) - set(plugins))
    if unknown:
        try:
            line = key_lines(path.read_text()).get(("cluster_allow_root",))
        except OSError:
            line = None
        raise ConfigError(
            f"{Location(path, line)}: cluster_allow_root names no installed plugin: "
            f"{', '.join(unknown)}"
        )
    return frozenset(config.cluster_allow_root)


def _choice(
    at: Callable[[str], Location], data: dict[str, object], key: str, allowed: tuple[str, ...]
) -> str:
    value = str(data.get(key, allowed[0]))
    if value not in allowed:
        raise ConfigError(f"{at(key)}: {key} must be one of {', '.join(allowed)} (got {value!r})")
    return value


def search_path(cli_dirs: list[Path], config: Config) -> list[Path]:
    """--profile-dir (in order) > config's profile_dirs > /etc/latencyd/profiles > shipped
    (the cluster's directory comes after them all: ProfileLibrary's cluster_dir)."""
    return [*cli_dirs, *config.profile_dirs, ETC_PROFILES, shipped_profiles_dir()]
