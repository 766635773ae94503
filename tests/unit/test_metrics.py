"""The Prometheus exposition: the listen address checked, and what a scrape returns from a
snapshot (prometheus_client renders it; the e2e test scrapes a running daemon)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from latencyd.core.errors import ConfigError
from latencyd.core.noise import Tally
from latencyd.service.config import Config, load_config
from latencyd.service.metrics import Metrics, parse_listen


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
    metrics = Metrics()
    metrics.update(profile="cpu-partitioning", settings={"applied": 12, "not_applicable": 2},
                   drift={("irq", "reapplied"): 3}, switch_seconds=0.25)  # fmt: skip
    metrics.add_noise({1: {"task 4242 stress-ng": Tally(2, 3_000_000, 2_000_000),
                           "local timer": Tally(250, 1_000_000, 8_000)}})  # fmt: skip
    metrics.add_noise({1: {"task 4343 stress-ng": Tally(1, 1_000_000, 1_000_000)}})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    text = generate_latest(registry).decode()
    # A task is labelled by its command name: one series, however many pids come and go.
    assert 'latencyd_noise_seconds_total{cpu="1",source="task stress-ng"} 0.004' in text
    assert 'latencyd_noise_events_total{cpu="1",source="task stress-ng"} 3.0' in text
    assert 'latencyd_noise_max_seconds{cpu="1"} 0.001' in text  # the last interval's
    assert 'latencyd_profile_info{profile="cpu-partitioning"} 1.0' in text
    assert 'latencyd_settings{state="applied"} 12.0' in text
    assert 'latencyd_drift_total{action="reapplied",section="irq"} 3.0' in text
    assert "latencyd_switch_duration_seconds 0.25" in text
