"""latencyctl: drive latencyd over D-Bus, and explain profiles without it.

Exit codes: 0 ok, 1 verify found drift (or an apply failed, or a plan would change
something), 2 usage or bad profile, 3 daemon unreachable, 4 permission denied.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # typing costs ~2 ms of every latencyctl call; annotations only need it here
    from collections.abc import Callable
    from typing import Any

    from latencyd.cpuset import CpuSet
    from latencyd.kernel.system import System
    from latencyd.tools.attribute import Attribution, GroupResult
    from latencyd.tools.measure.plan import Plan

from latencyd import BUS_NAME, INTERFACE, OBJECT_PATH
from latencyd.text import printable
from latencyd.tools.cliparser import parse, parser

OK, DRIFT, USAGE, UNREACHABLE, DENIED = 0, 1, 2, 3, 4
PENDING = 5  # verify: as the profile wants, but part of it takes effect at the next boot
WOULD_CHANGE = 1  # plan: the switch would change something (a canary's "not yet")
FAILED = 1  # the daemon tried and the kernel refused: like drift, the machine is not as asked

_UNREACHABLE = {
    "org.freedesktop.DBus.Error.ServiceUnknown",
    "org.freedesktop.DBus.Error.NameHasNoOwner",
    "org.freedesktop.DBus.Error.NoServer",
    "org.freedesktop.DBus.Error.FileNotFound",
    "org.freedesktop.DBus.Error.NoReply",
    "org.freedesktop.DBus.Error.Disconnected",
    "org.freedesktop.DBus.Error.Spawn.ServiceNotFound",
}
_DENIED = {"org.freedesktop.DBus.Error.AccessDenied", "org.latencyd.Error.PermissionDenied"}
_BAD_INPUT = {
    "org.latencyd.Error.BadProfile",
    "org.latencyd.Error.NoSuchProfile",
    "org.latencyd.Error.NoSuchHold",
}
# What Status leaves out for a caller who is not root nor in the admin group.
ROOT_AND_ADMINS = "shown to root and the admin group only"


class CliError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _call(method: str, *args: Any, timeout: float = 120.0) -> Any:
    import dbus

    try:
        bus = dbus.SystemBus()
        proxy = bus.get_object(BUS_NAME, OBJECT_PATH, introspect=False)
        return getattr(proxy, method)(*args, dbus_interface=INTERFACE, timeout=timeout)
    except dbus.DBusException as exc:
        name = exc.get_dbus_name() or ""
        message = exc.get_dbus_message() or str(exc)
        if name in _UNREACHABLE:
            raise CliError(
                UNREACHABLE,
                "latencyd is not running or not reachable on the system "
                f"bus ({message}). Start it (systemctl start latencyd) or check "
                "DBUS_SYSTEM_BUS_ADDRESS.",
            ) from exc
        if name in _DENIED:
            raise CliError(DENIED, f"permission denied: {message}") from exc
        if name in _BAD_INPUT:
            raise CliError(USAGE, message) from exc
        raise CliError(FAILED, message) from exc


def _call_showing_progress(method: str, *args: Any) -> Any:
    """A change that may take long (thousands of tasks): on a terminal, once it has run
    for PROGRESS_AFTER_S, a progress bar from the daemon's status until it replies."""
    if not sys.stderr.isatty():
        return _call(method, *args)
    import threading

    ended = threading.Event()
    thread = threading.Thread(target=_show_progress, args=(ended,), daemon=True)
    thread.start()
    try:
        return _call(method, *args)
    finally:
        ended.set()
        thread.join(1.0)


PROGRESS_AFTER_S = 1.0


def _show_progress(ended: Any) -> None:
    """Polls Status on a connection of its own (the call waits on the other)."""
    import dbus

    from latencyd.tools.terminal import ProgressBar

    if ended.wait(PROGRESS_AFTER_S):
        return
    bus = dbus.SystemBus(private=True)
    shown = False
    progress_bar = ProgressBar()
    try:
        proxy = bus.get_object(BUS_NAME, OBJECT_PATH, introspect=False)
        while not ended.wait(0.2):
            status = json.loads(str(proxy.Status(dbus_interface=INTERFACE, timeout=5)))
            busy = status.get("in_progress")
            if busy and busy["total"]:
                progress_bar(busy["what"], busy["done"] / busy["total"])
                shown = True
    except dbus.DBusException:
        pass  # the call itself reports what went wrong
    finally:
        if shown:
            sys.stderr.write("\r\033[K")  # the reply's line replaces the bar
        bus.close()


def _emit(args: argparse.Namespace, data: Any, lines: list[str]) -> None:
    """A command's answer on stdout: with --json the data as it is (JSON escapes what
    needs it), else `lines`. Each is written as one printable line (`_text`): what they
    interpolate holds text other users chose (task names, hold reasons)."""
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    elif lines:
        print(_text(lines))


def _text(lines: list[str]) -> str:
    """Lines for the terminal, each escaped as one line (latencyd.text.printable): a
    newline or an escape sequence inside one came from what it interpolates."""
    return "\n".join(map(printable, lines))


def _say(message: str) -> None:
    """A message on stderr, as one printable line (daemon errors quote profile names,
    tasks and paths)."""
    print(printable(message), file=sys.stderr)


