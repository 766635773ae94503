"""The latencyd process: arguments, the main loop, watchers and signals around the Daemon."""

from __future__ import annotations

import argparse
import collections
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from latencyd.core.capabilities import FollowsTasks, declares, files_to_watch
from latencyd.core.engine import Engine, SettingId, section_schemas
from latencyd.core.journal import Journal
from latencyd.core.plugin import TaskEvent, load_plugins
from latencyd.core.profile import Profile, ProfileLibrary
from latencyd.errors import ConfigError, LatencydError
from latencyd.kernel.owners import overlap, running_tuners
from latencyd.kernel.system import System, Writer
from latencyd.paths import CONFIG_FILE, DEFAULT_KEEP_DIR, DEFAULT_STATE_DIR
from latencyd.service.config import (
    Config,
    cluster_allowed,
    fixed_options,
    load_config,
    search_path,
)
from latencyd.service.daemon import Daemon
from latencyd.service.mainloop import PRIORITY_DEFAULT, PRIORITY_HIGH, MainLoop
from latencyd.service.noisewatch import ShieldWatch
from latencyd.service.sdnotify import FdStore, restart_pending
from latencyd.service.taskevents import (
    READ_BUDGET,
    RescanPace,
    TaskSource,
    coalesce,
    open_task_source,
)
from latencyd.service.watchers import FileWatcher, UdevWatcher

log = logging.getLogger("latencyd")

# Task events at D-Bus's priority: a turn of the main loop dispatches both, so however
# fast events come (any user can rename a process in a loop), calls are answered.
PRIORITY_TASKS = PRIORITY_DEFAULT


class DeviceWatch:
    """udev events for exactly the subsystems the active profile's plugins follow, open
    only while there are any: otherwise every uevent on the machine (a loop device, a USB
    stick) would wake the daemon for nothing."""

    def __init__(self, daemon: Daemon, loop: MainLoop) -> None:
        self.daemon = daemon
        self.loop = loop
        self.watcher: UdevWatcher | None = None
        self.source = -1
        daemon.before_apply.append(self.sync)

    def sync(self, profile: Profile | None) -> None:
        wanted: set[str] = set()
        for name in profile.sections if profile is not None else ():
            wanted.update(self.daemon.plugins[name].follows.udev)
        current = self.watcher.subsystems if self.watcher is not None else frozenset()
        if wanted == current:
            return
        if self.watcher is not None:
            self.loop.source_remove(self.source)
            self.watcher.close()
            self.watcher = None
            log.info("device events closed")
        if not wanted:
            return
        try:
            self.watcher = UdevWatcher(wanted)
        except Exception as exc:  # no netlink access: the monitor tick still catches it
            log.warning("device events unavailable (%s); relying on the periodic check", exc)
            return
        self.source = self.loop.fd_add(self.watcher.fileno(), self._readable, PRIORITY_HIGH)

    def _readable(self) -> bool:
        if self.watcher is None:
            return False
        events = self.watcher.read()
        for event in events:
            log.debug("device %s %s/%s", event.action, event.subsystem, event.name)
        if events:
            self.daemon.on_device_events(events)
        return True


