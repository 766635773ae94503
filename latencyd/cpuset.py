"""CpuSet: the one type for a set of CPUs, in every notation the kernel and users use.

Notations:
- cpulists as in /sys and `taskset -c`: ``0-3,8``, ``0-7:2`` (stride);
- affinity masks as in /proc/irq/N/smp_affinity: hex, comma-separated 32-bit words;
- expressions in profiles: ``all - ${isolated_cores}``, ``0-3 & ~1``, ``(0,1) | 4``.
  ``all`` is the machine's online CPUs, ``none`` the empty set, ``~X``/``!X`` the
  complement within ``all``; binary operators are ``|`` / ``+`` (union), ``&``
  (intersection), ``-`` (difference) and ``^`` (symmetric difference).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator


class CpuSetError(ValueError):
    pass


# The largest CPU count any Linux configuration supports (CONFIG_NR_CPUS is at most 8192
# on x86_64): bounds are checked before a set is built, so "0-200000000" is an error,
# not 200 million integers.
MAX_CPUS = 8192


# ASCII digits only: `\d`, str.isdigit() and int() also take other scripts' digits
# ("١-٣" is 1-3 to int()), which no kernel or person writes as a CPU number.
_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?$")
_DIGITS = frozenset("0123456789")


def _number(digits: str) -> int:
    """ASCII digits as an int; one with more digits than MAX_CPUS is taken as MAX_CPUS
    (beyond every CPU either way), so a long string is never converted: int() costs
    quadratic time in it, and refuses more than 4,300 digits with a ValueError."""
    significant = digits.lstrip("0")
    if len(significant) > len(str(MAX_CPUS)):
        return MAX_CPUS
    return int(significant or "0")


def _range_mask(lo: int, hi: int, step: int) -> int:
    """CPUs lo..hi every `step` as a bit mask, built with a few big-int operations whatever
    the count: a range costs the same whether it holds one CPU or 8,192."""
    count = (hi - lo) // step + 1
    if count == 1:
        return 1 << lo
    # count > 1, so step <= hi - lo < MAX_CPUS: the bits below stay few.
    ones = (1 << (step * count)) - 1
    return ones // ((1 << step) - 1) << lo  # `count` ones, `step` bits apart


def _cpulist_mask(text: str) -> int:
    """A cpulist (``0-3,8``, ``0-7:2``) as a bit mask; bounds are checked per range, before
    anything is built, and a range costs O(1) operations, not O(its CPUs)."""
    text = text.strip()
    if not text:
        return 0
    mask = 0
    for part in text.split(","):
        part = part.strip()
        m = _RANGE.match(part)
        if not m:
            raise CpuSetError(f"{part[:40]!r} is not a CPU number or range (like 0-3,8)")
        lo = _number(m.group(1))
        hi = _number(m.group(2)) if m.group(2) is not None else lo
        step = _number(m.group(3)) if m.group(3) is not None else 1
        if hi < lo:
            raise CpuSetError(f"range {part[:40]!r} runs backwards")
        if step < 1:
            raise CpuSetError(f"range {part[:40]!r} has a zero stride")
        if hi >= MAX_CPUS:
            last = (m.group(2) or m.group(1)).lstrip("0")
            shown = last if len(last) <= 12 else f"{last[:12]}... ({len(last)} digits)"
            raise CpuSetError(f"CPU {shown} is beyond the largest CPU number Linux supports")
        mask |= _range_mask(lo, hi, step)
    return mask


def _hex_mask(text: str) -> int:
    """An affinity mask (hex, optionally ``0x``-prefixed, comma-separated 32-bit words)."""
    raw = text.strip().lower()
    if raw.startswith("0x"):
        raw = raw[2:]
    words = raw.split(",")
    if not raw or any(not w or not re.fullmatch(r"[0-9a-f]+", w) for w in words):
        raise CpuSetError(f"{text.strip()[:40]!r} is not a hex CPU mask (like 3 or ff,ffffffff)")
    if len(raw) > MAX_CPUS // 4 + MAX_CPUS // 32:  # hex digits plus separators
        raise CpuSetError("CPU mask is longer than any CPU count Linux supports")
    value = 0
    for w in words:
        value = (value << 32) | int(w, 16)
    if value.bit_length() > MAX_CPUS:
        raise CpuSetError("CPU mask names CPUs beyond the largest Linux supports")
    return value


def _cpus_of(mask: int) -> frozenset[int]:
    """The CPUs of a bit mask, in time linear in its bits (testing bit by bit is quadratic
    on a big int)."""
    bits = bin(mask)[:1:-1]  # lowest bit first, without the "0b"
    cpus: set[int] = set()
    for run in re.finditer("1+", bits):
        cpus.update(range(run.start(), run.end()))
    return frozenset(cpus)


@functools.lru_cache(maxsize=64)
def _mask_of(cpus: frozenset[int]) -> int:
    """The bit mask of a set of CPUs, in time linear in the largest (a sum of 1 << cpu is
    quadratic); cached: it is mostly the machine's online CPUs, for each expression."""
    if not cpus:
        return 0
    bits = bytearray(b"0" * (max(cpus) + 1))
    for cpu in cpus:
        bits[cpu] = ord("1")
    return int(bits[::-1], 2)  # a power-of-two base: no digit limit, linear