# -- commands ------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace) -> int:
    profiles = [
        {"name": str(n), "summary": str(s), "error": str(e) or None}
        for n, s, e in _call("ListProfiles")
    ]
    active = str(_call("ActiveProfile"))
    lines = []
    for p in profiles:
        mark = "*" if p["name"] == active else " "
        desc = f"INVALID: {p['error']}" if p["error"] else p["summary"]
        lines.append(f"{mark} {p['name']:<24} {desc}")
    _emit(args, {"active": active or None, "profiles": profiles}, lines)
    return OK


def cmd_active(args: argparse.Namespace) -> int:
    active = str(_call("ActiveProfile"))
    _emit(args, {"active": active or None}, [active or "none (all settings at their originals)"])
    return OK


def cmd_plan(args: argparse.Namespace) -> int:
    """What a switch would do, nothing written: exit 0 if nothing would change, else 1."""
    plan = json.loads(str(_call_showing_progress("Plan", args.profile)))
    _emit(args, plan, format_plan(plan))
    return OK if plan["would_change"] == 0 else WOULD_CHANGE


def cmd_switch(args: argparse.Namespace) -> int:
    if args.dry_run:
        return cmd_plan(args)
    report = json.loads(str(_call_showing_progress("SwitchProfile", args.profile)))
    if report["held"]:
        held = (
            f"base profile set to {report['base']}; {report['profile']} stays in force "
            "while it is held (latencyctl status lists the holds)"
        )
        _emit(args, report, [held])
        return OK
    lines = [
        f"{report['profile']}: {report['applied']} applied, {report['restored']} restored, "
        f"{report['unchanged']} unchanged in {report['apply_ms']:.1f} ms"
    ]
    lines += [
        f"  not applicable: [{item['plugin']}] {item['setting']}: {item['reason']}"
        for item in report["not_applicable"]
    ]
    _emit(args, report, lines)
    return OK


