"""What latencyd trusts on disk: a state directory only it can change, no symlink followed
in it, and no journal entry that names something its plugin must not touch. A journal is
what a restore writes back, so a planted or tampered one must never reach a file outside
/proc and /sys, and no content at all may stop the daemon from starting."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from latencyd.plugins.sysctl import Sysctl, SysctlPlugin
from latencyd.plugins.sysfs import SysfsPlugin

from latencyd.core.engine import Engine
from latencyd.core.journal import Journal, JournalState
from latencyd.errors import JournalError, KernelRefused, UnsafePath
from latencyd.kernel.system import System
from latencyd.kernel.trust import open_private_dir
from tests.unit.fakesys import make_fake_root

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")


def _engine(root: Path, state: Path) -> Engine:
    system = System(root)
    return Engine({"sysctl": SysctlPlugin(system), "sysfs": SysfsPlugin(system)}, Journal(state))


def _tampered(state: Path, entries: dict[tuple[str, str], object]) -> None:
    Journal(state).save(JournalState(dict(entries), "p"))


@pytest.mark.parametrize(
    ("plugin", "target"),
    [
        ("sysctl", {"kind": "sysctl", "key": "../../etc/shadow"}),
        ("sysctl", {"kind": "sysctl", "key": "kernel.core_pattern"}),  # hands out root
        ("sysfs", {"kind": "sysfs_file", "path": "/sys/../etc/shadow"}),
        ("sysfs", {"kind": "sysfs_file", "path": "/etc/shadow"}),
    ],
)
def test_a_tampered_journal_target_is_set_aside_and_never_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, plugin: str, target: dict[str, str]
) -> None:
    root = make_fake_root(tmp_path / "root")
    shadow = root / "etc" / "shadow"
    shadow.parent.mkdir()
    shadow.write_text("secret\n")
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/core_pattern").write_text("core\n")
    state = tmp_path / "state"
    key = json.dumps(target, sort_keys=True, separators=(",", ":"))
    swap = json.dumps({"key": "vm.swappiness", "kind": "sysctl"}, separators=(",", ":"))
    _tampered(state, {(plugin, key): "|/tmp/evil %p", ("sysctl", swap): "60"})
    engine = _engine(root, state)
    with caplog.at_level(logging.ERROR):
        assert engine.adopt() is not None
    assert [sid[1] for sid in engine.applied] == [Sysctl("vm.swappiness")]
    assert f"journal entry cannot be restored: [{plugin}]" in caplog.text
    assert engine.off() == []
    assert shadow.read_text() == "secret\n"
    assert (root / "proc/sys/kernel/core_pattern").read_text() == "core\n"
    assert Journal(state).load() is None  # the entry set aside is gone from the journal too


def test_the_system_facade_writes_under_proc_and_sys_only(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("root\n")
    system = System(root)
    for rel in ("proc/sys/../../etc/passwd", "etc/passwd", "sys/../etc/passwd"):
        with pytest.raises(KernelRefused, match="under /proc and /sys only"):
            system.write(rel, "pwned")
    assert (root / "etc/passwd").read_text() == "root\n"
    system.write("proc/sys/vm/../vm/swappiness", "5")
    assert (root / "proc/sys/vm/swappiness").read_text() == "5"


@pytest.mark.parametrize(
    "text",
    [
        '{"format":4,"originals":' + "[" * 200_000 + "]" * 200_000 + "}\n",
        '{"format":4,"originals":{},"profile":["not","a","name"]}\n',
        '{"format":4,"originals":{}}\n{"set":' + "[" * 200_000 + "]" * 200_000 + "}\n",
        '{"format":4,"originals":{"sysctl":[["1",null,["' + "[" * 50_000 + '"]]]}}\n',
        b"\xff\xfe not utf-8\n".decode("latin-1"),
    ],
    ids=["nested-snapshot", "profile-not-a-name", "nested-delta", "nested-key", "not-utf8"],
)
def test_no_journal_content_stops_the_daemon_from_starting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    root = make_fake_root(tmp_path / "root")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "journal.jsonl").write_bytes(text.encode("latin-1"))
    engine = _engine(root, state)
    engine.adopt()  # never raises, whatever the file holds
    assert engine.applied == {}
    assert engine.off() == []


def test_a_state_directory_someone_else_could_change_is_refused(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o700)
    loose.chmod(0o777)
    with pytest.raises(JournalError, match="writable by group or others"):
        Journal(loose).open()
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(JournalError, match="it is a symlink"):
        Journal(tmp_path / "link").open()
    # A directory above it that anyone may write to (without the sticky bit of /tmp).
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(JournalError, match=r"open cannot be trusted: writable by group or others"):
        Journal(open_dir / "state").open()
    Journal(tmp_path / "fine" / "state").open()
    assert (tmp_path / "fine" / "state").stat().st_mode & 0o777 == 0o700


@as_root
def test_a_state_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(UnsafePath, match=f"owned by uid {NOBODY}"):
        open_private_dir(theirs)
    with pytest.raises(JournalError, match=f"owned by uid {NOBODY}"):
        Journal(theirs).load()


def test_no_symlink_in_the_state_directory_is_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    planted = JournalState({("sysctl", '{"key":"vm.swappiness","kind":"sysctl"}'): "1"}, "p")
    elsewhere = tmp_path / "elsewhere"
    Journal(elsewhere).save(planted)
    (state / "journal.jsonl").symlink_to(elsewhere / "journal.jsonl")
    with pytest.raises(JournalError, match=r"journal\.jsonl: a symbolic link, not a regular file"):
        Journal(state).load()  # a planted journal is not adopted through a link
    (state / "journal.jsonl").unlink()
    (state / "journal.tmp").symlink_to(victim)
    (state / "base.tmp").symlink_to(victim)
    journal = Journal(state)
    journal.save(JournalState({("sysctl", "k"): "1"}, "p"))
    journal.save_base("p")
    assert victim.read_text() == "precious\n"
    assert journal.load() == JournalState({("sysctl", "k"): "1"}, "p")
    assert journal.load_base() == (True, "p")