class TaskWatch:
    """Task events, open only while the profile has a section for a plugin that follows
    threads: otherwise every fork on the machine would wake the daemon for nothing.

    Whatever any user can make happen as fast as a CPU allows (renaming a process in a
    loop) must not keep the daemon from answering: the kernel drops the events no section
    follows (renames, unless one does), a wake-up reads at most READ_BUDGET of them and
    hands on one per task and kind (coalesce), at D-Bus's own priority so calls are
    answered between wake-ups, and the rescans lost events ask for are paced (RescanPace)."""

    def __init__(
        self,
        daemon: Daemon,
        loop: MainLoop,
        preference: str,
        opener: Callable[[str, bool, bool], TaskSource | None] = open_task_source,
    ) -> None:
        self.daemon = daemon
        self.loop = loop
        self.preference = preference
        self.opener = opener  # (preference, user_execs, renames) -> the source, or None
        self.source: TaskSource | None = None
        self.opened = False
        self.user_execs = False
        self.renames = False
        self.watches: list[int] = []
        self.pace = RescanPace()
        self.rescan_timer: int | None = None
        daemon.before_apply.append(self.sync)

    def sync(self, profile: Profile | None) -> None:
        followers = [
            p
            for n, p in self.daemon.plugins.items()
            if declares(p, FollowsTasks) and profile is not None and n in profile.sections
        ]
        sections = profile.sections if profile is not None else {}
        asked = [
            (cast(FollowsTasks[Any, Any], p), p.options_of(sections[p.name])) for p in followers
        ]
        user_execs = any(follower.follows_user_tasks(options) for follower, options in asked)
        renames = any(follower.follows_renames(options) for follower, options in asked)
        wanted = (user_execs, renames)
        if self.opened and (not followers or wanted != (self.user_execs, self.renames)):
            self._close()
        if followers and not self.opened:
            self.user_execs, self.renames = wanted
            self._open()
            for plugin in followers:
                plugin.rescan_interval_s = 60.0 if self.source else 0.0

    def _open(self) -> None:
        self.opened = True
        source = self.opener(self.preference, self.user_execs, self.renames)
        self.daemon.task_source = source.name if source else "none (periodic rescan)"
        log.info(
            "task events from %s%s",
            self.daemon.task_source,
            " (renames dropped in the kernel: no section follows them)" * (not self.renames),
        )
        if source is None:
            return
        self.source = source
        self.watches = [self.loop.fd_add(fd, self._readable, PRIORITY_TASKS)
                        for fd in source.filenos()]  # fmt: skip

    def _readable(self) -> bool:
        if self.source is None:
            return False
        events = coalesce(self.source.read(READ_BUDGET))
        if events and log.isEnabledFor(logging.DEBUG):  # --verbose: what each wake-up read
            kinds = collections.Counter(e.kind for e in events)
            kthreads = [e.pid for e in events if e.kind == "fork" and e.ppid == 2]
            said = ", ".join(f"{n} {k}" for k, n in kinds.items())
            log.debug("task events: %s%s", said, f" (new kthreads {kthreads})" * bool(kthreads))
        if any(e.lost for e in events):
            events = [e for e in events if not e.lost]
            self._rescan_when_due()
        if events:
            self.daemon.on_task_events(events)
        return True

    def _rescan_when_due(self) -> None:
        """Events were lost: a rescan now, or one when the pace allows (only one waits)."""
        if self.rescan_timer is not None:
            return
        wait = self.pace.wait(time.monotonic())
        if wait <= 0:
            self._rescan()
            return
        self.rescan_timer = self.loop.timeout_add(
            max(1, math.ceil(wait * 1000)), self._rescan_timed, PRIORITY_TASKS
        )

    def _rescan_timed(self) -> bool:
        self.rescan_timer = None
        self._rescan()
        return False

    def _rescan(self) -> None:
        started = time.monotonic()
        self.daemon.on_task_events([TaskEvent("lost", 0, 0, lost=True)])
        self.pace.ran(started, time.monotonic())

    def _close(self) -> None:
        for watch in self.watches:
            self.loop.source_remove(watch)
        self.watches = []
        if self.rescan_timer is not None:
            self.loop.source_remove(self.rescan_timer)
            self.rescan_timer = None
        if self.source is not None:
            self.source.close()
            self.source = None
        self.opened = False
        self.daemon.task_source = "none"
        log.info("task events closed")


