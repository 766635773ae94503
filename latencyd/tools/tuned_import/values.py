"""TuneD's value language: option values with ${variable} and ${f:function:arg:...}
references (`parse_value`), TuneD's own evaluation of them on this machine
(`Evaluator`, with TuneD's functions), and `Tr`, a value translated or evaluated
together with what was lost or worth noting on the way. Also TuneD's booleans.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from latencyd.tools.tuned_import.cpulists import cpulist2hex, cpulist_pack, cpulist_unpack
from latencyd.tools.tuned_import.host import Host


@dataclass(frozen=True)
class Text:
    """Literal text in a value."""

    text: str
    escaped: bool = False  # \${...}: TuneD's literal "${...}" (latencyd has no such escape)


@dataclass(frozen=True)
class Var:
    """${name}: a TuneD variable."""

    name: str


@dataclass(frozen=True)
class Func:
    """${f:name:arg:...}: a call of a TuneD function; `raw` is how it was written."""

    name: str
    args: tuple[tuple[Node, ...], ...]
    raw: str


Node = Text | Var | Func


def parse_value(value: str) -> tuple[Node, ...]:
    """A TuneD option value as text, ${variable} and ${f:function:arg:...} nodes."""
    nodes: list[Node] = []
    buf: list[str] = []
    i = 0
    while i < len(value):
        if value.startswith("${", i):
            end = _closing(value, i)
            if end < 0:  # TuneD logs "non pair '{'" and keeps the text
                buf.append(value[i:])
                break
            inner = value[i + 2 : end]
            escaped = bool(buf) and buf[-1].endswith("\\")
            if escaped:
                buf[-1] = buf[-1][:-1]
                if buf:
                    nodes.append(Text("".join(buf)))
                    buf = []
                nodes.append(Text(value[i : end + 1], escaped=True))
            elif inner.startswith("f:"):
                if buf:
                    nodes.append(Text("".join(buf)))
                    buf = []
                parts = _split_args(inner)
                args = tuple(parse_value(a.replace("\\:", ":")) for a in parts[2:])
                nodes.append(Func(parts[1] if len(parts) > 1 else "", args, value[i : end + 1]))
            elif re.fullmatch(r"\w+", inner):
                if buf:
                    nodes.append(Text("".join(buf)))
                    buf = []
                nodes.append(Var(inner))
            else:
                buf.append(value[i : end + 1])
            i = end + 1
            continue
        buf.append(value[i])
        i += 1
    if buf:
        nodes.append(Text("".join(buf)))
    return tuple(_join_text(nodes))


def _join_text(nodes: list[Node]) -> list[Node]:
    out: list[Node] = []
    for n in nodes:
        last = out[-1] if out else None
        if isinstance(n, Text) and not n.escaped and isinstance(last, Text) and not last.escaped:
            out[-1] = Text(last.text + n.text)
        elif not (isinstance(n, Text) and not n.text):
            out.append(n)
    return out


def _closing(value: str, start: int) -> int:
    depth = 0
    i = start
    while i < len(value):
        if value.startswith("${", i):
            depth += 1
            i += 2
            continue
        if value[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _split_args(inner: str) -> list[str]:
    """`f:name:a:b` split on ':' not escaped and not inside a nested ${...}."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    i = 0
    while i < len(inner):
        if inner.startswith("${", i):
            depth += 1
            current.append("${")
            i += 2
            continue
        ch = inner[i]
        if ch == "}" and depth:
            depth -= 1
        if ch == ":" and depth == 0 and not (current and current[-1] == "\\"):
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    parts.append("".join(current))
    return parts


def var_names(node: Node) -> set[str]:
    """The variables a node refers to, in function arguments too."""
    if isinstance(node, Var):
        return {node.name}
    if isinstance(node, Func):
        return {v for arg in node.args for n in arg for v in var_names(n)}
    return set()


