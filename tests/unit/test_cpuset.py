from __future__ import annotations

import random

import pytest

from latencyd.cpuset import MAX_CPUS, CpuSet, CpuSetError

ALL4 = CpuSet.from_list("0-3")


def cpus(*numbers: int) -> CpuSet:
    return CpuSet(numbers)


# -- from_list ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", {0}),
        ("0-3", {0, 1, 2, 3}),
        ("0-3,8", {0, 1, 2, 3, 8}),
        ("8,0-1", {0, 1, 8}),
        ("0-7:2", {0, 2, 4, 6}),
        ("1-8:3", {1, 4, 7}),
        ("0-0", {0}),
        (" 2 , 4-5 ", {2, 4, 5}),
        ("3,3,2-3", {2, 3}),
        ("127", {127}),
        ("", set()),
        ("  \n", set()),
    ],
)
def test_from_list(text: str, expected: set[int]) -> None:
    assert set(CpuSet.from_list(text)) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a", "'a' is not a CPU number or range"),
        ("1,,2", "'' is not a CPU number or range"),
        ("0-3,", "'' is not a CPU number or range"),
        ("-1", "'-1' is not a CPU number or range"),
        ("3-1", "range '3-1' runs backwards"),
        ("0-7:0", "range '0-7:0' has a zero stride"),
        ("0x3", "'0x3' is not a CPU number or range"),
        ("1:2", "'1:2' is not a CPU number or range"),
    ],
)
def test_from_list_errors(text: str, message: str) -> None:
    with pytest.raises(CpuSetError, match="^" + message.replace("(", r"\(")):
        CpuSet.from_list(text)


@pytest.mark.parametrize("text", ["\u0661", "0-\u0663", "\uff11", "1,\u0967", "0-7:\u0662"])
def test_cpu_numbers_are_ascii_digits(text: str) -> None:
    """int() and str.isdigit() take any script's digits ("\u0661" is 1 to int()); a CPU
    number is written in ASCII, by the kernel and in profiles."""
    with pytest.raises(CpuSetError, match="is not a CPU number or range"):
        CpuSet.from_list(text)
    with pytest.raises(CpuSetError, match="cannot read CPU list"):
        CpuSet.parse(f"all & {text}", ALL4)


def test_ranges_and_strides_match_python_ranges() -> None:
    """Ranges are built as bit masks: every (first, last, stride) agrees with range()."""
    rng = random.Random(37)
    for _ in range(2000):
        lo = rng.randrange(MAX_CPUS)
        hi = rng.randrange(lo, min(MAX_CPUS, lo + rng.choice((2, 40, 300, MAX_CPUS))))
        step = rng.choice((1, 2, 3, 7, 64, 1000, 10**12))
        expected = set(range(lo, hi + 1, step))
        assert set(CpuSet.from_list(f"{lo}-{hi}:{step}")) == expected, (lo, hi, step)
        assert set(CpuSet.parse(f"~~{lo}-{hi}:{step}", CpuSet(range(MAX_CPUS)))) == expected


def test_cpuset_error_is_a_value_error() -> None:
    assert issubclass(CpuSetError, ValueError)


def test_negative_cpu_rejected() -> None:
    with pytest.raises(CpuSetError, match="negative"):
        CpuSet([1, -2])


# -- from_mask ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", {0}),
        ("3", {0, 1}),
        ("f0", {4, 5, 6, 7}),
        ("0x3", {0, 1}),
        ("0X3", {0, 1}),
        ("FF", set(range(8))),
        ("0", set()),
        ("00000000,00000000", set()),
        ("ff,00000001", {0, *range(32, 40)}),
        ("1,00000000,00000000", {64}),
        ("80000000,00000000", {63}),
        ("ffffffff,ffffffff", set(range(64))),
        (" 0x1,00000002\n", {1, 32}),
    ],
)
def test_from_mask(text: str, expected: set[int]) -> None:
    assert set(CpuSet.from_mask(text)) == expected


@pytest.mark.parametrize("text", ["", "0x", "g", "1,,2", ",1", "1,", "0x-1", "1 2", "ff,zz"])
def test_from_mask_errors(text: str) -> None:
    with pytest.raises(CpuSetError, match="is not a hex CPU mask"):
        CpuSet.from_mask(text)


