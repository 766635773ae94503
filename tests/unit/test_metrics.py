"""The Prometheus exposition: the listen address checked, what a scrape returns from a
snapshot (prometheus_client renders it, its parser reads it back; the e2e test scrapes a
running daemon), the noise series bounded however many command names come and go, and
the HTTP server bounded however many clients connect and send nothing (real sockets on
127.0.0.1)."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from latencyd.errors import ConfigError
from latencyd.kernel.noise import Tally
from latencyd.service.config import Config, load_config
from latencyd.service.metrics import Metrics, parse_listen, serve


def test_listen_addresses_are_ip_and_port() -> None:
    assert parse_listen("127.0.0.1:9477") == ("127.0.0.1", 9477)
    assert parse_listen("[::1]:9477") == ("::1", 9477)
    for bad, why in (("localhost:9477", "expected ADDRESS:PORT"), ("1.2.3.4:0", "port 0"),
                     ("999.1.1.1:80", "not an IP address"), ("9477", "expected")):  # fmt: skip
        with pytest.raises(ValueError, match=why):
            parse_listen(bad)


def test_a_bad_metrics_listen_names_the_file_and_what_is_wrong(tmp_path: Path) -> None:
    conf = tmp_path / "latencyd.conf"
    conf.write_text('# metrics\nmetrics_listen = "127.0.0.1:99999"\n')
    with pytest.raises(ConfigError, match=r"latencyd.conf:2: metrics_listen: port 99999"):
        load_config(conf)
    conf.write_text('metrics_listen = "127.0.0.1:9477"\n')
    assert load_config(conf).metrics_listen == ("127.0.0.1", 9477)


@pytest.mark.parametrize(
    "listen",
    ["0.0.0.0:9477", "[::]:9477", "192.168.1.20:9477", "[fe80::1]:9477", "[::ffff:127.0.0.1]:1"],
)
def test_an_address_other_hosts_reach_is_refused_unless_the_config_says_so(
    tmp_path: Path, listen: str
) -> None:
    conf = tmp_path / "latencyd.conf"
    conf.write_text(f'default_profile = "balanced"\nmetrics_listen = "{listen}"\n')
    host, _ = parse_listen(listen)
    with pytest.raises(ConfigError) as info:
        load_config(conf)
    assert str(info.value).startswith(
        f"{conf}:2: metrics_listen: {host} is not a loopback address: other hosts could read"
    )
    assert "metrics_allow_remote = true" in str(info.value)  # what to write to mean it
    conf.write_text(f'metrics_listen = "{listen}"\nmetrics_allow_remote = true\n')
    config = load_config(conf)
    assert (config.metrics_listen, config.metrics_allow_remote) == (parse_listen(listen), True)


@pytest.mark.parametrize("listen", ["127.0.0.1:9477", "127.42.0.7:9477", "[::1]:9477"])
def test_a_loopback_address_needs_no_more_than_metrics_listen(tmp_path: Path, listen: str) -> None:
    conf = tmp_path / "latencyd.conf"
    conf.write_text(f'metrics_listen = "{listen}"\n')
    assert load_config(conf) == Config(metrics_listen=parse_listen(listen))
    conf.write_text(f'metrics_listen = "{listen}"\nmetrics_allow_remote = "yes"\n')
    with pytest.raises(ConfigError, match=r"latencyd.conf:2: metrics_allow_remote has the wrong"):
        load_config(conf)


def test_a_scrape_holds_the_noise_by_source_the_profile_and_drift() -> None:
    metrics = Metrics(Config().metrics_sources_per_cpu)
    metrics.update(profile="cpu-partitioning", settings={"applied": 12, "not_applicable": 2},
                   drift={("irq", "reapplied"): 3}, switch_seconds=0.25)  # fmt: skip
    metrics.add_noise({1: {"task 4242 stress-ng": Tally(2, 3_000_000, 2_000_000),
                           "local timer": Tally(250, 1_000_000, 8_000)}})  # fmt: skip
    metrics.add_noise({1: {"task 4343 stress-ng": Tally(1, 1_000_000, 1_000_000)}})
    metrics.add_breach(1)
    metrics.add_breach(1)
    text = exposition(metrics)
    # A task is labelled by its command name: one series, however many pids come and go.
    assert 'latencyd_noise_seconds_total{cpu="1",source="task stress-ng"} 0.004' in text
    assert 'latencyd_noise_events_total{cpu="1",source="task stress-ng"} 3.0' in text
    assert 'latencyd_noise_max_seconds{cpu="1"} 0.001' in text  # the last interval's
    assert 'latencyd_profile_info{profile="cpu-partitioning"} 1.0' in text
    assert 'latencyd_settings{state="applied"} 12.0' in text
    assert 'latencyd_drift_total{action="reapplied",section="irq"} 3.0' in text
    assert "latencyd_switch_duration_seconds 0.25" in text
    assert 'latencyd_noise_budget_exceeded_total{cpu="1"} 2.0' in text  # the alert's


def test_a_task_named_with_control_characters_is_exposed_printable() -> None:
    """prometheus_client escapes only a backslash, a quote and a newline in label values:
    a task's name (any user's choice) reaches the exposition printable."""
    metrics = Metrics(Config().metrics_sources_per_cpu)
    metrics.add_noise({1: {"task 4242 a\x1b[2Jb\rc\x07": Tally(2, 3_000_000, 2_000_000)}})
    text = exposition(metrics)
    assert not any(c in text for c in "\x1b\r\x07")
    sources = scrape(metrics)[(SECONDS, "1")]
    assert sources.keys() == {"other", "task a\\x1b[2Jb\\rc\\x07"}  # read back: the escapes


def exposition(metrics: Metrics) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return generate_latest(registry).decode()


SECONDS, EVENTS = "latencyd_noise_seconds_total", "latencyd_noise_events_total"
Scrape = dict[tuple[str, str], dict[str, float]]  # (metric, cpu) -> source -> value


def scrape(metrics: Metrics) -> Scrape:
    """The noise counters as a scraper reads them."""
    out: Scrape = {}
    for family in text_string_to_metric_families(exposition(metrics)):
        for sample in family.samples:
            if sample.name in (SECONDS, EVENTS):
                cpu, source = sample.labels["cpu"], sample.labels["source"]
                out.setdefault((sample.name, cpu), {})[source] = sample.value
    return out


def increase(before: Scrape, after: Scrape) -> dict[tuple[str, str], float]:
    """What Prometheus counts between two scrapes, per (metric, cpu): each series' rise, all
    of a new series (one that ended and came back started again from zero). A counter that
    went down would be a reset: a burst of noise that never happened."""
    out = {}
    for key, series in after.items():
        rises = []
        for source, value in series.items():
            previous = before.get(key, {}).get(source)
            assert previous is None or value >= previous, f"{key} {source}: went down"
            rises.append(value - (previous or 0.0))
        out[key] = sum(rises)
    return out


def test_two_thousand_command_names_make_the_top_sources_and_other_on_each_cpu() -> None:
    top = Config().metrics_sources_per_cpu
    metrics = Metrics(top)
    steady = {
        "local timer": Tally(250, 1_000_000, 8_000),
        "irq 34 virtio4-input": Tally(60, 600_000, 20_000),
    }
    tasks = {
        f"task {4000 + i} comm-{i}": Tally(1 + i % 3, 1_000 + 7 * i, 1_000) for i in range(2000)
    }
    metrics.add_noise({1: steady | tasks, 2: steady})
    seen = scrape(metrics)
    assert {len(series) for series in seen.values()} == {top + 1, len(steady) + 1}
    seconds, events = seen[(SECONDS, "1")], seen[(EVENTS, "1")]
    # Named: the sources with the most time; "other" holds the rest, so the totals stay whole.
    biggest = [f"task comm-{i}" for i in range(1999, 1999 - (top - len(steady)), -1)]
    assert set(seconds) == set(events) == {*steady, *biggest, "other"}
    all_sources = steady | tasks
    assert sum(seconds.values()) == pytest.approx(
        sum(t.total_ns for t in all_sources.values()) / 1e9
    )
    assert sum(events.values()) == sum(t.count for t in all_sources.values())
    assert seconds["local timer"] == 0.001

    # Churn: 20 more intervals of 100 new command names each. The names stay as they are,
    # the exposition keeps its size, and every interval's noise counts once.
    names, lines = set(seconds), len(exposition(metrics).splitlines())
    for n in range(20):
        churn = {
            f"task {9000 + 100 * n + i} churn-{n}-{i}": Tally(1, 5_000 + 100 * i, 5_000)
            for i in range(100)
        }
        before = seen
        metrics.add_noise({1: steady | churn, 2: steady})
        seen = scrape(metrics)
        assert set(seen[(SECONDS, "1")]) == set(seen[(EVENTS, "1")]) == names
        rise = increase(before, seen)
        assert rise[(SECONDS, "1")] == pytest.approx(
            sum(t.total_ns for t in (steady | churn).values()) / 1e9
        )
        assert rise[(EVENTS, "1")] == sum(t.count for t in (steady | churn).values())
        assert rise[(SECONDS, "2")] == pytest.approx(0.0016)
    assert len(exposition(metrics).splitlines()) == lines


def test_a_name_goes_from_a_source_gone_quiet_to_one_that_recurs_never_to_a_one_off() -> None:
    metrics = Metrics(2)
    timer = {"local timer": Tally(250, 10_000_000, 8_000)}
    metrics.add_noise({1: timer | {"task 41 burst": Tally(9, 500_000_000, 90_000_000)}})
    for _ in range(10):  # the burst is over: its rank halves every interval
        metrics.add_noise({1: timer})
    seconds = scrape(metrics)[(SECONDS, "1")]
    assert seconds == {"local timer": pytest.approx(0.11), "task burst": 0.5, "other": 0.0}
    # A newcomer seen once takes no name, however big: "other" counts it.
    newcomer = {"task 77 newcomer": Tally(3, 5_000_000, 2_000_000)}
    metrics.add_noise({1: timer | newcomer})
    seconds = scrape(metrics)[(SECONDS, "1")]
    assert seconds == {"local timer": pytest.approx(0.12), "task burst": 0.5, "other": 0.005}
    # Seen again, it ranks above the burst and takes its name: the burst's series ends, and
    # its 0.5 s stay out of "other" (a scraper has counted them already).
    metrics.add_noise({1: timer | newcomer})
    seconds = scrape(metrics)[(SECONDS, "1")]
    assert seconds == {"local timer": pytest.approx(0.13), "task newcomer": 0.005, "other": 0.005}
    # A source that recurs but ranks below every named one stays in "other".
    for _ in range(3):
        metrics.add_noise({1: timer | newcomer | {"task 78 small": Tally(1, 1_000_000, 1_000_000)}})
    seconds = scrape(metrics)[(SECONDS, "1")]
    assert seconds == {"local timer": pytest.approx(0.16), "task newcomer": 0.02, "other": 0.008}


@contextlib.contextmanager
def serving(metrics: Metrics, request_timeout_s: float, max_connections: int) -> Iterator[str]:
    """The exposition served on a free port of 127.0.0.1: its URL, while the block runs."""
    server = serve(("127.0.0.1", 0), metrics, request_timeout_s, max_connections)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def closed(conn: socket.socket) -> bool:
    """Whether the server has ended the connection, without waiting."""
    if not select.select([conn], [], [], 0)[0]:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except ConnectionResetError:
        return True


def wait_until(done: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def connect(url: str) -> socket.socket:
    host, port = url.split("/")[2].split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def test_idle_connections_get_no_more_than_their_places_and_are_dropped_after_the_timeout() -> None:
    metrics = Metrics(Config().metrics_sources_per_cpu)
    metrics.update(profile="cpu-partitioning")
    threads = threading.active_count()
    with (
        serving(metrics, request_timeout_s=2.0, max_connections=8) as url,
        contextlib.ExitStack() as stack,
    ):
        idle = [stack.enter_context(connect(url)) for _ in range(50)]
        # Beyond 8, each newcomer takes the place of the oldest that has sent nothing.
        assert wait_until(lambda: sum(map(closed, idle)) == 42)
        assert wait_until(lambda: threading.active_count() <= threads + 1 + 8)  # + the server's
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        assert 'latencyd_profile_info{profile="cpu-partitioning"} 1.0' in body
        # The scrape took the oldest idle one's place, and did not wait for their timeout:
        waiting = [conn for conn in idle if not closed(conn)]
        assert len(waiting) == 7
        # which ends them: nothing sent for two seconds.
        assert wait_until(lambda: all(map(closed, waiting)))


def test_a_client_sending_a_byte_now_and_then_is_dropped_at_its_deadline() -> None:
    """Each byte comes well within the timeout of a read, so only a deadline on the whole
    request ends the connection: not before it (1 s), and long before the request's last
    byte (it would take a minute). How long after the deadline depends on the load."""
    request = b"GET /metrics HTTP/1.0\r\nUser-Agent: " + b"x" * 1000
    sent = 0
    with serving(Metrics(1), request_timeout_s=1.0, max_connections=8) as url, connect(url) as slow:
        started = time.monotonic()
        with contextlib.suppress(OSError):  # the server has gone: the send is refused
            for byte in request:
                slow.sendall(bytes([byte]))
                sent += 1
                if closed(slow):
                    break
                time.sleep(0.05)
        assert wait_until(lambda: closed(slow))
        print(f"dropped {time.monotonic() - started:.2f} s in, {sent} bytes sent")
        assert time.monotonic() - started >= 1.0
        assert sent < len(request)
