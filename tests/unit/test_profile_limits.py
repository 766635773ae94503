"""Hostile profiles: every one is refused with `file:line: what is wrong`, in bounded time
and memory, and a seeded fuzz run finds no other outcome."""

from __future__ import annotations

import os
import random
import re
import threading
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest

from latencyd.core.engine import section_schemas
from latencyd.core.plugin import load_plugins
from latencyd.core.profile import LIMITS, ProfileLibrary, check_name, read_source
from latencyd.core.schema import Option, Schema
from latencyd.cpuset import CpuSet
from latencyd.errors import ProfileError, ProfileNotFound
from latencyd.kernel.system import Machine, System
from latencyd.paths import shipped_profiles_dir
from tests.fuzzprofiles import mutate
from tests.unit.fakesys import add_cpuidle, add_irqs, make_fake_root

MACHINE = Machine(CpuSet.from_list("0-3"), 8 << 30)
MEMORY_LIMIT = 50 << 20


@pytest.fixture
def lib(tmp_path: Path) -> ProfileLibrary:
    root = make_fake_root(tmp_path)
    add_cpuidle(root)
    add_irqs(root, "           CPU0       CPU1\n 24:  1  0  IO-APIC   5-edge   ACPI:Ged\n")
    pdir = tmp_path / "profiles"
    pdir.mkdir()
    return ProfileLibrary([pdir], section_schemas(load_plugins(System(root))), MACHINE)


def write(lib: ProfileLibrary, name: str, text: str) -> Path:
    path = lib.search_path[0] / f"{name}.toml"
    path.write_text(text)
    return path


def refused(lib: ProfileLibrary, name: str) -> ProfileError:
    """Load `name`, expecting a ProfileError, while measuring the memory it takes."""
    tracemalloc.start()
    try:
        with pytest.raises(ProfileError) as info:
            lib.load(name)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < MEMORY_LIMIT, f"loading took {peak >> 20} MiB"
    return info.value


def at_line(error: ProfileError, path: Path) -> int:
    m = re.match(rf"{re.escape(str(path))}:(\d+): \S", str(error))
    assert m, f"no file:line in {error}"
    return int(m.group(1))


def test_a_long_include_chain_is_an_error_not_a_recursion(lib: ProfileLibrary) -> None:
    for i in range(1000):
        write(lib, f"p{i}", f'[main]\ninclude = ["p{i + 1}"]\n' if i < 999 else "")
    error = refused(lib, "p0")
    assert "includes nested more than 16 deep" in str(error)
    at_line(error, lib.search_path[0] / "p15.toml")


def test_a_wide_include_fan_is_bounded(lib: ProfileLibrary) -> None:
    for i in range(100):
        write(lib, f"leaf{i}", "")
    names = ", ".join(f'"leaf{i}"' for i in range(100))
    path = write(lib, "fan", f"[main]\ninclude = [{names}]\n")
    error = refused(lib, "fan")
    assert at_line(error, path) == 2 and "more than 64 files included" in str(error)


