"""loader benchmark: hostile profiles are refused in bounded time and memory.

For each hostile profile an outside test built (a 1,000-file include chain, arrays
nested 3,000 deep, a 3,000-variable chain, doubling variables, a huge CPU range, a
3,000-entry rule list, names of 10 kB and 1 MB, a file of 1 MB) it prints the time and
the peak memory (tracemalloc) of loading it, and the error's first words. Then the cost
per KB of large hostile profiles that look valid, at three sizes (CPU expressions of
hundreds of overlapping ranges, written out or through one variable used by every rule):
a flat figure is a cost linear in the file's size. Then what ListProfiles costs over the
shipped profiles and three large ones: its first answer, the next (nothing changed) and
one after a profile changed. Then it loads --cases seeded mutations of the shipped
profiles and counts the outcomes.

    python -m bench loader [--cases 10000] [--seed N] [--json] [--quick]

Goals: every case <= 1 s and <= 50 MB; every refusal says `file:line: what is wrong`;
the cost per KB flat as a file grows to the 256 KiB limit.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import arguments
from latencyd.core.engine import section_schemas
from latencyd.core.plugin import load_plugins
from latencyd.core.profile import ProfileLibrary
from latencyd.cpuset import CpuSet
from latencyd.errors import ProfileError
from latencyd.kernel.system import Machine, System
from latencyd.paths import shipped_profiles_dir
from tests.fuzzprofiles import mutate


def hostile(pdir: Path) -> dict[str, Callable[[], str]]:
    """name -> a function that writes the case's files and returns the name to load."""

    def files(contents: dict[str, str], load: str) -> Callable[[], str]:
        def write() -> str:
            for name, text in contents.items():
                (pdir / f"{name}.toml").write_text(text)
            return load

        return write

    chain = {f"c{i}": f'[main]\ninclude = ["c{i + 1}"]\n' for i in range(999)} | {"c999": ""}
    doubling = "[variables]\n" + "".join(
        f'v{i} = "${{v{i + 1}}}${{v{i + 1}}}"\n' for i in range(40)
    )
    return {
        "1,000-file include chain": files(chain, "c0"),
        "array nested 3,000 deep": files(
            {"deep": '[sysctl]\n"vm.x" = ' + "[" * 3000 + "]" * 3000 + "\n"}, "deep"
        ),
        "3,000-variable chain": files(
            {
                "vars": "[variables]\n"
                + "".join(f'v{i} = "${{v{i + 1}}}"\n' for i in range(3000))
                + 'v3000 = "1"\n'
            },
            "vars",
        ),
        "variables doubling 40 levels": files({"double": doubling + 'v40 = "x"\n'}, "double"),
        'isolate = "0-200000000"': files({"range": '[irq]\nisolate = "0-200000000"\n'}, "range"),
        "3,000-entry rule list": files(
            {"rules": '[[kthread.rule]]\nmatch = "x"\ncpus = "0"\n' * 3000}, "rules"
        ),
        "10 kB include name": files({"inc": '[main]\ninclude = ["' + "x" * 10_000 + '"]\n'}, "inc"),
        "1 MB profile name": lambda: "p" * (1 << 20),
        "1 MB file": files({"big": "#" * (1 << 20)}, "big"),
    }


# Sizes of the large profiles, in KiB: up to just below the 256 KiB limit.
SIZES_KB = (64, 128, 240)
WIDE = ",".join(["0-8191"] * 580)  # 4 KB of ranges that each cover every CPU there can be


# Arrays of tables whose entries name CPUs (1,024 entries each at most, the limit).
ARRAYS = ("kthread.rule", "irq.rule", "cstate.cpus", "cpu.cpus")


