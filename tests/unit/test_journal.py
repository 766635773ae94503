from __future__ import annotations

import contextlib
import json
import resource
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from latencyd.core.journal import FORMAT, Journal, JournalState, key_of
from latencyd.errors import JournalError


def test_nothing_on_disk_means_clean_exit(tmp_path: Path) -> None:
    assert Journal(tmp_path / "state").load() is None


def test_save_load_round_trip(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "run" / "latencyd")
    state = JournalState(
        {
            ("writeback", "dirty"): {"ratio": 20},
            ("writeback", "dirty_expire_centisecs"): 3000,
            ("sysctl", "vm.swappiness"): "60",
            ("sysctl", "net.ipv4.tcp_rmem"): "4096 131072 6291456",
            ("irq", "42"): [0, 1],
        },
        "latency-performance",
    )
    journal.save(state)
    loaded = journal.load()
    assert loaded == state
    doc = json.loads(journal.path.read_text())
    assert doc["format"] == FORMAT
    assert doc["profile"] == "latency-performance"
    assert doc["originals"]["sysctl"] == [
        ["60", None, ["vm.swappiness"]],
        ["4096 131072 6291456", None, ["net.ipv4.tcp_rmem"]],
    ]


def test_settings_with_the_same_original_are_one_record(tmp_path: Path) -> None:
    """Issue 19: 20,000 threads a shield narrowed, all on every CPU before, are one record
    of the value and a row of fields per thread, not 20,000 entries spelling each out."""
    journal = Journal(tmp_path)
    threads = {
        ("kthread", json.dumps({"kind": "task_affinity", "pid": 9, "start_time": 5, "tid": t},
                               sort_keys=True, separators=(",", ":"))): "0-1"
        for t in range(100, 20100)
    }  # fmt: skip
    other = ("kthread", '{"kind":"workqueue","name":"writeback"}')
    state = JournalState({**threads, other: "3"}, "cpu-partitioning")
    journal.save(state)
    doc = json.loads(journal.path.read_text())
    assert doc["originals"]["kthread"] == [
        ["0-1", ["kind", "pid", "start_time", "tid"],
         [["task_affinity", 9, 5, t] for t in range(100, 20100)]],
        ["3", ["kind", "name"], [["workqueue", "writeback"]]],
    ]  # fmt: skip
    assert journal.path.stat().st_size < 40 * 20000  # was 75 bytes a thread
    assert Journal(tmp_path).load() == state
    # a delta too: 1,000 more threads, then 1,000 given back, one record each
    more = {(p, k.replace('"pid":9', '"pid":10')): v for (p, k), v in list(threads.items())[:1000]}
    journal.save(JournalState({**threads, other: "3", **more}, "cpu-partitioning"))
    journal.save(JournalState({**threads, other: "3"}, "cpu-partitioning"))
    added, dropped = map(json.loads, journal.path.read_text().splitlines()[1:])
    assert [len(r) for r in added["set"]] == [4] and len(added["set"][0][3]) == 1000
    assert [len(r) for r in dropped["drop"]] == [3] and len(dropped["drop"][0][2]) == 1000
    assert Journal(tmp_path).load() == state


