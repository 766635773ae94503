"""Metrics a fleet can scrape: a Prometheus text exposition, off unless the config sets
`metrics_listen = "127.0.0.1:9477"`, rendered by prometheus_client and served by an HTTP
server of bounded means (MetricsServer: connections at most MAX_CONNECTIONS, each given
REQUEST_TIMEOUT_S to send its request).

Only what latencyd alone knows: the time stolen from the watched CPUs, by source (the
noise watch), the profile in force, the state of its settings, drift found and what was
done about it, how long switches take. Per-CPU interrupt and softirq counts, cpufreq and
the like are prometheus-node-exporter's. Task sources are labelled by command name
without the pid ("task stress-ng"): a pid label would be a new series for every process
that ever ran. Status gives command names to root and the admin group only, hence an
address other hosts reach only with metrics_allow_remote (latencyd.service.config).

The noise series are bounded: each watched CPU names its `sources_per_cpu` sources that
took the most time lately, and counts the rest together as source="other", so a churn of
thousands of command names costs no more series than a quiet CPU (see `noise_series`).

The HTTP thread never touches the daemon: the main loop hands it a new immutable
snapshot after each change (a switch, a drift check, a noise interval), and a scrape
reads whichever snapshot is current.
"""

from __future__ import annotations

import contextlib
import heapq
import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from latencyd.errors import ConfigError
from latencyd.kernel.noise import Tally, task_of
from latencyd.text import printable

log = logging.getLogger(__name__)

OTHER = "other"  # the source label of what a CPU's named sources leave
# How much of a source's time from earlier intervals still counts for its rank, per
# interval: the last interval weighs as much as all before it, so a source that went quiet
# gives its rank up within a few intervals, and a steady source ranks at twice its time in
# one interval.
DECAY = 0.5
Rank = tuple[float, float]  # time (ns) and events: events order sources without time


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
    """A noise source as a label value, printable: prometheus_client escapes only `\\`,
    `"` and a newline, and a task's name is any user's choice (a terminal's escapes, a
    carriage return that hides the rest of the line in a console)."""
    task = task_of(source)
    return printable(f"task {task[1]}" if task else source)


def _ranked(rank: Rank, tally: Tally) -> Rank:
    ns, events = rank
    return ns * DECAY + tally.total_ns, events * DECAY + tally.count


@dataclass(frozen=True)
class Series:
    """One (cpu, source) pair of the noise counters, and what ranks it on its CPU."""

    events: int = 0
    ns: int = 0
    rank: Rank = (0.0, 0.0)

    def plus(self, tally: Tally) -> Series:
        """After one more interval (`tally`: the source's in it)."""
        return Series(
            self.events + tally.count, self.ns + tally.total_ns, _ranked(self.rank, tally)
        )


@dataclass(frozen=True)
class CpuSeries:
    """One watched CPU's noise series: its named sources and OTHER, and the unnamed sources
    seen lately, the candidates for a name (at most as many as there are names)."""

    named: Mapping[str, Series] = field(default_factory=dict)
    other: Series = Series()
    candidates: Mapping[str, Rank] = field(default_factory=dict)

    def series(self) -> dict[str, Series]:
        return {**self.named, OTHER: self.other}


def noise_series(cpu: CpuSeries, interval: Mapping[str, Tally], top: int) -> CpuSeries:
    """One CPU's series after one more interval (source -> Tally): at most `top` sources
    named, and OTHER for the rest, so that the exposition is bounded and every interval's
    time and events are counted once in what scrapes see increase.

    Free names go at once to the sources with the most time. Once all are taken, a source
    takes one only when it is seen in a second interval and ranks (DECAY) above the named
    source ranked lowest: a churn of one-off tasks, thousands of command names, changes no
    name, and a source that recurs replaces one that went quiet within a few intervals.
    The replaced source's series ends (a scrape no longer shows it, as after a restart),
    its time in this interval goes to OTHER, and the newcomer's series starts with its own.
    The ended total does not move to OTHER: Prometheus would take that for a burst of noise
    that never happened (rate() of OTHER, and of the CPU's sum, jumping by it)."""
    tallies: dict[str, Tally] = {}
    for source, tally in interval.items():
        label = source_label(source)
        tallies[label] = tallies[label].merged(tally) if label in tallies else tally
    rest, quiet = tallies.pop(OTHER, Tally()), Tally()
    named = {label: s.plus(tallies.get(label, quiet)) for label, s in cpu.named.items()}
    seen = {
        label: (_ranked(cpu.candidates.get(label, (0.0, 0.0)), tally), tally)
        for label, tally in tallies.items()
        if label not in named
    }
    candidates: dict[str, Rank] = {}
    for label, (rank, tally) in sorted(
        seen.items(), key=lambda kv: (kv[1][0], kv[0]), reverse=True
    ):
        if len(named) < top:
            named[label] = Series(tally.count, tally.total_ns, rank)
            continue
        if label in cpu.candidates:
            weakest = min(named, key=lambda n: (named[n].rank, n))
            if rank > named[weakest].rank:
                del named[weakest]
                rest = rest.merged(tallies.get(weakest, quiet))
                named[label] = Series(tally.count, tally.total_ns, rank)
                continue
        rest = rest.merged(tally)
        candidates[label] = rank
    for label, rank in cpu.candidates.items():
        if label not in seen:  # quiet in this interval
            candidates[label] = _ranked(rank, quiet)
    kept = heapq.nlargest(top, candidates.items(), key=lambda kv: kv[1])
    return CpuSeries(named, cpu.other.plus(rest), dict(kept))


