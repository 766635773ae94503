"""Profile loading: includes, variables, validation, and `file:line: what is wrong` errors."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from latencyd.plugins.kthread import KthreadPlugin
from latencyd.plugins.shield import ShieldPlugin
from latencyd.plugins.sysctl import SysctlPlugin
from latencyd.plugins.writeback import WritebackPlugin

from latencyd.core.engine import section_schemas
from latencyd.core.plugin import load_plugins
from latencyd.core.profile import ProfileLibrary, Removal
from latencyd.core.schema import ArrayOfTables, Cpus, Option, Regex, Schema
from latencyd.cpuset import CpuSet
from latencyd.errors import Location, ProfileError, ProfileNotFound
from latencyd.kernel.system import Machine, System
from latencyd.paths import shipped_profiles_dir
from tests.unit.fakesys import make_fake_root

MACHINE = Machine(CpuSet.from_list("0-3"), 8 << 30)
WRITEBACK_OPTIONS = (
    "dirty_ratio, dirty_bytes, dirty_background_ratio, dirty_background_bytes, "
    "dirty_expire_centisecs, dirty_writeback_centisecs"
)
# A section with CPU lists and an array of tables, like the affinity plugins will have.
AFFINITY = Schema(
    options=(Option("cpus", Cpus(), "housekeeping CPUs"),),
    tables=(
        ArrayOfTables(
            "rule",
            Schema(
                options=(
                    Option("match", Regex(), "thread names"),
                    Option("cpus", Cpus(), "where they run"),
                ),
                required=("match",),
            ),
            "one rule per thread group",
        ),
    ),
)


@pytest.fixture
def lib(tmp_path: Path, pdir: Path) -> ProfileLibrary:
    system = System(make_fake_root(tmp_path))
    schemas = {
        "writeback": WritebackPlugin(system).schema,
        "sysctl": SysctlPlugin(system).schema,
        "affinity": AFFINITY,
    }
    return ProfileLibrary([pdir], schemas, MACHINE)


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def load_error(lib: ProfileLibrary, name: str) -> ProfileError:
    with pytest.raises(ProfileError) as info:
        lib.load(name)
    return info.value


def line_of(path: Path, needle: str) -> int:
    """1-based line of the only line containing `needle` (keeps expected lines honest)."""
    hits = [n for n, line in enumerate(path.read_text().splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


ISSUE_2 = """
[main]
summary = "low-latency writeback"
include = ["other-profile"]   # resolved on the search path

[variables]
isolated_cores = "1"

[writeback]
dirty_background_bytes = "3%"
dirty_expire_centisecs = 1000

[sysctl]
"vm.swappiness" = 10
"""

OTHER = """
[main]
summary = "the base"

[writeback]
dirty_ratio = 10
dirty_expire_centisecs = 3000
dirty_writeback_centisecs = 500