def test_the_files_of_one_profile_are_bounded_together(lib: ProfileLibrary) -> None:
    """Each file within its own limit, 20 of them over the profile's: refused at the
    include that crosses it (64 such files took ~20 s to load)."""
    filler = "# " + "x" * 1000 + "\n"
    big = filler * (LIMITS.file_bytes // len(filler) - 1)
    for i in range(20):
        write(lib, f"big{i}", big)
    names = ", ".join(f'"big{i}"' for i in range(20))
    path = write(lib, "heavy", f"[main]\ninclude = [{names}]\n")
    error = refused(lib, "heavy")
    assert at_line(error, path) == 2 and f"exceed {LIMITS.profile_bytes} bytes" in str(error)
    write(lib, "light", '[main]\ninclude = ["big0", "big1", "big2"]\n')
    lib.load("light")  # three of them are within it


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("[sysctl]\n\n" + '"vm.x" = ' + "[" * 3000 + "]" * 3000 + "\n", 3, "nested more than 16"),
        ("[irq]\nx = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n", 2, "nested more than 16"),
        ("[irq]\nx = [\n" + "[\n" * 3000 + "]\n" * 3001, 18, "nested more than 16"),
        ("[kthread]\n" + ".".join(f"k{i}" for i in range(3000)) + " = 1\n", 2, "nested more"),
        ("[" + ".".join(f"k{i}" for i in range(3000)) + "]\n", 1, "nested more than 16"),
        ('[irq]\nisolate = "0-200000000"\n', 2, "beyond the largest CPU number"),
        ('[irq]\nisolate = "' + "~" * 3000 + '1"\n', 2, "nests more than 32 deep"),
        ('[irq]\nisolate = "0x' + "f" * 100000 + '"\n', 2, "longer than 4096 characters"),
        ("a = 1\na = 2", 2, "TOML syntax error: Cannot overwrite a value"),
        # Numbers Python holds and TOML does not: int() refuses over 4,300 digits (a
        # ValueError), a 400-digit size is float infinity (int() of it: OverflowError).
        ("[writeback]\n\ndirty_expire_centisecs = 1" + "0" * 5000, 3, "more than 4300 digits"),
        ("[writeback]\ndirty_expire_centisecs = 0x" + "f" * 5000, 2, "beyond the 64-bit range"),
        ('[writeback]\ndirty_expire_centisecs = "' + "1" * 4000 + '"', 2, "beyond the 64-bit"),
        (
            '[writeback]\ndirty_bytes = "' + "9" * 400 + 'T"',
            2,
            "more than 9223372036854775807 bytes",
        ),
        # Digits of other scripts, which int() takes: "\u0661-\u0663" would be 1-3.
        ('[irq]\nisolate = "\u0661-\u0663"', 2, "cannot read CPU list"),
        ('[writeback]\ndirty_bytes = "\u0661\u0662M"', 2, "expected a size like 65536"),
        ('[writeback]\ndirty_ratio = "\uff11\uff12"', 2, "expected an integer"),
        ("[sysctl]\n" + '"vm.swappiness" = 1\n' * 2, 3, "TOML syntax error"),
    ],
)
def test_hostile_structures_are_refused_with_their_line(
    lib: ProfileLibrary, text: str, line: int, message: str
) -> None:
    path = write(lib, "hostile", text)
    error = refused(lib, "hostile")
    assert message in str(error)
    assert at_line(error, path) == line


def test_doubling_variables_stop_at_the_value_limit(lib: ProfileLibrary) -> None:
    lines = [f'v{i} = "${{v{i + 1}}}${{v{i + 1}}}"' for i in range(40)] + ['v40 = "x"']
    path = write(lib, "double", "[variables]\n" + "\n".join(lines) + "\n")
    error = refused(lib, "double")
    assert "longer than 4096 characters once variables are substituted" in str(error)
    assert at_line(error, path) > 1


def test_lists_multiplied_through_variables_are_bounded(lib: ProfileLibrary) -> None:
    refs = ", ".join(['"${v2}"'] * 1000)
    text = (
        f"[variables]\nv1 = [{refs}]\nv2 = [{refs.replace('v2', 'v3')}]\nv3 = [1, 2]\n"
        '[shield]\nallow = "${v1}"\n'
    )
    path = write(lib, "multiply", text)
    error = refused(lib, "multiply")
    assert "too large once variables are substituted" in str(error)
    at_line(error, path)


def test_a_long_variable_chain_resolves_and_too_many_variables_is_an_error(
    lib: ProfileLibrary,
) -> None:
    chain = [f'v{i} = "${{v{i + 1}}}"' for i in range(200)] + ['v200 = "1"']
    write(lib, "chain", "[variables]\n" + "\n".join(chain) + '\n[irq]\nisolate = "${v0}"\n')
    assert lib.load("chain").sections["irq"]["isolate"] == CpuSet([1])
    many = [f'v{i} = "${{v{i + 1}}}"' for i in range(3000)] + ['v3000 = "1"']
    path = write(lib, "many", "[variables]\n" + "\n".join(many) + "\n")
    error = refused(lib, "many")
    assert "3001 variables; at most 256" in str(error) and at_line(error, path) == 1


