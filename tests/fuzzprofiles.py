"""Mutations of profiles for fuzzing the loader (the test suite and bench/loader.py)."""

from __future__ import annotations

import random

SNIPPETS = [
    "[", "]", "{", "}", "[[", "]]", '"', "'", '"""', "=", ".", ",", "\n", "#", "${", "}",
    "${isolated_cores}", "${nope}", "[main]\n", "[variables]\n", "[[kthread.rule]]\n",
    "[[cstate.cpus]]\n", "[irq]\n", "[sysctl]\n", "[writeback]\n", 'include = ["x"]\n',
    'cpus = "all"\n', 'cpus = "0-99999999"\n', 'match = "("\n', "dirty_ratio = 500\n",
    "\x00", "\udcff", "é", "0x", "~", "-", "1e999", "-0", "inf", "true", "[]", "{}",
    'isolate = "' + "(" * 40 + '"\n', "a.b.c.d.e = 1\n", 'x = """\n', "\t", "\r\n",
    # Numbers int() and float() take or refuse where TOML and the kernel do not.
    "1" * 4400, "0x" + "f" * 40, "9" * 400 + "T", "\u0661", "\uff11", "0-8191:3",
]  # fmt: skip


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        pos = rng.randint(0, len(text))
        op = rng.random()
        if op < 0.4:
            text = text[:pos] + rng.choice(SNIPPETS) + text[pos:]
        elif op < 0.6:
            text = text[:pos] + text[pos + rng.randint(1, 8) :]
        elif op < 0.8:
            lines = text.splitlines(keepends=True)
            if lines:
                line = rng.choice(lines)
                text = text[:pos] + line * rng.randint(1, 3) + text[pos:]
        else:
            text = text[:pos] + chr(rng.randint(1, 0x2FF)) + text[pos:]
    return text
