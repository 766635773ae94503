"""Old spellings of moved options (schema.Moved): [kthread]'s user-task options, now
[shield]'s, load as the new ones, with a warning naming the line that was written."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest
from latencyd.plugins.kthread import KthreadPlugin
from latencyd.plugins.shield import ShieldPlugin

from latencyd.core.profile import ProfileLibrary
from latencyd.cpuset import CpuSet
from latencyd.errors import Location, ProfileError
from latencyd.kernel.system import Machine, System
from tests.unit.fakesys import make_fake_root

MACHINE = Machine(CpuSet.from_list("0-3"), 8 << 30)
OLD = """
[main]
summary = "written for an older latencyd"

[kthread]
writeback_cpumask = "0"
isolate_tasks = "1-2"
allow = ["sshd"]

[[kthread.rule]]
match = "^kswapd"
cpus = "0"

[[kthread.rule]]
match = "^app$"
cpus = "3"
user = true

[[kthread.rule]]
match = "^jbd2"
cpus = "0"
user = false
"""
NEW = """
[main]
summary = "written for an older latencyd"

[kthread]
writeback_cpumask = "0"

[[kthread.rule]]
match = "^kswapd"
cpus = "0"

[[kthread.rule]]
match = "^jbd2"
cpus = "0"

[shield]
cpus = "1-2"
allow = ["sshd"]

[[shield.rule]]
match = "^app$"
cpus = "3"
"""


@pytest.fixture
def lib(tmp_path: Path) -> ProfileLibrary:
    system = System(make_fake_root(tmp_path / "root"))
    schemas = {"kthread": KthreadPlugin(system).schema, "shield": ShieldPlugin(system).schema}
    return ProfileLibrary([tmp_path / "profiles"], schemas, MACHINE)


def write(lib: ProfileLibrary, name: str, text: str) -> Path:
    path = lib.search_path[0] / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_the_old_spelling_loads_as_the_new_one_and_says_where(
    lib: ProfileLibrary, caplog: pytest.LogCaptureFixture
) -> None:
    old, new = write(lib, "old", OLD), write(lib, "new", NEW)
    caplog.set_level(logging.WARNING, logger="latencyd.core.respell")
    loaded = lib.load("old")
    assert warnings_of(caplog) == [
        f"{old}:6: [kthread] isolate_tasks is now [shield] cpus",
        f"{old}:7: [kthread] allow is now [shield] allow",
        f"{old}:13: [[kthread.rule]] with user = true is now [[shield.rule]] (without user)",
    ]
    caplog.clear()
    assert loaded.sections == lib.load("new").sections
    assert warnings_of(caplog) == []  # the new spelling: nothing to say
    # Positions are the lines that were written, not where the new spelling would be.
    assert loaded.origins["shield"]["cpus"] == Location(old, 6)
    assert loaded.origins["shield"]["allow"] == Location(old, 7)
    assert loaded.origins["shield"]["rule"] == Location(old, 13)
    assert loaded.origins["kthread"]["rule"] == Location(old, 9)
    assert loaded.written["shield"] == {
        "cpus": "1-2",
        "allow": ["sshd"],
        "rule": [{"match": "^app$", "cpus": "3"}],
    }
    assert new.exists()


def test_a_section_left_empty_by_the_move_is_gone(lib: ProfileLibrary) -> None:
    """A [kthread] that only shielded must not make an empty kthread section (it would
    follow every new thread for nothing)."""
    write(lib, "p", '[kthread]\nisolate_tasks = "1"\n')
    assert set(lib.load("p").sections) == {"shield"}


@pytest.mark.parametrize(
    ("text", "line", "spelled"),
    [
        ('[kthread]\nisolate_tasks = "1"\n[shield]\ncpus = "2"\n', 2, "[kthread] isolate_tasks"),
        ('[shield]\nallow = ["a"]\n[kthread]\nallow = ["b"]\n', 4, "[kthread] allow"),
        (
            '[[shield.rule]]\nmatch = "a"\ncpus = "1"\n'
            '[[kthread.rule]]\nmatch = "b"\ncpus = "1"\nuser = true\n',
            4,
            "[[kthread.rule]] with user = true",
        ),
    ],
)
def test_both_spellings_in_one_file_are_refused_where_the_old_one_is(
    lib: ProfileLibrary, text: str, line: int, spelled: str
) -> None:
    path = write(lib, "p", text)
    with pytest.raises(ProfileError) as info:
        lib.load("p")
    assert info.value.location == Location(path, line)
    assert info.value.message.startswith(spelled) and "keep that one only" in info.value.message


def test_kernel_thread_rules_beside_shield_rules_are_not_both_spellings(
    lib: ProfileLibrary,
) -> None:
    write(lib, "p", '[[kthread.rule]]\nmatch = "^k"\ncpus = "0"\n[[shield.rule]]\nmatch = "a"\n'
                    'cpus = "1"\n')  # fmt: skip
    sections = lib.load("p").sections
    assert [r["match"] for r in sections["kthread"]["rule"]] == ["^k"]
    assert [r["match"] for r in sections["shield"]["rule"]] == ["a"]


def test_an_old_spelling_overrides_an_included_new_one(lib: ProfileLibrary) -> None:
    """A user's profile written for an older version, over a shipped one in the new
    spelling: the later file wins, as if both said it the same way."""
    write(lib, "base", '[shield]\ncpus = "1"\nallow = ["x"]\n')
    child = write(lib, "child", '[main]\ninclude = ["base"]\n[kthread]\nisolate_tasks = "2"\n')
    loaded = lib.load("child")
    assert loaded.sections["shield"]["cpus"] == CpuSet({2})
    assert loaded.sections["shield"]["allow"] == ["x"]
    assert loaded.origins["shield"]["cpus"] == Location(child, 4)


@pytest.mark.parametrize(
    ("inherit", "left"),
    [
        ('drop = ["isolate_tasks"]', {"allow": ["x"]}),
        ("replace = true", {}),
        ("enabled = false", {}),
    ],
)
def test_taking_away_an_old_option_takes_away_the_new_one(
    lib: ProfileLibrary, inherit: str, left: dict[str, Any]
) -> None:
    write(lib, "base", '[shield]\ncpus = "1"\nallow = ["x"]\n[kthread]\nwriteback_cpumask = "0"\n')
    write(lib, "child", f'[main]\ninclude = ["base"]\n[kthread]\n{inherit}\n')
    shield = lib.load("child").sections.get("shield", {})
    assert {k: v for k, v in shield.items() if k in ("cpus", "allow")} == left


def test_errors_in_a_moved_option_name_its_line(lib: ProfileLibrary) -> None:
    path = write(lib, "p", '[kthread]\nwriteback_cpumask = "0"\nisolate_tasks = "9"\n')
    with pytest.raises(ProfileError) as info:
        lib.load("p")
    assert info.value.location == Location(path, 3)
    assert "not online" in info.value.message
