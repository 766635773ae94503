"""TuneD's CPU lists ("0-3,^2", "0xf,,5"): TuneD's own functions on them, to evaluate
what TuneD would on this machine, and their translation into latencyd's CPU-list
expressions ("0-3 - 2"), which latencyd evaluates itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


def _cpu(text: str) -> bool:
    """A CPU number as TuneD's lists write one: ASCII digits, below Linux's 8,192 CPUs
    (str.isdigit takes other scripts' digits, and int() of thousands of them raises)."""
    text = text.strip()
    return re.fullmatch(r"[0-9]{1,4}", text) is not None and int(text) <= 8191


def cpulist_unpack(text: str) -> list[int] | None:
    """TuneD's cpulist_unpack: "0-3,^2", "0x3" masks (commas inside, ",," ends one);
    None where TuneD gives an empty list for a parse error."""
    items = str(text).strip("'\"").split(",")
    plain: list[str] = []
    neg: list[int] = []
    mask = ""
    in_mask = False
    for item in items:
        if in_mask:
            if not item:
                plain.append(mask)
                mask, in_mask = "", False
            else:
                mask += item
            continue
        if item[:2].lower() == "0x":
            mask, in_mask = item, True
        elif item and item[0] in "^!":
            lo, _, hi = item[1:].partition("-")
            if not _cpu(lo) or (hi and not _cpu(hi)):
                return None
            neg.extend(range(int(lo), int(hi or lo) + 1))
        elif item.strip():
            plain.append(item.strip())
    if mask:
        plain.append(mask)
    cpus: set[int] = set()
    for item in plain:
        if item[:2].lower() == "0x":
            if len(item) > 2 + 2048 + 256:  # 8,192 CPUs' mask, with commas
                return None
            try:
                value = int(item[2:].replace(",", ""), 16)
            except ValueError:
                return None
            cpus.update(i for i in range(value.bit_length()) if value >> i & 1)
            continue
        lo, _, hi = item.partition("-")
        if not _cpu(lo) or (hi and not _cpu(hi)):
            return None
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus - set(neg))


def cpulist_pack(cpus: Iterable[int]) -> str:
    """TuneD's cpulist_pack: CPUs as ranges ("0-3,5")."""
    out: list[str] = []
    for c in sorted(set(cpus)):
        if out and "-" not in out[-1].split(",")[-1] and int(out[-1]) == c - 1:
            out[-1] = f"{out[-1]}-{c}"
        elif out and "-" in out[-1] and int(out[-1].split("-")[1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def cpulist2hex(cpus: Iterable[int]) -> str:
    """TuneD's cpulist2hex: CPUs as a hex mask in comma-separated 32-bit words."""
    value = sum(1 << c for c in set(cpus))
    digits = f"{value:x}"
    digits = digits.zfill(-(-len(digits) // 8) * 8)
    return ",".join(digits[i : i + 8] for i in range(0, len(digits), 8))


def cpulist_expr(text: str, mask: bool = False) -> str | None:
    """A TuneD CPU list ("0-3,^2", "0xf,,5") as a latencyd CPU-list expression; with
    `mask`, a bare hex mask ("fffffffd", "ff,ffffffff") as TuneD's masks are written."""
    text = text.strip().strip("'\"").strip()
    if not text:
        return "none"
    if mask:
        if re.fullmatch(r"(0[xX])?[0-9a-fA-F]+(,[0-9a-fA-F]+)*", text):
            return "0x" + re.sub(r"^0[xX]", "", text).lower()
        return None
    items = text.split(",")
    plus: list[str] = []
    minus: list[str] = []
    i = 0
    while i < len(items):
        item = items[i].strip()
        i += 1
        if item[:2].lower() == "0x":
            words = [item[2:]]
            while i < len(items) and items[i].strip():
                words.append(items[i].strip())
                i += 1
            if not all(re.fullmatch(r"[0-9a-fA-F]+", w) for w in words):
                return None
            plus.append("0x" + ",".join(words).lower())
        elif item[:1] in ("^", "!"):
            if not re.fullmatch(r"\d+(-\d+)?", item[1:]):
                return None
            minus.append(item[1:])
        elif item:
            if not re.fullmatch(r"\d+(-\d+)?", item):
                return None
            plus.append(item)
    lists = [p for p in plus if not p.startswith("0x")]
    terms = ([",".join(lists)] if lists else []) + [p for p in plus if p.startswith("0x")]
    expr = " | ".join(terms) or "none"
    if minus:
        expr = (
            f"({expr}) - ({','.join(minus)})" if len(terms) > 1 else f"{expr} - {','.join(minus)}"
        )
    return expr