def cmd_hold(args: argparse.Namespace) -> int:
    """Hold a profile while a command runs (see _held_while)."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    return _held_while(args, args.profile, command, lambda: None, _cpus_arg(args.cpus))


def _cpus_arg(text: str | None) -> str:
    """--cpus as the daemon takes it (HoldAndPlaceOn), checked here first ("": none)."""
    from latencyd.cpuset import CpuSet, CpuSetError

    try:
        return CpuSet.from_list(text).to_list() if text else ""
    except CpuSetError as exc:
        raise CliError(USAGE, f"--cpus {text!r}: {exc}") from exc


def cmd_run(args: argparse.Namespace) -> int:
    """Start a command on the shielded CPUs: a hold on the profile (the active one by
    default) places this process inside the shield (its cpuset, or its CPUs), so the
    command is born there; `--cpus` names the hold's own CPUs (HoldAndPlaceOn: holds on
    other CPUs compose) and `--fifo`/`--rr` give it a real-time policy, set before the
    fork so a refusal is said in words."""
    import os

    from latencyd.cpuset import CpuSet, CpuSetError

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise CliError(USAGE, "run needs a command: latencyctl run [options] -- CMD ARGS")
    try:
        cpus = CpuSet.from_list(args.cpus) if args.cpus else None
    except CpuSetError as exc:
        raise CliError(USAGE, f"--cpus {args.cpus!r}: {exc}") from exc
    profile = args.profile or str(_call("ActiveProfile"))
    if not profile:
        raise CliError(USAGE, "no profile is active: name one with --profile")

    def prepare() -> None:
        """In this process, after the hold placed it: what the command inherits."""
        if cpus is not None:
            try:
                os.sched_setaffinity(0, cpus)
            except OSError as exc:
                raise CliError(
                    USAGE,
                    f"--cpus {cpus}: the kernel refused them ({exc.strerror}): inside a "
                    f"cpuset shield only its CPUs, {CpuSet(os.sched_getaffinity(0))}, are "
                    "allowed (taskset and sched_setaffinity are refused outside it too)",
                ) from exc
        if args.fifo or args.rr:
            policy = os.SCHED_FIFO if args.fifo else os.SCHED_RR
            try:
                os.sched_setscheduler(0, policy, os.sched_param(args.fifo or args.rr))
            except OSError as exc:
                raise CliError(DENIED, f"a real-time policy was refused: {exc.strerror}") from exc

    return _held_while(args, profile, command, prepare, _cpus_arg(args.cpus))


def _held_while(
    args: argparse.Namespace,
    profile: str,
    command: list[str],
    prepare: Callable[[], None],
    cpus: str = "",
) -> int:
    """Hold a profile while a command runs. The hold lives on this process's bus
    connection, so it ends even if latencyctl is killed. The daemon places the holder on
    the shielded CPUs in the same apply (HoldAndPlace), and the command, started after,
    is born there.
    SIGTERM and SIGHUP are passed to the command, and the hold lasts until it has exited:
    a command that undoes its own changes when stopped does so while the profile is still
    held."""
    import os
    import signal
    import subprocess

    reason = args.reason or (" ".join(command) if command else "latencyctl hold")
    if cpus:  # the hold's own CPUs (without a command, latencyctl waits on them)
        cookie = int(_call_showing_progress("HoldAndPlaceOn", profile, reason, cpus))
    else:
        method = "HoldAndPlace" if command else "HoldProfile"
        cookie = int(_call_showing_progress(method, profile, reason))
    if not args.json:
        _say(f"holding {profile} (cookie {cookie})")
    try:
        if not command:  # hold until interrupted
            stop = {signal.SIGINT, signal.SIGTERM}
            signal.pthread_sigmask(signal.SIG_BLOCK, stop)
            signal.sigwait(stop)
            return OK
        prepare()
        try:
            child = subprocess.Popen(command)
        except OSError as exc:
            _say(f"latencyctl: cannot run {command[0]}: {exc.strerror}")
            return 127
        finally:  # the command has its policy; this process waits as any other
            if os.sched_getscheduler(0) != os.SCHED_OTHER:
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

        def forward(signum: int, frame: object) -> None:
            child.send_signal(signum)

        # ^C reaches the command from the terminal itself: it decides; we wait for it.
        # (A handler, not SIG_IGN: an ignored signal would stay ignored in the command.)
        signal.signal(signal.SIGINT, lambda signum, frame: None)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, forward)
        return child.wait()
    finally:
        try:
            import dbus

            _call("ReleaseProfile", dbus.UInt32(cookie))
        except CliError as exc:
            _say(f"latencyctl: releasing hold {cookie}: {exc}")


def cmd_release(args: argparse.Namespace) -> int:
    import dbus

    _call("ReleaseProfile", dbus.UInt32(args.cookie))
    _emit(args, {"released": args.cookie}, [f"hold {args.cookie} released"])
    return OK


def cmd_reload(args: argparse.Namespace) -> int:
    _call("Reload")
    _emit(args, {"reloaded": True}, ["profiles re-read; the active one re-applied if it changed"])
    return OK


def cmd_off(args: argparse.Namespace) -> int:
    _call("Off")
    _emit(args, {"active": None}, ["all settings restored to their original values"])
    return OK


def cmd_verify(args: argparse.Namespace) -> int:
    from latencyd.tools.top import top_view

    drifts = json.loads(str(_call("Verify")))
    status = json.loads(str(_call("Status")))
    pending = status.get("reboot_pending") or []
    lines = [
        f"drift: [{d['plugin']}] {d['setting']}, but it is {d['actual']!r}" for d in drifts
    ] or ["ok: every applied setting matches the profile"]
    lines += [f"reboot pending: [{p['plugin']}] {p['text']}: {p['reason']}" for p in pending]
    data: dict[str, Any] = {"ok": not drifts, "drift": drifts, "reboot_pending": pending}
    view = top_view(status)
    noise = view["cpus"] if view.get("watching") else None
    if noise is not None:  # beside drift: whether the shield's promise held, last interval
        data["noise"] = noise
        lines += [
            f"noise, last interval, CPU {cpu}: {sum(s['total_us'] for s in rows):.0f} µs"
            + (f" (most: {rows[0]['source']} {rows[0]['total_us']:.0f} µs)" if rows else "")
            for cpu, rows in noise.items()
        ]
    _emit(args, data, lines)
    return DRIFT if drifts else PENDING if pending else OK


def cmd_status(args: argparse.Namespace) -> int:
    status = json.loads(str(_call("Status")))
    _emit(args, status, format_status(status))
    return OK


def cmd_top(args: argparse.Namespace) -> int:
    """The watched CPUs' noise, refreshed each interval of the profile's [monitor]."""
    import time

    from latencyd.tools.top import format_top, top_view

    while True:
        view = top_view(json.loads(str(_call("Status"))))
        if args.once or not view.get("watching"):
            _emit(args, view, format_top(view))
            return OK if view.get("watching") else FAILED
        sys.stdout.write("\x1b[H\x1b[2J" + _text(format_top(view)) + "\n")  # ours: home, clear
        sys.stdout.flush()
        interval = view.get("interval_ms")
        time.sleep((interval if isinstance(interval, int) else 1000) / 1000)


def cmd_explain(args: argparse.Namespace) -> int:
    from latencyd.tools.explain import explain

    try:
        data = explain(args.profile, args.profile_dir)
    except Exception as exc:
        from latencyd.errors import LatencydError

        if isinstance(exc, LatencydError):
            raise CliError(USAGE, str(exc)) from exc
        raise
    _emit(args, data, format_explain(data))
    return OK


def cmd_plugins(args: argparse.Namespace) -> int:
    from latencyd.tools.explain import plugin_docs

    docs = plugin_docs()
    _emit(args, docs, format_plugins(docs))
    return OK


def cmd_import_tuned(args: argparse.Namespace) -> int:
    """Convert a TuneD profile and the profiles it includes into latencyd profiles: exit 0
    if everything converted, 1 if some settings did not (listed on stderr and in the
    files), 2 if nothing could be (not a TuneD profile, unreadable, an include cycle)."""
    from latencyd.tools.tuned_import import ImportFailed, import_tuned

    try:
        result = import_tuned(args.tuned_profile, args.output, args.tuned_dir)
    except ImportFailed as exc:
        raise CliError(USAGE, f"import-tuned: {exc}") from exc
    lines = []
    for path, f in result.files:
        lines.append(f"wrote {path} ({'complete' if f.complete else 'partial'}; {f.source})")
        for x in f.findings:
            if x.counted:
                _say(f"{path.name}: not converted: {x.label}: {x.text}")
    for name in result.shadows:
        _say(f"note: {name}.toml {result.SHADOW_NOTE}")
    _emit(args, result.as_json(), lines)
    return result.code


def cmd_man(args: argparse.Namespace) -> int:
    """A man page as roff, from the same source as --help: latencyctl man | man -l -"""
    from latencyd.tools.manpages import page

    sys.stdout.write(page(args.page))
    return OK


def cmd_completion(args: argparse.Namespace) -> int:
    from latencyd.errors import LatencydError
    from latencyd.tools.manpages import completion

    try:
        sys.stdout.write(completion(args.shell))
    except LatencydError as exc:  # no shtab that writes working scripts
        raise CliError(FAILED, str(exc)) from exc
    return OK


def cmd_complete(args: argparse.Namespace) -> int:
    """What the completion scripts ask for on Tab (`latencyctl __complete KIND`, hidden)."""
    from latencyd.tools.manpages import complete_words

    sys.stdout.write("".join(w + "\n" for w in complete_words(args.kind)))
    return OK


def cmd_measure(args: argparse.Namespace) -> int:
    """Run the standard latency tools per scenario, alternating scenarios in rounds."""
    import dbus

    from latencyd.cpuset import CpuSet, CpuSetError
    from latencyd.kernel.system import System
    from latencyd.tools.latency import plot
    from latencyd.tools.measure import MeasureError
    from latencyd.tools.measure.load import cpu_load
    from latencyd.tools.measure.plan import Plan
    from latencyd.tools.measure.report import format_measure
    from latencyd.tools.measure.runner import run as measure
    from latencyd.tools.measure.tools import TOOLS, missing_tools
    from latencyd.tools.terminal import ProgressBar

    system = System("/")
    online = system.online_cpus()
    try:
        app = CpuSet.parse(args.cpus, online) if args.cpus else CpuSet([max(online)])
    except CpuSetError as exc:
        raise CliError(USAGE, f"--cpus: {exc}") from exc
    housekeeping = online - app
    if not app or not housekeeping:
        raise CliError(USAGE, f"need application CPUs and housekeeping CPUs (online: {online})")
    if args.attribute and (not args.profile or args.vs):
        raise CliError(USAGE, "--attribute takes --profile P (and no --vs)")
    if not args.attribute and (args.group or args.control or args.budget):
        raise CliError(USAGE, "--group, --control and --budget go with --attribute")
    scenarios = [args.profile or "current", *args.vs]
    if len(set(scenarios)) != len(scenarios):
        raise CliError(USAGE, f"a scenario is named twice: {' '.join(scenarios)}")
    if args.tools:
        tools = args.tools.split(",")
        unknown = [t for t in tools if t not in TOOLS]
        if unknown:
            raise CliError(USAGE, f"unknown tools {unknown} (known: {', '.join(TOOLS)})")
    elif args.attribute:
        # Not oslat: its samples are loop iterations, millions a second, so its p50 to
        # p99.9 read 1 µs whatever the profile (a CPU hog sharing its CPU included); only
        # its max moves, and max does not count. --tools adds it.
        tools = ["sockperf", "cyclictest"]
    else:  # sockperf and cyclictest, and oslat where it is installed
        tools = ["sockperf", "cyclictest"] + ([] if missing_tools(["oslat"]) else ["oslat"])
    load = None
    if args.load:
        load = cpu_load(len(online))
    elif args.load_cmd:
        load = ["sh", "-c", args.load_cmd]
    # Attribution defaults: 3 rounds (the verdicts' spread needs them, its many scenarios
    # need the time) and 1 s of idle cost per scenario (recommend drops what costs).
    rounds = args.rounds or (3 if args.attribute else 4)
    idle = args.idle_seconds if args.idle_seconds is not None else float(args.attribute)
    plan = Plan(
        scenarios,
        app,
        housekeeping,
        args.seconds_given or 10.0,
        rounds,
        tools,
        load,
        idle,
        args.tuned_etc,
    )
    if not args.json and not args.attribute:
        _say(
            f"measuring {', '.join(scenarios)} on CPUs {app} (housekeeping {housekeeping}): "
            f"{rounds} rounds x {len(tools)} tools x {plan.seconds:g} s, "
            f"about {plan.estimate_s:.0f} s"
        )

    def hold(profile: str) -> int:
        return int(_call("HoldProfile", profile, "latencyctl measure"))

    def release(cookie: int) -> None:
        _call("ReleaseProfile", dbus.UInt32(cookie))

    if args.attribute:
        return _attribute(args, system, plan, hold, release)
    try:
        result = measure(system, plan, hold, release, ProgressBar(),
                         lambda: json.loads(str(_call("Status"))))  # fmt: skip
    except MeasureError as exc:
        raise CliError(FAILED, str(exc)) from exc
    if args.plot:
        plot(result, args.plot)
        result["plot"] = args.plot
    if args.save:
        saved = _save(args.save, "measure", result["started"], result)
        with contextlib.suppress(ImportError):  # the picture too, where matplotlib is
            plot(result, str(saved.with_suffix(".png")))
        result["saved"] = str(saved)
    old = json.loads(args.compare.read_text()) if args.compare else None
    _emit(args, result if old is None else {"new": result, "old": old},
          format_measure(result, old))  # fmt: skip
    return OK


def _attribution(
    system: System,
    profile: str,
    plan: Plan,
    specs: list[str],
    control: bool,
    profile_dirs: list[Path],
    seconds: float | None,
    budget: str | None,
    quiet: bool,
    hold: Callable[[str], int],
    release: Callable[[int], None],
) -> tuple[Attribution, list[GroupResult], dict[str, Any], str]:
    """`profile`'s settings in groups (--group first, the control group where asked for)
    attributed through the daemon (latencyd.tools.attribute_run): (the attribution, the
    groups judged, the measure result, the machine they hold on)."""
    from latencyd.errors import LatencydError
    from latencyd.tools import attribute_run
    from latencyd.tools.explain import library
    from latencyd.tools.measure import MeasureError

    profiles = library(profile_dirs, system)
    try:
        at = attribute_run.attribution_plan(profiles, profile, plan.app_cpus, specs, control)
    except LatencydError as exc:
        raise CliError(USAGE, str(exc)) from exc
    # With --seconds the rounds are as long as asked, and --budget is not read.
    budget_s = parse_duration(budget or "15m", "--budget") if seconds is None else 0.0
    try:
        groups, result, machine = attribute_run.run(
            system, at, plan, seconds, budget_s, hold, release,
            lambda: json.loads(str(_call("Status"))), None if quiet else _say,
        )  # fmt: skip
    except MeasureError as exc:
        raise CliError(FAILED, str(exc)) from exc
    return at, groups, result, machine


def _attribute(
    args: argparse.Namespace,
    system: System,
    plan: Plan,
    hold: Callable[[str], int],
    release: Callable[[int], None],
) -> int:
    """measure --attribute: each group of P's settings, left out of P and added to untuned."""
    from latencyd.tools import attribute

    at, groups, result, machine = _attribution(
        system, args.profile, plan, args.group, args.control, args.profile_dir,
        args.seconds_given, args.budget, args.json, hold, release,
    )  # fmt: skip
    data = {
        "profile": at.profile,
        "machine": machine,
        "rule": attribute.RULE,
        "groups": [g.as_json() for g in groups],
        "measure": result,
    }
    if args.plot:
        attribute.plot(groups, plan.tools, machine, args.plot)
        data["plot"] = args.plot
    if args.save:
        data["saved"] = str(_save(args.save, "attribute", result["started"], data))
    lines = attribute.render(groups, plan.tools, machine)
    lines += [f"saved: {data['saved']}"] if "saved" in data else []
    _emit(args, data, lines)
    return OK