def test_a_long_variable_used_often_is_refused_not_validated_a_thousand_times(
    lib: ProfileLibrary,
) -> None:
    """A 4 KB variable in each of 1,000 list entries is 4 MB to validate from a 9 KB file:
    what variables add to one profile is bounded, so its cost stays linear in the file."""
    long = "x" * 4000
    entries = ", ".join(['"${v}"'] * 1000)
    path = write(lib, "inline", f'[variables]\nv = "{long}"\n[shield]\nallow = [{entries}]\n')
    error = refused(lib, "inline")
    assert "variables add more than 262144 characters" in str(error)
    assert at_line(error, path) == 4
    # The same through a list variable used whole: its entries count too.
    lists = ", ".join(['"${v}"'] * 100)
    text = f'[variables]\nv = "{long}"\nl = [{lists}]\n[shield]\nallow = "${{l}}"\n'
    path = write(lib, "whole", text)
    error = refused(lib, "whole")
    assert "variables add more than 262144 characters" in str(error)
    assert at_line(error, path) == 5
    # Used a few times, it loads.
    write(lib, "few", f'[variables]\nv = "{long}"\n[shield]\nallow = ["${{v}}", "${{v}}"]\n')
    assert lib.load("few").sections["shield"]["allow"] == [long, long]


def test_a_long_rule_list_is_refused(lib: ProfileLibrary) -> None:
    rules = '[[kthread.rule]]\nmatch = "x"\ncpus = "0"\n' * 3000
    path = write(lib, "rules", rules)
    error = refused(lib, "rules")
    assert "3000 entries; at most 1024 are allowed" in str(error) and at_line(error, path) == 1


def test_an_oversized_file_is_refused_without_reading_it_all(lib: ProfileLibrary) -> None:
    path = write(lib, "big", "# padding\n" * 100_000)
    error = refused(lib, "big")
    assert str(error) == f"{path}: profile is larger than 256 KiB"


def test_long_names_are_errors_not_oserrors(lib: ProfileLibrary) -> None:
    with pytest.raises(ProfileNotFound, match="1048576 characters long"):
        lib.load("p" * (1 << 20))
    path = write(lib, "inc", '[main]\ninclude = ["' + "x" * 10_000 + '"]\n')
    error = refused(lib, "inc")
    assert at_line(error, path) == 2 and "10000 characters long" in str(error)
    path = write(lib, "incpath", '[main]\ninclude = ["/' + "x/" * 3000 + 'a.toml"]\n')
    error = refused(lib, "incpath")
    assert at_line(error, path) == 2 and "characters long" in str(error)


def test_names_and_paths_a_caller_may_use() -> None:
    check_name("network-latency", by_path=False)
    check_name("my_profile.v2+rt@host", by_path=False)
    check_name("/etc/latencyd/profiles/x.toml", by_path=True)
    for bad in ("../../etc/shadow", "x.toml", "/etc/shadow", "a/b"):
        with pytest.raises(ProfileNotFound, match="only root may apply profile files"):
            check_name(bad, by_path=False)
    for bad in (".hidden", "-flag", "sp ace", "a\0b", ""):
        with pytest.raises(ProfileNotFound):
            check_name(bad, by_path=False)


def trusting_root(lib: ProfileLibrary, pdir: Path) -> ProfileLibrary:
    """A library of the profiles in `pdir` that reads only root's files, as the daemon as root."""
    return ProfileLibrary([pdir], lib.schemas, MACHINE, trusted_only=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="trusted profiles are root's: only root makes them")
def test_profiles_others_could_write_are_refused(lib: ProfileLibrary, tmp_path: Path) -> None:
    d = tmp_path / "trusted"
    d.mkdir(mode=0o755)
    good = d / "good.toml"
    good.write_text("")
    trusted = trusting_root(lib, d)
    trusted.load("good")
    good.chmod(0o664)
    with pytest.raises(ProfileError, match="writable by group or others"):
        trusted.load("good")
    good.chmod(0o644)
    d.chmod(0o777)
    with pytest.raises(ProfileError, match=r"directory .* writable by group or others"):
        trusted.load("good")
    d.chmod(0o755)
    os.chown(good, 65534, 65534)
    with pytest.raises(ProfileError, match="owned by uid 65534, not root"):
        trusted.load("good")