@dataclass(frozen=True)
class Snapshot:
    profile: str = ""
    settings: Mapping[str, int] = field(default_factory=dict)  # state -> count
    drift: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (section, action)
    switch_seconds: float | None = None
    reboot_pending: bool = False
    noise: Mapping[str, CpuSeries] = field(default_factory=dict)  # by cpu
    noise_max_seconds: Mapping[str, float] = field(default_factory=dict)  # cpu
    budget_exceeded: Mapping[str, int] = field(default_factory=dict)  # by cpu


class Metrics:
    """The current snapshot, and the prometheus_client collector that exposes it."""

    def __init__(self, sources_per_cpu: int) -> None:
        self.snapshot = Snapshot()
        self.sources_per_cpu = sources_per_cpu

    def update(self, **changes: Any) -> None:
        self.snapshot = replace(self.snapshot, **changes)  # one reference swap: atomic

    def add_noise(self, cpus: Mapping[int, Mapping[str, Tally]]) -> None:
        """An interval's tallies (cpu -> source -> Tally) added to the running totals."""
        noise = dict(self.snapshot.noise)
        longest = {}
        for cpu, tallies in cpus.items():
            longest[str(cpu)] = max((t.max_ns for t in tallies.values()), default=0) / 1e9
            before = noise.get(str(cpu), CpuSeries())
            noise[str(cpu)] = noise_series(before, tallies, self.sources_per_cpu)
        self.update(noise=noise, noise_max_seconds=longest)

    def add_breach(self, cpu: int) -> None:
        counts = dict(self.snapshot.budget_exceeded)
        counts[str(cpu)] = counts.get(str(cpu), 0) + 1
        self.update(budget_exceeded=counts)

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
        for cpu, cpu_series in sorted(s.noise.items()):
            for source, series in sorted(cpu_series.series().items()):
                noise.add_metric([cpu, source], series.ns / 1e9)
                events.add_metric([cpu, source], float(series.events))
        longest = gauge("latencyd_noise_max_seconds", HELP["noise_max_seconds"], labels=["cpu"])
        for cpu, value in sorted(s.noise_max_seconds.items()):
            longest.add_metric([cpu], value)
        exceeded = counter(
            "latencyd_noise_budget_exceeded", HELP["budget_exceeded"], labels=["cpu"]
        )
        for cpu, n in sorted(s.budget_exceeded.items()):
            exceeded.add_metric([cpu], float(n))
        pending = gauge("latencyd_reboot_pending", HELP["reboot_pending"], value=s.reboot_pending)
        yield from (info, settings, pending, drift, noise, events, longest, exceeded)
        if s.switch_seconds is not None:
            yield gauge("latencyd_switch_duration_seconds", HELP["switch"], value=s.switch_seconds)


# Each metric as a scrape shows it (counters get _total), and its help text: also
# latencyd(8)'s METRICS section, and docs/operations.md's table.
NAMES = {
    "profile_info": "latencyd_profile_info{profile}",
    "settings": "latencyd_settings{state}",
    "reboot_pending": "latencyd_reboot_pending",
    "drift": "latencyd_drift_total{section,action}",
    "noise_seconds": "latencyd_noise_seconds_total{cpu,source}",
    "noise_events": "latencyd_noise_events_total{cpu,source}",
    "noise_max_seconds": "latencyd_noise_max_seconds{cpu}",
    "budget_exceeded": "latencyd_noise_budget_exceeded_total{cpu}",
    "switch": "latencyd_switch_duration_seconds",
}
HELP = {
    "profile_info": 'The profile in force (value 1; profile="" when none is)',
    "settings": "Settings of the profile in force, by state: applied, not_applicable",
    "reboot_pending": "1 when applied settings take effect only at the next boot (kernel "
    "arguments written, not booted), else 0",
    "drift": "Owned settings found changed by someone else, by section and by what was "
    "done (reapplied, reported, failed)",
    "noise_seconds": "Time the watched CPUs spent interrupted, by CPU and source",
    "noise_events": "Interruptions of the watched CPUs, by CPU and source",
    "noise_max_seconds": "The longest single interruption of each watched CPU in the last interval",
    "switch": "How long the last switch (or start-up apply) took",
    "budget_exceeded": "Intervals in which a watched CPU took more noise than its budget "
    "([monitor] budget_us, max_single_us), by CPU",
}