@dataclass(frozen=True)
class Tr:
    """A value translated (or evaluated): `text`, or None with `why`. `approx` are
    evaluations on this machine latencyd cannot express (they make the import partial);
    `notes` explain exact translations."""

    text: str | None
    why: str = ""
    approx: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def __add__(self, other: Tr) -> Tr:
        if self.text is None or other.text is None:
            why = "; ".join(w for w in (self.why, other.why) if w)
            return Tr(None, why, self.approx + other.approx, self.notes + other.notes)
        return Tr(self.text + other.text, "", self.approx + other.approx, self.notes + other.notes)

    def but(self, text: str | None, why: str = "") -> Tr:
        return Tr(text, why or self.why, self.approx, self.notes)

    def plus(self, approx: Iterable[str] = (), notes: Iterable[str] = ()) -> Tr:
        return Tr(self.text, self.why, self.approx + tuple(approx), self.notes + tuple(notes))


def concat(parts: Iterable[Tr]) -> Tr:
    """Translations one after the other: None where any part is."""
    out = Tr("")
    for p in parts:
        out = out + p
    return out


class Evaluator:
    """TuneD's own expansion (eager, as on this machine), for what must be known as text:
    conditions, include names, the kernel command line a profile wanted."""

    def __init__(self, env: Mapping[str, str | None], host: Host, lenient: bool = False) -> None:
        self.env = env
        self.host = host
        self.lenient = lenient  # show what cannot be evaluated as written, and go on

    def eval(self, nodes: Sequence[Node]) -> Tr:
        if not self.lenient:
            return concat(self.node(n) for n in nodes)
        parts = []
        strict = Evaluator(self.env, self.host)
        for n in nodes:
            got = strict.node(n)
            raw = (
                n.text
                if isinstance(n, Text)
                else n.raw
                if isinstance(n, Func)
                else f"${{{n.name}}}"
            )
            parts.append(got if got.text is not None else Tr(raw, approx=(got.why,)))
        return concat(parts)

    def node(self, node: Node) -> Tr:
        if isinstance(node, Text):
            return Tr(node.text)
        if isinstance(node, Var):
            if node.name not in self.env:
                return Tr("${" + node.name + "}")  # TuneD leaves it as it is
            value = self.env[node.name]
            if value is None:
                return Tr(None, f"${{{node.name}}} cannot be evaluated")
            return Tr(value)
        args = [self.eval(a) for a in node.args]
        missing = [a for a in args if a.text is None]
        if missing:
            return missing[0].but(None)
        texts = [a.text or "" for a in args]
        base = concat(a.but("") for a in args)
        return base + self.call(node.name, texts, node.raw)

    def call(self, name: str, args: list[str], raw: str) -> Tr:
        host = self.host
        joined = ",,".join(args)
        if name in ("cpulist_unpack", "cpulist_pack", "cpulist_online", "cpulist_present"):
            cpus = cpulist_unpack(",".join(args) if name == "cpulist_online" else joined) or []
            if name == "cpulist_online":
                cpus = [c for c in cpus if c in host.online]
            if name == "cpulist_present":
                cpus = [c for c in cpus if c in host.present]
            return Tr(cpulist_pack(cpus) if name == "cpulist_pack" else ",".join(map(str, cpus)))
        if name in ("cpulist_invert", "cpulist2hex_invert"):
            given = set(cpulist_unpack(joined) or [])
            rest = [c for c in host.online if c not in given]
            return Tr(
                cpulist2hex(rest) if name == "cpulist2hex_invert" else ",".join(map(str, rest))
            )
        if name == "cpulist2hex":
            return Tr(cpulist2hex(cpulist_unpack(joined) or []))
        if name == "hex2cpulist":
            mask = cpulist_unpack("0x" + args[0].replace(",", "")) if args else []
            return Tr(",".join(map(str, mask or [])))
        if name == "cpulist2devs":
            return Tr(",".join(f"cpu{c}" for c in cpulist_unpack(",".join(args)) or []))
        if name == "strip":
            return Tr("".join(args).strip())
        if name in ("kb2s", "s2kb"):
            if len(args) != 1 or not re.fullmatch(r"-?\d+", args[0]):
                return Tr(None, f"{raw}: not a number")
            n = int(args[0])
            return Tr(str(n * 2 if name == "kb2s" else round(n / 2)))
        if name == "regex_search_ternary":
            if len(args) != 4:
                return Tr(None, f"{raw}: takes 4 arguments")
            try:
                hit = re.search(args[1], args[0]) is not None
            except re.error as exc:
                return Tr(None, f"{raw}: bad regular expression: {exc}")
            return Tr(args[2] if hit else args[3])
        if name in ("assertion", "assertion_non_equal"):
            return Tr("")
        if name == "calc_isolated_cores":
            return calc_isolated_cores(args, host)
        if name == "virt_check":
            return virt_check(args, host)
        if name == "cpuinfo_check":
            return cpuinfo_check(args, host)
        if name == "check_net_queue_count":
            if args and re.fullmatch(r"[0-9]{1,6}", args[0]):
                return Tr(args[0])
            return Tr(
                None,
                "netdev_queue_count is not set: TuneD would use the CPU count (nproc) "
                "when applying; latencyd needs a number",
            )
        if name == "exec":
            return Tr(None, f"{raw} runs a command: latencyd profiles run no commands")
        return Tr(None, f"{raw}: TuneD function {name!r} is unknown to this importer")


