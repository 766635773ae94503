"""latencyctl's command line: the argparse parser, and nothing it runs.

It stands alone so that what reads it (latencyd.tools.cli runs it; latencyd.tools.manpages
renders it as latencyctl(8) and the shell completions) depends on it, never the other way:
each subcommand names its handler by `handler` in its defaults, the key of its entry in
latencyd.tools.cli.HANDLERS.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# What each exit status means (cli.py returns them; the epilog and latencyctl(8) list them).
EXIT_CODES = {
    0: "ok",
    1: "drift, apply failed, or plan: something would change",
    2: "usage or bad profile",
    3: "daemon unreachable",
    4: "permission denied",
    5: "verify: as the profile wants, but part of it takes effect at the next boot",
}
MAN_PAGES = ("latencyctl", "latencyd", "latencyd.profile")  # latencyd.tools.manpages.PAGES


CPUS_HELP = (
    "the hold's own CPUs (a list: 1,3-4): the profile's isolated_cores, or which of its "
    "shielded CPUs; holds on other CPUs compose, each command on its own"
)
# The help of the argument that is a command to run (hold, run): parse() finds it by it.
COMMAND_HELP = "-- command and arguments"


def _cookie(text: str) -> int:
    value = int(text)
    if not 0 < value < 1 << 32:
        raise ValueError(text)
    return value


def _priority(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 99:
        raise ValueError(text)
    return value


def parser() -> argparse.ArgumentParser:
    codes = ", ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items())
    p = argparse.ArgumentParser(
        prog="latencyctl", description="Control latencyd.", epilog=f"Exit codes: {codes}."
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_)
        sp.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
        )
        sp.set_defaults(handler=name)
        return sp

    add("list", "list profiles (invalid ones with their error)")
    add("active", "print the active profile")
    switch = add("switch", "apply a profile (incrementally)")
    switch.add_argument("profile")
    switch.add_argument(
        "--dry-run",
        action="store_true",
        help="change nothing: show what the switch would do (as plan; exit 1 if it would "
        "change anything)",
    )
    add(
        "plan",
        "what switching to a profile would change now, setting by setting (now -> would be, "
        "unchanged, not applicable and why; what a reboot would need); nothing is written. "
        "Exit 0: nothing would change, 1: something would",
    ).add_argument("profile")
    hold = add(
        "hold",
        "hold a profile while a command runs: hold PROFILE -- CMD ARGS "
        "(without a command: until Ctrl-C)",
    )
    hold.add_argument("profile")
    hold.add_argument("--reason", help="shown in status (default: the command line)")
    hold.add_argument("--cpus", help=CPUS_HELP)
    hold.add_argument("command", nargs=argparse.REMAINDER, help=COMMAND_HELP)
    run = add(
        "run",
        "start a command on the shielded CPUs, holding a profile while it runs: "
        "run [--profile P] [--cpus LIST] [--fifo N | --rr N] -- CMD ARGS",
    )
    run.add_argument("--profile", help="the profile to hold (default: the active one)")
    run.add_argument("--cpus", help=CPUS_HELP)
    policy = run.add_mutually_exclusive_group()
    policy.add_argument("--fifo", type=_priority, metavar="N", help="SCHED_FIFO at priority N")
    policy.add_argument("--rr", type=_priority, metavar="N", help="SCHED_RR at priority N")
    run.add_argument("--reason", help="shown in status (default: the command line)")
    run.add_argument("command", nargs=argparse.REMAINDER, help=COMMAND_HELP)
    release = add("release", "end a hold by its cookie")
    release.add_argument("cookie", type=_cookie)
    add("off", "restore every original value (also ends every hold)")
    add("reload", "re-read profile files; re-apply the active one if it changed")
    add("verify", "check the kernel still matches the profile (exit 1 on drift)")
    add("status", "what each plugin applied, refused and measured")
    top = add("top", "what interrupts the watched CPUs ([monitor]), live like top")
    top.add_argument("--once", action="store_true", help="print one view and exit")
    ex = add(
        "explain",
        "show a profile's merged settings and where each came from (works without the daemon)",
    )
    ex.add_argument("profile", help="profile name or path to a .toml file")
    add("plugins", "list plugins and every option they take (no daemon needed)")
    tuned = add(
        "import-tuned",
        "convert a TuneD profile and those it includes to latencyd profiles, listing what "
        "cannot be converted (exit 1: partly converted)",
    )
    tuned.add_argument(
        "tuned_profile",
        metavar="NAME|DIR|FILE",
        help="a TuneD profile name (looked up as TuneD does), its directory or its tuned.conf",
    )
    tuned.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("."),
        metavar="DIR",
        help="write NAME.toml files here (default: the current directory)",
    )
    tuned.add_argument(
        "--tuned-dir",
        type=Path,
        action="append",
        default=[],
        help="look for TuneD profiles here before /etc/tuned and /usr/lib/tuned (repeatable)",
    )
    m = add(
        "measure",
        "measure latency with cyclictest, sockperf and oslat, per profile, alternating "
        "profiles in rounds; puts back the profile that was in force",
    )
    m.add_argument("--profile", help="the first scenario (default: current, nothing switched)")
    m.add_argument(
        "--vs",
        action="append",
        default=[],
        metavar="SCENARIO",
        help='more scenarios: a profile, "untuned", "current" or "tuned:NAME" (repeatable)',
    )
    m.add_argument("--cpus", help="application CPUs measured (default: the last CPU)")
    m.add_argument(
        "--seconds",
        type=float,
        default=None,
        dest="seconds_given",
        help="per tool and round (10; with --attribute: what fits --budget)",
    )
    m.add_argument(
        "--rounds", type=int, default=None, help="rounds of all scenarios (4; --attribute: 3)"
    )
    m.add_argument(
        "--idle-seconds",
        type=float,
        default=None,
        help="per scenario and round, first measure how much of the time the measured CPUs "
        "stay awake (running or polling) with no traffic (0; with --attribute: 1)",
    )
    m.add_argument(
        "--tools", help="sockperf,cyclictest,oslat (default: those, oslat where installed)"
    )
    load = m.add_mutually_exclusive_group()
    load.add_argument(
        "--load",
        action="store_true",
        help="stress-ng, a CPU hog per CPU, unpinned (as from a shell)",
    )
    load.add_argument("--load-cmd", metavar="CMD", help="run CMD (sh -c) as the load")
    m.add_argument(
        "--tuned-etc",
        type=Path,
        default=Path("/etc/tuned"),
        metavar="DIR",
        help='the TuneD configuration "tuned:NAME" scenarios read (TuneD gets a private '
        "copy either way: it never writes the machine's /etc/tuned)",
    )
    m.add_argument(
        "--attribute",
        action="store_true",
        help="what each group of --profile's settings buys: each left out of the profile "
        "and added to untuned, alone",
    )
    m.add_argument(
        "--group",
        action="append",
        default=[],
        metavar="NAME=SECTION[.OPTION],...",
        help="with --attribute: a group of your own (repeatable); the rest are grouped by plugin",
    )
    m.add_argument(
        "--control",
        action="store_true",
        help="with --attribute: add a group known to hurt (a real-time task busy 80 µs of "
        "every 100, moved onto the measured CPUs by a [[shield.rule]]), to see the "
        "measurement catch harm",
    )
    m.add_argument(
        "--budget",
        metavar="DURATION",
        help="with --attribute: the whole run's time (15m); shortens rounds, never drops a group",
    )
    m.add_argument(
        "--profile-dir",
        type=Path,
        action="append",
        default=[],
        help="with --attribute: look for profiles here first (repeatable)",
    )
    m.add_argument("--plot", metavar="FILE.png", help="histograms and tails, log scale")
    m.add_argument("--save", type=Path, metavar="DIR", help="keep the result (JSON, PNG) here")
    m.add_argument("--compare", type=Path, metavar="OLD.json", help="set a saved run beside")
    rec = add(
        "recommend",
        "propose a profile and isolated CPUs for this machine, explaining each choice",
    )
    rec.add_argument(
        "--measure",
        action="store_true",
        help="attribute the proposal here (measure --attribute) and keep only the groups of "
        "settings that measurably help",
    )
    rec.add_argument(
        "--seconds", type=float, help="with --measure: per tool and round (what fits --budget)"
    )
    rec.add_argument("--rounds", type=int, default=3, help="with --measure: rounds (3)")
    rec.add_argument(
        "--budget", metavar="DURATION", help="with --measure: the attribution's time (15m)"
    )

    ex.add_argument(
        "--profile-dir",
        type=Path,
        action="append",
        default=[],
        help="look for profiles here first (repeatable)",
    )
    man = add("man", "print a man page (roff): latencyctl man latencyctl | man -l -")
    man.add_argument("page", nargs="?", default="latencyctl", choices=MAN_PAGES)
    add("completion", "print the shell completion script").add_argument(
        "shell", choices=("bash", "zsh")
    )
    # Hidden (no help): profile, plugin or section.option names for the completion scripts,
    # from the configured search path, without the daemon (see latencyd/tools/manpages.py).
    complete = sub.add_parser("__complete")
    complete.add_argument("kind", choices=("profiles", "plugins", "options"))
    complete.set_defaults(handler="__complete")
    return p


def parse(p: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """latencyctl's arguments as `p` (parser()) reads them; after the first `--`, a command's.

    argparse.REMAINDER after a positional (hold's PROFILE) takes every later word, options
    included, so `hold PROFILE --cpus 1 -- CMD` gave `--cpus 1 --` to CMD: the words
    before `--` are read with the command left out (in any order, as latencyctl's own),
    and those after it are the command's as they are. Only a subcommand that runs a
    command takes any. The parser keeps REMAINDER for help, man page and completions."""
    if "--" not in argv:
        return p.parse_args(argv)
    split = argv.index("--")
    (sub,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    commands = [a for sp in sub.choices.values() for a in sp._actions if a.help == COMMAND_HELP]
    for action in commands:
        action.nargs = "*"
    try:
        args = p.parse_args(argv[:split])
    finally:
        for action in commands:
            action.nargs = argparse.REMAINDER
    if not any(a.help == COMMAND_HELP for a in sub.choices[args.handler]._actions):
        p.error(f"{args.handler} takes no command after --")
    # A command already begun before `--` (`run git log -- path`) keeps its own `--`.
    args.command = args.command + argv[split:] if args.command else argv[split + 1 :]
    return args
