"""Daemon: which profile is in force and why, independent of how it is asked (D-Bus, signals).

The process around it (arguments, main loop, watchers, signals) is latencyd.main.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from latencyd.engine import Drift, Engine, StepReport
from latencyd.errors import LatencydError, NoSuchHold
from latencyd.plugin import Plugin
from latencyd.profile import Profile, ProfileInfo, ProfileLibrary
from latencyd.system import System
from latencyd.taskevents import TaskEvent

log = logging.getLogger("latencyd")


@dataclass(frozen=True)
class Hold:
    """An application holding a profile while it runs (D-Bus HoldProfile)."""

    cookie: int
    profile: str
    reason: str
    owner: str  # the holder's unique bus name; its holds end when it leaves the bus
    since: float


class Daemon:
    def __init__(
        self, system: System, plugins: dict[str, Plugin], library: ProfileLibrary, engine: Engine
    ) -> None:
        self.system = system
        self.plugins = plugins
        self.library = library
        self.engine = engine
        self.active: Profile | None = None
        self.active_ref: str | None = None  # the name or path `active` was loaded by
        self.base: str | None = None  # the profile in force when nothing is held
        self.holds: dict[int, Hold] = {}  # by cookie, oldest first
        self._next_cookie = 1
        self.last_error: str | None = None
        self.on_profile_changed: list[Any] = []  # callbacks(name: str)
        self.task_source = "none"
        self.before_apply: list[Callable[[Profile | None], None]] = []

    # -- lifecycle --------------------------------------------------------------
    def start(self, profile: str | None) -> None:
        """Restore what an unclean exit left behind, then apply the start-up profile."""
        problems = self.engine.recover()
        if problems is not None:
            log.warning(
                "restored originals left by an unclean exit%s",
                f" ({len(problems)} problems)" if problems else "",
            )
        if profile:
            try:
                self.switch(profile)
            except LatencydError as exc:
                # A bad start-up profile must not keep the daemon (and `latencyctl`) away.
                self.last_error = str(exc)
                log.error("start-up profile %s not applied: %s", profile, exc)

    def stop(self) -> list[str]:
        problems = self.engine.off()
        for plugin in self.plugins.values():
            plugin.close()
        return problems

    # -- requests -----------------------------------------------------------------
    def in_force(self) -> str | None:
        """The profile that should be active: the newest hold's, else the base profile."""
        return next(reversed(self.holds.values())).profile if self.holds else self.base

    def switch(self, name: str) -> StepReport | None:
        """Set the base profile. It is applied now, unless a hold keeps another in force
        (then it is checked now and applied when the last hold is released)."""
        if self.holds:
            self.library.load(name)  # a bad profile is an error now, not at release time
            self.base = name
            log.info("base profile set to %s; %s stays in force while held", name, self.in_force())
            return None
        report = self._apply(name)
        self.base = name
        return report

    def hold(self, name: str, reason: str, owner: str) -> tuple[int, StepReport]:
        """Apply a profile for as long as the hold lasts (ReleaseProfile, or the holder
        leaving the bus). Holds stack: the newest is in force."""
        report = self._apply(name)
        cookie = self._next_cookie
        self._next_cookie += 1
        self.holds[cookie] = Hold(cookie, name, reason, owner, time.time())
        log.info("hold %d on %s by %s (%s)", cookie, name, owner or "latencyd", reason or "-")
        return cookie, report

    def release(self, cookie: int) -> StepReport | None:
        if cookie not in self.holds:
            held = ", ".join(str(c) for c in self.holds) or "none"
            raise NoSuchHold(f"no hold with cookie {cookie} (current holds: {held})")
        hold = self.holds.pop(cookie)
        log.info("hold %d on %s released", cookie, hold.profile)
        return self._apply_in_force()

    def release_owner(self, owner: str) -> None:
        """The holder left the bus (exited, crashed): its holds end with it."""
        gone = [c for c, h in self.holds.items() if h.owner == owner]
        for cookie in gone:
            log.info(
                "hold %d on %s ended: %s left the bus", cookie, self.holds[cookie].profile, owner
            )
            del self.holds[cookie]
        if gone:
            self._apply_in_force()

    def _apply_in_force(self) -> StepReport | None:
        ref = self.in_force()
        if ref == self.active_ref and self.active is not None:
            return None
        if ref is None:
            self._restore_all()
            return None
        try:
            return self._apply(ref)
        except LatencydError as exc:
            log.error(
                "could not apply %s after a hold ended; %s stays: %s",
                ref,
                self.active.name if self.active else "nothing",
                exc,
            )
            self.last_error = str(exc)
            return None

    def _apply(self, ref: str) -> StepReport:
        profile = self.library.load(ref)  # ProfileError leaves everything as it is
        self._before_apply(profile)
        try:
            wanted = self.engine.wanted(profile)
            report = self.engine.switch(wanted, profile.name)
        except LatencydError:
            self._before_apply(self.active)  # the old profile stays, with its watchers
            raise
        previous = self.active.name if self.active else None
        self.active = profile
        self.active_ref = ref
        for name in profile.sections:
            self.plugins[name].on_profile_applied()
        self.last_error = None
        na = len(report.not_applicable)
        log.info(
            "profile %s active: %d applied, %d restored, %d unchanged%s (%.1f ms)",
            profile.name,
            report.applied,
            report.restored,
            report.unchanged,
            f", {na} not applicable" if na else "",
            report.seconds * 1000,
        )
        if previous != profile.name:
            self._changed(profile.name)
        return report

    def off(self) -> list[str]:
        """Restore every original value; drops the base profile and every hold."""
        if self.holds:
            log.info("off: dropping %d hold(s)", len(self.holds))
        self.holds.clear()
        self.base = None
        return self._restore_all()

    def _restore_all(self) -> list[str]:
        problems = self.engine.off()
        had = self.active is not None
        self.active = None
        self.active_ref = None
        self._before_apply(None)
        log.info("all settings restored%s", f" ({len(problems)} problems)" if problems else "")
        if had:
            self._changed("")
        return problems

    def reload(self) -> None:
        """Re-read profiles; re-apply the one in force incrementally if its files changed."""
        if self.active_ref is not None:
            self._apply(self.active_ref)

    def verify(self) -> list[Drift]:
        return self.engine.verify()

    def refresh(self, plugin_names: set[str]) -> StepReport | None:
        """Re-expand some plugins' sections (a new IRQ, thread or device appeared)."""
        if self.active is None:
            return None
        names = plugin_names & set(self.active.sections)
        if not names:
            return None
        wanted = self.engine.wanted(self.active, names)
        return self.engine.switch(wanted, self.active.name, scope=names, recheck=True)

    def on_events(self, kinds: set[str]) -> None:
        """Device or CPU events: re-expand the plugins that care, incrementally."""
        if "cpu" in kinds:
            self.machine_changed()
        names = {n for n, p in self.plugins.items() if p.events & kinds}
        try:
            report = self.refresh(names)
            if report is not None and (report.applied or report.restored):
                log.info(
                    "device events (%s): %d applied, %d restored in %.1f ms",
                    ", ".join(sorted(kinds)),
                    report.applied,
                    report.restored,
                    report.seconds * 1000,
                )
        except LatencydError as exc:
            log.error("applying the profile to new devices failed: %s", exc)

    def on_task_events(self, events: list[TaskEvent]) -> None:
        """New or renamed threads: give them their settings now; lost events mean rescan."""
        if self.active is None:
            return
        interested = [
            p for n, p in self.plugins.items() if "thread" in p.events and n in self.active.sections
        ]
        if not interested:
            return
        if any(e.lost for e in events):
            log.warning("task events were lost: rescanning")
            self.refresh({p.name for p in interested})
            return
        wanted: dict[tuple[str, str], Any] = {}
        timed: list[tuple[Plugin, TaskEvent]] = []
        for event in events:
            for plugin in interested:
                settings = plugin.on_task(event)
                if settings:
                    wanted.update({(plugin.name, k): v for k, v in settings.items()})
                    timed.append((plugin, event))
        if not wanted:
            return
        try:
            self.engine.extend(wanted)
        except LatencydError as exc:
            log.error("pinning new threads failed: %s", exc)
            return
        for plugin, event in timed:
            plugin.record_delay(event)

    def machine_changed(self) -> None:
        """CPUs went on/offline: re-resolve the profile's CPU lists ("all") and re-apply."""
        self.library.machine = self.system.machine()
        if self.active_ref is not None:
            try:
                self._apply(self.active_ref)
            except LatencydError as exc:
                log.error("re-applying after a CPU change failed: %s", exc)

    def check(self) -> list[dict[str, Any]]:
        """The monitor tick: pick up new targets, then find drift and re-apply or report it."""
        if self.active is None:
            return []
        changed = {n for n in self.active.sections if self.plugins[n].changed()}
        if changed:
            log.info("new targets for %s: re-applying", ", ".join(sorted(changed)))
            try:
                self.refresh(changed)
            except LatencydError as exc:
                log.error("applying the profile to new targets failed: %s", exc)
        records = []
        drifts = self.engine.verify()
        for d in drifts:
            action = self.active.sections.get(d.plugin, {}).get("on_drift", "report")
            record = drift_dict(d) | {"action": "reported"}
            if action == "reapply":
                problems = self.engine.reapply([d])
                record["action"] = "failed: " + problems[0] if problems else "reapplied"
            log.warning(
                "drift: [%s] %s is %r, profile wants %r: %s",
                d.plugin,
                d.key,
                d.actual,
                d.wanted,
                record["action"],
            )
            records.append(record)
        return records

    def list_profiles(self) -> list[ProfileInfo]:
        return self.library.all()

    def status(self) -> dict[str, Any]:
        plugins: dict[str, Any] = {}
        for name, plugin in self.plugins.items():
            applied = [
                {
                    "key": key,
                    "value": value,
                    "original": self.engine.originals.get((p, key)),
                    "text": plugin.describe(key, value),
                }
                for (p, key), value in self.engine.applied.items()
                if p == name
            ]
            refused = [
                {"key": key, "reason": reason}
                for (p, key), reason in self.engine.not_applicable.items()
                if p == name
            ]
            monitor = plugin.status() if (self.active and name in self.active.sections) else {}
            if applied or refused or monitor:
                plugins[name] = {"applied": applied, "not_applicable": refused, "monitor": monitor}
        step = self.engine.last_step
        return {
            "active_profile": self.active.name if self.active else "",
            "profile_files": [str(p) for p in self.active.files] if self.active else [],
            "summary": self.active.summary if self.active else "",
            "last_apply_ms": round(step.seconds * 1000, 3) if step else None,
            "base_profile": self.base or "",
            "holds": [
                {
                    "cookie": h.cookie,
                    "profile": h.profile,
                    "reason": h.reason,
                    "owner": h.owner,
                    "since": h.since,
                }
                for h in self.holds.values()
            ],
            "last_error": self.last_error,
            "task_events": self.task_source,
            "plugins": plugins,
        }

    def _before_apply(self, profile: Profile | None) -> None:
        for hook in self.before_apply:
            hook(profile)

    def _changed(self, name: str) -> None:
        for callback in self.on_profile_changed:
            callback(name)


def drift_dict(drift: Drift) -> dict[str, Any]:
    return asdict(drift)