def _save(directory: Path, kind: str, started: str, data: dict[str, Any]) -> Path:
    """A run's JSON kept as DIR/KIND-YYYYMMDDTHHMMSS.json."""
    directory.mkdir(parents=True, exist_ok=True)
    saved = directory / f"{kind}-{started.replace(':', '').replace('-', '')}.json"
    saved.write_text(json.dumps(data, indent=1))
    return saved


def parse_duration(text: str, what: str) -> float:
    """ "900", "900s", "15m", "1h" -> seconds."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*", text)
    if not m or float(m[1]) <= 0:
        raise CliError(USAGE, f"{what}: expected a duration like 900s, 15m or 1h, got {text!r}")
    return float(m[1]) * {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m[2]]


def cmd_recommend(args: argparse.Namespace) -> int:
    """Propose a profile and isolated CPUs for this machine; --measure attributes the
    proposal here and keeps only the groups of settings that measurably help."""
    from latencyd.cpuset import CpuSet
    from latencyd.kernel.system import System
    from latencyd.tools.recommend import read_facts, recommend

    system = System("/")
    facts = read_facts(system)
    rec = recommend(facts)
    data: dict[str, Any] = {}
    verdict: list[str] = []
    profile_file = rec.toml()
    if args.measure:
        from latencyd.tools import attribute

        app = rec.isolated or CpuSet([max(facts.online)])
        at, groups, result, machine = _attribute_recommendation(profile_file, app, facts.online,
                                                                args, system)  # fmt: skip
        kept, dropped = attribute.keep(groups)
        rec = recommend(facts, measured=[f"{r.name}: {attribute.quote(r)}" for r in kept])
        profile_file = attribute.evidence_profile(at, groups, machine) if kept else ""
        data |= {
            "machine": machine,
            "attribution": [g.as_json() for g in groups],
            "kept": [r.name for r in kept],
            "dropped": [{"name": r.name, "why": why} for r, why in dropped],
            "confirmed": bool(kept),
            "measured": result,
        }
        verdict = ["", *attribute.render_kept(groups, result["plan"]["tools"], machine)]
    data = {
        "profile": rec.profile,
        "isolated_cores": rec.isolated.to_list(),
        "reasons": rec.reasons,
        "profile_file": profile_file,
    } | data
    lines = [f"recommended: {rec.profile}"
             + (f" with isolated_cores = {rec.isolated}" if rec.isolated else "")]  # fmt: skip
    lines += [f"  - {r}" for r in rec.reasons]
    if profile_file:
        lines += ["", "as a profile (e.g. /etc/latencyd/profiles/recommended.toml):"]
        lines += profile_file.splitlines()
    _emit(args, data, lines + verdict)
    return OK if not args.measure or data["confirmed"] else FAILED


def _attribute_recommendation(
    profile_text: str, app: CpuSet, online: CpuSet, args: argparse.Namespace, system: System
) -> tuple[Attribution, list[GroupResult], dict[str, Any], str]:
    """`measure --attribute` of the proposal (held from files) on this machine."""
    import tempfile

    import dbus

    from latencyd.tools.measure.plan import Plan
    from latencyd.tools.measure.scratch import scratch_dir

    tools = ["sockperf", "cyclictest"]  # as measure --attribute's (oslat: see cmd_measure)
    with tempfile.TemporaryDirectory(
        prefix=f"latencyd-recommend-{os.getpid()}-", dir=scratch_dir()
    ) as tmp:
        Path(tmp).chmod(0o755)  # the daemon reads it; root's, not writable by others
        proposal = Path(tmp) / "recommended.toml"
        proposal.write_text(profile_text)
        plan = Plan([], app, online - app, args.seconds or 10.0, args.rounds, tools,
                    idle_seconds=1.0, scratch=(Path(tmp),))  # fmt: skip
        return _attribution(
            system, str(proposal), plan, [], False, [], args.seconds, args.budget, args.json,
            lambda name: int(_call("HoldProfile", name, "latencyctl recommend --measure")),
            lambda cookie: _call("ReleaseProfile", dbus.UInt32(cookie)),
        )  # fmt: skip


# -- rendering -------------------------------------------------------------------------
def format_plugins(docs: dict[str, Any]) -> list[str]:
    out = []
    for name, info in docs.items():
        out.append(f"[{name}]  {info['summary']}")
        out.extend(_format_options(info["options"], "  "))
        out.append("")
    from latencyd.tools.terminal import trimmed

    return trimmed(out)


def _format_options(options: list[dict[str, Any]], indent: str) -> list[str]:
    out = []
    for opt in options:
        unit = f" [{opt['unit']}]" if opt["unit"] else ""
        default = f" (default: {opt['default']!r})" if opt["default"] is not None else ""
        out.append(f"{indent}{opt['option']}: {opt['type']}{unit}{default}")
        out.append(f"{indent}    {opt['doc']}")
        out.extend(_format_options(opt.get("fields", []), indent + "    "))
    return out


def format_boot(status: dict[str, Any]) -> list[str]:
    """The isolation the machine booted with, what it gives the shielded CPUs, and the
    tick there as the noise watch counted it (what nohz_full would take away)."""
    from latencyd.cpuset import CpuSet
    from latencyd.kernel.noise import TICK
    from latencyd.tools.top import top_view

    boot = status.get("boot")
    if not boot:
        return []
    out = ["", "[boot]  (isolation only a reboot changes)"]
    out.append(f"  booted with: {' '.join(boot.get('arguments', [])) or 'no isolation arguments'}")
    view = top_view(status)
    for f in boot.get("findings", []):
        out.append(f"  {f['feature']}, CPUs {f['cpus']}: {f['state']}: {f['detail']}")
        if f["feature"] != "tick" or f["state"] not in ("not booted", "not applicable"):
            continue
        for cpu, rows in (view.get("cpus") or {}).items():
            tick = next((r for r in rows if r["source"] == TICK), None)
            if tick and int(cpu) in CpuSet.from_list(f["cpus"]):
                out.append(
                    f"    the noise watch counted {tick['count']} ticks on CPU {cpu}, "
                    f"{tick['total_us']:.0f} µs, in its last {view['interval_ms']} ms"
                )
    out.extend(f"  ignored by the kernel: {p}" for p in boot.get("problems", []))
    return out


def _in_cgroup(pid: int, cgroups: dict[str, str]) -> str:
    """A hold's task as status shows it: its pid, and the cgroup it runs in when known."""
    cgroup = cgroups.get(str(pid))
    return f"{pid} in {cgroup}" if cgroup else str(pid)