@pytest.mark.skipif(os.geteuid() != 0, reason="trusted profiles are root's: only root makes them")
def test_every_directory_above_a_profile_is_checked(lib: ProfileLibrary, tmp_path: Path) -> None:
    """As sudo and OpenSSH check theirs: whoever may write a directory above a profile
    may rename another in its place. A sticky one (/tmp) keeps what root made in it, so
    it may be open to all above, not where the file is (anyone could add a profile)."""
    top = tmp_path / "open"
    pdir = top / "etc" / "profiles"
    pdir.mkdir(parents=True)
    for d in (top, top / "etc", pdir):
        d.chmod(0o755)
    profile = pdir / "p.toml"
    profile.write_text('[main]\nsummary = "mine"\n')
    trusted = trusting_root(lib, pdir)
    assert trusted.load("p").summary == "mine"

    def refusal() -> str:
        with pytest.raises(ProfileError) as info:
            trusted.load("p")
        return str(info.value)

    top.chmod(0o777)
    assert refusal() == (
        f"{profile}: refusing directory {top}: writable by group or others (mode 777)"
    )
    top.chmod(0o1777)
    assert trusted.load("p").summary == "mine"
    pdir.chmod(0o1777)
    assert refusal() == (
        f"{profile}: refusing directory {pdir}: writable by group or others (mode 1777)"
    )
    pdir.chmod(0o755)
    os.chown(top / "etc", 65534, 65534)
    assert refusal() == f"{profile}: refusing directory {top / 'etc'}: owned by uid 65534, not root"
    # Without trust (latencyctl explain as a user) it is read.
    assert ProfileLibrary([pdir], lib.schemas, MACHINE).load("p").summary == "mine"


def test_a_symbolic_link_is_refused(lib: ProfileLibrary) -> None:
    target = write(lib, "real", '[main]\nsummary = "real"\n')
    link = lib.search_path[0] / "link.toml"
    link.symlink_to(target)
    assert lib.load("real").summary == "real"
    with pytest.raises(ProfileError) as info:
        lib.load("link")
    assert (
        str(info.value) == f"{link}: refusing profile {link}: a symbolic link, not a regular file"
    )


def test_a_fifo_or_a_device_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    """open() of a FIFO without a writer blocks until one comes, unless O_NONBLOCK; a
    device's open() is its driver's to do what it likes. Each is refused by its type,
    unopened. (Read in a thread, so that a regression fails instead of hanging.)"""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    outcome: list[object] = []

    def read() -> None:
        try:
            outcome.append(read_source("fifo", fifo))
        except Exception as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked in open(): a writer lets it go, and the test fails
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
        pytest.fail(f"reading the FIFO {fifo} blocked")
    assert str(outcome[0]) == f"{fifo}: refusing profile {fifo}: a FIFO, not a regular file"
    null = Path("/dev/null")
    with pytest.raises(ProfileError) as info:
        read_source("null", null)
    assert (
        str(info.value)
        == f"{null}: refusing profile {null}: a character device, not a regular file"
    )


@pytest.mark.parametrize(
    ("path", "filesystem"),
    [("/proc/self/status", "procfs"), ("/sys/devices/system/cpu/online", "sysfs")],
)
def test_files_of_kernel_file_systems_are_refused_unread(
    lib: ProfileLibrary, path: str, filesystem: str
) -> None:
    """/proc/kmsg and tracefs's trace_pipe are regular files whose reads block (and take
    what their reader waits for): no file of a kernel file system is a profile. Tested
    with files whose reading would change nothing."""
    with pytest.raises(ProfileError) as info:
        lib.load(path)
    assert str(info.value) == (
        f"{path}: refusing profile {path}: a file of {filesystem}, a kernel interface "
        "(reading it may block)"
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="trusted profiles are root's: only root makes them")
def test_a_library_that_trusts_only_root_checks_includes_too(tmp_path: Path) -> None:
    root = make_fake_root(tmp_path)
    pdir = tmp_path / "p"
    pdir.mkdir(mode=0o755)
    (pdir / "base.toml").write_text("")
    (pdir / "top.toml").write_text('[main]\ninclude = ["base"]\n')
    lib = ProfileLibrary([pdir], section_schemas(load_plugins(System(root))), MACHINE, True)
    lib.load("top")
    (pdir / "base.toml").chmod(0o666)
    with pytest.raises(ProfileError, match=r"base\.toml: writable by group or others"):
        lib.load("top")