def calc_isolated_cores(args: Sequence[str], host: Host) -> Tr:
    reserve = 1
    if args and args[0]:
        if not args[0].isdecimal():
            return Tr(None, f"calc_isolated_cores:{args[0]}: not a number")
        reserve = int(args[0])
    sockets: dict[str, list[int]] = {}
    for cpu, package in sorted(host.packages.items()):
        if package.isdecimal():
            sockets.setdefault(package, []).append(cpu)
    isolated = sorted(c for cpus in sockets.values() for c in cpus[reserve:])
    what = f"calc_isolated_cores:{reserve} (all CPUs but the first {reserve} of each socket)"
    if not isolated:
        return Tr(None, f"{what} leaves no CPU to isolate on this machine")
    text = ",".join(map(str, isolated))
    return Tr(
        text,
        approx=(
            f"{what} is {text!r} on this machine; latencyd's CPU lists know no sockets: set "
            "it for the machine the profile is for",
        ),
    )


def virt_check(args: Sequence[str], host: Host) -> Tr:
    if len(args) != 2:
        return Tr(None, "virt_check takes 2 arguments")
    virtual = bool(host.virtualized)
    how = host.virtualized or (
        "no sign of a hypervisor" if host.virtualized == "" else "no sign either way"
    )
    chosen = args[0] if virtual else args[1]
    return Tr(
        chosen,
        approx=(
            f"virt_check chose {chosen!r} because this machine is "
            f"{'virtual' if virtual else 'not virtual'} ({how}); on a "
            f"{'physical' if virtual else 'virtual'} machine TuneD uses "
            f"{args[1] if virtual else args[0]!r}",
        ),
    )


def cpuinfo_check(args: Sequence[str], host: Host) -> Tr:
    chosen = args[-1] if len(args) % 2 else ""
    for i in range(0, len(args) - 1, 2):
        try:
            if re.search(args[i], host.cpuinfo, re.MULTILINE):
                chosen = args[i + 1]
                break
        except re.error as exc:
            return Tr(None, f"cpuinfo_check: bad regular expression {args[i]!r}: {exc}")
    return Tr(
        chosen,
        approx=(f"cpuinfo_check gives {chosen!r} for this machine's CPUs (/proc/cpuinfo)",),
    )


# The words TuneD's plugins read as booleans.
TRUE_WORDS = ("1", "y", "yes", "t", "true", "on")
FALSE_WORDS = ("0", "n", "no", "f", "false", "off")


def tuned_bool(raw: str) -> bool | None:
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    return None