def format_status(status: dict[str, Any]) -> list[str]:
    out = []
    name = status.get("active_profile") or ""
    if name:
        out.append(f"active profile: {name} — {status.get('summary', '')}")
        out.append(f"files: {', '.join(status.get('profile_files', []))}")
        if status.get("last_apply_ms") is not None:
            out.append(f"last apply: {status['last_apply_ms']:.1f} ms")
    else:
        out.append("active profile: none (all settings at their originals)")
    if status.get("holds"):
        out.append(f"base profile: {status.get('base_profile') or 'none'}")
        for h in status["holds"]:
            reason = "reason shown to root" if h["reason"] is None else h["reason"]
            tasks, cgroups = h.get("tasks"), h.get("cgroups") or {}
            out.append(
                f"hold {h['cookie']}: {h['profile']} by {h['owner'] or '?'} "
                f"({reason or 'no reason given'}), CPUs {h.get('cpus') or 'none'}"
                + (f", tasks {', '.join(_in_cgroup(t, cgroups) for t in tasks)}" if tasks else "")
            )
    if status.get("last_error"):
        out.append(f"last error: {status['last_error']}")
    for n in status.get("not_placed") or ():
        who = f"process {n['pid']}" if n["pid"] is not None else "an application"
        out.append(f"not placed: {who} holding {n['profile']}: {n['why']}")
    if status.get("in_progress"):
        busy = status["in_progress"]
        out.append(f"in progress: {busy['what']} ({busy['done']:,} of {busy['total']:,} steps)")
    rb = status.get("readback") or {}
    if rb.get("settings_without_a_file"):
        out.append(
            f"read-back: {rb['settings_without_a_file']} settings without a file (thread "
            f"affinities, NIC settings), {rb['read_per_poll']} every {rb['poll_interval_s']:g} s:"
            f" each checked every {rb['each_checked_every_s']:g} s"
        )
    out.extend(f"reboot pending: [{p['plugin']}] {p['text']}: {p['reason']}"
               for p in status.get("reboot_pending") or [])  # fmt: skip
    out.extend(format_boot(status))
    for t in status.get("other_tuners") or []:
        profile = f", profile {t['profile']}" if t.get("profile") else ""
        profile = (f", {t['unit']}" if t.get("unit") else "") + profile
        fights = "; ".join(t.get("overlap") or []) or "nothing latencyd applies"
        out.append(f"also running at start: {t['name']} (pid {t['pid']}{profile}), "
                   f"setting what latencyd sets: {fights}")  # fmt: skip
    for plugin, info in status.get("plugins", {}).items():
        out += ["", f"[{plugin}]  (on drift: {info.get('on_drift', 'reapply')})"]
        table, more = info.get("owners", []), 0
        named: set[int] = set()
        for item in info.get("applied", []):
            note = f" ({item['note']})" if item.get("note") else ""
            out.append(f"  {item['text']}{note}   (original: {_short(item['original'])})")
            # Each other owner once, under the first of its settings (one irqbalance for
            # every IRQ); how many more settings it also sets, after the section's rows.
            lines, again = owners_once(item.get("owners", []), table, named)
            out.extend(lines)
            more += again
        if more:
            out.append(f"  (the other owners named above also set {more} more of these)")
        for item in info.get("not_applicable", []):
            out.append(f"  not applicable: {item['text']}: {item['reason']}")
        out.extend(f"  {opt} fixed by the daemon's config ({where})"
                   for opt, where in info.get("fixed", {}).items())  # fmt: skip
        if n := info.get("hidden", 0):
            out.append(f"  ({n:,} setting{'s' * (n != 1)} of tasks: {ROOT_AND_ADMINS})")
        out.extend(format_tables(info.get("tables", [])))
        out.extend(f"  {k}: {_short(v)}" for k, v in info.get("facts", {}).items())
    return out


