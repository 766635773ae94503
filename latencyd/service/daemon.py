"""Daemon: which profile is in force and why, independent of how it is asked (D-Bus, signals).

The process around it (arguments, main loop, watchers, signals) is latencyd.service.main.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from latencyd.core.capabilities import (
    FollowsDevices,
    FollowsTasks,
    HoldsResources,
    PlacesApplications,
    ReportsGrouped,
    declares,
)
from latencyd.core.compose import Held, compose
from latencyd.core.engine import (
    ADOPTED,
    Drift,
    Engine,
    Progress,
    Refused,
    SettingId,
    StepReport,
    Steps,
)
from latencyd.core.planning import SwitchPlan
from latencyd.core.plugin import (
    DeviceEvent,
    Plugin,
    Target,
    TaskEvent,
    Value,
    encode_target,
    in_one_go,
    names_a_task,
)
from latencyd.core.profile import Profile, ProfileInfo, ProfileLibrary
from latencyd.core.schema import shielded_cpus
from latencyd.cpuset import CpuSet
from latencyd.errors import (
    LatencydError,
    Location,
    NoSuchHold,
    NotPlaced,
    PermissionDenied,
    ProfileError,
)
from latencyd.kernel.boot import BootState, booted, compare, unmet
from latencyd.kernel.owners import Owner, OwnerIndex, read_owners
from latencyd.kernel.system import System, Writer
from latencyd.service.taskevents import coalesce
from latencyd.text import printable

log = logging.getLogger("latencyd")


@dataclass(frozen=True)
class Caller:
    """Who asked for a change: root may name profile files and apply root-only sections."""

    uid: int = 0
    name: str = "root"

    @property
    def is_root(self) -> bool:
        return self.uid == 0


ROOT = Caller()
# The variable a profile names its application's CPUs by (cpu-partitioning's): a hold
# that names its CPUs (HoldAndPlaceOn, run/hold --cpus) sets it.
CPUS_VARIABLE = "isolated_cores"
FOLLOW_UP_ROUNDS = 4  # generations of tasks started before their parent's settings landed
# Events kept while a change runs: past this many, what they would have done is done by
# re-expanding every section once the change is over (the rescan events that were lost
# ask for), so a fork storm during a long switch costs memory bounded by this.
MAX_DEFERRED = 4096


@dataclass(frozen=True)
class Hold:
    """An application holding a profile while it runs (D-Bus HoldProfile)."""

    cookie: int
    profile: str
    reason: str
    owner: str  # the holder's unique bus name; its holds end when it leaves the bus
    since: float
    pid: int | None = None  # the holder's process: it and its children are never moved
    placed: bool = False  # HoldAndPlace: the holder is put on the shielded CPUs
    # The holder's start time when it asked: with the pid, what tells it from a process
    # that got the pid after it exited (pids are reused), which must not be placed.
    start_time: int | None = None
    # The CPUs its application needs (its profile's shielded CPUs): the shield is the
    # union of every hold's, and a placed holder goes on its own only.
    cpus: CpuSet = field(default_factory=CpuSet)
    caller: Caller = field(default_factory=Caller)  # whose the hold is: how it is loaded
    asked: CpuSet | None = None  # the CPUs it named (HoldAndPlaceOn), if it did

    @property
    def name(self) -> str:
        return f"hold {self.cookie} ({self.profile})"


@dataclass
class Delays:
    """Event -> settings in place, per plugin, for status and the benchmarks."""

    ns: list[int] = field(default_factory=list)

    def add(self, delay_ns: int) -> None:
        self.ns.append(delay_ns)
        del self.ns[:-1000]

    def summary(self) -> dict[str, float]:
        d = sorted(self.ns)
        return {
            "count": len(d),
            "p50": round(d[len(d) // 2] / 1000, 1),
            "p99": round(d[min(len(d) - 1, int(len(d) * 0.99))] / 1000, 1),
            "max": round(d[-1] / 1000, 1),
        }


class Daemon:
    def __init__(
        self,
        system: System,
        plugins: dict[str, Plugin[Any, Any, Any]],
        library: ProfileLibrary,
        engine: Engine,
    ) -> None:
        self.system = system
        self.plugins = plugins
        self.library = library
        self.engine = engine
        # Sections in which a profile from the cluster's directory may do what only root
        # may (the config's cluster_allow_root); in every other, it is held to the admin
        # group's limits, whoever asks.
        self.cluster_allow_root: frozenset[str] = frozenset()
        self.active: Profile | None = None
        self.active_ref: str | None = None  # the name or path `active` was loaded by
        self.base: str | None = None  # the profile in force when nothing is held
        self.holds: dict[int, Hold] = {}  # by cookie, oldest first
        # The latest holds that asked to be placed and could not be (status shows them).
        self.not_placed: list[dict[str, Any]] = []
        self._next_cookie = 1
        self.last_error: str | None = None
        self.on_profile_changed: list[Callable[[str], None]] = []
        self.on_drift: list[Callable[[list[dict[str, Any]]], None]] = []
        self.task_source = "none"
        # Called with the profile about to be applied (watchers open and close here)...
        self.before_apply: list[Callable[[Profile | None], None]] = []
        # ...and after every change to what the engine owns (drift watches follow it).
        self.after_step: list[Callable[[], None]] = []
        self.delays: dict[str, Delays] = {}
        self.readback: dict[str, Any] = {}  # how settings without a file are read back
        # The change in progress (latencyd.service.operations runs them a slice at a time), how far
        # it has come, and the events that wait for it: they would see it half done.
        self.busy: str | None = None
        self.progress: Progress | None = None
        self._deferred: list[Callable[[], object]] = []
        # Other tuners running when the daemon started (latencyd.service.main says them).
        self.tuners: list[dict[str, Any]] = []
        self._waiting_tasks: list[TaskEvent] = []  # task events kept for _tasks_waited
        # How the machine booted: read once, it changes only with a reboot.
        self.boot = read_boot(system)
        # Applied settings the next boot brings into effect (Engine.pending), followed
        # after every step; told to on_pending_changed when there come to be some or none.
        self.reboot_pending: list[dict[str, str]] = []
        self.on_pending_changed: list[Callable[[bool], None]] = []
        self.after_step.append(self._follow_pending)

    # -- lifecycle --------------------------------------------------------------
    def start(self, profile: str | None, resume: bool = False) -> None:
        """Adopt what a previous run left in the journal, then apply the start-up profile
        incrementally: a restart changes only what the profile wants differently. With
        `resume`, the base profile the last `switch` or `off` chose is applied instead of
        `profile` (the configured default), after a restart, a crash, a stop or a reboot
        alike, as TuneD keeps `tuned-adm profile`: a boot into the kernel arguments a
        switch wrote finds them wanted, not taken out again. A noted profile that no
        longer loads gives way to `profile`."""
        adopted = self.engine.adopt() is not None
        default = profile
        if resume:
            found, kept = self.engine.journal.load_base()
            if found and kept != profile:
                log.info("resuming %s, the profile the last switch chose", kept or "none")
                profile = kept
        if profile:
            try:
                self.switch(profile)
            except LatencydError as exc:
                # A bad start-up profile must not keep the daemon (and latencyctl) away.
                self.last_error = str(exc)
                log.error("start-up profile %s not applied: %s", profile, exc)
                if default and default != profile:
                    log.info("applying the default profile %s instead", default)
                    with contextlib.suppress(LatencydError):  # said by switch's own log
                        self.switch(default)
        if adopted and self.active is None:
            problems = self.engine.off()
            log.warning(
                "restored the originals a previous run left%s",
                f" ({len(problems)} problems)" if problems else "",
            )
        self._stepped()

    def stop(self, restore: bool = True) -> list[str]:
        """Restore everything but the boot configuration (the default), or leave the tuning
        and the journal in place for the next start to adopt (on_stop = "keep"). Kernel
        arguments for the next boot stay either way: a stop is often a shutdown, and the
        reboot is what they were written for; only off or a switch away takes them out.
        The base profile stays noted: the next start (a reboot's) resumes it."""
        problems = self.engine.off(stopping=True) if restore else []
        for plugin in self.plugins.values():
            if declares(plugin, HoldsResources):
                cast(HoldsResources, plugin).close()
        return problems

    # -- requests -----------------------------------------------------------------
    def in_force(self) -> str | None:
        """The profile that should be active, by name: the holds' (composed), else the base
        profile. The base is not composed with holds: it is in force while nothing is."""
        if self.holds:
            return "+".join(dict.fromkeys(h.profile for h in holds_in_force(self.holds.values())))
        return self.base

    def held(self, holds: Iterable[Hold]) -> Profile:
        """The profile in force under `holds` (latencyd.core.compose): each caller's newest
        hold, composed; HoldConflict if two ask one machine-wide setting two ways."""
        loaded = [
            Held(h.name, self.load(h.profile, h.caller, h.asked)) for h in holds_in_force(holds)
        ]
        return compose(loaded, self.library.schemas)

    def _wanted(self) -> tuple[Profile | None, str | None]:
        """The profile in force now (None: nothing) and the name it goes by."""
        if self.holds:
            return self.held(self.holds.values()), self.in_force()
        if self.base is None:
            return None, None
        return self.load(self.base), self.base

    def load(self, ref: str, caller: Caller = ROOT, cpus: CpuSet | None = None) -> Profile:
        """A profile as `caller` may have it: only root names files and applies sections
        that can hand out root, and a profile from the cluster's directory is held to the
        admin group's limits whoever asks for it (a node agent asks as root), but in the
        sections the config's cluster_allow_root names. Every switch, hold, release,
        reload and re-apply loads through here, so a refusal leaves the profile in force
        as it is."""
        profile = self.library.load(ref, by_path=caller.is_root)
        if cpus is not None and CPUS_VARIABLE in profile.variables:
            profile = self.library.load(ref, caller.is_root, {CPUS_VARIABLE: cpus.to_list()})
        elif cpus is not None and not cpus.issubset(self.shielded(profile)):
            raise ProfileError(
                Location(profile.path),
                f"profile {profile.name} has no {CPUS_VARIABLE} variable to give CPUs {cpus}, "
                f"and they are not among the CPUs it shields ({self.shielded(profile) or 'none'})",
            )
        for name, options in profile.sections.items():
            if caller.is_root and not (
                profile.from_cluster and name not in self.cluster_allow_root
            ):
                continue
            plugin = self.plugins[name]
            reason = plugin.root_only(plugin.options_of(options))
            if reason is None:
                continue
            if not caller.is_root:
                raise PermissionDenied(
                    f"profile {profile.name} cannot be applied for {caller.name} "
                    f"(uid {caller.uid}): [{name}] {reason}; only root may apply it"
                )
            raise PermissionDenied(
                f"profile {profile.name} comes from the cluster ({profile.path}) and cannot "
                f"be applied: [{name}] {reason}; a cluster profile is held to the admin "
                f"group's limits unless this node's latencyd.conf says cluster_allow_root "
                f'= ["{name}"]'
            )
        if profile.booted_isolation == "require":
            why = unmet(self.shielded(profile), self.boot)
            if why is not None:
                # A refused switch writes nothing, [bootloader] write = true included. Such
                # a profile is still allowed, not a load error: once booted as it asks, it
                # keeps its arguments written (a profile without them would take them back
                # out). The message says how to get there.
                how = (
                    ". Nothing is applied, boot configuration included: have them written (a "
                    "profile with [bootloader] write = true, this one with booted_isolation = "
                    '"show"), then reboot'
                    if self.boot is not None
                    else ""
                )
                raise ProfileError(
                    profile.booted_isolation_at or Location(profile.path),
                    f'profile {profile.name}: booted_isolation = "require", but {why}{how}',
                )
        return profile

    def switch_steps(self, ref: str, caller: Caller = ROOT) -> Steps[StepReport | None]:
        """Set the base profile. It is applied now, unless a hold keeps another in force
        (then it is checked now and applied when the last hold is released)."""
        if self.holds:
            self.load(ref, caller)  # a bad profile is an error now, not at release time
            self.base = ref
            self._note_base()
            log.info("base profile set to %s; %s stays in force while held", ref, self.in_force())
            return None
        report = yield from self._apply_steps(self.load(ref, caller), ref)
        self.base = ref
        self._note_base()
        return report

    def _note_base(self) -> None:
        try:
            self.engine.journal.save_base(self.base)
        except LatencydError as exc:
            log.warning("%s: the next start will apply the default profile", exc)

    def hold_steps(
        self,
        ref: str,
        reason: str,
        owner: str,
        caller: Caller = ROOT,
        pid: int | None = None,
        placed: bool = False,
        cpus: CpuSet | None = None,
    ) -> Steps[tuple[int, StepReport]]:
        """Apply a profile for as long as the hold lasts (ReleaseProfile, or the holder
        leaving the bus). Holds compose (latencyd.core.compose): the profile in force is
        every hold's together, and a hold asking a machine-wide setting another hold sets
        otherwise is refused before anything changes. The holder's process and what it
        starts (the application) are exempt from moving user tasks; `placed`
        (HoldAndPlace: `latencyctl run`, `hold -- CMD`) also puts the holder on its
        hold's CPUs in the same apply, so the command it starts next is born there.
        `cpus` (HoldAndPlaceOn) names the hold's CPUs: the profile's isolated_cores, or,
        for a profile without it, which of the CPUs it shields the application gets."""
        profile = self.load(ref, caller, cpus)
        holder = self.system.task(pid) if pid is not None else None
        cookie = self._next_cookie
        hold = Hold(
            cookie, ref, reason, owner, time.time(), pid, placed,
            holder.start_time if holder is not None else None,
            cpus if cpus is not None else self.shielded(profile), caller, cpus,
        )  # fmt: skip
        if self.holds:
            profile = self.held([*self.holds.values(), hold])
        self._next_cookie += 1
        self.holds[cookie] = hold
        self._exempt()
        try:
            report = yield from self._apply_steps(profile, self.in_force() or ref)
        except (Exception, GeneratorExit):
            del self.holds[cookie]
            self._exempt()
            raise
        why = self._not_placed(pid) if placed and pid is not None and hold.cpus else None
        if why is not None:
            # Asked and not done is said: the hold is undone, and the caller told why.
            yield from self.release_steps(cookie)
            refused = {"pid": pid, "profile": ref, "reason": reason, "why": why}
            self.not_placed = [*self.not_placed[-9:], refused | {"since": time.time()}]
            log.warning("hold on %s by %s not placed: %s", ref, owner or "latencyd", why)
            raise NotPlaced(f"the application was not placed on the shielded CPUs: {why}")
        log.info("hold %d on %s by %s (%s)", cookie, ref, owner or "latencyd", reason or "-")
        return cookie, report

    def _not_placed(self, pid: int) -> str | None:
        """Why the holder `pid` is not where a plugin placing applications puts it."""
        for name, section in self.engine.sections.items():
            plugin = self.plugins[name]
            if declares(plugin, PlacesApplications):
                placing = cast(PlacesApplications[Any], plugin)
                why = placing.not_placed(section.expansion.rules, pid)
                if why is not None:
                    return why
        return None

    def release_steps(self, cookie: int) -> Steps[StepReport | None]:
        if cookie not in self.holds:
            held = ", ".join(str(c) for c in self.holds) or "none"
            raise NoSuchHold(f"no hold with cookie {cookie} (current holds: {held})")
        hold = self.holds.pop(cookie)
        log.info("hold %d on %s released", cookie, hold.profile)
        self._exempt()
        return (yield from self._apply_in_force())

    def release_owners_steps(self, gone: Callable[[str], bool], why: str) -> Steps[None]:
        """Holders that left the bus (exited, crashed, or the bus restarted): their holds end."""
        ended = [c for c, h in self.holds.items() if gone(h.owner)]
        for cookie in ended:
            hold = self.holds.pop(cookie)
            log.info("hold %d on %s ended: %s %s", cookie, hold.profile, hold.owner, why)
        if ended:
            self._exempt()
            yield from self._apply_in_force()

    def _apply_in_force(self) -> Steps[StepReport | None]:
        """After holds ended: what the holds left (composed) or the base profile, applied
        incrementally: what the remaining holds still need is not touched."""
        ref = self.in_force()
        if ref is None:
            self._restore_all()
            return None
        try:
            profile, ref = self._wanted()
            assert profile is not None and ref is not None
            return (yield from self._apply_steps(profile, ref))
        except LatencydError as exc:
            log.error(
                "could not apply %s after a hold ended; %s stays: %s",
                ref,
                self.active.name if self.active else "nothing",
                exc,
            )
            self.last_error = str(exc)
            return None

    def _apply_steps(self, profile: Profile, ref: str) -> Steps[StepReport]:
        self._before_apply(profile)
        try:
            report = yield from self.engine.apply_steps(profile)
        except (Exception, GeneratorExit):
            self._before_apply(self.active)  # the old profile stays, with its watchers
            raise
        finally:
            self._stepped()
        previous = self.active.name if self.active else None
        self.active = profile
        self.active_ref = ref
        for name, section in self.engine.sections.items():
            self.plugins[name].on_applied(section.expansion.rules)
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
        self._exempt()
        self.base = None
        self._note_base()
        return self._restore_all()

    def _restore_all(self) -> list[str]:
        problems = self.engine.off()
        had = self.active is not None
        self.active = None
        self.active_ref = None
        self._before_apply(None)
        self._stepped()
        log.info("all settings restored%s", f" ({len(problems)} problems)" if problems else "")
        if had:
            self._changed("")
        return problems

    def plan_steps(self, ref: str, caller: Caller = ROOT) -> Steps[SwitchPlan]:
        """What switching to `ref` would change now, loaded as the switch would load it,
        from what the engine holds (Engine.plan_steps): nothing written, journaled or held."""
        return (yield from self.engine.plan_steps(self.load(ref, caller)))

    def plan_json(self, switch_plan: SwitchPlan, show_tasks: bool = True) -> dict[str, Any]:
        """A plan as D-Bus's Plan answers it: each setting with its other owners (what
        else sets it, and when: one read of the machine's configuration), and under holds,
        that a switch now only sets the base profile."""
        out = switch_plan.as_json(self.plugins, show_tasks, read_owners(self.system))
        if self.holds:
            out["held"] = (
                f"{self.in_force()} is held: a switch now only sets the base "
                "profile, applied as planned here once the holds end"
            )
        return out

    def reload_steps(self) -> Steps[None]:
        """Re-read profiles; re-apply the one in force incrementally if its files changed."""
        if self.active_ref is not None:
            profile, ref = self._wanted()
            if profile is not None and ref is not None:
                yield from self._apply_steps(profile, ref)

    # The changes in one go (start-up, signals, tests); D-Bus runs them a slice at a time.
    switch = in_one_go(switch_steps)
    hold = in_one_go(hold_steps)
    release = in_one_go(release_steps)
    release_owners = in_one_go(release_owners_steps)
    reload = in_one_go(reload_steps)
    _apply = in_one_go(_apply_steps)

    # -- events wait for a change in progress -------------------------------------------
    def deferred(self, action: Callable[[], object]) -> bool:
        """While a change runs a slice at a time, an event (a new thread, a device, a
        drift check) would see it half done: it is kept for later. True if it was."""
        if self.busy is None:
            return False
        log.debug("an event waits for the change in progress")
        if len(self._deferred) < MAX_DEFERRED:
            self._deferred.append(action)
        elif len(self._deferred) == MAX_DEFERRED:
            log.warning(
                "more than %d events waited for %s: every section is re-expanded after it",
                MAX_DEFERRED, self.busy,
            )  # fmt: skip
            self._deferred = [self._refresh_all]
        return True

    def _refresh_all(self) -> None:
        if self.active is not None:
            self.refresh(list(self.active.sections))

    def run_deferred(self) -> None:
        """The events that waited, once the change is over, in the order they came."""
        actions, self._deferred = self._deferred, []
        for action in actions:
            try:
                action()
            except Exception:  # one event's failure must not lose the others
                log.exception("handling an event that waited for a change")

    # -- keeping it applied -----------------------------------------------------------
    def refresh(self, names: Iterable[str]) -> StepReport | None:
        """Re-expand some sections (new IRQs, a rescan), re-applying what the kernel lost."""
        if self.active is None:
            return None
        wanted = [n for n in names if n in self.active.sections]
        if not wanted:
            return None
        try:
            return self.engine.apply(self.active, only=wanted)
        finally:
            self._stepped()

    def on_device_events(self, events: list[DeviceEvent]) -> None:
        """udev events: CPUs re-resolve the profile; devices go to the plugins that follow
        them, as settings for just those devices (one engine step per plugin for all the
        events read together) or as a re-expansion of the section."""
        if self.deferred(lambda: self.on_device_events(events)):
            return
        if self.active is None:
            return
        started = time.monotonic_ns()
        if any(e.subsystem == "cpu" for e in events):
            self.machine_changed()
            return
        events = without_covered(events)
        for name in list(self.active.sections):
            plugin = self.plugins[name]
            mine = [e for e in events if e.action in plugin.follows.udev.get(e.subsystem, ())]
            if not mine:
                continue
            try:
                report = self._device_step(name, plugin, mine)
            except LatencydError as exc:
                log.error("applying the profile to new devices failed: %s", exc)
                continue
            if report is not None and (report.applied or report.restored):
                log.info(
                    "[%s] %s: %d applied, %d restored in %.1f ms",
                    name,
                    ", ".join(f"{e.subsystem} {e.name} {e.action}" for e in mine),
                    report.applied,
                    report.restored,
                    report.seconds * 1000,
                )
            delays = self.delays.setdefault(name, Delays())
            for _ in mine:
                delays.add(time.monotonic_ns() - started)

    def _device_step(
        self, name: str, plugin: Plugin[Any, Any, Any], events: list[DeviceEvent]
    ) -> StepReport | None:
        """The settings the events' devices need, in one step; the whole section is
        expanded again if the plugin cannot handle an event in place."""
        section = self.engine.sections.get(name)
        owned = self.engine.owned(name)
        wanted: dict[SettingId, Value] = {}
        touched: set[SettingId] = set()
        for event in events:
            update = (
                cast(FollowsDevices[Any], plugin).on_device(section.expansion.rules, event, owned)
                if section and declares(plugin, FollowsDevices)
                else None
            )
            if update is None:
                return self.refresh([name])
            settings, targets = update
            wanted.update({(name, t): v for t, v in settings.items()})
            touched.update((name, t) for t in targets)
        # Owned targets the events concern that the devices no longer want (a rename that
        # stops matching) are given back; the rest of the section is left alone.
        drop = [sid for sid in touched if sid not in wanted and sid in self.engine.applied]
        try:
            return self.engine.update(name, wanted, drop, touched | set(wanted))
        finally:
            self._stepped()

    def on_task_events(self, events: list[TaskEvent]) -> None:
        """New or renamed threads: give them their settings now; lost events mean rescan."""
        if self.busy is not None:
            self._wait_for_change(events)
            return
        if self.active is None:
            return
        followers = [n for n in self.active.sections if declares(self.plugins[n], FollowsTasks)]
        if not followers:
            return
        if any(e.lost for e in events):
            log.warning("task events were lost: rescanning")
            self.refresh(followers)
            return
        for name in followers:
            section = self.engine.sections.get(name)
            if section is None:
                continue
            plugin = cast(FollowsTasks[Any, Any], self.plugins[name])
            owned = self.engine.owned(name)
            settings: dict[Target, Value] = {}
            timed: list[TaskEvent] = []
            for event in events:
                got = plugin.on_task(section.expansion.rules, event, owned)
                if got:
                    settings.update(got)
                    timed.append(event)
            if not settings:
                continue
            try:
                refused = dict(self.engine.extend(name, settings).not_applicable)
                # What those tasks started before the write did not inherit it: asked now.
                for _ in range(FOLLOW_UP_ROUNDS):
                    more = plugin.started_meanwhile(
                        section.expansion.rules, self.engine.owned(name)
                    )
                    if not more:
                        break
                    refused.update(self.engine.extend(name, more).not_applicable)
                self._say_refused(name, refused)
            except LatencydError as exc:
                log.error("pinning new threads failed: %s", exc)
                continue
            finally:
                self._stepped()
            log.debug("%s: %d setting(s) for new threads", name, len(settings))
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            for event in timed:
                if event.time_ns:
                    self.delays.setdefault(name, Delays()).add(now - event.time_ns)

    def _say_refused(self, name: str, refused: Mapping[SettingId, Refused]) -> None:
        """New threads' settings the kernel refused, in one line (status lists each under
        not applicable): what a profile asked for is never dropped unsaid."""
        if not refused:
            return
        (target, first), more = next(iter(refused.items())), len(refused) - 1
        log.warning(
            "[%s] %s: not applicable: %s%s",
            name,
            self.plugins[name].describe(target[1], first.wanted),
            first.reason,
            f" (and {more} more setting(s) for new threads: status lists them)" if more else "",
        )

    def _wait_for_change(self, events: list[TaskEvent]) -> None:
        """Task events while a change runs: kept in one list for one handler (at the place
        of the first in the order events came), one per task and kind (the handler reads
        each task as it is by then), at most MAX_DEFERRED; past that, a rescan once the
        change is over, as lost events ask. A rename flood during a long switch then
        costs memory bounded by that, not by batches times their size."""
        if self._tasks_waited not in self._deferred:  # the first, or dropped for a refresh
            self._waiting_tasks = []
            self.deferred(self._tasks_waited)
        waiting = coalesce(self._waiting_tasks + events)
        if len(waiting) > MAX_DEFERRED:
            waiting = [TaskEvent("lost", 0, 0, lost=True)]
        self._waiting_tasks = waiting

    def _tasks_waited(self) -> None:
        events, self._waiting_tasks = self._waiting_tasks, []
        if events:
            self.on_task_events(events)

    def machine_changed(self) -> None:
        """CPUs went on/offline: re-resolve the profile's CPU lists ("all") and re-apply."""
        if self.deferred(self.machine_changed):
            return
        self.library.machine = self.system.machine()
        if self.active_ref is not None:
            try:
                profile, ref = self._wanted()
                if profile is not None and ref is not None:
                    self._apply(profile, ref)
            except LatencydError as exc:
                log.error("re-applying after a CPU change failed: %s", exc)

    def check(self, verify: Iterable[SettingId] | None = None) -> list[dict[str, Any]]:
        """The safety-net tick: pick up new targets, then verify what we own (everything,
        or the settings given)."""
        if self.busy is not None:  # the next tick checks again
            return []
        if self.active is None:
            return []
        changed = [
            n for n, s in self.engine.sections.items() if self.plugins[n].changed(s.expansion.rules)
        ]
        if changed:
            log.info("new targets for %s: re-applying", ", ".join(sorted(changed)))
            try:
                self.refresh(changed)
            except LatencydError as exc:
                log.error("applying the profile to new targets failed: %s", exc)
        return self.check_drift(verify)

    def check_drift(
        self, sids: Iterable[SettingId] | None, writers: Mapping[SettingId, Writer] | None = None
    ) -> list[dict[str, Any]]:
        """Verify some (or all) owned settings; put drift back or report it, per section,
        naming the process that wrote a setting where the file watch saw it (`writers`)."""
        if sids is not None:
            sids = list(sids)
        if self.deferred(lambda: self.check_drift(sids, writers)):
            return []
        drifts: list[Drift] = self.engine.verify(sids)
        if not drifts:
            return []
        records = self.engine.handle_drift(drifts, read_owners(self.system), writers)
        for callback in self.on_drift:
            callback(records)
        return records

    def verify(self) -> list[Drift]:
        return self.engine.verify()

    # -- reads --------------------------------------------------------------------------
    def list_profiles(self) -> list[ProfileInfo]:
        return self.library.all()

    def _applied_rows(
        self,
        name: str,
        plugin: Plugin[Any, Any, Any],
        owned: list[tuple[Target, Value]],
        notes: Mapping[Target, str],
        owners: OwnerIndex,
        shown: dict[Owner, int],
    ) -> list[dict[str, Any]]:
        """Status rows of one plugin's owned settings: one per setting, except that
        targets of one `group` with the same value and original are one row (the
        threads of a process), so status stays small and fast beside 50,000 threads.
        A row's other owners are indices into `shown` (the plugin's table of them: one
        irqbalance is named once, not once for each of 4,096 IRQs)."""
        rows: list[dict[str, Any]] = []
        groups: dict[tuple[Hashable, str, str], tuple[int, list[Target]]] = {}
        originals = self.engine.originals
        grouped = declares(plugin, ReportsGrouped)
        grouper = cast(ReportsGrouped[Target], plugin) if grouped else None
        for t, value in owned:
            key = grouper.group(t) if grouper and value is not ADOPTED and t not in notes else None
            if key is not None:
                group = (key, repr(value), repr(originals.get((name, t))))
                if group in groups:
                    groups[group][1].append(t)
                    continue
                groups[group] = (len(rows), [t])
            rows.append(
                {
                    "target": encode_target(t),
                    "value": None if value is ADOPTED else value,  # not re-applied yet
                    "original": originals.get((name, t)),
                    "text": plugin.describe(t, "(adopted)" if value is ADOPTED else value),
                    "note": notes.get(t, ""),
                    "owners": [shown.setdefault(o, len(shown)) for o in owners.of(t.claims())],
                }
            )
        for at, targets in groups.values():
            if len(targets) > 1:
                rows[at]["targets"] = len(targets)
                assert grouper is not None
                rows[at]["text"] = grouper.describe_group(targets, rows[at]["value"])
        return rows

    def status(self, sees_tasks: bool = True) -> dict[str, Any]:
        """What is in force, per plugin what is applied, refused and measured. A caller
        who may not see other users' tasks (`sees_tasks` false: not root, not in the admin
        group) gets it as hidepid would have it: settings of tasks (names_a_task) and table
        rows naming tasks left out and counted ("hidden"), or shown without their pids and
        names (Table.hide_tasks), and no holder's pid, bus name or reason."""
        plugins: dict[str, Any] = {}
        hidden: dict[str, int] = {}

        def shown(plugin: str, target: Target) -> bool:
            if sees_tasks or not names_a_task(target):
                return True
            hidden[plugin] = hidden.get(plugin, 0) + 1
            return False

        owned: dict[str, list[tuple[Target, Value]]] = {}
        for (p, t), value in self.engine.applied.items():
            if shown(p, t):
                owned.setdefault(p, []).append((t, value))
        refusals: dict[str, list[tuple[SettingId, Refused]]] = {}
        for sid, refusal in self.engine.not_applicable.items():
            if shown(*sid):
                refusals.setdefault(sid[0], []).append((sid, refusal))
        index = read_owners(self.system)
        for name, plugin in self.plugins.items():
            section = self.engine.sections.get(name)
            notes = section.expansion.notes if section else {}
            others: dict[Owner, int] = {}
            applied = self._applied_rows(name, plugin, owned.get(name, []), notes, index, others)
            refused = [
                {
                    "target": encode_target(t),
                    "text": plugin.describe(t, r.wanted),
                    "reason": r.reason,
                }
                for (p, t), r in refusals.get(name, ())
            ] + [
                {"target": None, "text": what, "reason": reason}
                for what, reason in (section.expansion.refused.items() if section else ())
            ]
            monitor = plugin.monitor(section.expansion.rules) if section else None
            facts = dict(monitor.facts) if monitor else {}
            if name in self.delays and self.delays[name].ns:
                facts["event_to_applied_us"] = self.delays[name].summary()
            if applied or refused or section or name in hidden:
                plugins[name] = {
                    "applied": applied,
                    "not_applicable": refused,
                    "tables": [t.as_json(sees_tasks) for t in monitor.tables] if monitor else [],
                    "facts": facts,
                    "on_drift": self.engine.on_drift(name),
                    "owners": [o.as_json() for o in others],
                }
                if name in hidden:
                    plugins[name]["hidden"] = hidden[name]
                fixed = self.active.fixed.get(name, {}) if self.active else {}
                if fixed:  # options the daemon's config set over the profile's
                    plugins[name]["fixed"] = {opt: str(where) for opt, where in fixed.items()}
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
                    # by default the held command's whole command line: the holder's own
                    "reason": h.reason if sees_tasks else None,
                    "owner": h.owner if sees_tasks else None,
                    "pid": h.pid if sees_tasks else None,
                    "since": h.since,
                    "cpus": h.cpus.to_list(),
                    # the application: the holder and the processes it started
                    "tasks": tasks if sees_tasks else None,
                    # and the cpuset cgroup each runs in ({pid: cgroup}; "" once exited)
                    "cgroups": self._cgroups_of(tasks) if sees_tasks else None,
                }
                for h, tasks in ((h, self._tasks_of(h)) for h in self.holds.values())
            ],
            "last_error": self.last_error,
            # holds that asked to be placed and were refused (their holder's pid and
            # reason for root and the admin group only)
            "not_placed": [
                n if sees_tasks else n | {"pid": None, "reason": None} for n in self.not_placed
            ],
            # A change running a slice at a time: what, and how many settings of how many
            # it has read or written (the rest of status is as before it began).
            "in_progress": (
                {
                    "what": self.busy,
                    "done": self.progress.done if self.progress else 0,
                    "total": self.progress.total if self.progress else 0,
                }
                if self.busy
                else None
            ),
            "task_events": self.task_source,
            "readback": self.readback,
            "boot": self.boot_status(),
            "reboot_pending": self.reboot_pending,
            "other_tuners": self.tuners,
            "plugins": plugins,
        }

    def _follow_pending(self) -> None:
        was = bool(self.reboot_pending)
        self.reboot_pending = [
            {"plugin": sid[0], "text": self.plugins[sid[0]].describe(sid[1], value), "reason": why}
            for sid, value, why in self.engine.pending()
        ]
        if bool(self.reboot_pending) != was:
            for callback in self.on_pending_changed:
                callback(not was)

    def shielded(self, profile: Profile | None = None) -> CpuSet:
        """The CPUs a profile (the active one) keeps for the application (Option.shields)."""
        profile = profile or self.active
        found = CpuSet()
        for name, options in profile.sections.items() if profile else ():
            if name in self.plugins:
                found = found | shielded_cpus(self.plugins[name].schema, options)
        return found

    def boot_status(self) -> dict[str, Any] | None:
        """The booted isolation, and what it gives the CPUs the profile shields."""
        if self.boot is None:
            return None
        shield = self.shielded()
        return self.boot.as_json() | {
            "shielded": shield.to_list(),
            "booted_isolation": self.active.booted_isolation if self.active else "show",
            "findings": [f.as_json() for f in compare(shield, self.boot)],
        }

    def _tasks_of(self, hold: Hold) -> list[int]:
        """The hold's application: its holder and what it started, while it is the holder."""
        if hold.pid is None or not self._still_the_holder(hold):
            return []
        return [hold.pid, *self.system.children(hold.pid)]

    def _cgroups_of(self, pids: list[int]) -> dict[str, str]:
        """The cgroup each task runs in (its cpuset's, where the cpuset controller is)."""
        return {str(pid): self.system.task_cgroup(pid) or "" for pid in pids}

    def _exempt(self) -> None:
        holders = [h for h in self.holds.values() if h.pid and self._still_the_holder(h)]
        # A hold that asked to be placed and needs no CPUs (its profile shields none,
        # another hold's shield is in force) is an application like any other: kept off
        # the shield, not exempt from it.
        pids = frozenset(h.pid for h in holders if h.pid and (h.cpus or not h.placed))
        # A hold that needs no CPUs (its profile shields none) has none to be placed on.
        placed = {h.pid: h.cpus for h in holds_in_force(holders) if h.pid and h.placed and h.cpus}
        for plugin in self.plugins.values():
            if declares(plugin, PlacesApplications):
                cast(PlacesApplications[Any], plugin).holders(pids, placed)

    def _still_the_holder(self, hold: Hold) -> bool:
        """The hold's pid is still the process that asked (not one that reused the pid)."""
        task = self.system.task(hold.pid) if hold.pid else None
        return task is not None and task.start_time == hold.start_time

    def _before_apply(self, profile: Profile | None) -> None:
        for hook in self.before_apply:
            hook(profile)

    def _stepped(self) -> None:
        for hook in self.after_step:
            hook()

    def _changed(self, name: str) -> None:
        for callback in self.on_profile_changed:
            callback(name)