@functools.lru_cache(maxsize=4096)
def _parse_cpulist(text: str) -> frozenset[int]:
    return _cpus_of(_cpulist_mask(text))


@functools.lru_cache(maxsize=1024)
def _format_cpulist(cpus: frozenset[int]) -> str:
    out: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


class CpuSet:
    __slots__ = ("_cpus",)

    def __init__(self, cpus: Iterable[int] = ()) -> None:
        s = frozenset(int(c) for c in cpus) if not isinstance(cpus, frozenset) else cpus
        if s and min(s) < 0:
            raise CpuSetError("CPU numbers cannot be negative")
        self._cpus = s

    @classmethod
    def _of(cls, cpus: frozenset[int]) -> CpuSet:
        """From a frozenset already of valid CPU numbers (set algebra on CpuSets)."""
        cpuset = cls.__new__(cls)
        cpuset._cpus = cpus
        return cpuset

    @classmethod
    def from_kernel(cls, cpus: Iterable[int]) -> CpuSet:
        """CPUs the kernel reported (sched_getaffinity): valid by construction, so not
        checked again; checking costs O(CPUs) per thread, 50,000 times on a server."""
        return cls._of(frozenset(cpus))

    # -- parsing ---------------------------------------------------------
    @classmethod
    def from_list(cls, text: str) -> CpuSet:
        """Parse a kernel cpulist (``0-3,8``, ``0-7:2``, empty string for none). Parsed
        once per distinct text: the daemon compares thousands of threads' CPU lists, and
        they are nearly all the same few."""
        return cls._of(_parse_cpulist(text))

    @classmethod
    def from_mask(cls, text: str) -> CpuSet:
        """Parse an affinity mask: hex, optionally ``0x``-prefixed, comma-separated 32-bit words."""
        return cls._of(_cpus_of(_hex_mask(text)))

    @classmethod
    def from_bytes(cls, mask: bytes) -> CpuSet:
        """A bit mask as bytes, lowest CPUs first (systemd's CPU sets on D-Bus)."""
        if len(mask) * 8 > MAX_CPUS:
            raise CpuSetError("CPU mask names CPUs beyond the largest Linux supports")
        return cls._of(_cpus_of(int.from_bytes(mask, "little")))

    @classmethod
    def parse(cls, expr: str, all_cpus: CpuSet) -> CpuSet:
        """Evaluate a profile CPU expression against the machine's online CPUs: in time
        linear in its length (sets as bit masks until the end), whatever CPUs it names."""
        return cls._of(_cpus_of(_Parser(expr, _mask_of(all_cpus._cpus)).parse()))

    # -- formatting ------------------------------------------------------
    def to_list(self) -> str:
        """Kernel cpulist form, ranges collapsed: ``0-3,8``."""
        return _format_cpulist(self._cpus)

    def to_mask(self, nr_cpus: int = 0) -> str:
        """Hex mask in the kernel's comma-separated 32-bit word form."""
        value = _mask_of(self._cpus)
        bits = max(nr_cpus, value.bit_length(), 1)
        nwords = (bits + 31) // 32
        words = [(value >> (32 * i)) & 0xFFFFFFFF for i in reversed(range(nwords))]
        first, *rest = words
        return ",".join([f"{first:x}"] + [f"{w:08x}" for w in rest])

    def to_bytes(self) -> bytes:
        """The bit mask as bytes, lowest CPUs first; none for no CPU (from_bytes)."""
        value = _mask_of(self._cpus)
        return value.to_bytes((value.bit_length() + 7) // 8, "little")

    def as_frozenset(self) -> frozenset[int]:
        """The CPUs unordered, as the kernel's sched_setaffinity takes them (iterating a
        CpuSet sorts)."""
        return self._cpus

    # -- set behaviour ---------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._cpus))

    def __len__(self) -> int:
        return len(self._cpus)

    def __contains__(self, cpu: object) -> bool:
        return cpu in self._cpus

    def __bool__(self) -> bool:
        return bool(self._cpus)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CpuSet) and self._cpus == other._cpus

    def __hash__(self) -> int:
        return hash(self._cpus)

    def __or__(self, other: CpuSet) -> CpuSet:
        return CpuSet._of(self._cpus | other._cpus)

    def __and__(self, other: CpuSet) -> CpuSet:
        return CpuSet._of(self._cpus & other._cpus)

    def __sub__(self, other: CpuSet) -> CpuSet:
        return CpuSet._of(self._cpus - other._cpus)

    def __xor__(self, other: CpuSet) -> CpuSet:
        return CpuSet._of(self._cpus ^ other._cpus)

    def issubset(self, other: CpuSet) -> bool:
        return self._cpus <= other._cpus

    def __repr__(self) -> str:
        return f"CpuSet({self.to_list()!r})"

    def __str__(self) -> str:
        return self.to_list()


