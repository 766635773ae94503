"""The file watch's decoding, from bytes built as the kernel lays them out: fanotify's
events (who wrote which file), inotify's, and which watched paths a batch of writes
names (issue 52: drift names the process that wrote it). The real kernel's events:
tests/kernel/test_file_watch.py."""

from __future__ import annotations

import struct
from pathlib import Path

from latencyd.kernel.system import System, Writer
from latencyd.service.watchers import (
    FAN_MODIFY,
    FAN_Q_OVERFLOW,
    IN_IGNORED,
    IN_MODIFY,
    FanEvent,
    parse_fanotify,
    parse_inotify,
    writers_of,
)
from tests.unit.fakesys import add_task, make_fake_root

FAN_NOFD = -1


def fan_event(mask: int, fd: int, pid: int, event_len: int = 24) -> bytes:
    """struct fanotify_event_metadata: event_len, vers, reserved, metadata_len, mask, fd, pid."""
    return struct.pack("IBBHQii", event_len, 3, 0, 24, mask, fd, pid)


def test_fanotify_events_are_read_in_order_with_their_fd_and_pid() -> None:
    data = fan_event(FAN_MODIFY, 7, 4242) + fan_event(FAN_Q_OVERFLOW, FAN_NOFD, 0)
    assert parse_fanotify(data) == [
        FanEvent(FAN_MODIFY, 7, 4242),
        FanEvent(FAN_Q_OVERFLOW, FAN_NOFD, 0),
    ]


def test_a_longer_event_is_stepped_over_by_its_length() -> None:
    # A later kernel may append information records: event_len says where the next starts.
    longer = fan_event(FAN_MODIFY, 5, 10, event_len=40) + bytes(16)
    assert parse_fanotify(longer + fan_event(FAN_MODIFY, 6, 11)) == [
        FanEvent(FAN_MODIFY, 5, 10),
        FanEvent(FAN_MODIFY, 6, 11),
    ]
    assert parse_fanotify(fan_event(FAN_MODIFY, 5, 10)[:20]) == []  # a partial event: none


def test_inotify_events_step_over_their_names() -> None:
    data = struct.pack("iIII", 3, IN_MODIFY, 0, 16) + bytes(16)
    data += struct.pack("iIII", 4, IN_IGNORED, 0, 0)
    assert list(parse_inotify(data)) == [(3, IN_MODIFY), (4, IN_IGNORED)]


FILES = {
    (1, 100): ["/proc/irq/29/smp_affinity_list"],
    (1, 101): ["/proc/irq/29/smp_affinity"],
    # one sysfs file under two paths (one through a symlink): both are named
    (2, 7): ["/sys/devices/system/cpu/cpu1/x", "/sys/bus/cpu/devices/cpu1/x"],
}


def test_writes_map_to_every_watched_path_of_their_file_with_the_last_writer() -> None:
    written = [((1, 100), 500), ((2, 7), 501), ((1, 100), 502), ((9, 9), 503)]
    pids, unknown = writers_of(written, FILES, own_pid=1)
    assert pids == {
        "/proc/irq/29/smp_affinity_list": 502,  # the last write is the value there now
        "/sys/devices/system/cpu/cpu1/x": 501,
        "/sys/bus/cpu/devices/cpu1/x": 501,
    }  # a file not watched (9, 9): nothing
    assert not unknown


def test_the_daemons_own_writes_are_no_ones_drift() -> None:
    pids, unknown = writers_of([((1, 100), 77), ((1, 101), 78)], FILES, own_pid=77)
    assert pids == {"/proc/irq/29/smp_affinity": 78}
    assert not unknown


def test_a_write_to_an_unknown_file_means_any_may_have_changed() -> None:
    # An overflow or an fd the kernel could not open: which file is not known.
    pids, unknown = writers_of([(None, 0), ((1, 101), 78)], FILES, own_pid=77)
    assert unknown and pids == {"/proc/irq/29/smp_affinity": 78}


def test_a_writer_is_named_with_its_comm_escaped(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    add_task(root, 4321, "evil\x1b[2J")
    # as the kernel has it: each argument ended by a NUL, no newline
    (root / "proc/4321/cmdline").write_bytes(b"sh\0-c\0echo 0 > /proc/irq/29/smp_affinity_list\0")
    writer = System(root).writer(4321)
    assert writer == Writer(4321, "evil\x1b[2J", "sh -c echo 0 > /proc/irq/29/smp_affinity_list")
    assert str(writer) == "4321 (evil\\x1b[2J)"
    assert writer.as_json() == {
        "pid": 4321,
        "comm": "evil\x1b[2J",
        "cmdline": "sh -c echo 0 > /proc/irq/29/smp_affinity_list",
    }


def test_a_writer_gone_already_is_its_pid_alone(tmp_path: Path) -> None:
    writer = System(make_fake_root(tmp_path)).writer(999)
    assert writer == Writer(999) and str(writer) == "999"


def test_a_writer_in_another_pid_namespace_is_said_to_be_one(tmp_path: Path) -> None:
    # fanotify gives pid 0 for it; there is no /proc/0 to read, and "0" would name nobody.
    writer = System(make_fake_root(tmp_path)).writer(0)
    assert writer == Writer(0)
    assert str(writer) == "a process outside latencyd's PID namespace"