def test_a_string_and_a_number_that_print_alike_stay_apart(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    state = JournalState({("sysctl", "a"): "5", ("sysctl", "b"): 5, ("sysctl", "c"): [5]})
    journal.save(state)
    assert Journal(tmp_path).load() == state


def test_a_journal_of_format_3_is_still_read(tmp_path: Path) -> None:
    """Left by the version before (a crash, then an upgrade): its originals are restored."""
    key = '{"kind":"irq","irq":42}'
    journal = Journal(tmp_path)
    journal.path.write_text(
        json.dumps({"format": 3, "profile": "p", "originals": {"irq": {key: "0-3"}}})
        + "\n"
        + json.dumps({"set": [["sysctl", "vm.swappiness", "60"]], "drop": [["irq", key]]})
        + "\n"
    )
    assert journal.load() == JournalState({("sysctl", "vm.swappiness"): "60"}, "p")


def test_save_replaces_atomically_and_privately(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    journal = Journal(state_dir)
    journal.save(JournalState({("a", "k"): 1}, "one"))
    journal.save(JournalState({("b", "k"): 2}, None))
    assert sorted(p.name for p in state_dir.iterdir()) == ["journal.jsonl"]  # no .tmp left
    assert journal.load() == JournalState({("b", "k"): 2}, None)
    assert stat.S_IMODE(journal.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700


def test_save_over_a_stale_temp_file(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    (tmp_path / "journal.tmp").write_text("torn")
    journal.save(JournalState({("a", "k"): 1}))
    assert not (tmp_path / "journal.tmp").exists()
    assert journal.load() == JournalState({("a", "k"): 1})


def test_clear(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "state")
    journal.clear()  # nothing there yet: fine
    journal.save(JournalState({("a", "k"): 1}, "p"))
    journal.clear()
    assert not journal.path.exists()
    assert journal.load() is None
    journal.clear()


@pytest.mark.parametrize(
    "content", ["", "{", "not json", '{"format": 1, "originals": ', "\x00\x01"]
)
def test_garbage_is_a_journal_error(tmp_path: Path, content: str) -> None:
    journal = Journal(tmp_path)
    journal.path.write_text(content)
    with pytest.raises(JournalError, match=f"^journal {journal.path} is unreadable: "):
        journal.load()


@pytest.mark.parametrize(
    "content",
    [
        "[]",
        "null",
        "42",
        '"text"',
        '{"format": 1, "originals": []}',
        '{"format": 1, "originals": {"sysctl": 5}}',
    ],
)
def test_valid_json_of_the_wrong_shape_is_a_journal_error(tmp_path: Path, content: str) -> None:
    journal = Journal(tmp_path)
    journal.path.write_text(content)
    with pytest.raises(JournalError, match=f"^journal {journal.path} "):
        journal.load()


def test_undecodable_bytes_are_a_journal_error(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.path.write_bytes(b'{"format": 1, "profile": "\xff"}')
    with pytest.raises(JournalError, match="is unreadable"):
        journal.load()


def test_unreadable_journal_path_is_a_journal_error(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.path.mkdir()  # a directory where the file should be
    with pytest.raises(JournalError, match="is unreadable"):
        journal.load()


@pytest.mark.parametrize("fmt", [1, 0, "2", None])
def test_unknown_format(tmp_path: Path, fmt: object) -> None:
    journal = Journal(tmp_path)
    journal.path.write_text(json.dumps({"format": fmt, "originals": {}}))
    with pytest.raises(JournalError) as info:
        journal.load()
    assert str(info.value) == f"journal {journal.path} has unknown format {fmt!r}"


def test_save_failure_is_a_journal_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    journal = Journal(blocker / "state")  # the state dir cannot be created under a file
    with pytest.raises(JournalError, match=r"^cannot write journal "):
        journal.save(JournalState({("a", "k"): 1}))


def test_clear_failure_is_a_journal_error(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.path.mkdir()
    with pytest.raises(JournalError, match=r"^cannot remove journal "):
        journal.clear()


def test_later_saves_append_deltas_and_load_replays_them(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.save(JournalState({("a", "k"): 1}, "p"))
    journal.save(JournalState({("a", "k"): 1, ("kthread", "thread/7@9/affinity"): "0-1"}, "p"))
    journal.save(JournalState({("kthread", "thread/7@9/affinity"): "0-1"}, "q"))
    lines = journal.path.read_text().splitlines()
    assert len(lines) == 3  # a snapshot, then one small line per change
    # a record: plugin, original value, no fields (a key that is no target), the keys
    assert json.loads(lines[1]) == {"set": [["kthread", "0-1", None, ["thread/7@9/affinity"]]]}
    assert json.loads(lines[2]) == {"drop": [["a", None, ["k"]]], "profile": "q"}
    assert Journal(tmp_path).load() == JournalState(
        {("kthread", "thread/7@9/affinity"): "0-1"}, "q"
    )


def test_unchanged_state_writes_nothing(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.save(JournalState({("a", "k"): 1}, "p"))
    before = journal.path.read_text()
    journal.save(JournalState({("a", "k"): 1}, "p"))
    assert journal.path.read_text() == before


def test_a_torn_last_append_is_ignored_but_a_bad_middle_line_is_an_error(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.save(JournalState({("a", "k"): 1}, "p"))
    journal.save(JournalState({("a", "k"): 1, ("b", "k"): 2}, "p"))
    with open(journal.path, "a") as f:
        f.write('{"set":[["c","k",')  # the crash came mid-append: no newline
    assert Journal(tmp_path).load() == JournalState({("a", "k"): 1, ("b", "k"): 2}, "p")
    with open(journal.path, "a") as f:
        f.write("\n{}\n")
    with pytest.raises(JournalError, match=r"journal\.jsonl:3 is malformed"):
        Journal(tmp_path).load()


def test_growing_journal_is_compacted_into_one_snapshot(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    state = JournalState({}, "p")
    for i in range(400):
        state = JournalState({("kthread", f"thread/{i}@1/affinity"): "0-1"}, "p")
        journal.save(state)
    assert len(journal.path.read_text().splitlines()) < 300
    assert Journal(tmp_path).load() == state


@pytest.mark.parametrize(
    "fields",
    [
        {"kind": "task_affinity", "pid": 1, "start": 5, "tid": 7},
        {"name": 'é"\\ü\n', "kind": "x"},  # escapes and non-ASCII, keys out of order
        {"kind": "k", "n": None},
        {"kind": "z", "b": True},  # a bool is not an int here
        {"kind": "s", "v": -3, "w": [1, "a"]},
    ],
)
def test_a_key_is_the_canonical_json_of_the_target(fields: dict[str, object]) -> None:
    assert key_of(fields) == json.dumps(fields, sort_keys=True, separators=(",", ":"))


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """The kernel's own short write, without a full disk: beyond RLIMIT_FSIZE a write is
    cut short and the next one fails (EFBIG; SIGXFSZ ignored so it is an error, not a kill)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def _keys(n: int, start: int = 0) -> dict[tuple[str, str], str]:
    return {("kthread", key_of({"kind": "t", "pid": p})): "0-1" for p in range(start, start + n)}


@pytest.mark.parametrize("how", ["append", "snapshot"])
def test_a_write_cut_short_loses_nothing_and_commits_nothing(tmp_path: Path, how: str) -> None:
    """Issue 37: a write the disk cuts short is retried for the rest or fails whole; what
    the journal holds in memory changes only once the disk holds it, and after a failed
    write the next change writes a whole snapshot (no torn line is ever followed by
    another, so the next start can read every original)."""
    journal = Journal(tmp_path)
    before = JournalState(_keys(10), "a")
    journal.save(before)
    if how == "snapshot":
        journal._fresh = False  # as after a restart: the next change rewrites the file
    size = journal.path.stat().st_size
    more = _keys(2000, start=10)
    with file_size_limit(size + 100), pytest.raises(JournalError, match="File too large"):
        journal.record(more, [], "b")
    assert journal.path.stat().st_size == size  # cut back where it began
    assert Journal(tmp_path).load() == before  # nothing lost ...
    assert journal._written == before  # ... and nothing claimed that the disk lacks
    journal.record(more, [], "b")  # the disk has room again: the same change goes through
    assert Journal(tmp_path).load() == JournalState({**before.originals, **more}, "b")
    assert len(journal.path.read_text().splitlines()) == 1  # as a whole snapshot
    assert not list(tmp_path.glob("*.tmp"))