def rules(kb: int, cpus: Callable[[int], str], head: str = "") -> str:
    """A profile of about `kb` KiB: after `head`, entries of ARRAYS whose CPUs are `cpus(i)`."""
    out, size, i = [head], len(head), 0
    while size < kb * 1024:
        array = ARRAYS[i // 1024]
        match = f'match = "r{i}"\n' if array.endswith(".rule") else ""
        entry = f'[[{array}]]\n{match}cpus = "{cpus(i)}"\n'
        out.append(entry)
        size += len(entry)
        i += 1
    return "".join(out)


def large(kb: int) -> dict[str, str]:
    """name -> a hostile profile of about `kb` KiB that looks valid (CPUs 0-3 online), each
    CPU list unlike any other (none is parsed once for several rules, or several sizes)."""
    return {
        "written out": rules(kb, lambda i: f"all & ({WIDE},{kb}-{kb + i})"),
        "through one variable": rules(
            kb,
            lambda i: f"all & (${{wide}},{kb}-{kb + i}) | none",
            f'[variables]\nwide = "{WIDE}"\n',
        ),
    }


def listing(pdir: Path, library: ProfileLibrary) -> dict[str, float]:
    """Seconds of ListProfiles (library.all()) over the shipped profiles and the large
    ones written out: first, again with nothing changed, and after one profile changed."""
    pdir.mkdir()
    for path in shipped_profiles_dir().glob("*.toml"):
        (pdir / path.name).write_text(path.read_text())
    for kb in SIZES_KB:
        (pdir / f"large-{kb}.toml").write_text(large(kb)["written out"])
    listed = ProfileLibrary([pdir], library.schemas, library.machine)
    seconds = {}
    for when in ("first", "unchanged", "one changed"):
        if when == "one changed":
            with (pdir / "balanced.toml").open("a") as f:
                f.write("# edited\n")
        started = time.perf_counter()
        listed.all()
        seconds[when] = time.perf_counter() - started
    return seconds


def timed(load: Callable[[], Any]) -> tuple[float, str]:
    """Seconds `load` took, and "loaded" or the ProfileError it raised."""
    started = time.perf_counter()
    try:
        load()
        outcome = "loaded"
    except ProfileError as exc:
        outcome = str(exc)
    return time.perf_counter() - started, outcome


def measure(load: Callable[[], Any]) -> tuple[float, int, str]:
    """timed(load), and its peak memory (tracemalloc: it slows what allocates much)."""
    tracemalloc.start()
    seconds, outcome = timed(load)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return seconds, peak, outcome


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="latencyd-loader-") as tmp:
        pdir = Path(tmp)
        system = System("/")
        library = ProfileLibrary(
            [pdir], section_schemas(load_plugins(system)), Machine(CpuSet.from_list("0-3"), 8 << 30)
        )
        cases = []
        for name, prepare in hostile(pdir).items():
            ref = prepare()

            def load(ref: str = ref) -> Any:
                return library.load(ref)

            seconds, peak, outcome = measure(load)
            cases.append({"case": name, "seconds": seconds, "peak_bytes": peak, "outcome": outcome})
        per_kb = []
        for kb in SIZES_KB[:1] if args.quick else SIZES_KB:
            for name, text in large(kb).items():
                (pdir / "large.toml").write_text(text)
                seconds, outcome = timed(lambda: library.load("large"))  # not traced: see measure
                size = len(text.encode()) / 1024
                per_kb.append(
                    {
                        "case": name,
                        "kib": size,
                        "seconds": seconds,
                        "ms_per_kib": seconds * 1000 / size,
                        "outcome": outcome,
                    }
                )
        listed = listing(pdir / "listed", library)
        rng = random.Random(args.seed)
        seeds = {p.stem: p.read_text() for p in shipped_profiles_dir().glob("*.toml")}
        for name, text in seeds.items():
            (pdir / f"{name}.toml").write_text(text)
        outcomes = {
            "loaded": 0,
            "refused with file:line": 0,
            "refused without a line": 0,
            "other exception": 0,
        }
        slowest = 0.0
        peak_max = 0
        fuzz = pdir / "fuzz.toml"
        for _ in range(args.cases):
            fuzz.write_text(mutate(rng.choice(list(seeds.values())), rng), errors="surrogateescape")
            tracemalloc.start()
            started = time.perf_counter()
            try:
                library.load("fuzz")
                outcomes["loaded"] += 1
            except ProfileError as exc:
                key = (
                    "with file:line"
                    if re.match(r"/\S+\.toml:\d+: ", str(exc))
                    else "without a line"
                )
                outcomes[f"refused {key}"] += 1
            except Exception:
                outcomes["other exception"] += 1
            slowest = max(slowest, time.perf_counter() - started)
            peak_max = max(peak_max, tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
    return {
        "benchmark": "loader",
        "hostile": cases,
        "per_kib": per_kb,
        "list_profiles_seconds": listed,
        "fuzz": {
            "cases": args.cases,
            "seed": args.seed,
            "outcomes": outcomes,
            "slowest_seconds": slowest,
            "peak_bytes_max": peak_max,
        },
    }


def report(r: dict[str, Any]) -> None:
    print("hostile profiles (goal: refused with file:line, <= 1 s, <= 50 MB each)")
    for c in r["hostile"]:
        ok = c["seconds"] <= 1 and c["peak_bytes"] <= 50 << 20
        print(
            f"  {c['case']:30} {c['seconds'] * 1000:8.1f} ms {c['peak_bytes'] / 2**20:7.2f} MiB"
            f"  [{'PASS' if ok else 'MISS'}]  {c['outcome'][-90:]}"
        )
    print("large hostile profiles that look valid (goal: ms per KiB flat as the file grows)")
    for c in r["per_kib"]:
        outcome = re.sub(r"^/.*?:(\d+): ", r"line \1: ", c["outcome"])  # the file is large.toml
        print(
            f"  {c['case']:22} {c['kib']:5.0f} KiB {c['seconds'] * 1000:9.1f} ms "
            f"{c['ms_per_kib']:8.2f} ms/KiB  {outcome}"
        )
    listed = ", ".join(
        f"{when} {s * 1000:.1f} ms" for when, s in r["list_profiles_seconds"].items()
    )
    print(f"ListProfiles over the shipped profiles and the large ones: {listed}")
    f = r["fuzz"]
    print(f"fuzz: {f['cases']} mutations of the shipped profiles (seed {f['seed']})")
    for outcome, count in f["outcomes"].items():
        print(f"  {outcome:26} {count}")
    print(
        f"  slowest case {f['slowest_seconds'] * 1000:.1f} ms, "
        f"largest peak {f['peak_bytes_max'] / 2**20:.2f} MiB"
    )


def main(argv: list[str]) -> int:
    parser = arguments("loader", __doc__, quick="300 fuzz cases")
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=20261123)
    args = parser.parse_args(argv)
    if args.quick:
        args.cases = 300
    result = run(args)
    if args.json:
        print(json.dumps(result))
    else:
        report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