_TOKEN = re.compile(r"\s*(0x[0-9a-fA-F,]+|all|none|[0-9][0-9,:\-]*[0-9]|[0-9]|[()|&~!+^-])")


class _Parser:
    """Recursive-descent parser; precedence: unary ~ > & > ^ > | + -. Sets are bit masks
    while it works (an operation costs the same for 1 CPU or 8,192)."""

    MAX_DEPTH = 32  # parentheses and ~ inside each other (the parser recurses per level)

    def __init__(self, expr: str, all_cpus: int) -> None:
        self.expr = expr if len(expr) <= 80 else expr[:77] + "..."
        self.all = all_cpus
        self.depth = 0
        expr = re.sub(r"\s*,\s*", ",", expr)  # "1, 2" is a list, as in from_list
        self.tokens: list[str] = []
        pos = 0
        stripped = expr.rstrip()
        while pos < len(stripped):
            m = _TOKEN.match(stripped, pos)
            if not m:
                rest = stripped[pos:].strip()[:20]
                raise CpuSetError(f"cannot read CPU list {self.expr!r} at {rest!r}")
            self.tokens.append(m.group(1))
            pos = m.end()
        self.i = 0

    def parse(self) -> int:
        if not self.tokens:
            raise CpuSetError("empty CPU list (write 'none' for no CPUs)")
        result = self._union()
        if self.i != len(self.tokens):
            raise CpuSetError(f"unexpected {self.tokens[self.i]!r} in CPU list {self.expr!r}")
        return result

    def _peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def _take(self) -> str:
        tok = self._peek()
        if tok is None:
            raise CpuSetError(f"CPU list {self.expr!r} ends too early")
        self.i += 1
        return tok

    def _union(self) -> int:
        left = self._xor()
        while self._peek() in ("|", "+", "-"):
            op = self._take()
            right = self._xor()
            left = left & ~right if op == "-" else left | right
        return left

    def _xor(self) -> int:
        left = self._and()
        while self._peek() == "^":
            self._take()
            left = left ^ self._and()
        return left

    def _and(self) -> int:
        left = self._unary()
        while self._peek() == "&":
            self._take()
            left = left & self._unary()
        return left

    def _unary(self) -> int:
        tok = self._take()
        if tok in ("~", "!", "("):
            self.depth += 1
            if self.depth > self.MAX_DEPTH:
                raise CpuSetError(f"CPU list {self.expr!r} nests more than {self.MAX_DEPTH} deep")
            try:
                if tok != "(":
                    return self.all & ~self._unary()
                inner = self._union()
                if self._peek() != ")":
                    raise CpuSetError(f"missing ')' in CPU list {self.expr!r}")
                self._take()
                return inner
            finally:
                self.depth -= 1
        if tok == "all":
            return self.all
        if tok == "none":
            return 0
        if tok.startswith("0x"):
            return _hex_mask(tok)
        if tok[0] in _DIGITS:
            return _cpulist_mask(tok)
        raise CpuSetError(f"unexpected {tok!r} in CPU list {self.expr!r}")