class DriftWatch:
    """Drift, found as it happens: fanotify (or inotify) on every file that holds an owned
    setting, so a rewrite by anyone is put back (or reported) at once, naming the writer
    where fanotify tells it, and idle costs nothing. Owned
    settings that live in no file (thread affinities, NIC settings, the PM QoS request)
    are read back in turn, at most POLL_SLICE every `poll_interval_s` and only while
    there are any: each is checked every ceil(n / POLL_SLICE) polls, and a daemon beside
    20,000 narrowed threads pays for 256 reads a second, not 20,000."""

    POLL_SLICE = 256

    def __init__(self, daemon: Daemon, loop: MainLoop, poll_interval_s: float) -> None:
        self.daemon = daemon
        self.loop = loop
        self.poll_ms = int(poll_interval_s * 1000)
        self.files = FileWatcher(daemon.system.writer)
        self.watched: dict[SettingId, tuple[str, ...]] = {}  # owned setting -> its files
        self.by_path: dict[str, set[SettingId]] = {}
        self.unwatched: set[SettingId] = set()
        self.round: list[SettingId] = []  # what this round of polls has still to read
        self.poll_source: int | None = None
        loop.fd_add(self.files.fileno(), self._readable)
        daemon.after_step.append(self.sync)

    def sync(self) -> None:
        """Follow what the engine owns: only settings new since the last step are asked
        for their files (a step that pins one new thread costs one lookup, not one per
        owned setting)."""
        applied = self.daemon.engine.applied
        system = self.daemon.system
        changes = self.daemon.engine.take_changes()
        if changes is None:  # everything may have changed: compare it all, once
            gone = self.watched.keys() - applied.keys()
            new = applied.keys() - self.watched.keys()
        else:
            gone = {sid for sid in changes if sid in self.watched and sid not in applied}
            new = {sid for sid in changes if sid in applied and sid not in self.watched}
        gone_files = False
        for sid in gone:
            gone_files = gone_files or bool(self.watched[sid])
            for path in self.watched.pop(sid):
                self.by_path[path].discard(sid)
                if not self.by_path[path]:
                    del self.by_path[path]
            self.unwatched.discard(sid)
        for sid in new:
            files = files_to_watch(self.daemon.plugins[sid[0]], sid[1])
            paths = tuple(str(system.path(rel)) for rel in files)
            self.watched[sid] = paths
            for path in paths:
                self.by_path.setdefault(path, set()).add(sid)
            if not paths:
                self.unwatched.add(sid)
        if self.files.stale or any(self.watched.get(sid) for sid in new) or gone_files:
            self.files.sync(self.by_path)
        self.daemon.readback = self.readback()
        polling = bool(self.unwatched) and self.poll_ms > 0
        if polling and self.poll_source is None:
            self.poll_source = self.loop.timeout_add(self.poll_ms, self._poll)
        elif not polling and self.poll_source is not None:
            self.loop.source_remove(self.poll_source)
            self.poll_source = None

    def _readable(self) -> bool:
        sids: set[SettingId] = set()
        writers: dict[SettingId, Writer] = {}
        for path, writer in self.files.read().items():
            for sid in self.by_path.get(path, ()):
                sids.add(sid)
                if writer is not None:
                    writers[sid] = writer
        if sids:
            self.daemon.check_drift(sids, writers)
        return True

    def _poll(self) -> bool:
        if not self.round:
            self.round = list(self.unwatched)  # O(n) once per round of n / POLL_SLICE polls
        batch = self.round[-self.POLL_SLICE :]
        del self.round[-self.POLL_SLICE :]
        self.daemon.check_drift([sid for sid in batch if sid in self.unwatched])
        self.daemon.readback = self.readback()
        return True

    def readback(self) -> dict[str, Any]:
        """How settings without a file are read back: for status and docs/guarantees.md."""
        polls = -(-len(self.unwatched) // self.POLL_SLICE)  # ceil
        return {
            "settings_without_a_file": len(self.unwatched),
            "read_per_poll": min(len(self.unwatched), self.POLL_SLICE),
            "poll_interval_s": self.poll_ms / 1000,
            "each_checked_every_s": round(polls * self.poll_ms / 1000, 1),
        }

    def file_backed(self) -> list[SettingId]:
        """Owned settings with a file: inotify sees their rewrites; the tick re-reads them
        for what the kernel changes without a write."""
        return [sid for sid, paths in self.watched.items() if paths]


def say_other_tuners(daemon: Daemon) -> None:
    """TuneD or another latencyd running now, said at start with what both would set
    (they would undo each other's writes), and kept for status."""
    ours = {claim for _, target in daemon.engine.applied for claim in target.claims()}
    for tuner in running_tuners(daemon.system, os.getpid()):
        fights = overlap(tuner, ours)
        profile = f", profile {tuner.profile}" if tuner.profile else ""
        unit = f", {tuner.unit}" if tuner.unit else ""
        log.warning(
            "%s is running (pid %d%s%s): it and latencyd both set %s; they will undo each "
            "other's writes: stop one of them",
            tuner.name, tuner.pid, unit, profile,
            "; ".join(fights) or "nothing latencyd applies now",
        )  # fmt: skip
        daemon.tuners.append(tuner.as_json() | {"overlap": fights})


def build(
    args: argparse.Namespace,
    config: Config,
    fdstore: FdStore | None = None,
    journal: Journal | None = None,
) -> Daemon:
    system = System(args.root, fdstore=fdstore)
    plugins = load_plugins(system)
    schemas, machine = section_schemas(plugins), system.machine()
    library = ProfileLibrary(
        search_path(args.profile_dir, config),
        schemas,
        machine,
        # As root, profiles must be root's (a local user must not plant settings).
        trusted_only=os.geteuid() == 0 and system.is_real,
        fixed=fixed_options(config, schemas, machine),  # ConfigError: its line
        cluster_dir=config.cluster_profiles,
    )
    engine = Engine(plugins, journal or Journal(args.state_dir, args.keep_dir))
    daemon = Daemon(system, plugins, library, engine)
    daemon.cluster_allow_root = cluster_allowed(config, plugins, args.config)
    return daemon


def arg_parser() -> argparse.ArgumentParser:
    """latencyd's options (also the source of latencyd(8), see latencyd/tools/manpages.py)."""
    parser = argparse.ArgumentParser(
        prog="latencyd", description="Put the machine into a low-latency state and keep it there."
    )
    parser.add_argument("--profile", help="profile to apply at start (default: from the config)")
    parser.add_argument(
        "--profile-dir",
        type=Path,
        action="append",
        default=[],
        help="look for profiles here first (repeatable)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"where the journal of original values lives ({DEFAULT_STATE_DIR})",
    )
    parser.add_argument(
        "--keep-dir",
        type=Path,
        default=DEFAULT_KEEP_DIR,
        help=f"where the profile the last switch chose is kept for every later start, "
        f"a reboot's included ({DEFAULT_KEEP_DIR})",
    )
    parser.add_argument(
        "--config", type=Path, default=CONFIG_FILE, help=f"configuration file ({CONFIG_FILE})"
    )
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)  # tests: a fake /proc+/sys
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="start without applying any profile (restores what a previous run left)",
    )
    parser.add_argument(
        "--restore",
        action="store_true",
        help="put back every original a previous run left (its journal) and exit, without "
        "D-Bus; only where no latencyd runs (the Debian package's prerm, on remove)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return arg_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from latencyd.service.logs import setup_logging

    started = time.perf_counter()
    # Until the main loop's handlers are in place, a SIGTERM must not kill the process
    # half-way through applying: note it, and stop (restoring everything) once we can.
    early_stop: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda sig, _frame: early_stop.append(sig))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    args = parse_args(argv)
    setup_logging(args.verbose)
    try:
        config = load_config(args.config)
        # A state directory another user could change is refused before anything is
        # tuned: its journal's "originals" are what a restore writes.
        journal = Journal(args.state_dir, args.keep_dir)
        journal.open()
    except LatencydError as exc:
        log.error("%s", exc)
        return 2
    if os.geteuid() != 0 and args.root == "/":
        log.warning("not running as root: most settings will be refused")
    if args.restore:
        return restore_left(args, config, journal)

    # D-Bus is imported here, not at module level, so the Daemon logic is testable without it.
    import dbus.mainloop.glib

    from latencyd.service.dbus import BusLink, Service
    from latencyd.service.operations import Operations

    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    try:
        daemon = build(args, config, FdStore.from_environment(), journal)
    except ConfigError as exc:  # [plugin.NAME] checked against the plugins, nothing tuned yet
        log.error("%s", exc)
        return 2
    loop = MainLoop()
    operations = Operations(daemon, loop)
    service = Service(daemon, config, operations)
    link = BusLink(service, loop)

    def on_terminate() -> bool:
        if config.on_stop == "keep":
            keep, why = True, "keeping the tuning in place (on_stop = keep)"
        elif restart_pending(service.bus):
            keep, why = True, "keeping the tuning in place for the restart systemd is doing"
        else:
            keep, why = False, "restoring every original but the next boot's kernel arguments"
        log.info("stopping: %s", why)
        operations.cancel("the daemon stopping")  # a change half done is rolled back first
        shield.close()
        daemon.stop(restore=not keep)
        loop.quit()
        return False

    def on_hup() -> bool:
        log.info("SIGHUP: reloading profiles")
        service.reload_from_signal()
        return True

    # GLib takes the signals over from here; one arriving before the loop runs waits for it.
    loop.signal_add(signal.SIGTERM, on_terminate)
    loop.signal_add(signal.SIGINT, on_terminate)
    loop.signal_add(signal.SIGHUP, on_hup)
    if early_stop:
        log.info("stopped before start-up finished")
        return 0
    # Watch before applying, so threads and devices that appear meanwhile are not missed.
    DeviceWatch(daemon, loop)
    TaskWatch(daemon, loop, config.task_events)
    drift = DriftWatch(daemon, loop, config.poll_interval_s)
    shield = ShieldWatch(daemon, loop, service.noise_exceeded)
    if config.metrics_listen is not None:
        try:
            expose_metrics(daemon, shield, config.metrics_listen, config.metrics_sources_per_cpu)
        except LatencydError as exc:
            log.error("%s", exc)
            return 2
    # An explicit --profile wins; otherwise a restart resumes what `switch` left in force.
    daemon.start(
        None if args.no_profile else (args.profile or config.default_profile),
        resume=not args.no_profile and not args.profile,
    )
    say_other_tuners(daemon)
    # The name is claimed only now: whoever waits for it (systemd Type=dbus, scripts)
    # knows the start-up profile is applied and verified.
    if link.connect():
        if not service.claim_name():
            daemon.stop()
            return 3
    else:
        log.warning(
            "no system bus at %s yet: tuning is applied; connecting when it is up", link.address
        )
        link.retry()
    log.info(
        "ready in %.0f ms; profile: %s",
        (time.perf_counter() - started) * 1000,
        daemon.active.name if daemon.active else "(none)",
    )
    if config.verify_interval_s > 0:
        loop.timeout_add(int(config.verify_interval_s * 1000), lambda: _tick(daemon, drift))
    loop.run()
    return 0


