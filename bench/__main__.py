"""Dispatch: ``python -m bench [NAME] [options]``.

``python -m bench daemon --runs 20 --idle-seconds 60`` runs one benchmark with its own
options; ``python -m bench [options]`` runs every registered benchmark in turn, passing the
same options to each (so use only options they all accept: ``--json``, ``--quick``).
``--quick`` runs each one briefly, to show it still runs (the suite does this); its
figures are rough.

A benchmark is a module with ``main(argv: list[str]) -> int``; register it in BENCHMARKS.
Modules are imported only when run, so one that cannot import does not stop the others.
One that needs what not every machine has (a VM image) names it in RUNS_ONLY_WITH: the
run of all of them skips it, saying why, where that is missing; named, it runs (and says
what is missing itself).
Exit status: 0 when every benchmark ran (missed targets do not count: benchmarks report,
they do not judge), otherwise the first non-zero status.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

# name -> module whose main(argv) runs it
BENCHMARKS: dict[str, str] = {
    "daemon": "bench.daemon",
    "kthread": "bench.kthread",
    "shield": "bench.shield",
    "drift": "bench.drift",
    "loader": "bench.loader",
    "nic": "bench.nic",
    "latency": "bench.latency",
    "tuned": "bench.tuned",
    "scale": "bench.scale",
    "attribute": "bench.attribute",
    "noise": "bench.noise",
    "tasks": "bench.tasks",
    "verdicts": "bench.verdicts",
    "flood": "bench.flood",
    "fuzz": "bench.fuzz",
    "fleet": "bench.fleet",
    "vm_ticks": "bench.vm_ticks",
}


def _vm_image() -> str | None:
    from tests.qemu import not_built

    return not_built()


# name -> why the run of every benchmark skips it here (None: it runs)
RUNS_ONLY_WITH: dict[str, Callable[[], str | None]] = {
    "vm_ticks": _vm_image,  # boots the VM tier's Debian VM: minutes, the image built once
}

USAGE = """\
usage: python -m bench [NAME] [options]
       python -m bench --list

Runs the named benchmark, or all of them ({names}) when no name is given.
`python -m bench NAME --help` shows a benchmark's options.
"""


def load(name: str) -> Callable[[list[str]], int]:
    module = importlib.import_module(BENCHMARKS[name])
    main: Callable[[list[str]], int] = module.main
    return main


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(USAGE.format(names=", ".join(BENCHMARKS)), end="")
        return 0
    if args and args[0] == "--list":
        print("\n".join(BENCHMARKS))
        return 0
    if args and not args[0].startswith("-"):
        name, rest = args[0], args[1:]
        if name not in BENCHMARKS:
            print(
                f"bench: unknown benchmark {name!r} (known: {', '.join(BENCHMARKS)})",
                file=sys.stderr,
            )
            return 2
        return load(name)(rest)

    status = 0
    for name in BENCHMARKS:
        missing = RUNS_ONLY_WITH.get(name, lambda: None)()
        if missing is not None:
            print(f"bench: {name}: skipped: {missing}", file=sys.stderr)
            continue
        try:
            code = load(name)(list(args))
        except Exception as exc:  # report and go on with the other benchmarks
            print(f"bench: {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 1
        status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main())
