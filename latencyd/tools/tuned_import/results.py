"""What an import yields: the conversion of a merged TuneD profile (latencyd `Item`s and
`Finding`s), and `ImportFailed` when there is nothing to yield.

Also the shape of latencyd's side that the conversion and the files written from it
must agree on: which options are arrays of tables, which writeback options pair up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Options of latencyd sections that are arrays of tables.
TABLE_ARRAYS = {("cstate", "cpus"), ("cpu", "cpus"), ("irq", "rule"), ("kthread", "rule")}
TABLE_ARRAYS |= {("net", "nic"), ("shield", "rule")}
# The writeback pairs the kernel keeps one of; latencyd drops the other mode by itself.
WRITEBACK_PAIRS = (
    ("dirty_ratio", "dirty_bytes"),
    ("dirty_background_ratio", "dirty_background_bytes"),
)


class ImportFailed(Exception):
    """The profile cannot be converted at all (exit 2): not a TuneD profile, unreadable,
    not found, an include cycle; or the files cannot be written."""


# The TuneD settings an item comes from: (TuneD section, option) pairs.
Sources = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Finding:
    """Something not converted (`counted`), or a note on how something was converted."""

    unit: str  # TuneD section
    option: str | None  # TuneD option; None: the section as a whole
    text: str
    counted: bool = True
    home: str | None = None  # the latencyd section it sits next to
    line: str | None = None  # a TOML line the user may enable where it applies
    path: str = ""  # the TuneD profile it is about (set for include/variables findings)

    @property
    def label(self) -> str:
        return f"[{self.unit}] {self.option}" if self.option else f"[{self.unit}]"

    @property
    def key(self) -> tuple[str, str | None, str]:
        return (self.unit, self.option, self.text)


@dataclass(frozen=True)
class Item:
    """One latencyd option (or one variable, in section "variables")."""

    section: str
    option: str
    value: Any
    sources: Sources
    note: str = ""


@dataclass
class Conversion:
    """A merged TuneD profile as latencyd options, by (section, option), and findings."""

    items: dict[tuple[str, str], Item] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
