from __future__ import annotations

import tomllib

from latencyd.core.tomlpos import key_lines, nearest_line


def lines_of(text: str) -> dict[tuple[str | int, ...], int]:
    tomllib.loads(text)  # key_lines only ever sees documents tomllib accepted
    return key_lines(text)


def test_tables_and_keys() -> None:
    text = """\
# a comment
top = 1

[main]
summary = "x"

[writeback]
dirty_ratio = 5
  indented = 6
"""
    assert lines_of(text) == {
        ("top",): 2,
        ("main",): 4,
        ("main", "summary"): 5,
        ("writeback",): 7,
        ("writeback", "dirty_ratio"): 8,
        ("writeback", "indented"): 9,
    }


def test_arrays_of_tables_get_indices() -> None:
    text = """\
[[irq.rule]]
match = "eth0"
cpus = "1"

[[irq.rule]]
match = "virtio"

[other]
x = 1
"""
    lines = lines_of(text)
    assert lines[("irq", "rule")] == 1
    assert lines[("irq", "rule", 0)] == 1
    assert lines[("irq", "rule", 0, "match")] == 2
    assert lines[("irq", "rule", 0, "cpus")] == 3
    assert lines[("irq", "rule", 1)] == 5
    assert lines[("irq", "rule", 1, "match")] == 6
    assert ("irq", "rule", 1, "cpus") not in lines
    assert lines[("other", "x")] == 9


def test_dotted_table_headers_give_their_parents_a_line() -> None:
    # [irq.rule] implicitly defines [irq]; errors about the [irq] section need a line.
    lines = lines_of("# x\n[irq.rule]\na = 1\n\n[[kthread.group]]\nb = 2\n")
    assert lines[("irq",)] == 2
    assert lines[("irq", "rule")] == 2
    assert lines[("kthread",)] == 5
    assert lines[("kthread", "group", 0, "b")] == 6


def test_quoted_and_dotted_keys() -> None:
    text = """\
[sysctl]
"vm.swappiness" = 10
'net.core.busy_read' = 50
"a=b" = 1
net.ipv4 . tcp_fastopen = 3
"odd.name".inner = 2

["quoted.table"]
x = 1
[a."b.c".d]
y = 2
"""
    lines = lines_of(text)
    assert lines[("sysctl", "vm.swappiness")] == 2
    assert lines[("sysctl", "net.core.busy_read")] == 3
    assert lines[("sysctl", "a=b")] == 4
    assert lines[("sysctl", "net")] == 5
    assert lines[("sysctl", "net", "ipv4")] == 5
    assert lines[("sysctl", "net", "ipv4", "tcp_fastopen")] == 5
    assert lines[("sysctl", "odd.name", "inner")] == 6
    assert lines[("quoted.table",)] == 8
    assert lines[("quoted.table", "x")] == 9
    assert lines[("a", "b.c", "d")] == 10
    assert lines[("a", "b.c", "d", "y")] == 11


def test_table_header_with_bracket_in_quoted_name() -> None:
    lines = lines_of('["a]b"]\nx = 1\n[["c]]d"]]\ny = 2\n')
    assert lines[("a]b",)] == 1
    assert lines[("a]b", "x")] == 2
    assert lines[("c]]d", 0)] == 3
    assert lines[("c]]d", 0, "y")] == 4


def test_multiline_array_content_is_not_keys() -> None:
    text = """\
[main]
include = [
  "a = b",   # looks like a key
  "[notatable]",
  ["nested = 1", [
    "x = 2"]],
]
after = 1
[next]
"""
    lines = lines_of(text)
    assert lines[("main", "include")] == 2
    assert lines[("main", "after")] == 8
    assert lines[("next",)] == 9
    assert set(lines) == {("main",), ("main", "include"), ("main", "after"), ("next",)}


def test_multiline_strings_content_is_not_keys() -> None:
    text = '''\
[main]
summary = """
fake = "value"
[fake.table]
"""
doc = \'\'\'
other = 1 \\
[[x]]
\'\'\'
one_line = """a = b"""
esc = """ends with \\""" still = inside
not = key
"""
real = 2
'''
    lines = lines_of(text)
    assert set(lines) == {
        ("main",),
        ("main", "summary"),
        ("main", "doc"),
        ("main", "one_line"),
        ("main", "esc"),
        ("main", "real"),
    }
    assert lines[("main", "one_line")] == 10
    assert lines[("main", "real")] == 14


def test_comments_with_brackets_and_quotes() -> None:
    text = """\
[a] # see [b] and "quotes
x = 1 # value [ not closed
y = "#[not a comment" # ]
# [commented.out]
#z = 3
[[r]] # ]]
w = 4
"""
    lines = lines_of(text)
    assert lines == {
        ("a",): 1,
        ("a", "x"): 2,
        ("a", "y"): 3,
        ("r",): 6,
        ("r", 0): 6,
        ("r", 0, "w"): 7,
    }


def test_inline_tables_record_their_key_only() -> None:
    lines = lines_of('[a]\nt = { b = 1, c = "}" }\nnext = 2\n')
    assert lines == {("a",): 1, ("a", "t"): 2, ("a", "next"): 3}


def test_strings_with_escaped_quotes_do_not_confuse_the_scanner() -> None:
    lines = lines_of('[a]\nx = "say \\"[\\" now"\ny = \'c:\\\\[\'\nz = 1\n')
    assert lines[("a", "z")] == 4


def test_nearest_line() -> None:
    lines = {("w",): 3, ("w", "a"): 4, ("t", "rule", 0): 7}
    assert nearest_line(lines, ("w", "a")) == 4
    assert nearest_line(lines, ("w", "b")) == 3
    assert nearest_line(lines, ("t", "rule", 0, "cpus", 2)) == 7
    assert nearest_line(lines, ("nope", "x")) is None
    assert nearest_line(lines, ()) is None


def test_multiline_string_ending_in_quotes() -> None:
    # """a"""" is the string 'a"': the closing delimiter is the last three quotes.
    text = "arr = [\"\"\"a\"\"\"\", '''b''''', 1]\nnext = 2\n"
    assert tomllib.loads(text)["arr"] == ['a"', "b''", 1]
    assert lines_of(text) == {("arr",): 1, ("next",): 2}