# A scrape sends its request at once; one that has not within this many seconds (nothing
# sent, or a byte now and then) is dropped. Prometheus times its own scrapes out after 10 s
# by default, so nothing a real scraper does comes near it; not a setting, as there is no
# good reason to want another.
REQUEST_TIMEOUT_S = 5.0
# Connections served at once: a scraper uses one at a time, so this is room for a few
# Prometheus servers, an agent and someone's curl. When every one is taken, the one that
# has waited longest for its request is dropped for the newcomer: idle connections cannot
# keep a scrape out.
MAX_CONNECTIONS = 16
# What socketserver hands its methods; a stream server's is the connection's socket.
Request = socket.socket | tuple[bytes, socket.socket]


class _Handler(WSGIRequestHandler):
    """One connection: one request (HTTP/1.0, then closed), answered without a log line."""

    server: MetricsServer

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout_s)  # each read and write

    def parse_request(self) -> bool:
        whole = super().parse_request()  # the request line and the headers are in
        if whole:
            self.server.request_read(self.request)
        return whole

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


class MetricsServer(WSGIServer):
    """prometheus_client's WSGI app behind a bounded HTTP server: at most `max_connections`
    connections, each with a thread of its own, and none waits longer than
    `request_timeout_s` for its request: the server's own thread drops it then (a byte now
    and then does not keep it), or earlier when a newcomer needs its place."""

    request_queue_size = 64  # connections the kernel completes before they are accepted

    def __init__(
        self, listen: tuple[str, int], request_timeout_s: float, max_connections: int
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        self.request_timeout_s = request_timeout_s
        self.max_connections = max_connections
        self._slots = threading.Condition()
        self._open = 0  # connections with a thread
        self._waiting: dict[Request, float] = {}  # for a request: its deadline, by age
        super().__init__(listen, _Handler)

    def process_request(self, request: Request, client_address: Any) -> None:
        """A new connection: a place for it (the oldest still waiting for its request
        dropped if need be), then a thread."""
        with self._slots:
            if self._open >= self.max_connections and self._waiting:
                self._drop(next(iter(self._waiting)))
            if not self._slots.wait_for(
                lambda: self._open < self.max_connections, self.request_timeout_s
            ):  # every place is sending an answer: cannot happen with a scrape's size
                self.shutdown_request(request)
                return
            self._open += 1
            self._waiting[request] = time.monotonic() + self.request_timeout_s
        threading.Thread(
            target=self._serve,
            args=(request, client_address),
            name="metrics-connection",
            daemon=True,  # the daemon's exit waits for none
        ).start()

    def _serve(self, request: Request, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            with self._slots:
                self._open -= 1
                self._slots.notify_all()

    def request_read(self, request: Request) -> None:
        """The connection's request is in: it is answered, never dropped."""
        with self._slots:
            self._waiting.pop(request, None)

    def service_actions(self) -> None:
        """Each turn of serve_forever: drop the connections past their deadline."""
        now = time.monotonic()
        with self._slots:
            for request in [r for r, deadline in self._waiting.items() if deadline <= now]:
                self._drop(request)

    def _drop(self, request: Request) -> None:
        """End a connection from another thread (its own returns from its read at once);
        the lock held. Never closed here: its thread does that (shutdown_request)."""
        del self._waiting[request]
        with contextlib.suppress(OSError):
            (request if isinstance(request, socket.socket) else request[1]).shutdown(
                socket.SHUT_RDWR
            )

    def shutdown_request(self, request: Request) -> None:
        with self._slots:  # out of reach of _drop before its descriptor can be reused
            self._waiting.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Request, client_address: Any) -> None:
        """A client gone, dropped or too slow: not worth more than a debug line."""
        log.debug("metrics: connection from %s ended early", client_address, exc_info=True)


def serve(
    listen: tuple[str, int],
    metrics: Metrics,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> MetricsServer:
    """Start the exposition on its own thread; ConfigError when it cannot bind."""
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    host, port = listen
    try:
        server = MetricsServer(listen, request_timeout_s, max_connections)
    except OSError as exc:
        raise ConfigError(f"metrics_listen {host}:{port}: cannot listen: {exc.strerror}") from exc
    server.set_app(make_wsgi_app(registry))
    # The deadlines are checked each turn of the loop: a few times within one.
    poll_s = min(0.5, request_timeout_s / 4)
    threading.Thread(
        target=server.serve_forever, args=(poll_s,), name="metrics", daemon=True
    ).start()
    return server