# -- formatting ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpu_list", "text"),
    [
        ([], ""),
        ([0], "0"),
        ([0, 1, 2, 3], "0-3"),
        ([0, 1, 2, 3, 8], "0-3,8"),
        ([1, 3, 5], "1,3,5"),
        ([0, 1, 3, 4, 5, 9], "0-1,3-5,9"),
        ([100, 101], "100-101"),
    ],
)
def test_to_list(cpu_list: list[int], text: str) -> None:
    assert CpuSet(cpu_list).to_list() == text
    assert str(CpuSet(cpu_list)) == text


@pytest.mark.parametrize(
    ("cpu_list", "nr_cpus", "mask"),
    [
        ([], 0, "0"),
        ([0], 0, "1"),
        ([0, 1], 0, "3"),
        ([0, 1], 2, "3"),
        ([31], 0, "80000000"),
        ([32], 0, "1,00000000"),
        ([0, *range(32, 40)], 0, "ff,00000001"),
        ([0], 64, "0,00000001"),
        ([64], 0, "1,00000000,00000000"),
        ([], 40, "0,00000000"),
    ],
)
def test_to_mask(cpu_list: list[int], nr_cpus: int, mask: str) -> None:
    assert CpuSet(cpu_list).to_mask(nr_cpus) == mask


def random_sets() -> list[CpuSet]:
    rng = random.Random(1234)
    sets = [CpuSet(), cpus(0), cpus(31), cpus(32), cpus(63), cpus(64), CpuSet(range(129))]
    for size in (4, 33, 65, 130, 300):
        for _ in range(60):
            density = rng.random()
            sets.append(CpuSet(c for c in range(size) if rng.random() < density))
    return sets


def test_list_round_trip_many_sets() -> None:
    for s in random_sets():
        text = s.to_list()
        assert CpuSet.from_list(text) == s, text
        # The canonical form is stable: no duplicate or overlapping pieces.
        assert CpuSet.from_list(text).to_list() == text