def restore_left(args: argparse.Namespace, config: Config, journal: Journal) -> int:
    """--restore: adopt what a previous run left in the journal, restore it and exit (1 if
    a setting could not be restored). Nothing is applied and no bus is needed, so it runs
    where the service does not: a package's removal after a stop that kept the tuning."""
    try:
        daemon = build(args, config, None, journal)
    except ConfigError as exc:
        log.error("%s", exc)
        return 2
    daemon.start(None, resume=False)  # adopts the journal, and restores it with no profile
    problems = daemon.stop()
    for problem in problems:
        log.error("not restored: %s", problem)
    log.info("restored what a previous run left%s", " (with problems)" if problems else "")
    return 1 if problems else 0


def expose_metrics(
    daemon: Daemon, shield: ShieldWatch, listen: tuple[str, int], sources_per_cpu: int
) -> None:
    """The Prometheus exposition, fed from the main loop (see latencyd/service/metrics.py)."""
    from latencyd.service.metrics import Metrics, serve

    metrics = Metrics(sources_per_cpu)

    def stepped() -> None:
        step = daemon.engine.last_step
        metrics.update(
            profile=daemon.active.name if daemon.active else "",
            settings={
                "applied": len(daemon.engine.applied),
                "not_applicable": len(daemon.engine.not_applicable),
            },
            switch_seconds=step.seconds if step else None,
            reboot_pending=bool(daemon.reboot_pending),
        )

    def drifted(records: list[dict[str, Any]]) -> None:
        counts = dict(metrics.snapshot.drift)
        for r in records:
            key = (str(r["plugin"]), str(r["action"]).split(":")[0])
            counts[key] = counts.get(key, 0) + 1
        metrics.update(drift=counts)

    daemon.after_step.append(stepped)
    daemon.on_drift.append(drifted)
    shield.on_interval.append(metrics.add_noise)
    shield.on_breach.append(lambda breach: metrics.add_breach(breach.cpu))
    stepped()
    serve(listen, metrics)
    log.info("metrics at http://%s:%d/metrics", *listen)


def _tick(daemon: Daemon, drift: DriftWatch) -> bool:
    try:
        # What lives in no file is read back by the drift watch's polls, in slices.
        daemon.check(drift.file_backed() if drift.poll_ms > 0 else None)
    except LatencydError as exc:
        log.error("periodic check failed: %s", exc)
    return True


if __name__ == "__main__":
    sys.exit(main())
