"""A merged TuneD profile's [variables], and TuneD values translated into latencyd's.

Variables stay variables where latencyd has the same thing (`${isolated_cores}` is
late-bound in both), CPU-list functions become CPU-list expressions (`cpulist_invert`
-> `all - (...)`), and functions that depend on the machine (`calc_isolated_cores`,
`virt_check`, `cpuinfo_check`) are evaluated on this machine and reported, since
latencyd profiles have no conditions. Commands (`exec`) are never run.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from latencyd.tools.tuned_import.cpulists import cpulist_expr
from latencyd.tools.tuned_import.host import Host
from latencyd.tools.tuned_import.profiles import Unit, parse_variables_file
from latencyd.tools.tuned_import.results import Finding
from latencyd.tools.tuned_import.values import (
    Evaluator,
    Func,
    Node,
    Text,
    Tr,
    Var,
    concat,
    parse_value,
    var_names,
)

# TuneD's CPU-list functions whose result is the CPUs they are given (in another
# notation): latencyd's CPU-list expression of their argument.
CPU_IDENTITY = frozenset(
    {"cpulist_unpack", "cpulist_pack", "cpulist_online", "cpulist_present", "cpulist2hex"}
    | {"hex2cpulist", "cpulist2devs"}
)
# ...and those giving every other CPU: `all - (...)`.
CPU_INVERT = frozenset({"cpulist_invert", "cpulist2hex_invert"})
# Evaluated on this machine: what they give depends on it, or on values known only here.
EVALUATED = frozenset(
    {"calc_isolated_cores", "virt_check", "cpuinfo_check", "regex_search_ternary", "strip"}
    | {"kb2s", "s2kb", "check_net_queue_count"}
)


class Variables:
    """A merged profile's [variables]: TuneD's eager values (for what must be evaluated)
    and their latencyd translations (late-bound, like TuneD's own use in settings)."""

    def __init__(
        self,
        unit: Unit | None,
        files: Mapping[str, str | None],
        host: Host,
    ) -> None:
        self.host = host
        # (name, raw value, nodes, source key in [variables], profile path)
        self.defs: list[tuple[str, str, tuple[Node, ...], str, str]] = []
        self.problems: list[Finding] = []
        if unit is not None:
            for key, raw in unit.options.items():
                origin = unit.origin.get(key, unit.profile)
                if key == "include":
                    path = os.path.normpath(raw)
                    text = files.get(path)
                    if text is None:
                        self.problems.append(
                            Finding(
                                "variables",
                                "include",
                                f"variables file {path} cannot be read: its variables "
                                "are missing (TuneD logs an error and goes on)",
                                path=origin,
                            )
                        )
                        continue
                    for name, value in parse_variables_file(text):
                        self.defs.append((name, value, parse_value(value), "include", origin))
                elif re.fullmatch(r"\w+", key):
                    self.defs.append((key, raw, parse_value(raw), key, origin))
        self.env: dict[str, str | None] = {}
        for name, _raw, nodes, _key, _origin in self.defs:
            self.env[name] = Evaluator(self.env, host).eval(nodes).text
        self.final: dict[str, tuple[str, tuple[Node, ...], str, str]] = {}
        for name, raw, nodes, key, origin in self.defs:
            if nodes == (Var(name),):
                continue  # TuneD's "x = ${x}" idiom keeps x's place; latencyd binds late anyway
            self.final[name] = (raw, nodes, key, origin)
        self._memo: dict[str, Tr] = {}
        self._busy: set[str] = set()

    def evaluate(self, nodes: Sequence[Node]) -> Tr:
        return Evaluator(self.env, self.host).eval(nodes)

    def evaluate_raw(self, raw: str) -> Tr:
        nodes = parse_value(raw)
        result = self.evaluate(nodes)
        used = sorted({n.name for n in nodes if isinstance(n, Var)})
        if used and result.text is not None:
            result = result.plus(
                notes=(f"{raw} resolved with this profile's variables when converted",)
            )
        return result

    def var(self, name: str) -> Tr:
        """A variable's latencyd value."""
        if name in self._memo:
            return self._memo[name]
        if name not in self.final:
            return Tr(None, f"variable ${{{name}}} is not defined (TuneD keeps the text)")
        if name in self._busy:
            return Tr(None, f"variable ${{{name}}} refers to itself")
        self._busy.add(name)
        try:
            raw, nodes, _key, _origin = self.final[name]
            result = self.translate(nodes, "text")
            literal = all(isinstance(n, Text) and not n.escaped for n in nodes)
            if literal and re.fullmatch(r"[\s\d,\-^!]*[\^!][\s\d,\-^!]*", raw):
                # TuneD's CPU-list negation ("2-7,^4"), which latencyd writes as "2-7 - 4".
                expr = cpulist_expr(raw)
                if expr:
                    result = Tr(expr, notes=(f"{raw}: TuneD's CPU-list syntax, as latencyd's",))
            if result.text is None:
                result = result.but(None, f"${{{name}}} = {raw}: {result.why}")
        finally:
            self._busy.discard(name)
        self._memo[name] = result
        return result

    def names(self) -> list[str]:
        """Every variable with a definition, in TuneD's order."""
        return [n for n in dict.fromkeys(d[0] for d in self.defs) if n in self.final]

    def definition(self, name: str) -> tuple[str, str, str] | None:
        """(raw value, key in [variables], profile path) of a variable's definition."""
        if name not in self.final:
            return None
        raw, _nodes, key, origin = self.final[name]
        return raw, key, origin

    def translate_raw(self, raw: str, kind: str = "text") -> Tr:
        return self.translate(parse_value(raw), kind)

    def translate(self, nodes: Sequence[Node], kind: str = "text") -> Tr:
        """Into latencyd text. `kind` "cpus" (a CPU-list expression) or "mask" (a hex mask
        where TuneD wrote one) converts literal CPU lists too."""
        if kind != "text" and len(nodes) > 1 and any(isinstance(n, Text) for n in nodes):
            return self._cpu_items(nodes, kind)
        parts = []
        for node in nodes:
            if isinstance(node, Text):
                if node.escaped:
                    parts.append(
                        Tr(None, f"{node.text!r} is TuneD's escaped literal; latencyd has none")
                    )
                elif kind == "text":
                    parts.append(Tr(node.text))
                else:
                    expr = cpulist_expr(node.text, mask=kind == "mask")
                    what = "hex CPU mask" if kind == "mask" else "CPU list"
                    parts.append(Tr(expr) if expr else Tr(None, f"{node.text!r} is not a {what}"))
            elif isinstance(node, Var):
                parts.append(self._ref(node.name, kind))
            else:
                parts.append(self._func(node, kind))
        return concat(parts)

    def _ref(self, name: str, kind: str) -> Tr:
        value = self.var(name)
        if value.text is None:
            return value.but(None)
        if kind == "mask" and self.final.get(name) is not None:
            raw, nodes, _key, _origin = self.final[name]
            if all(isinstance(n, Text) for n in nodes):  # a literal mask: latencyd needs 0x
                expr = cpulist_expr(raw, mask=True)
                if expr:
                    return Tr(
                        expr, notes=(f"${{{name}}} = {raw} is a hex mask: written as {expr}",)
                    )
        return Tr("${" + name + "}")

    def _cpu_items(self, nodes: Sequence[Node], kind: str) -> Tr:
        """A CPU list mixing text and references ("1,${x}"): a union of its items."""
        items: list[list[Node]] = [[]]
        for node in nodes:
            if isinstance(node, Text) and not node.escaped:
                pieces = node.text.split(",")
                for j, piece in enumerate(pieces):
                    if j:
                        items.append([])
                    if piece.strip():
                        items[-1].append(Text(piece))
            else:
                items[-1].append(node)
        terms: list[Tr] = []
        negative: list[str] = []
        for item in (i for i in items if i):
            if len(item) == 1 and isinstance(item[0], Text):
                text = item[0].text.strip()
                if text[:1] in "^!":
                    negative.append(text[1:])
                    continue
                expr = cpulist_expr(text, mask=kind == "mask")
                terms.append(Tr(expr) if expr else Tr(None, f"{text!r} is not a CPU list"))
            elif len(item) == 1:
                t = self.translate(item, kind)
                terms.append(t.but(f"({t.text})") if t.text is not None else t)
            else:
                return Tr(None, "a CPU list mixing text and variables inside one item")
        out = terms[0] if terms else Tr("none")
        for t in terms[1:]:
            out = out + Tr(" | ") + t
        if negative and out.text is not None:
            if not all(re.fullmatch(r"\d+(-\d+)?", n) for n in negative):
                return Tr(None, "negated CPUs must be numbers or ranges")
            out = out.but(f"({out.text}) - ({','.join(negative)})")
        return out

    def _func(self, node: Func, kind: str) -> Tr:
        name = node.name
        if name in CPU_IDENTITY or name in CPU_INVERT:
            arg_kind = "mask" if name == "hex2cpulist" else "cpus"
            args = [self.translate(a, arg_kind) for a in node.args]
            bad = [a for a in args if a.text is None]
            if bad:
                return bad[0]
            texts = [a.text for a in args if a.text]
            inner = texts[0] if len(texts) == 1 else " | ".join(f"({t})" for t in texts)
            merged = concat(a.but("") for a in args)
            if name in CPU_INVERT:
                return merged + Tr(f"all - ({inner or 'none'})")
            return merged + Tr(inner or "none")
        if name in EVALUATED:
            result = self.evaluate((node,))
            used = sorted(var_names(node))
            if result.text is not None and used and name not in ("strip",):
                result = result.plus(
                    notes=(
                        f"{node.raw} evaluated when converted (from "
                        f"{', '.join('${' + u + '}' for u in used)})",
                    )
                )
            if result.text is not None and name == "strip" and used:
                args = [self.translate(a, kind) for a in node.args]
                return concat(args)
            if result.text is not None and kind != "text":
                expr = cpulist_expr(result.text, mask=kind == "mask")
                return (
                    result.but(expr, f"{result.text!r} is not a CPU list")
                    if expr
                    else result.but(None)
                )
            return result
        return self.evaluate((node,))