def test_mask_round_trip_many_sets() -> None:
    for s in random_sets():
        mask = s.to_mask()
        assert CpuSet.from_mask(mask) == s, mask
        assert CpuSet.from_mask("0x" + mask) == s
        words = mask.split(",")
        assert all(len(w) == 8 for w in words[1:]), mask
        assert len(words) == max(1, (max(s, default=0) + 32) // 32)
        # Padding to a wider machine keeps the set.
        assert CpuSet.from_mask(s.to_mask(nr_cpus=512)) == s
        assert len(s.to_mask(nr_cpus=512).split(",")) == 16


def test_list_and_mask_agree() -> None:
    for s in random_sets():
        assert CpuSet.from_mask(s.to_mask()) == CpuSet.from_list(s.to_list())


# -- set behaviour ----------------------------------------------------------------


def test_set_operations() -> None:
    a, b = CpuSet.from_list("0-3"), CpuSet.from_list("2-5")
    assert a | b == CpuSet.from_list("0-5")
    assert a & b == CpuSet.from_list("2-3")
    assert a - b == CpuSet.from_list("0-1")
    assert a ^ b == CpuSet.from_list("0-1,4-5")
    assert list(CpuSet([3, 1, 2])) == [1, 2, 3]
    assert len(a) == 4 and 3 in a and 4 not in a
    assert not CpuSet() and a
    assert (a & b).issubset(a) and not a.issubset(b)
    assert hash(CpuSet([1, 2])) == hash(CpuSet.from_list("1-2"))
    assert CpuSet([1]) != {1}
    assert repr(a) == "CpuSet('0-3')"


# -- expressions ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("all", "0-3"),
        ("none", ""),
        ("1", "1"),
        ("0-3,8", "0-3,8"),
        ("0-7:2", "0,2,4,6"),
        ("all - 1", "0,2-3"),
        ("all-1", "0,2-3"),
        ("all - 1 - 3", "0,2"),
        ("~1", "0,2-3"),
        ("!1", "0,2-3"),
        ("~~1", "1"),
        ("~none", "0-3"),
        ("~all", ""),
        ("(0-3 | 8) & 2-9", "2-3,8"),
        ("0-3 | 8 & 2-9", "0-3,8"),
        ("(0,1) | 4", "0-1,4"),
        ("0 + 2", "0,2"),
        ("0-3 & ~1", "0,2-3"),
        ("0-3 ^ 2-5", "0-1,4-5"),
        ("0-1 | 2 ^ 2-3", "0-1,3"),
        ("0-3 & 1 ^ 1-2", "2"),
        ("0-3 - (1 | 2)", "0,3"),
        ("0-3 - 1 | 2", "0,2-3"),
        ("0x5", "0,2"),
        ("0xff,00000000 & 32-33", "32-33"),
        ("none | 2", "2"),
        ("  all  ", "0-3"),
    ],
)
def test_parse(expr: str, expected: str) -> None:
    assert CpuSet.parse(expr, ALL4) == CpuSet.from_list(expected)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty CPU list (write 'none' for no CPUs)"),
        ("   ", "empty CPU list"),
        ("(0-3", "missing ')' in CPU list '(0-3'"),
        ("((0-3) | 1", "missing ')' in CPU list '((0-3) | 1'"),
        ("(0-3 1)", "missing ')' in CPU list '(0-3 1)'"),
        ("0-3)", "unexpected ')' in CPU list '0-3)'"),
        ("1 2", "unexpected '2' in CPU list '1 2'"),
        ("all -", "CPU list 'all -' ends too early"),
        ("~", "CPU list '~' ends too early"),
        ("& 1", "unexpected '&' in CPU list '& 1'"),
        ("foo", "cannot read CPU list 'foo' at 'foo'"),
        ("all - cpu3", "cannot read CPU list 'all - cpu3' at 'cpu3'"),
        ("3-1", "range '3-1' runs backwards"),
        ("0x", "cannot read CPU list '0x' at 'x'"),
    ],
)
def test_parse_errors(expr: str, message: str) -> None:
    with pytest.raises(CpuSetError) as info:
        CpuSet.parse(expr, ALL4)
    assert message in str(info.value)


def test_sizes_are_checked_before_sets_are_built() -> None:
    """Hostile input is refused before it costs memory or stack."""
    all_cpus = CpuSet.from_list("0-3")
    for expr, message in [
        ("0-200000000", "beyond the largest CPU number"),
        ("0x" + "f" * 3000, "longer than any CPU count"),
        ("0x1" + "0" * 2100, "beyond the largest"),
        ("~" * 100 + "1", "nests more than 32 deep"),
        ("(" * 100 + "1" + ")" * 100, "nests more than 32 deep"),
    ]:
        with pytest.raises(CpuSetError, match=message):
            CpuSet.parse(expr, all_cpus)
    assert CpuSet.parse("~" * 32 + "1", all_cpus) == CpuSet([1])
    with pytest.raises(CpuSetError, match=r"CPU 123456789012\.\.\. \(5000 digits\) is beyond"):
        CpuSet.from_list("1-12345678901" + "2" * 4989)  # int() would refuse 4,300 digits
    assert len(CpuSet.from_list(f"0-{MAX_CPUS - 1}")) == MAX_CPUS


def test_bytes_as_systemd_puts_cpu_sets_on_the_bus() -> None:
    # cpu_set_to_dbus: bit N of byte N/8 is CPU N; no bytes is no CPU (AllowedCPUs= unset)
    assert CpuSet({0}).to_bytes() == b"\x01"
    assert CpuSet({1, 8, 255}).to_bytes() == b"\x02\x01" + b"\x00" * 29 + b"\x80"
    assert CpuSet().to_bytes() == b""
    for cpus in (CpuSet(), CpuSet({3}), CpuSet(range(0, 256, 3))):
        assert CpuSet.from_bytes(cpus.to_bytes()) == cpus
    assert CpuSet.from_bytes(b"\x00\x00") == CpuSet()
    with pytest.raises(CpuSetError):
        CpuSet.from_bytes(b"\xff" * 1025)