[sysctl]
"vm.swappiness" = 60
"kernel.timer_migration" = 0
"""


def test_issue_2_example_loads_as_written(lib: ProfileLibrary, pdir: Path) -> None:
    child = write(pdir, "my-profile", ISSUE_2)
    other = write(pdir, "other-profile", OTHER)
    profile = lib.load("my-profile")
    assert profile.name == "my-profile"
    assert profile.path == child
    assert profile.summary == "low-latency writeback"
    assert profile.files == (other, child)
    assert profile.variables == {"isolated_cores": "1"}
    assert profile.sections == {
        "writeback": {
            "dirty_ratio": 10,
            "dirty_expire_centisecs": 1000,
            "dirty_writeback_centisecs": 500,
            "dirty_background_bytes": int((8 << 30) * 3 / 100),
        },
        "sysctl": {"vm.swappiness": 10, "kernel.timer_migration": 0},
    }
    wb = {k: str(v) for k, v in profile.origins["writeback"].items()}
    assert wb == {
        "dirty_ratio": f"{other}:5",
        "dirty_expire_centisecs": f"{child}:10",
        "dirty_writeback_centisecs": f"{other}:7",
        "dirty_background_bytes": f"{child}:9",
    }
    assert line_of(child, "dirty_expire_centisecs") == 10
    assert line_of(other, "dirty_writeback_centisecs") == 7
    sysctl = {k: str(v) for k, v in profile.origins["sysctl"].items()}
    assert sysctl == {"vm.swappiness": f"{child}:13", "kernel.timer_migration": f"{other}:11"}
    assert line_of(child, "vm.swappiness") == 13


def test_load_by_path(lib: ProfileLibrary, tmp_path: Path) -> None:
    elsewhere = write(tmp_path / "elsewhere", "solo", "[sysctl]\n'vm.swappiness' = 1\n")
    profile = lib.load(str(elsewhere))
    assert profile.name == "solo"
    assert profile.sections == {"sysctl": {"vm.swappiness": 1}}


def test_include_by_relative_file_path(lib: ProfileLibrary, pdir: Path) -> None:
    base = write(pdir / "parts", "base", "[writeback]\ndirty_ratio = 7\n")
    write(pdir, "top", '[main]\ninclude = "parts/base.toml"\n')
    profile = lib.load("top")
    assert profile.sections == {"writeback": {"dirty_ratio": 7}}
    assert str(profile.origins["writeback"]["dirty_ratio"]) == f"{base}:2"


# -- include semantics ------------------------------------------------------------


def test_later_file_wins_option_by_option(lib: ProfileLibrary, pdir: Path) -> None:
    a = write(pdir, "a", "[sysctl]\n'vm.swappiness' = 1\n'vm.stat_interval' = 1\n")
    b = write(pdir, "b", "[sysctl]\n'vm.stat_interval' = 2\n'net.core.busy_read' = 2\n")
    c = write(pdir, "c", '[main]\ninclude = ["a", "b"]\n[sysctl]\n"net.core.busy_read" = 3\n')
    profile = lib.load("c")
    assert profile.sections["sysctl"] == {
        "vm.swappiness": 1,
        "vm.stat_interval": 2,
        "net.core.busy_read": 3,
    }
    assert {k: str(v) for k, v in profile.origins["sysctl"].items()} == {
        "vm.swappiness": f"{a}:2",
        "vm.stat_interval": f"{b}:2",
        "net.core.busy_read": f"{c}:4",
    }
    assert profile.files == (a, b, c)
    assert profile.summary == ""


def test_summary_falls_back_to_the_nearest_include(lib: ProfileLibrary, pdir: Path) -> None:
    write(pdir, "a", '[main]\nsummary = "from a"\n')
    write(pdir, "b", '[main]\nsummary = "from b"\ninclude = ["a"]\n')
    write(pdir, "c", '[main]\ninclude = ["b"]\n')
    assert lib.load("c").summary == "from b"


def test_child_dirty_bytes_replaces_parent_dirty_ratio(lib: ProfileLibrary, pdir: Path) -> None:
    write(pdir, "base", "[writeback]\ndirty_ratio = 20\ndirty_background_ratio = 10\n")
    mid = write(pdir, "mid", '[main]\ninclude = ["base"]\n[writeback]\ndirty_bytes = "64M"\n')
    profile = lib.load("mid")
    assert profile.sections["writeback"] == {"dirty_bytes": 64 << 20, "dirty_background_ratio": 10}
    assert str(profile.origins["writeback"]["dirty_bytes"]) == f"{mid}:4"
    assert "dirty_ratio" not in profile.origins["writeback"]
    # ... and a grandchild can switch back to a ratio.
    write(pdir, "top", '[main]\ninclude = ["mid"]\n[writeback]\ndirty_ratio = 5\n')
    assert lib.load("top").sections["writeback"] == {
        "dirty_ratio": 5,
        "dirty_background_ratio": 10,
    }


def test_child_variables_are_used_by_included_values(lib: ProfileLibrary, pdir: Path) -> None:
    base = write(
        pdir,
        "base",
        """
        [variables]
        expire = 3000
        isolated_cores = "3"

        [writeback]
        dirty_expire_centisecs = "${expire}"

        [affinity]
        cpus = "all - ${isolated_cores}"
        """,
    )
    write(
        pdir,
        "child",
        """
        [main]
        include = ["base"]
        [variables]
        expire = 500
        isolated_cores = "1-2"
        """,
    )
    profile = lib.load("child")
    # A value that is exactly ${name} keeps the variable's type (int here).
    assert profile.sections["writeback"] == {"dirty_expire_centisecs": 500}
    assert profile.sections["affinity"] == {"cpus": CpuSet([0, 3])}
    assert profile.variables == {"expire": 500, "isolated_cores": "1-2"}
    assert str(profile.origins["affinity"]["cpus"]) == f"{base}:{line_of(base, 'cpus =')}"


def test_variables_refer_to_variables(lib: ProfileLibrary, pdir: Path) -> None:
    write(
        pdir,
        "v",
        """
        [variables]
        housekeeping = "all - ${isolated}"
        isolated = "${first}-${last}"
        first = 1
        last = 2

        [affinity]
        cpus = "${housekeeping}"

        [[affinity.rule]]
        match = "^ksoftirqd"
        cpus = "${isolated}"
        """,
    )
    profile = lib.load("v")
    assert profile.variables["housekeeping"] == "all - 1-2"
    assert profile.sections["affinity"] == {
        "cpus": CpuSet([0, 3]),
        "rule": [{"match": "^ksoftirqd", "cpus": CpuSet([1, 2])}],
    }


def test_shared_include_is_merged_once(lib: ProfileLibrary, pdir: Path) -> None:
    # top includes b and c, which both include base: base must not be merged again
    # after b, or it would silently undo b's overrides.
    write(pdir, "base", "[sysctl]\n'vm.swappiness' = 60\n[writeback]\ndirty_ratio = 20\n")
    write(
        pdir,
        "b",
        '[main]\ninclude = ["base"]\n[sysctl]\n"vm.swappiness" = 1\n'
        '[writeback]\ndirty_bytes = "1M"\n',
    )
    write(pdir, "c", '[main]\ninclude = ["base"]\n[sysctl]\n"vm.stat_interval" = 5\n')
    write(pdir, "top", '[main]\ninclude = ["b", "c"]\n')
    profile = lib.load("top")
    assert profile.sections["sysctl"] == {"vm.swappiness": 1, "vm.stat_interval": 5}
    assert profile.sections["writeback"] == {"dirty_bytes": 1 << 20}
    assert [p.name for p in profile.files] == ["base.toml", "b.toml", "c.toml", "top.toml"]


# -- search path ----------------------------------------------------------------------


def test_search_path_first_directory_wins(tmp_path: Path, lib: ProfileLibrary) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    mine = write(first, "p", '[main]\nsummary = "first"\n')
    write(second, "p", '[main]\nsummary = "second"\n')
    only2 = write(second, "q", '[main]\nsummary = "only in second"\n')
    lib2 = ProfileLibrary([first, second, tmp_path / "missing"], lib.schemas, MACHINE)
    assert lib2.find("p") == mine
    assert lib2.load("p").summary == "first"
    assert lib2.load("q").summary == "only in second"
    assert lib2.names() == {"p": mine, "q": only2}
    # Includes are looked up on the same path.
    write(second, "r", '[main]\ninclude = ["p"]\n')
    assert lib2.load("r").summary == "first"


def test_missing_profile(lib: ProfileLibrary, pdir: Path) -> None:
    with pytest.raises(ProfileNotFound) as info:
        lib.load("nope")
    assert str(info.value) == f"no profile named 'nope' (searched {pdir})"
    with pytest.raises(ProfileNotFound) as info:
        lib.load(str(pdir / "nope.toml"))
    assert str(info.value) == f"{pdir}/nope.toml: no such profile file"
    empty = ProfileLibrary([], lib.schemas, MACHINE)
    with pytest.raises(ProfileNotFound, match=r"\(searched \(empty search path\)\)"):
        empty.load("x")


def test_all_lists_invalid_profiles_with_their_error(lib: ProfileLibrary, pdir: Path) -> None:
    good = write(pdir, "good", '[main]\nsummary = "fine"\n[sysctl]\n"vm.swappiness" = 5\n')
    bad = write(pdir, "bad", '[main]\nsummary = "broken"\n[writeback]\ndirty_ratio = 500\n')
    ugly = pdir / "ugly.toml"
    ugly.write_bytes(b'[main]\nsummary = "\xff\xfe"\n')
    infos = {i.name: i for i in lib.all()}
    assert list(infos) == ["bad", "good", "ugly"]
    assert (infos["good"].path, infos["good"].summary, infos["good"].error) == (good, "fine", None)
    assert infos["bad"].path == bad
    assert infos["bad"].summary == ""
    assert infos["bad"].error == f"{bad}:4: dirty_ratio: 500 is above the maximum 100"
    assert infos["ugly"].error == (
        f"{ugly}:2: cannot read profile: not UTF-8 text (invalid start byte)"
    )


def test_the_listing_loads_again_only_what_changed(lib: ProfileLibrary, pdir: Path) -> None:
    """ListProfiles (all()) is asked at every `latencyctl list` and Tab: a profile is
    loaded again when a file it read, the profiles on the search path or the machine
    changed, and only then (an answer not loaded again is the very same object)."""
    base = write(pdir, "base", '[main]\nsummary = "base"\n')
    write(pdir, "top", '[main]\ninclude = ["base"]\n')
    write(pdir, "alone", '[main]\nsummary = "alone"\n')
    first = {i.name: i for i in lib.all()}
    assert {n: i.summary for n, i in first.items()} == {
        "alone": "alone",
        "base": "base",
        "top": "base",
    }
    again = {i.name: i for i in lib.all()}
    assert all(again[n] is first[n] for n in first)
    # An edit of the included file: the two profiles that read it, not the third.
    base.write_text('[main]\nsummary = "base, edited"\n')
    edited = {i.name: i for i in lib.all()}
    assert edited["top"].summary == edited["base"].summary == "base, edited"
    assert edited["alone"] is first["alone"]
    # A profile added: every one is loaded again (an include by name may find another).
    write(pdir, "zzz", "")
    added = {i.name: i for i in lib.all()}
    assert list(added) == ["alone", "base", "top", "zzz"]
    assert added["top"] == edited["top"] and added["top"] is not edited["top"]
    # The machine changed (CPUs went offline): loaded again ("all" is another set).
    lib.machine = Machine(CpuSet.from_list("0-1"), 8 << 30)
    assert not any(i is added[i.name] for i in lib.all())


@pytest.mark.skipif(os.geteuid() != 0, reason="trusted profiles are root's: only root makes them")
def test_the_listing_loads_again_a_profile_whose_trust_changed(
    lib: ProfileLibrary, pdir: Path
) -> None:
    """A chmod changes no content, but whether root may trust the file."""
    write(pdir, "base", '[main]\nsummary = "base"\n')
    write(pdir, "top", '[main]\ninclude = ["base"]\n')
    alone = write(pdir, "alone", '[main]\nsummary = "alone"\n')
    trusted = ProfileLibrary([pdir], lib.schemas, MACHINE, trusted_only=True)
    assert [i.error for i in trusted.all()] == [None, None, None]
    alone.chmod(0o666)
    assert [bool(i.error) for i in trusted.all()] == [True, False, False]


def test_shipped_profiles_load(fake_root: Path) -> None:
    schemas = section_schemas(load_plugins(System(fake_root)))
    library = ProfileLibrary([shipped_profiles_dir()], schemas, MACHINE)
    infos = {i.name: i for i in library.all()}
    assert {"balanced", "latency-performance", "network-latency"} <= set(infos)
    assert [i.error for i in infos.values() if i.error] == []
    net = library.load("network-latency")
    assert net.sections["sysctl"]["net.core.busy_read"] == 50
    assert net.sections["writeback"]["dirty_bytes"] == int((8 << 30) * 2 / 100)


# -- errors: file:line: what is wrong -----------------------------------------------------


def test_toml_syntax_error(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", '[main]\nsummary = "x"\n\n[writeback]\ndirty_ratio = \n')
    err = load_error(lib, "p")
    assert str(err) == f"{path}:5: TOML syntax error: Invalid value"
    assert (err.location.path, err.location.line) == (path, 5)


def test_toml_syntax_error_in_an_include(lib: ProfileLibrary, pdir: Path) -> None:
    base = write(pdir, "base", "[sysctl]\n'vm.swappiness' = 1\n'vm.swappiness' = 2\n")
    write(pdir, "top", '[main]\ninclude = ["base"]\n')
    assert str(load_error(lib, "top")) == (f"{base}:3: TOML syntax error: Cannot overwrite a value")


def test_unknown_plugin_section(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", '[main]\nsummary = "x"\n\n[cstate]\nmax_latency_us = 0\n')
    assert str(load_error(lib, "p")) == (
        f"{path}:4: unknown plugin section [cstate] (plugins: affinity, sysctl, writeback)"
    )


def test_unknown_plugin_section_as_array_of_tables(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", '[main]\nsummary = "x"\n\n[[irq.rule]]\nmatch = "eth0"\n')
    assert str(load_error(lib, "p")).startswith(f"{path}:4: unknown plugin section [irq] ")


def test_section_that_is_a_value(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", '[main]\nsummary = "x"\nwriteback = 5\n')
    assert str(load_error(lib, "p")) == (
        f"{path}:3: unknown key 'writeback' in [main] (known: summary, include, booted_isolation)"
    )
    path = write(pdir, "q", 'writeback = 5\n[main]\nsummary = "x"\n')
    assert str(load_error(lib, "q")) == (
        f"{path}:1: 'writeback' must be a table like [writeback], not a value"
    )


def test_unknown_option(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", "[writeback]\ndirty_ratio = 5\n\ndirty_ration = 6\n")
    assert str(load_error(lib, "p")) == (
        f"{path}:4: unknown option 'dirty_ration' (known options: {WRITEBACK_OPTIONS})"
    )


def test_wrong_type(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", '[writeback]\ndirty_ratio = 5\ndirty_expire_centisecs = "soon"\n')
    err = load_error(lib, "p")
    assert str(err) == f"{path}:3: dirty_expire_centisecs: expected an integer, got 'soon'"
    assert err.message == "dirty_expire_centisecs: expected an integer, got 'soon'"
    path = write(pdir, "q", '[writeback]\ndirty_background_bytes = "lots"\n')
    assert str(load_error(lib, "q")) == (
        f"""{path}:2: dirty_background_bytes: expected a size like 65536, "64M" or "3%", """
        "got 'lots'"
    )


def test_wrong_value_in_an_include_names_the_included_file(lib: ProfileLibrary, pdir: Path) -> None:
    base = write(pdir, "base", "# base\n[writeback]\ndirty_ratio = 101\n")
    write(pdir, "top", '[main]\ninclude = ["base"]\n[writeback]\ndirty_expire_centisecs = 1\n')
    assert str(load_error(lib, "top")) == f"{base}:3: dirty_ratio: 101 is above the maximum 100"


def test_bad_cpu_list(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", '[affinity]\ncpus = "0-9"\n')
    assert str(load_error(lib, "p")) == (
        f"{path}:2: cpus: CPU list '0-9' names CPUs 4-9 that are not online (online: 0-3)"
    )
    path = write(pdir, "q", '[affinity]\ncpus = "(0-1"\n')
    assert str(load_error(lib, "q")) == f"{path}:2: cpus: missing ')' in CPU list '(0-1'"


def test_bad_cpu_list_in_second_rule(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(
        pdir,
        "p",
        """
        [[affinity.rule]]
        match = "^jbd2/"
        cpus = "0"

        [[affinity.rule]]
        match = "^kswapd"
        cpus = "all - all"
        """,
    )
    assert str(load_error(lib, "p")) == f"{path}:7: cpus: CPU list 'all - all' is empty"
    path = write(pdir, "q", '[[affinity.rule]]\nmatch = "a"\n\n[[affinity.rule]]\ncpus = "1"\n')
    assert str(load_error(lib, "q")) == f"{path}:4: missing required option 'match'"


def test_bad_cpu_list_through_a_variable(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(
        pdir,
        "p",
        '[variables]\nisolated_cores = "1-9"\n\n[affinity]\ncpus = "all - ${isolated_cores}"\n'
        '[[affinity.rule]]\nmatch = "x"\ncpus = "${isolated_cores}"\n',
    )
    assert str(load_error(lib, "p")) == (
        f"{path}:8: cpus: CPU list '1-9' names CPUs 4-9 that are not online (online: 0-3)"
    )


def test_include_cycle(lib: ProfileLibrary, pdir: Path) -> None:
    write(pdir, "a", '[main]\nsummary = "a"\ninclude = ["b"]\n')
    b = write(pdir, "b", '# b\n[main]\ninclude = ["a"]\n')
    assert str(load_error(lib, "a")) == f"{b}:3: include cycle: a.toml -> b.toml -> a.toml"


def test_include_of_itself(lib: ProfileLibrary, pdir: Path) -> None:
    a = write(pdir, "a", '[main]\ninclude = [\n  "b",\n  "a",\n]\n')
    write(pdir, "b", "")
    assert str(load_error(lib, "a")) == f"{a}:2: include cycle: a.toml -> a.toml"


def test_missing_include(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", '[main]\nsummary = "x"\ninclude = ["other", "nope"]\n')
    write(pdir, "other", "")
    assert str(load_error(lib, "p")) == (
        f"{path}:3: included profile 'nope' not found: no profile named 'nope' (searched {pdir})"
    )
    path = write(pdir, "q", '[main]\ninclude = ["sub/nope.toml"]\n')
    assert str(load_error(lib, "q")) == (
        f"{path}:2: included profile 'sub/nope.toml' not found: no such profile file"
    )


def test_bad_main_section(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", '[main]\nsummary = "x"\ninclude = [1]\n')
    assert str(load_error(lib, "p")) == f"{path}:3: include must be a list of profile names"
    path = write(pdir, "q", '[main]\nsummary = "x"\nincludes = ["a"]\n')
    assert str(load_error(lib, "q")) == (
        f"{path}:3: unknown key 'includes' in [main] (known: summary, include, booted_isolation)"
    )
    path = write(pdir, "r", 'main = "x"\n')
    assert str(load_error(lib, "r")) == f"{path}:1: [main] must be a table"


def test_booted_isolation_is_show_or_require_and_the_last_file_setting_it_wins(
    lib: ProfileLibrary, pdir: Path
) -> None:
    path = write(pdir, "p", '[main]\nsummary = "x"\nbooted_isolation = "always"\n')
    assert str(load_error(lib, "p")) == (
        f'{path}:3: booted_isolation must be "show" or "require" (got \'always\')'
    )
    write(pdir, "q", "")
    assert lib.load("q").booted_isolation == "show"
    base = write(pdir, "base", '[main]\nbooted_isolation = "require"\n')
    write(pdir, "rt", '[main]\ninclude = ["base"]\n')
    rt = lib.load("rt")
    assert (rt.booted_isolation, str(rt.booted_isolation_at)) == ("require", f"{base}:2")
    write(pdir, "loose", '[main]\ninclude = ["base"]\nbooted_isolation = "show"\n')
    assert lib.load("loose").booted_isolation == "show"


def test_undefined_variable(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(
        pdir,
        "p",
        '[variables]\nisolated_cores = "1"\n\n[affinity]\ncpus = "all - ${isolated_core}"\n',
    )
    assert str(load_error(lib, "p")) == (
        f"{path}:5: undefined variable ${{isolated_core}} (variables: isolated_cores)"
    )
    path = write(pdir, "q", '[variables]\na = "${b}"\n')
    assert str(load_error(lib, "q")) == f"{path}:2: undefined variable ${{b}} (variables: a)"
    path = write(pdir, "r", '[sysctl]\n"vm.swappiness" = "${x}"\n')
    assert str(load_error(lib, "r")) == (
        f"{path}:2: undefined variable ${{x}} (variables: none defined)"
    )


def test_variable_cycle(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", '[variables]\nok = 1\na = "x${b}"\nb = "${a}"\n')
    assert str(load_error(lib, "p")) == f"{path}:3: variable cycle: a -> b -> a"
    path = write(pdir, "q", '[variables]\nself = "${self}"\n')
    assert str(load_error(lib, "q")) == f"{path}:2: variable cycle: self -> self"


def test_unknown_sysctl(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(pdir, "p", '[sysctl]\n"vm.swappiness" = 10\n"vm.swapiness" = 10\n"vm.x" = 1\n')
    assert str(load_error(lib, "p")) == (
        f"{path}:3: unknown sysctl 'vm.swapiness': "
        "/proc/sys/vm/swapiness does not exist on this kernel"
    )


def test_exclusive_options_in_one_file(lib: ProfileLibrary, pdir: Path) -> None:
    path = write(
        pdir,
        "p",
        '[writeback]\ndirty_bytes = "64M"\ndirty_expire_centisecs = 100\ndirty_ratio = 5\n',
    )
    err = str(load_error(lib, "p"))
    assert err.startswith(f"{path}:")
    assert err.endswith(
        ": dirty_ratio and dirty_bytes are exclusive (the kernel keeps only one of them): "
        "set just one"
    )
    # The line is one of the two offending options.
    assert int(err.split(":")[1]) in (2, 4)


def test_exclusive_options_both_in_child(lib: ProfileLibrary, pdir: Path) -> None:
    write(pdir, "base", "[writeback]\ndirty_background_ratio = 5\n")
    child = write(
        pdir,
        "child",
        '[main]\ninclude = ["base"]\n[writeback]\n'
        'dirty_background_ratio = 5\ndirty_background_bytes = "1M"\n',
    )
    assert str(load_error(lib, "child")).startswith(
        f"{child}:5: dirty_background_ratio and dirty_background_bytes are exclusive"
    )


def test_a_user_rule_with_a_policy_is_refused_at_its_line(tmp_path: Path, pdir: Path) -> None:
    """A policy in a user process's rule (once `user = true`, now [[shield.rule]]) would be
    silently unused: refused where it stands, in either spelling."""
    system = System(make_fake_root(tmp_path))
    schemas = {"kthread": KthreadPlugin(system).schema, "shield": ShieldPlugin(system).schema}
    lib = ProfileLibrary([pdir], schemas, MACHINE)
    path = write(
        pdir,
        "p",
        '[[kthread.rule]]\nmatch = "^app$"\ncpus = "1"\nuser = true\npolicy = "fifo"\n',
    )
    assert str(load_error(lib, "p")).startswith(f"{path}:5: unknown option 'policy'")
    path = write(pdir, "s", '[[shield.rule]]\nmatch = "^app$"\ncpus = "1"\npolicy = "fifo"\n')
    assert str(load_error(lib, "s")).startswith(f"{path}:4: unknown option 'policy'")
    write(pdir, "q", '[[kthread.rule]]\nmatch = "^k"\ncpus = "1"\npolicy = "fifo"\n')
    assert lib.load("q").sections["kthread"]["rule"][0]["policy"] == "fifo"


def test_directory_named_like_a_profile_is_not_one(lib: ProfileLibrary, pdir: Path) -> None:
    (pdir / "dir.toml").mkdir()
    with pytest.raises(ProfileNotFound, match="no profile named 'dir'"):
        lib.load("dir")
    assert [i.error for i in lib.all()] == [f"no profile named 'dir' (searched {pdir})"]


# -- inheritance controls: enabled, replace, drop -------------------------------------------

BASE = """
    [sysctl]
    "vm.swappiness" = 10
    "vm.stat_interval" = 10

    [writeback]
    dirty_ratio = 10
    dirty_expire_centisecs = 1000
