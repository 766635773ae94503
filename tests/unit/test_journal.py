from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from latencyd.errors import JournalError
from latencyd.journal import FORMAT, Journal, JournalState


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
    assert doc["originals"]["sysctl"] == {
        "vm.swappiness": "60",
        "net.ipv4.tcp_rmem": "4096 131072 6291456",
    }


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
    assert json.loads(lines[1]) == {"set": [["kthread", "thread/7@9/affinity", "0-1"]]}
    assert json.loads(lines[2]) == {"drop": [["a", "k"]], "profile": "q"}
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