def holds_in_force(holds: Iterable[Hold]) -> list[Hold]:
    """The holds in force: each caller's (bus connection's) newest, in the order of those.
    One caller's holds stack (measure holds its next scenario before it lets the last go);
    different callers' compose."""
    newest: dict[str, Hold] = {}
    for hold in holds:
        newest.pop(hold.owner, None)
        newest[hold.owner] = hold
    return list(newest.values())


def without_covered(events: list[DeviceEvent]) -> list[DeviceEvent]:
    """Events of sub-devices (a NIC's queues) whose device was added or renamed in the same
    batch are covered by that event: plugins tune a device as a whole when it appears."""
    whole = {e.devpath for e in events if e.action in ("add", "move") and e.devpath}
    return [e for e in events if not (whole and _under(e.devpath, whole))]


def _under(devpath: str, devices: set[str]) -> bool:
    """Whether a parent of `devpath` is one of `devices` (string work: a burst of
    hundreds of NICs brings thousands of queue events)."""
    while "/" in devpath:
        devpath = devpath.rpartition("/")[0]
        if devpath in devices:
            return True
    return False


def read_boot(system: System) -> BootState | None:
    """The booted isolation, said in the log (what the kernel ignored of it as warnings);
    None where the machine does not show it (a fake root without /proc/cmdline)."""
    try:
        state = booted(system.boot_readings())
    except LatencydError as exc:
        log.info("the booted isolation is not known here: %s", exc)
        return None
    args = " ".join(str(a) for a in state.args) or "none"
    log.info("booted with isolation arguments: %s", printable(args))
    for problem in state.problems:
        log.warning("kernel command line: %s", printable(problem))
    return state