"""


def test_drop_removes_inherited_options_and_says_where(lib: ProfileLibrary, pdir: Path) -> None:
    write(pdir, "base", BASE)
    child = write(
        pdir, "child", '[main]\ninclude = ["base"]\n[sysctl]\ndrop = ["vm.stat_interval"]\n'
    )
    profile = lib.load("child")
    assert set(profile.sections["sysctl"]) == {"vm.swappiness"}
    assert profile.removed == {"sysctl": [Removal("vm.stat_interval", "drop", Location(child, 4))]}


def test_replace_starts_the_section_afresh(lib: ProfileLibrary, pdir: Path) -> None:
    write(pdir, "base", BASE)
    write(
        pdir,
        "child",
        '[main]\ninclude = ["base"]\n[writeback]\nreplace = true\ndirty_bytes = 4096\n',
    )
    profile = lib.load("child")
    assert profile.sections["writeback"] == {"dirty_bytes": 4096}
    assert [(r.option, r.how) for r in profile.removed["writeback"]] == [
        ("dirty_ratio", "replace = true"),
        ("dirty_expire_centisecs", "replace = true"),
    ]


def test_enabled_false_switches_an_inherited_section_off(lib: ProfileLibrary, pdir: Path) -> None:
    write(pdir, "base", BASE)
    write(pdir, "child", '[main]\ninclude = ["base"]\n[writeback]\nenabled = false\n')
    profile = lib.load("child")
    assert "writeback" not in profile.sections and "sysctl" in profile.sections
    assert [(r.option, r.how) for r in profile.removed["writeback"]] == [(None, "enabled = false")]
    # A grandchild may switch it on again with options of its own.
    write(pdir, "grandchild", '[main]\ninclude = ["child"]\n[writeback]\ndirty_ratio = 7\n')
    assert lib.load("grandchild").sections["writeback"]["dirty_ratio"] == 7


def test_inheritance_keys_are_checked(lib: ProfileLibrary, pdir: Path) -> None:
    write(pdir, "base", BASE)
    bad = write(pdir, "bad", '[main]\ninclude = ["base"]\n[sysctl]\ndrop = "vm.swappiness"\n')
    error = load_error(lib, "bad")
    assert str(error) == f"{bad}:4: drop: expected a list of option names, got 'vm.swappiness'"
    bad = write(pdir, "bad2", "[sysctl]\nenabled = 0\n")
    assert str(load_error(lib, "bad2")) == f"{bad}:2: enabled: expected true or false, got 0"


def test_an_include_that_cannot_be_read_names_the_including_file_and_line(
    lib: ProfileLibrary, pdir: Path
) -> None:
    """The fuzzer's find: `include = ["/proc/self/mem"]` was refused without saying where."""
    path = write(pdir, "p", '[main]\nsummary = "x"\ninclude = ["/proc/self/mem"]\n')
    assert str(load_error(lib, "p")) == (
        f"{path}:3: included profile /proc/self/mem: refusing profile /proc/self/mem: a file "
        "of procfs, a kernel interface (reading it may block)"
    )
    big = write(pdir, "big", "# " + "x" * (300 << 10) + "\n")
    path = write(pdir, "q", '[main]\ninclude = [\n  "big",\n]\n')
    assert str(load_error(lib, "q")) == (
        f"{path}:2: included profile {big}: profile is larger than 256 KiB"
    )
    # An error inside an included file keeps that file's own line.
    bad = write(pdir, "bad", "[main]\nsummary = 1\n")
    write(pdir, "r", '[main]\ninclude = ["bad"]\n')
    assert str(load_error(lib, "r")) == f"{bad}:2: summary must be a string"