@dataclass(frozen=True)
class Overflowing:
    """A plugin's value kind with a bug: it raises OverflowError, not ValueError."""

    @property
    def label(self) -> str:
        return "number"

    def parse(self, raw: object, machine: Machine) -> int:
        return int(float(str(raw)))  # "1e999" is infinity: OverflowError


def test_any_exception_while_loading_is_that_profiles_error(lib: ProfileLibrary) -> None:
    """Whatever escapes the loader's own checks (here a plugin's bug) is a ProfileError
    naming the profile: a listing shows the others, a default profile cannot stop the
    daemon."""
    schemas = {**lib.schemas, "odd": Schema(options=(Option("n", Overflowing(), "a number"),))}
    odd = ProfileLibrary(lib.search_path, schemas, MACHINE)
    write(lib, "fine", '[odd]\nn = "12"\n')
    path = write(lib, "buggy", '[main]\nsummary = "trips a bug"\n[odd]\nn = "1e999"\n')
    assert odd.load("fine").sections["odd"]["n"] == 12
    with pytest.raises(ProfileError) as info:
        odd.load("buggy")
    assert str(info.value) == (
        f"{path}: cannot load profile: OverflowError inside latencyd (a bug; its log has "
        "the details)"
    )
    listed = {i.name: i.error for i in odd.all()}
    assert listed == {"fine": None, "buggy": str(info.value)}


def test_a_profile_python_cannot_hold_is_listed_with_its_error(lib: ProfileLibrary) -> None:
    """ListProfiles answers for every profile when one of them holds a number int() or
    float() refuses (it used to raise ValueError for every caller)."""
    write(lib, "fine", '[main]\nsummary = "fine"\n')
    digits = write(lib, "digits", "[writeback]\ndirty_ratio = 1" + "0" * 5000 + "\n")
    size = write(lib, "size", '[writeback]\ndirty_bytes = "' + "9" * 400 + 'T"\n')
    listed = {i.name: (i.summary, i.error) for i in lib.all()}
    assert listed["fine"] == ("fine", None)
    assert listed["digits"][1] == (
        f"{digits}:2: an integer of more than 4300 digits (TOML's are 64-bit)"
    )
    assert listed["size"][1] == (
        f"{size}:2: dirty_bytes: '{'9' * 24}' is more than 9223372036854775807 bytes"
    )


# -- fuzz ----------------------------------------------------------------------------------


def test_fuzzed_profiles_load_or_fail_with_file_and_line(lib: ProfileLibrary) -> None:
    """3,000 mutations of the shipped profiles: each loads, or is refused with
    `file:line: reason`; nothing else (no other exception, no error without a line)."""
    rng = random.Random(20261123)
    seeds = {p.stem: p.read_text() for p in shipped_profiles_dir().glob("*.toml")}
    for name, text in seeds.items():
        write(lib, name, text)  # includes resolve to the originals
    outcomes: dict[str, int] = {"loaded": 0, "refused": 0}
    for case in range(3000):
        base = rng.choice(sorted(seeds))
        text = mutate(seeds[base], rng)
        path = lib.search_path[0] / "fuzz.toml"
        path.write_text(text, errors="surrogateescape")
        try:
            lib.load("fuzz")
            outcomes["loaded"] += 1
        except ProfileError as error:
            outcomes["refused"] += 1
            message = str(error)
            if message.startswith(f"{path}:"):
                assert re.match(rf"{re.escape(str(path))}:\d+: \S", message), (case, message)
            else:  # an error in an included (shipped) file names that file and line
                assert re.match(r"/\S+\.toml:\d+: \S", message), (case, message, text)
    assert outcomes["loaded"] > 100 and outcomes["refused"] > 1000, outcomes


def test_limits_are_far_beyond_real_profiles() -> None:
    for path in shipped_profiles_dir().glob("*.toml"):
        assert path.stat().st_size < LIMITS.file_bytes // 16