PLAN_ORDER = ("change", "not applicable", "unchanged")  # latencyd.core.planning.ACTIONS


def format_plan(plan: dict[str, Any]) -> list[str]:
    """A plan (D-Bus Plan) as a table: per plugin, each setting (those of one group alike
    in what would happen as one row: the threads of a process), what its section cannot
    take, and what a reboot would need."""
    out = [
        f"plan: {plan['from'] or 'nothing applied'} -> {plan['profile']} (nothing was changed)",
        f"{plan['would_change']:,} would change, {plan['unchanged']:,} unchanged, "
        f"{plan['not_applicable']:,} not applicable",
    ]
    kinds: dict[str, int] = {}
    for r in plan["settings"]:
        if r["action"] == "change":
            what = f"[{r['plugin']}] {r['target']['kind']}"
            kinds[what] = kinds.get(what, 0) + 1
    if kinds:  # which tasks, IRQs, NICs... would move, at a glance
        out.append("would change: " + ", ".join(f"{n:,} {what}" for what, n in kinds.items()))
    if plan.get("held"):
        out.append(plan["held"])
    plugins = dict.fromkeys(
        [r["plugin"] for r in plan["settings"]]
        + [r["plugin"] for r in plan["sections_not_applicable"]]
        + list(plan["hidden"])
    )
    table, named = plan.get("owners", []), set[int]()
    for name in plugins:
        anew = "  (all it holds given back first, then made anew)" * (name in plan["made_anew"])
        out += ["", f"[{name}]{anew}"]
        out += _plan_rows([r for r in plan["settings"] if r["plugin"] == name], table, named)
        out += [f"  {'not applicable':<15} {r['what']}: {r['reason']}"
                for r in plan["sections_not_applicable"] if r["plugin"] == name]  # fmt: skip
        if n := plan["hidden"].get(name, 0):
            out.append(f"  ({n:,} setting{'s' * (n != 1)} of tasks: {ROOT_AND_ADMINS})")
    for need in plan["needs_boot"]:
        out += ["", f"a reboot would need ([{need['plugin']}]): {' '.join(need['arguments'])}"]
    return out


