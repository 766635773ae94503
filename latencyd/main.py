"""The latencyd process: arguments, the main loop, watchers and signals around the Daemon."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

from latencyd.config import CONFIG_FILE, DEFAULT_STATE_DIR, Config, load_config, search_path
from latencyd.daemon import Daemon
from latencyd.engine import Engine
from latencyd.errors import LatencydError
from latencyd.journal import Journal
from latencyd.mainloop import PRIORITY_HIGH, MainLoop
from latencyd.plugin import load_plugins
from latencyd.profile import Profile, ProfileLibrary
from latencyd.system import System
from latencyd.taskevents import TaskSource
from latencyd.watchers import DEVICE_EVENT_KINDS, UdevWatcher

log = logging.getLogger("latencyd")
COALESCE_MS = 5  # a device burst (bind, queues, links) becomes one refresh


class DeviceWatch:
    """udev events, open only while the profile has a section for a plugin that reacts to
    devices or CPUs: otherwise every uevent on the machine (a loop device, a USB stick)
    would wake the daemon for nothing. Bursts are coalesced into one refresh."""

    def __init__(self, daemon: Daemon, loop: MainLoop) -> None:
        self.daemon = daemon
        self.loop = loop
        self.watcher: UdevWatcher | None = None
        self.source = -1
        self.pending: set[str] = set()
        daemon.before_apply.append(self.sync)

    def sync(self, profile: Profile | None) -> None:
        wanted = profile is not None and any(
            self.daemon.plugins[n].events & DEVICE_EVENT_KINDS for n in profile.sections
        )
        if wanted and self.watcher is None:
            try:
                self.watcher = UdevWatcher()
            except Exception as exc:  # no netlink access: the monitor tick still catches it
                log.warning("device events unavailable (%s); relying on the periodic check", exc)
                return
            self.source = self.loop.fd_add(self.watcher.fileno(), self._readable)
        elif not wanted and self.watcher is not None:
            self.loop.source_remove(self.source)
            self.watcher.close()
            self.watcher = None
            log.info("device events closed")

    def _flush(self) -> bool:
        kinds = set(self.pending)
        self.pending.clear()
        self.daemon.on_events(kinds)
        return False

    def _readable(self) -> bool:
        if self.watcher is None:
            return False
        events = self.watcher.read()
        if events and not self.pending:
            self.loop.timeout_add(COALESCE_MS, self._flush)
        for event in events:
            log.debug("device %s %s/%s", event.action, event.subsystem, event.name)
            self.pending.update(event.kinds)
        return True


class TaskWatch:
    """Task events, open only while the profile has a section for a plugin that follows
    threads: otherwise every fork on the machine would wake the daemon for nothing."""

    def __init__(self, daemon: Daemon, loop: MainLoop, preference: str) -> None:
        self.daemon = daemon
        self.loop = loop
        self.preference = preference
        self.source: TaskSource | None = None
        self.opened = False
        self.user_execs = False
        self.watches: list[int] = []
        daemon.before_apply.append(self.sync)

    def sync(self, profile: Profile | None) -> None:
        followers = [
            p
            for n, p in self.daemon.plugins.items()
            if "thread" in p.events and profile is not None and n in profile.sections
        ]
        user_execs = profile is not None and any(
            p.follows_user_tasks(profile.sections[p.name]) for p in followers
        )
        if self.opened and (not followers or user_execs != self.user_execs):
            self._close()
        if followers and not self.opened:
            self.user_execs = user_execs
            self._open()
            for plugin in followers:
                plugin.rescan_interval_s = 60.0 if self.source else 0.0

    def _open(self) -> None:
        from latencyd.taskevents import open_task_source

        self.opened = True
        source = open_task_source(self.preference, self.user_execs)
        self.daemon.task_source = source.name if source else "none (periodic rescan)"
        log.info("task events from %s", self.daemon.task_source)
        if source is None:
            return

        def readable() -> bool:
            self.daemon.on_task_events(source.read())
            return True

        self.source = source
        self.watches = [self.loop.fd_add(fd, readable, PRIORITY_HIGH) for fd in source.filenos()]

    def _close(self) -> None:
        for watch in self.watches:
            self.loop.source_remove(watch)
        self.watches = []
        if self.source is not None:
            self.source.close()
            self.source = None
        self.opened = False
        self.daemon.task_source = "none"
        log.info("task events closed")


def build(args: argparse.Namespace, config: Config) -> Daemon:
    system = System(args.root)
    plugins = load_plugins(system)
    library = ProfileLibrary(
        search_path(args.profile_dir, config),
        {n: p.schema for n, p in plugins.items()},
        system.machine(),
    )
    engine = Engine(plugins, Journal(args.state_dir))
    return Daemon(system, plugins, library, engine)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
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
        "--config", type=Path, default=CONFIG_FILE, help=f"configuration file ({CONFIG_FILE})"
    )
    parser.add_argument("--root", default="/", help=argparse.SUPPRESS)  # tests: a fake /proc+/sys
    parser.add_argument(
        "--no-profile", action="store_true", help="start without applying any profile"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from latencyd.logs import setup_logging

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
    except LatencydError as exc:
        log.error("%s", exc)
        return 2
    if os.geteuid() != 0 and args.root == "/":
        log.warning("not running as root: most settings will be refused")

    # D-Bus is imported here, not at module level, so the Daemon logic is testable without it.
    import dbus
    import dbus.mainloop.glib

    from latencyd.service import Service

    dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
    daemon = build(args, config)
    try:
        bus = dbus.SystemBus()
    except dbus.DBusException as exc:
        log.error("cannot connect to the system bus: %s", exc.get_dbus_message())
        return 3
    loop = MainLoop()
    service = Service(bus, daemon, config)

    def on_terminate() -> bool:
        log.info("stopping: restoring every original value")
        daemon.stop()
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
    daemon.start(None if args.no_profile else (args.profile or config.default_profile))
    # The name is claimed only now: whoever waits for it (systemd Type=dbus, scripts)
    # knows the start-up profile is applied and verified.
    if not service.claim_name():
        daemon.stop()
        return 3
    log.info(
        "ready in %.0f ms; profile: %s",
        (time.perf_counter() - started) * 1000,
        daemon.active.name if daemon.active else "(none)",
    )
    if config.verify_interval_s > 0:
        loop.timeout_add(int(config.verify_interval_s * 1000), service.tick)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
