"""Metrics a fleet can scrape: a Prometheus text exposition, off unless the config sets
`metrics_listen = "127.0.0.1:9477"`, served by prometheus_client's HTTP server thread.

Only what latencyd alone knows: the time stolen from the watched CPUs, by source (the
noise watch), the profile in force, the state of its settings, drift found and what was
done about it, how long switches take. Per-CPU interrupt and softirq counts, cpufreq and
the like are prometheus-node-exporter's. Nothing here is more than an unprivileged D-Bus
client can read with Status. Task sources are labelled by command name without the pid
("task stress-ng"): a pid label would be a new series for every process that ever ran.

The HTTP thread never touches the daemon: the main loop hands it a new immutable
snapshot after each change (a switch, a drift check, a noise interval), and a scrape
reads whichever snapshot is current.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from latencyd.core.errors import ConfigError

_TASK = re.compile(r"task \d+ (.*)")


def parse_listen(text: str) -> tuple[str, int]:
    """ "127.0.0.1:9477" or "[::1]:9477" -> (address, port); ValueError with the reason."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([0-9.]+):(\d+)", text.strip())
    if not m:
        raise ValueError(
            f'expected ADDRESS:PORT like "127.0.0.1:9477" or "[::1]:9477", got {text!r}'
        )
    host, port = (m[1], m[2]) if m[1] else (m[3], m[4])
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address") from None
    if not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port} is not between 1 and 65535")
    return host, int(port)


def source_label(source: str) -> str:
    m = _TASK.fullmatch(source)
    return f"task {m[1]}" if m else source


@dataclass(frozen=True)
class Snapshot:
    profile: str = ""
    settings: Mapping[str, int] = field(default_factory=dict)  # state -> count
    drift: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (section, action)
    switch_seconds: float | None = None
    noise_seconds: Mapping[tuple[str, str], float] = field(default_factory=dict)  # cpu, source
    noise_events: Mapping[tuple[str, str], int] = field(default_factory=dict)
    noise_max_seconds: Mapping[str, float] = field(default_factory=dict)  # cpu


class Metrics:
    """The current snapshot, and the prometheus_client collector that exposes it."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def update(self, **changes: Any) -> None:
        self.snapshot = replace(self.snapshot, **changes)  # one reference swap: atomic

    def add_noise(self, cpus: Mapping[int, Mapping[str, Any]]) -> None:
        """An interval's tallies (cpu -> source -> Tally) added to the running totals."""
        seconds, events = dict(self.snapshot.noise_seconds), dict(self.snapshot.noise_events)
        longest = {}
        for cpu, tallies in cpus.items():
            longest[str(cpu)] = max((t.max_ns for t in tallies.values()), default=0) / 1e9
            for source, t in tallies.items():
                key = (str(cpu), source_label(source))
                seconds[key] = seconds.get(key, 0.0) + t.total_ns / 1e9
                events[key] = events.get(key, 0) + t.count
        self.update(noise_seconds=seconds, noise_events=events, noise_max_seconds=longest)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.snapshot
        gauge, counter = GaugeMetricFamily, CounterMetricFamily
        info = gauge("latencyd_profile_info", HELP["profile_info"], labels=["profile"])
        info.add_metric([s.profile], 1.0)
        settings = gauge("latencyd_settings", HELP["settings"], labels=["state"])
        for state in ("applied", "not_applicable"):
            settings.add_metric([state], float(s.settings.get(state, 0)))
        drift = counter("latencyd_drift", HELP["drift"], labels=["section", "action"])
        for (section, action), n in sorted(s.drift.items()):
            drift.add_metric([section, action], float(n))
        noise = counter("latencyd_noise_seconds", HELP["noise_seconds"], labels=["cpu", "source"])
        events = counter("latencyd_noise_events", HELP["noise_events"], labels=["cpu", "source"])
        for key in sorted(s.noise_seconds):
            noise.add_metric(list(key), s.noise_seconds[key])
            events.add_metric(list(key), float(s.noise_events.get(key, 0)))
        longest = gauge("latencyd_noise_max_seconds", HELP["noise_max_seconds"], labels=["cpu"])
        for cpu, value in sorted(s.noise_max_seconds.items()):
            longest.add_metric([cpu], value)
        yield from (info, settings, drift, noise, events, longest)
        if s.switch_seconds is not None:
            yield gauge("latencyd_switch_duration_seconds", HELP["switch"], value=s.switch_seconds)


# Each metric as a scrape shows it (counters get _total), and its help text: also
# latencyd(8)'s METRICS section, and the README's table.
NAMES = {
    "profile_info": "latencyd_profile_info{profile}",
    "settings": "latencyd_settings{state}",
    "drift": "latencyd_drift_total{section,action}",
    "noise_seconds": "latencyd_noise_seconds_total{cpu,source}",
    "noise_events": "latencyd_noise_events_total{cpu,source}",
    "noise_max_seconds": "latencyd_noise_max_seconds{cpu}",
    "switch": "latencyd_switch_duration_seconds",
}
HELP = {
    "profile_info": 'The profile in force (value 1; profile="" when none is)',
    "settings": "Settings of the profile in force, by state: applied, not_applicable",
    "drift": "Owned settings found changed by someone else, by section and by what was "
    "done (reapplied, reported, failed)",
    "noise_seconds": "Time the watched CPUs spent interrupted, by CPU and source",
    "noise_events": "Interruptions of the watched CPUs, by CPU and source",
    "noise_max_seconds": "The longest single interruption of each watched CPU in the last interval",
    "switch": "How long the last switch (or start-up apply) took",
}


def serve(listen: tuple[str, int], metrics: Metrics) -> Any:
    """Start the exposition on its own thread; ConfigError when it cannot bind."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    host, port = listen
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ConfigError(f"metrics_listen {host}:{port}: cannot listen: {exc.strerror}") from exc
    return server