def _plan_rows(
    rows: list[dict[str, Any]], owners: list[dict[str, Any]], named: set[int]
) -> list[str]:
    """One plugin's rows, each followed by its other owners not yet named above (each
    owner once, as status does; how many more settings they also set, at the end)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for n, r in enumerate(sorted(rows, key=lambda r: PLAN_ORDER.index(r["action"]))):
        alike = (r["action"], r["step"], repr(r["now"]), repr(r["would_be"]), r["reason"],
                 tuple(r.get("owners", ())))  # fmt: skip
        groups.setdefault((*alike, r["group"] if r["group"] is not None else n), []).append(r)
    out, also = [], 0
    for members in groups.values():
        r = members[0]
        more = f" and {len(members) - 1:,} more like it" if len(members) > 1 else ""
        if r["action"] == "change":
            verb = "restore" if r["step"] == "restore" else "change"
            out.append(f"  {verb:<15} {r['setting']}{more}   (now: {_short(r['now'])})")
        elif r["action"] == "not applicable":
            out.append(f"  {'not applicable':<15} {r['setting']}{more}: {r['reason']}")
        else:
            out.append(f"  {'unchanged':<15} {r['setting']}{more}")
        lines, again = owners_once(r.get("owners", []), owners, named)
        out.extend(lines)
        also += again
    if also:
        out.append(f"  (the other owners named above also set {also} more of these)")
    return out


def format_tables(tables: list[dict[str, Any]]) -> list[str]:
    """Monitoring tables (latencyd.core.plugin.Table as JSON), columns right-aligned."""
    out = []
    for table in tables:
        out.append(f"  {table['title']}")
        cols = table["columns"]
        rows = [[str(c) for c in row] for row in table["rows"]]
        hidden = table.get("hidden", 0)
        if hidden:
            out.append(f"    ({hidden:,} row{'s' * (hidden != 1)} naming tasks: {ROOT_AND_ADMINS})")
        if not rows:
            if not hidden:
                out.append("    (none)")
            continue
        widths = [max([len(str(h)), *(len(r[i]) for r in rows)]) for i, h in enumerate(cols)]
        out.append("    " + "  ".join(str(h).rjust(w) for h, w in zip(cols, widths, strict=True)))
        for r in rows:
            out.append("    " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    return out


def owners_once(
    mine: list[int], table: list[dict[str, Any]], named: set[int]
) -> tuple[list[str], bool]:
    """A setting's other owners (indices into `table`) not yet `named` above, as lines,
    and whether all of them were (the setting is one more they also set)."""
    lines = format_owners([table[i] for i in mine if i not in named])
    again = bool(mine) and set(mine) <= named
    named.update(mine)
    return lines, again


def format_owners(owners: list[dict[str, Any]]) -> list[str]:
    """The other owners of a setting (latencyd.kernel.owners.Owner as JSON), one a line."""
    return [
        f"      also set by {o['who']} {o['where']}: {o['sets']}"
        + (f" (overridden by {o['overridden_by']})" if o.get("overridden_by") else "")
        + f", {o['when']}"
        for o in owners
    ]


def _short(value: Any) -> str:
    if isinstance(value, dict) and len(value) == 1:
        ((k, v),) = value.items()
        return f"{k} {v}"
    return str(value)


def format_explain(data: dict[str, Any]) -> list[str]:
    out = [f"profile {data['name']} — {data['summary']}", f"files: {', '.join(data['files'])}"]
    if data["variables"]:
        out += ["", "[variables]"]
        out.extend(f"  {k} = {v!r}" for k, v in data["variables"].items())
    for section in dict.fromkeys([*data["sections"], *data.get("removed", {})]):
        out += ["", f"[{section}]"]
        for opt in data["sections"].get(section, []):
            fixed = " (fixed by the daemon's config)" if opt.get("fixed") else ""
            out.append(f"  {opt['option']} = {opt['value']!r}   # {opt['from']}{fixed}")
        for setting in data.get("owners", {}).get(section, []):
            out.append(f"  {setting['setting']}:")
            out.extend(format_owners(setting["owners"]))
        for gone in data.get("removed", {}).get(section, []):
            out.append(f"  - {gone['option']}   # removed by {gone['how']} at {gone['from']}")
    return out


# Each subcommand's handler, by the name cliparser gives it (its `handler` default).
HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": cmd_list,
    "active": cmd_active,
    "switch": cmd_switch,
    "plan": cmd_plan,
    "hold": cmd_hold,
    "run": cmd_run,
    "release": cmd_release,
    "off": cmd_off,
    "reload": cmd_reload,
    "verify": cmd_verify,
    "status": cmd_status,
    "top": cmd_top,
    "explain": cmd_explain,
    "plugins": cmd_plugins,
    "import-tuned": cmd_import_tuned,
    "measure": cmd_measure,
    "recommend": cmd_recommend,
    "man": cmd_man,
    "completion": cmd_completion,
    "__complete": cmd_complete,
}


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(parser(), sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        return USAGE if exc.code not in (0, None) else OK
    handler = HANDLERS[args.handler]
    try:
        code: int = handler(args)
        return code
    except CliError as exc:
        if args.json:
            print(json.dumps({"error": str(exc), "exit_code": exc.code}))
        _say(f"latencyctl: {exc}")
        return exc.code
    except KeyboardInterrupt:
        return 130


def run() -> None:
    """Console-script entry: skip interpreter teardown (~7 ms) once output is flushed."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader left (`latencyctl status | head`): end as a shell tool killed by
        # SIGPIPE does, not with a traceback (Python ignores SIGPIPE, so EPIPE raises).
        code = 128 + signal.SIGPIPE
    with contextlib.suppress(BrokenPipeError):
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
