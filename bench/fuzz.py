"""fuzz benchmark: what reads files others may have written keeps its error contract.

--cases mutated inputs each (seeded, so a run is repeatable), every case bounded in time:
- the profile loader: shipped profiles, mutated, loaded (a ProfileError, or a profile);
- the journal decoder and adoption: a fake machine's journal, mutated, loaded and
  adopted (a JournalError at load; adoption never raises);
- the TuneD importer: TuneD's own profiles (or samples where TuneD is not installed),
  mutated, converted (ImportFailed, or files).
Figures: cases, refusals, escapes of the contract (target 0), hangs (target 0), and the
slowest case.

    python -m bench fuzz [--cases 10000] [--seconds-per-case 5] [--json] [--quick]

Pure: nothing of the real machine is touched (fake roots, temporary directories).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from bench import arguments
from latencyd.core.engine import Engine, section_schemas
from latencyd.core.journal import JOURNAL_FILE, Journal
from latencyd.core.plugin import discover
from latencyd.core.profile import ProfileLibrary
from latencyd.errors import LatencydError
from latencyd.kernel.system import System
from latencyd.paths import shipped_profiles_dir
from latencyd.tools import tuned_import as ti
from tests.fuzzjournal import applied_journal, plugins_on
from tests.fuzzprofiles import mutate
from tests.unit.fakesys import make_fake_machine

TUNED_SAMPLES = {
    "latency": "[main]\nsummary=s\n[cpu]\nforce_latency=1\ngovernor=performance\n"
    "[sysctl]\nvm.swappiness=10\nkernel.timer_migration=0\n",
    "partition": "[main]\ninclude=latency\n[variables]\nisolated_cores=1\n"
    "[bootloader]\ncmdline=nohz_full=${isolated_cores}\n[scheduler]\n"
    "isolated_cores=${isolated_cores}\n[irqbalance]\nbanned_cpus=${isolated_cores}\n",
}
JOURNAL_SNIPPETS = ["[" * 5000, "{" * 5000, '"', "\n", "null", "1e999", '"..\\/"']


class Hang(Exception):
    pass


@dataclass
class Tally:
    cases: int = 0
    refused: int = 0
    escapes: list[str] = field(default_factory=list)
    hangs: int = 0
    slowest_s: float = 0.0


@contextlib.contextmanager
def time_bound(seconds: float) -> Iterator[None]:
    def expired(_signum: int, _frame: FrameType | None) -> None:
        raise Hang

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def judge(tally: Tally, case: Callable[[], object], allowed: tuple[type[BaseException], ...],
          seconds: float) -> None:  # fmt: skip
    tally.cases += 1
    started = time.perf_counter()
    try:
        with time_bound(seconds):
            case()
    except Hang:
        tally.hangs += 1
    except allowed:
        tally.refused += 1
    except Exception as exc:  # the contract escaped: what the suite must show as a bug
        tally.escapes.append(f"{type(exc).__name__}: {exc}"[:200])
    tally.slowest_s = max(tally.slowest_s, time.perf_counter() - started)


def fuzz_loader(cases: int, seconds: float, rng: random.Random, tmp: Path) -> Tally:
    system = make_fake_machine(tmp / "machine")
    schemas = section_schemas({n: c(system) for n, c in discover().items()})
    shipped = sorted(shipped_profiles_dir().glob("*.toml"))
    texts = {p.stem: p.read_text() for p in shipped}
    tally = Tally()
    for i in range(cases):
        name = rng.choice(sorted(texts))
        where = tmp / "profiles" / str(i)
        where.mkdir(parents=True)
        (where / f"{name}.toml").write_text(mutate(texts[name], rng), errors="surrogatepass")
        library = ProfileLibrary([where, shipped_profiles_dir()], schemas, system.machine())
        judge(tally, lambda: library.load(name), (LatencydError,), seconds)  # noqa: B023
    return tally


def fuzz_journal(cases: int, seconds: float, rng: random.Random, tmp: Path) -> Tally:
    system, _, _, text = applied_journal(tmp / "machine")
    plugins = plugins_on(system)
    tally = Tally()
    for i in range(cases):
        state = tmp / "journals" / str(i)
        state.mkdir(parents=True, mode=0o700)
        mutated = mutate(text, rng)
        if rng.random() < 0.2:
            at = rng.randint(0, len(mutated))
            mutated = mutated[:at] + rng.choice(JOURNAL_SNIPPETS) + mutated[at:]
        (state / JOURNAL_FILE).write_text(mutated, errors="surrogatepass")

        def case(state: Path = state) -> None:
            journal = Journal(state)
            try:
                with contextlib.suppress(LatencydError):
                    journal.load()  # a JournalError: the daemon sets it aside
                Engine(plugins, Journal(state)).adopt()  # never raises
            finally:
                journal.close()

        judge(tally, case, (), seconds)
    del system
    return tally


def tuned_texts() -> dict[str, str]:
    found = {p.parent.name: p.read_text() for p in Path("/usr/lib/tuned").glob("*/tuned.conf")}
    return found or TUNED_SAMPLES


def fuzz_importer(cases: int, seconds: float, rng: random.Random, tmp: Path) -> Tally:
    texts = tuned_texts()
    host = ti.read_host(System("/"))
    tally = Tally()
    for i in range(cases):
        tuned = tmp / "tuned" / str(i)
        for name, text in texts.items():  # the others as they are: includes resolve
            (tuned / name).mkdir(parents=True)
            (tuned / name / "tuned.conf").write_text(text)
        name = rng.choice(sorted(texts))
        (tuned / name / "tuned.conf").write_text(mutate(texts[name], rng), errors="surrogatepass")

        def case(name: str = name, tuned: Path = tuned) -> None:
            ti.import_tuned(name, tmp / "out", dirs=[tuned], host=host, write=False)

        judge(tally, case, (ti.ImportFailed, LatencydError), seconds)
    return tally


def main(argv: list[str]) -> int:
    parser = arguments("fuzz", __doc__, "300 cases each")
    parser.add_argument("--cases", type=int, default=10000)
    parser.add_argument("--seconds-per-case", type=float, default=5.0)
    args = parser.parse_args(argv)
    cases = 300 if args.quick else args.cases
    logging.disable(logging.CRITICAL)  # adoption says what it set aside: 10,000 times here
    out: dict[str, Any] = {}
    for name, fuzz in (("loader", fuzz_loader), ("journal", fuzz_journal),
                       ("importer", fuzz_importer)):  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            tally = fuzz(cases, args.seconds_per_case, random.Random(name), Path(tmp))
            out[name] = {
                "cases": tally.cases,
                "refused": tally.refused,
                "escapes": len(tally.escapes),
                "first_escapes": tally.escapes[:3],
                "hangs": tally.hangs,
                "slowest_s": round(tally.slowest_s, 3),
                "seconds": round(time.perf_counter() - started, 1),
            }
    if args.json:
        print(json.dumps(out))
        return 0
    for name, r in out.items():
        marks = "PASS" if r["escapes"] == 0 and r["hangs"] == 0 else "MISS"
        print(f"fuzz {name}: {r['cases']} cases, {r['refused']} refused, {r['escapes']} escapes, "
              f"{r['hangs']} hangs (target 0 and 0: {marks}); slowest case {r['slowest_s']} s, "
              f"{r['seconds']} s in all")  # fmt: skip
        for escape in r["first_escapes"]:
            print(f"    {escape}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
