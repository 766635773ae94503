"""Engine: turns "what the profile wants" into kernel state as one transaction.

plan = diff(applied, wanted) -> journal originals (fsync) -> apply -> read back
-> verify; any failure rolls back everything changed in the step. Switching
profiles is the same diff, so settings two profiles share are never touched.

The engine owns, once for every plugin: the journal, rollback, the drift policy
(`on_drift`, valid in any section), turning refusals into "not applicable, with
the reason" (per kind of target), dropping targets that vanished, and the rules
each applied section keeps for targets that appear later. Whose a setting is (latencyd's
alone, or shared with its user) is each plugin's Ownership (latencyd.core.sharing), which
the engine calls at the same points for every plugin.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
from collections.abc import Callable, Collection, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from latencyd.core.capabilities import (
    ActsAtBoot,
    RemembersInStep,
    ReportsGrouped,
    SharesWithUser,
    TookOver,
    declares,
)
from latencyd.core.journal import Journal, JournalKey, JournalState, key_of
from latencyd.core.planning import CHANGE, NOT_APPLICABLE, UNCHANGED, PlannedSetting, SwitchPlan
from latencyd.core.plugin import (
    Expansion,
    Options,
    OwnedSettings,
    Plugin,
    Settings,
    Target,
    Value,
    decode_target,
    encode_target,
    in_one_go,
    names_a_task,
    target_kinds,
)
from latencyd.core.profile import Profile
from latencyd.core.schema import Choice, Option, Schema
from latencyd.core.sharing import Outcome, Ownership, ownership_of
from latencyd.errors import (
    ApplyFailed,
    Cancelled,
    JournalError,
    KernelRefused,
    LatencydError,
    LeftInPlace,
    NotApplicable,
)
from latencyd.kernel.owners import OwnerIndex
from latencyd.kernel.system import Writer

log = logging.getLogger(__name__)

SettingId = tuple[str, Target]  # (plugin name, target)
SECTION = "[section]"  # the `refused` key for a whole section that cannot apply

# Options every section has, owned by the engine rather than by any plugin.
ENGINE_OPTIONS = (
    Option(
        "on_drift",
        Choice(("reapply", "report")),
        "When something else changes a setting this section owns: put it back, or only "
        "report it (log and D-Bus signal Drift)",
        default="reapply",
    ),
)


ENGINE_OPTION_NAMES = frozenset(o.name for o in ENGINE_OPTIONS)

# A long step (thousands of tasks) gives its caller back control at least this often, so
# the daemon's main loop keeps answering (status, off) while it runs.
SLICE_S = 0.02
# Originals journaled at a time while they are read (a few milliseconds of a slice).
JOURNAL_BATCH = 1024


@dataclass(frozen=True)
class Progress:
    """How far a step has come: `done` of `total` settings read or written."""

    done: int
    total: int


T = TypeVar("T")
Steps = Generator[Progress, None, T]  # work done a slice at a time, then its result


class Slices:
    """Says when a loop has run for a slice (SLICE_S) and should give control back."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        self.until = time.perf_counter() + SLICE_S

    def due(self) -> bool:
        self.done += 1
        if time.perf_counter() < self.until:
            return False
        self.until = time.perf_counter() + SLICE_S
        return True

    @property
    def progress(self) -> Progress:
        return Progress(self.done, self.total)


def section_schemas(plugins: Mapping[str, Plugin[Any, Any, Any]]) -> dict[str, Schema]:
    """Each plugin's schema with the engine's own options added: what a section may hold."""
    return {name: p.schema.extended(ENGINE_OPTIONS) for name, p in plugins.items()}


def plugin_options(section: Options) -> dict[str, Any]:
    """A section without the engine's own options: what the plugin sees."""
    return {k: v for k, v in section.items() if k not in ENGINE_OPTION_NAMES}


class _Unknown:
    """The applied value of a setting adopted from the journal after a restart: we own it
    and know its original, but not what the last run set it to."""

    def __repr__(self) -> str:
        return "<adopted>"


ADOPTED: Any = _Unknown()
_APPLYING: Any = object()  # Engine._rules: the rules of the apply running, if any


class Owned(OwnedSettings):
    """One plugin's applied settings: a view on the engine's table, so a task event that
    asks "is this thread mine?" costs one lookup, not a copy of every owned setting. One
    adopted from the journal is given as the kernel holds it now (what the last run set):
    the placeholder never reaches a plugin; one that cannot be read any more is absent."""

    def __init__(self, engine: Engine, name: str) -> None:
        self._engine, self._name = engine, name

    def __getitem__(self, target: Target) -> Value:
        value = self._engine.applied[(self._name, target)]
        if value is ADOPTED:
            try:
                return self._engine.plugins[self._name].read(target)
            except LatencydError:
                raise KeyError(target) from None
        return value

    def __contains__(self, target: object) -> bool:
        try:
            self[target]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[Target]:
        return (t for p, t in list(self._engine.applied) if p == self._name and t in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def original(self, target: Target) -> Value | None:
        return self._engine.originals.get((self._name, target))

    def of_device(self, device: str) -> set[Target]:
        return {t for t in self._engine.by_device.get((self._name, device), ()) if t in self}


@dataclass(frozen=True)
class Drift:
    plugin: str
    target: Target
    wanted: Value
    actual: Value
    text: str  # the setting as the profile wants it, in words

    def as_json(self, show_tasks: bool = True) -> dict[str, Any]:
        """The drift for Verify; a task's (pid, name, CPUs) only with `show_tasks` (root
        and the admin group), else its plugin and kind alone."""
        if not show_tasks and names_a_task(self.target):
            hidden = "a task's setting (hidden)"
            target = {"kind": type(self.target).kind}
            return {"plugin": self.plugin, "target": target, "setting": hidden,
                    "wanted": None, "actual": None}  # fmt: skip
        return {
            "plugin": self.plugin,
            "target": encode_target(self.target),
            "setting": self.text,
            "wanted": self.wanted,
            "actual": self.actual,
        }


@dataclass
class Plan:
    """What one step will do; computed without touching the kernel."""

    restore: list[SettingId] = field(default_factory=list)
    apply: dict[SettingId, Value] = field(default_factory=dict)
    keep: list[SettingId] = field(default_factory=list)


def plan(
    applied: Mapping[SettingId, Value],
    wanted: Mapping[SettingId, Value],
    scope: Collection[str] | None = None,
    restore: Collection[SettingId] = (),
) -> Plan:
    """Pure diff: restore what is no longer wanted, apply what is new or different.

    `scope` limits which plugins' applied settings may be restored (None: all; an empty
    scope only adds settings for new targets); `restore` names more to restore. Restores
    come newest first, as `off` gives them back: a task is moved out of a cgroup before
    the cgroup goes, each move its own (written, reported and planned as one).
    """
    result = Plan()
    # An empty scope (new targets: a thread, a NIC) looks only at what it names, so the
    # step costs what it changes, not what is owned.
    candidates = applied if scope is None or scope else [s for s in restore if s in applied]
    for sid in reversed(list(candidates)):
        if sid not in wanted and (scope is None or sid[0] in scope or sid in restore):
            result.restore.append(sid)
    for sid, value in wanted.items():
        if sid in applied and applied[sid] == value:
            result.keep.append(sid)
        else:
            result.apply[sid] = value
    return result


@dataclass(frozen=True)
class Section:
    """An applied profile section: its options and its expansion, whose rules tune the
    targets that appear later."""

    options: Options
    expansion: Expansion[Any] = field(default_factory=Expansion)


@dataclass(frozen=True)
class Refused:
    """A setting this machine cannot take: what was wanted, and why not."""

    wanted: Value
    reason: str


Change = tuple[Target, Value, Value]  # a setting written: (target, before, after)


@dataclass
class StepReport:
    applied: int = 0
    restored: int = 0
    unchanged: int = 0
    not_applicable: dict[SettingId, Refused] = field(default_factory=dict)
    seconds: float = 0.0
    changes: dict[str, list[Change]] = field(default_factory=dict)  # by plugin

    def changed(self, plugin: str, target: Target, before: Value, after: Value) -> None:
        self.changes.setdefault(plugin, []).append((target, before, after))


class Engine:
    def __init__(self, plugins: Mapping[str, Plugin[Any, Any, Any]], journal: Journal) -> None:
        self.plugins = plugins
        self.journal = journal
        self.applied: dict[SettingId, Value] = {}
        # (plugin, device) -> its owned targets, and each plugin's count of them: kept with
        # `applied` by _own and _disown.
        self.by_device: dict[tuple[str, str], set[Target]] = {}
        self.owned_count: dict[str, int] = {}
        self.originals: dict[SettingId, Value] = {}
        self.not_applicable: dict[SettingId, Refused] = {}
        self.sections: dict[str, Section] = {}
        self._rules_ahead: dict[str, Any] = {}  # of the sections an apply is applying
        # Each plugin's Ownership (see ownership): latencyd's alone, made once; or, for a
        # plugin sharing its settings with their user, one per step (what it claims).
        self._ownerships: dict[str, Ownership[Any]] = {}
        self.profile: str | None = None
        self.last_step: StepReport | None = None
        self._changes: set[SettingId] | None = None  # see take_changes
        self._depth = 0  # steps in progress (see stepping)

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """One step for the plugins (RemembersInStep's begin_step, end_step), however nested, and
        each plugin's Ownership for it: made before anything is read or written, and what
        it left to a setting's user said at each turn and once the step is done."""
        self._depth += 1
        if self._depth == 1:
            self._own_afresh()
            for plugin in self._remembering():
                plugin.begin_step()
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._say_left()
                self._own_afresh(made=False)
                for plugin in self._remembering():
                    plugin.end_step()

    def _turn(self, progress: Progress) -> Steps[None]:
        """Give the main loop a turn. Meanwhile tasks exit and their pids are reused, so
        for the plugins a step ends here and a new one begins: nothing they kept of the
        machine (which process a pid is) outlives the turn, and each write is judged by
        what was read since (issue 37: a slow step wrote to a recycled pid). So what was
        left to a setting's user is said before, while its pid is still the task judged."""
        self._say_left()
        yield progress
        for plugin in self._remembering():
            plugin.end_step()
            plugin.begin_step()

    def _remembering(self) -> list[RemembersInStep]:
        """The plugins that keep what they read for a step (RemembersInStep)."""
        return [
            cast(RemembersInStep, p) for p in self.plugins.values() if declares(p, RemembersInStep)
        ]

    def _say_left(self) -> None:
        """Log what each plugin's Ownership left to a setting's user since it last said
        (Ownership.say, in the plugin's words): a plugin's words never fail its step."""
        for name, way in self._ownerships.items():
            try:
                way.say()
            except Exception:
                log.exception("[%s] saying what was left to its user", name)

    # -- what a profile wants -------------------------------------------------
    def owned(self, name: str) -> Owned:
        """Plugin `name`'s applied settings, as a view (see Owned)."""
        return Owned(self, name)

    def ownership(self, name: str) -> Ownership[Any]:
        """How plugin `name`'s settings are owned in the step running: latencyd's alone,
        or shared with their user (latencyd.core.sharing). Its values are judged by the
        rules being applied, or those that set them."""
        way = self._ownerships.get(name)
        plugin = self.plugins[name]
        if way is None or way.plugin is not plugin:
            judging = functools.partial(self._rules, name, _APPLYING)
            way = self._ownerships[name] = ownership_of(plugin, judging)
        return way

    def _own_afresh(self, made: bool = True) -> None:
        """Drop the shared ownerships of the last step (what they claimed), and, `made`,
        make this step's before anything is read or written (their plugins' handover)."""
        self._ownerships = {n: w for n, w in self._ownerships.items() if not w.per_step}
        if made:
            for name, plugin in self.plugins.items():
                if declares(plugin, SharesWithUser):
                    self.ownership(name)

    def _rules(self, name: str, ahead: Any, by_owner: bool) -> Any:
        """The rules plugin `name`'s values are judged by: those being applied (`ahead`;
        _APPLYING: the apply's), or, `by_owner`, those in force (that set them)."""
        section = self.sections.get(name)
        rules = section.expansion.rules if section else None
        if by_owner:
            return rules
        return self._rules_ahead.get(name, rules) if ahead is _APPLYING else ahead

    def expand_steps(
        self, profile: Profile, only: Iterable[str] | None = None, fresh: Collection[str] = ()
    ) -> Steps[dict[str, Expansion[Any]]]:
        """Each section's expansion (reads the machine, changes nothing), giving control
        back every slice (Plugin.expand_steps); its Progress counts no settings yet.
        Sections in `fresh` are expanded as if their plugin owned nothing (a plan of a
        section that starts afresh)."""
        names = (
            list(profile.sections) if only is None else [n for n in only if n in profile.sections]
        )
        out: dict[str, Expansion[Any]] = {}
        slices = Slices(0)
        for name in names:
            try:
                plugin = self.plugins[name]
                options = plugin.options_of(plugin_options(profile.sections[name]))
                owned = {} if name in fresh else self.owned(name)
                steps = plugin.expand_steps(options, owned)
                while True:
                    try:
                        next(steps)
                    except StopIteration as end:
                        out[name] = end.value
                        break
                    if slices.due():
                        yield from self._turn(Progress(0, 0))
            except NotApplicable as exc:
                out[name] = Expansion(refused={SECTION: str(exc)})
            except LatencydError as exc:
                raise ApplyFailed(f"[{name}]: {exc}") from exc
        return out

    def apply_steps(
        self, profile: Profile, only: Collection[str] | None = None
    ) -> Steps[StepReport]:
        """Make the kernel match `profile` (or re-expand only some of its sections), giving
        control back every slice (see switch_steps). A section whose settings must start
        afresh (Ownership.starts_afresh) has what it owns given back in a step of its own
        first, so its expansion reads the machine as that left it."""
        afresh = self._afresh(profile, only)
        if afresh:
            yield from self.switch_steps({}, self.profile, scope=afresh)
        expansions = yield from self.expand_steps(profile, only)
        wanted, current = _wanted(expansions)
        scope = None if only is None else set(only)
        self._rules_ahead = {name: exp.rules for name, exp in expansions.items()}
        try:
            report = yield from self.switch_steps(
                wanted, profile.name, scope, only is not None, current=current
            )
        finally:
            self._rules_ahead = {}
        if only is None:
            self.sections = {}
        for name, exp in expansions.items():
            self.sections[name] = Section(profile.sections[name], exp)
        return report

    def _afresh(self, profile: Profile, only: Collection[str] | None) -> list[str]:
        """Sections whose plugin must give back what it owns before they are expanded
        again (Ownership.starts_afresh: the first of its three points)."""
        return [
            name
            for name, options in profile.sections.items()
            if (only is None or name in only)
            and name in self.plugins
            and self.owned_count.get(name)
            and self.ownership(name).starts_afresh(options, self.owned(name))
        ]

    # -- a plan: what apply_steps would do, nothing written ---------------------
    def plan_steps(self, profile: Profile) -> Steps[SwitchPlan]:
        """What apply_steps(profile) would do to each setting, from what is owned and what
        the kernel holds now: the same expansion and the same diff (plan), each setting
        judged as _capture_originals, _apply_one and _restore_one judge it, with nothing
        written, journaled or held. A section that starts afresh is planned as given back
        whole, then expanded as if nothing were owned (the give-back itself is not done,
        so what its expansion reads is the machine as it is now)."""
        with self.stepping():
            afresh = self._afresh(profile, None)
            expansions = yield from self.expand_steps(profile, fresh=afresh)
            wanted, current = _wanted(expansions)
            applied = {sid: v for sid, v in self.applied.items() if sid[0] not in afresh}
            step = plan(applied, wanted)
            result = SwitchPlan(profile.name, self.profile, afresh=afresh)
            restores = [*(sid for sid in self.applied if sid[0] in afresh), *step.restore]
            slices = Slices(len(restores) + len(step.apply))
            ways: dict[str, Ownership[Any]] = {}  # each plugin's, judging by the rules planned
            for sid in restores:
                if slices.due():
                    yield from self._turn(slices.progress)
                planned = self._plan_restore(sid)
                if planned is not None:
                    result.settings.append(planned)
            for sid in step.keep:
                value = wanted[sid]
                result.settings.append(PlannedSetting(*sid, UNCHANGED, "keep", value, value))
            for sid, value in step.apply.items():
                if slices.due():
                    yield from self._turn(slices.progress)
                way = ways.get(sid[0])
                if way is None:  # judged by the rules the apply would apply
                    rules = functools.partial(self._rules, sid[0], expansions[sid[0]].rules)
                    way = ways[sid[0]] = ownership_of(self.plugins[sid[0]], rules)
                planned = self._plan_apply(sid, value, sid in applied, current, way)
                if planned is not None:
                    result.settings.append(planned)
            for name, exp in expansions.items():
                if exp.refused:
                    result.refused[name] = dict(exp.refused)
                plugin = self.plugins[name]
                needs = (
                    cast(ActsAtBoot[Target, Any], plugin).needs_boot(exp.rules)
                    if declares(plugin, ActsAtBoot) and exp.rules is not None
                    else []
                )
                if needs:
                    result.needs_boot[name] = needs
        return result

    plan_profile = in_one_go(plan_steps)

    def _plan_apply(
        self,
        sid: SettingId,
        value: Value,
        owned: bool,
        current: Mapping[SettingId, Value],
        way: Ownership[Any],
    ) -> PlannedSetting | None:
        """A setting the step would apply, judged as _capture_originals and _apply_one do;
        None where the step would drop it (gone, or someone else's)."""
        plugin, target = self.plugins[sid[0]], sid[1]
        if owned:  # re-applied with another value: written, unless adopted and as wanted
            now = self.applied[sid]
            if now is not ADOPTED:
                return PlannedSetting(*sid, CHANGE, "apply", now, value)
        try:
            now = current[sid] if sid in current and not owned else plugin.read(target)
        except (KernelRefused, NotApplicable) as exc:
            if not plugin.exists(target):
                return None  # gone between expand and now: nothing to tune
            if _not_applicable(target, exc):
                return PlannedSetting(
                    *sid, NOT_APPLICABLE, "apply", None, value, _reason(target, exc)
                )
            raise ApplyFailed(
                f"[{sid[0]}] cannot read {plugin.describe(target, value)} before changing it: {exc}"
            ) from exc
        if not owned and sid not in current and way.theirs(target, now):
            return None  # someone else's: the step leaves it alone (claimed by none)
        action = UNCHANGED if plugin.same(target, value, now) else CHANGE
        return PlannedSetting(*sid, action, "apply", now, value)

    def _plan_restore(self, sid: SettingId) -> PlannedSetting | None:
        """An owned setting the step would give back, judged as _restore_one does; None
        where its target is gone."""
        plugin, target = self.plugins[sid[0]], sid[1]
        if not plugin.exists(target):
            return None
        original, applied = self.originals[sid], self.applied[sid]
        try:
            now = plugin.read(target)
        except LatencydError:
            return PlannedSetting(*sid, CHANGE, "restore", None, original)  # the write says why
        if plugin.same(target, original, now):
            return PlannedSetting(*sid, UNCHANGED, "restore", now, original)
        way = self.ownership(sid[0])
        if (
            applied is not ADOPTED
            and not plugin.same(target, applied, now)
            and way.theirs(target, now, by_owner=True)
        ):
            return PlannedSetting(*sid, UNCHANGED, "restore", now, now)  # left as they set it
        return PlannedSetting(*sid, CHANGE, "restore", now, original)

    # -- one transaction ------------------------------------------------------
    def switch_steps(
        self,
        wanted: Mapping[SettingId, Value],
        profile: str | None,
        scope: Collection[str] | None = None,
        recheck: bool | Collection[SettingId] = False,
        restore: Collection[SettingId] = (),
        current: Mapping[SettingId, Value] | None = None,
    ) -> Steps[StepReport]:
        """Make the kernel match `wanted` (for plugins in `scope`, or all); all or nothing.

        `recheck` (all kept settings, or the given ones) reads kept settings back and
        re-applies those the kernel lost (an IRQ that vanished and came back).
        `restore` names owned settings to give back even outside `scope`.

        Yields its Progress every slice (SLICE_S) of reading and writing. Nothing else may
        step the engine until it ends; `throw` into it (Cancelled, say) rolls the step
        back like any failure.
        """
        with self.stepping():
            return (yield from self._switch(wanted, profile, scope, recheck, restore, current))

    # The same, in one go (start-up, events, tests).
    expand = in_one_go(expand_steps)
    apply = in_one_go(apply_steps)
    switch = in_one_go(switch_steps)

    def _switch(
        self,
        wanted: Mapping[SettingId, Value],
        profile: str | None,
        scope: Collection[str] | None,
        recheck: bool | Collection[SettingId],
        restore: Collection[SettingId],
        current: Mapping[SettingId, Value] | None = None,
    ) -> Steps[StepReport]:
        started = time.perf_counter()
        step = plan(self.applied, wanted, scope, restore)
        if recheck:
            self._recheck(step, None if recheck is True else recheck)
        report = StepReport(unchanged=len(step.keep))
        slices = Slices(2 * len(step.apply) + len(step.restore))
        journaled: list[SettingId] = []
        try:
            yield from self._capture_originals(step, report, slices, journaled, current or {})
        except (Exception, GeneratorExit) as exc:
            self._forget_unapplied()  # originals read for a step that never ran
            _quietly(lambda: self._save(journaled))  # and journaled: the journal drops them
            if isinstance(exc, Cancelled):
                raise ApplyFailed(f"{exc}. Nothing was changed.") from exc
            if isinstance(exc, LatencydError) or not isinstance(exc, Exception):
                raise
            raise ApplyFailed(
                f"reading the originals failed ({type(exc).__name__}: {exc}). Nothing was changed."
            ) from exc
        previous_profile = self.profile
        undo: list[Callable[[], None]] = []
        done: dict[SettingId, Value] = {}  # what this step owns afterwards, by sid
        touched = [*step.apply, *step.restore]
        try:
            self.profile = profile
            self._save(touched)
            for sid in step.restore:
                self._restore_one(sid, undo, report)
                report.restored += 1
                if slices.due():
                    yield from self._turn(slices.progress)
            for sid, value in step.apply.items():
                if slices.due():
                    yield from self._turn(slices.progress)
                if sid in report.not_applicable:
                    continue
                outcome = self._apply_one(sid, value, undo, report)
                if outcome is not None:
                    done[sid] = value
                    report.applied += outcome
        except (Exception, GeneratorExit) as exc:  # a plugin's bug, a cancel, close()
            self._roll_back(undo)
            self.profile = previous_profile
            self._forget_unapplied()
            self._save(touched)
            if not isinstance(exc, Exception):
                raise  # GeneratorExit: the step was dropped
            what = exc if isinstance(exc, LatencydError) else f"{type(exc).__name__}: {exc}"
            raise ApplyFailed(f"{what}. Nothing was changed: the step was rolled back.") from exc
        for sid in step.restore:
            self._disown(sid)
        for sid in step.apply:
            if sid in done:
                self._own(sid, done[sid])
            else:  # not applicable, or the target vanished
                self._disown(sid)
        if scope is None:
            self.not_applicable = dict(report.not_applicable)
        else:  # in place: a step for one new thread must not copy every refusal
            if scope:
                self.not_applicable = {
                    s: r for s, r in self.not_applicable.items() if s[0] not in scope
                }
            for sid in step.apply:
                self.not_applicable.pop(sid, None)
            self.not_applicable.update(report.not_applicable)
        # The journal already holds every original of this step; what it must lose now is
        # what the step gave back or dropped (not applicable, vanished).
        self._save([*step.restore, *(sid for sid in step.apply if sid not in done)])
        self._tell(report)
        report.seconds = time.perf_counter() - started
        self.last_step = report
        return report

    def _tell(self, report: StepReport) -> None:
        """Let each plugin say what the step changed, in as few log lines as it likes."""
        for name, changes in report.changes.items():
            plugin = self.plugins[name]
            if not declares(plugin, ReportsGrouped):
                continue  # status lists every setting
            try:
                cast(ReportsGrouped[Target], plugin).report(changes)
            except Exception:  # a plugin's words must never fail its step
                log.exception("[%s] reporting what changed", name)

    def extend(self, plugin: str, settings: Settings) -> StepReport:
        """Settings for new targets (a thread, a NIC): applied, nothing else touched."""
        return self.switch({(plugin, t): v for t, v in settings.items()}, self.profile, scope=())

    def update(
        self,
        plugin: str,
        wanted: Mapping[SettingId, Value],
        drop: Collection[SettingId],
        recheck: Collection[SettingId],
    ) -> StepReport:
        """One device's settings: apply `wanted`, give back `drop`, re-read `recheck`
        (a device that came back has its defaults again); the rest is left alone."""
        return self.switch(wanted, self.profile, scope=(), recheck=recheck, restore=drop)

    def _recheck(self, step: Plan, only: Collection[SettingId] | None) -> None:
        for sid in list(step.keep):
            if only is not None and sid not in only:
                continue
            plugin, target = self.plugins[sid[0]], sid[1]
            try:
                actual = plugin.read(target)
            except LatencydError:
                continue
            if not plugin.same(target, self.applied[sid], actual):
                step.keep.remove(sid)
                if not self._let_go(sid, actual):
                    step.apply[sid] = self.applied[sid]

    def _owned_by(self, name: str) -> Callable[[Target], tuple[Value, Value] | None]:
        """(original, applied) of one of plugin `name`'s applied targets, or None."""
        owned = self.owned(name)

        def lookup(target: Target) -> tuple[Value, Value] | None:
            sid = (name, target)
            if sid not in self.originals:
                return None
            try:
                return self.originals[sid], owned[target]  # adopted: as the kernel holds it
            except KeyError:
                return None

        return lookup

    def _forget_unapplied(self) -> None:
        self.originals = {s: v for s, v in self.originals.items() if s in self.applied}

    def _capture_originals(
        self,
        step: Plan,
        report: StepReport,
        slices: Slices,
        journaled: list[SettingId],
        current: Mapping[SettingId, Value],
    ) -> Steps[None]:
        """Read the original of each setting the step applies that is not owned yet (or
        take what its expansion just read: `current`), and journal them a slice at a time
        (into `journaled`): one journal write of 20,000 would hold the main loop for a
        tenth of a second. Each is claimed first (Ownership.claim: the second of its
        three points): one that is someone else's already leaves the step."""
        yield from self._turn(slices.progress)  # the diff that made `step` was a slice
        read: list[SettingId] = []
        for sid in list(step.apply):
            due = slices.due()
            if due or len(read) >= JOURNAL_BATCH:
                self._save(read)
                journaled += read
                read = []
            if due:
                yield from self._turn(slices.progress)
            if sid in self.originals:
                continue
            plugin, target = self.plugins[sid[0]], sid[1]
            try:
                now = current[sid] if sid in current else plugin.read(target)
                if not self.ownership(sid[0]).claim(target, now, sid in current):
                    del step.apply[sid]
                    continue
                self.originals[sid] = plugin.original(target, now, self._owned_by(sid[0]))
                read.append(sid)
            except (KernelRefused, NotApplicable) as exc:
                if not plugin.exists(target):
                    del step.apply[sid]  # gone between expand and now: nothing to tune
                    continue
                if _not_applicable(target, exc):
                    report.not_applicable[sid] = Refused(step.apply[sid], _reason(target, exc))
                    continue
                raise ApplyFailed(
                    f"[{sid[0]}] cannot read {plugin.describe(target, step.apply[sid])} "
                    f"before changing it: {exc}"
                ) from exc

    def _apply_one(
        self,
        sid: SettingId,
        value: Value,
        undo: list[Callable[[], None]],
        report: StepReport,
    ) -> int | None:
        """Write, read back, undo on failure: 1 if written, 0 if already as wanted, None
        if dropped (not applicable, gone, or left to its user). The write is the
        ownership's (the third of its three points)."""
        plugin, target = self.plugins[sid[0]], sid[1]
        way = self.ownership(sid[0])
        original = self.originals[sid]
        previous = self.applied.get(sid, original)
        new = sid not in self.applied or self.applied[sid] is ADOPTED
        wrote = False
        try:
            if previous is ADOPTED:  # after a restart: what is there now is what we undo to
                previous = plugin.read(target)
            outcome = way.write(target, value, previous, new)
            if outcome is Outcome.AS_WANTED:
                report.unchanged += 1  # record it, write nothing
                return 0
            if outcome is Outcome.LEFT:
                return None
            wrote = True
            undo.append(lambda: plugin.write(target, previous))
            actual = plugin.read(target)
            if not plugin.same(target, value, actual):
                if way.left(target, actual):
                    undo.pop()  # they set it right after us: theirs stays, nothing to undo
                    return None
                raise KernelRefused(
                    f"[{sid[0]}] {plugin.describe(target, value)}",
                    f"the kernel accepted the write but kept {actual!r}",
                )
            report.changed(sid[0], target, previous, value)
        except (KernelRefused, NotApplicable) as exc:
            gone = not plugin.exists(target)
            if gone or _not_applicable(target, exc):
                if not gone:
                    report.not_applicable[sid] = Refused(value, _reason(target, exc))
                if wrote:
                    undo.pop()
                # The step drops this setting: put the original back (also when an earlier
                # step applied it), or it would stay changed with nobody tracking it.
                if not gone and (wrote or sid in self.applied):
                    _quietly(lambda: way.give_back(target, original, previous, known=False))
                    if sid in self.applied:
                        undo.append(lambda: plugin.write(target, previous))
                return None
            if isinstance(exc, KernelRefused) and not exc.what.startswith("["):
                raise KernelRefused(
                    f"[{sid[0]}] {plugin.describe(target, value)}", str(exc)
                ) from exc
            raise
        return 1

    def _restore_one(
        self, sid: SettingId, undo: list[Callable[[], None]], report: StepReport
    ) -> None:
        plugin, target = self.plugins[sid[0]], sid[1]
        current = self.applied[sid]
        if not plugin.exists(target):
            return
        try:
            gave = self._give_back(sid, report)
        except NotApplicable as exc:
            _not_restored(sid, plugin, self.originals[sid], exc)
            return
        if gave and current is not ADOPTED:
            undo.append(lambda: plugin.write(target, current))

    def _give_back(self, sid: SettingId, report: StepReport) -> bool:
        """Restore one owned setting's original through its ownership (Ownership.
        give_back: not written where the kernel holds it already; where it is shared, not
        over what its user set since) and note it in `report`. False: left as its user
        set it."""
        target, current = sid[1], self.applied[sid]
        original = self.originals[sid]
        known = current is not ADOPTED
        outcome = self.ownership(sid[0]).give_back(target, original, current, known)
        if outcome is Outcome.WRITTEN:
            report.changed(sid[0], target, current if known else None, original)
        return outcome is not Outcome.LEFT

    def _roll_back(self, undo: list[Callable[[], None]]) -> None:
        for action in reversed(undo):
            try:
                action()
            except LatencydError as exc:
                log.error("rollback step failed: %s", exc)

    # -- restoring everything ---------------------------------------------------
    def off(self, stopping: bool = False) -> list[str]:
        """Restore every original, newest first, also of what plugins keep on disk that the
        journal lost (ActsAtBoot.kept_elsewhere); empty the journal. Returns problems, if any.
        `stopping` (the daemon stops: SIGTERM, a shutdown): settings whose kind is
        kept_at_stop (kernel arguments for the next boot) are left as they are, for their
        plugin's own record to give them to the next start."""
        with self.stepping():
            return self._off(stopping)

    def _off(self, stopping: bool) -> list[str]:
        problems = []
        report = StepReport()
        if not stopping:
            self._own_kept_elsewhere()
        for sid in reversed(list(self.applied)):
            plugin, target = self.plugins[sid[0]], sid[1]
            if stopping and type(target).kept_at_stop:
                shown = _what(plugin, target, self.applied[sid])
                log.info("[%s] %s: left for the next boot (only off or a switch away takes "
                         "it back)", sid[0], shown)  # fmt: skip
                continue
            try:
                self._give_back(sid, report)
            except NotApplicable as exc:
                _not_restored(sid, plugin, self.originals[sid], exc)
                if isinstance(exc, LeftInPlace):  # off gives everything back: it was not
                    problems.append(f"[{sid[0]}] {exc}")
            except Exception as exc:  # one bad setting must not keep the others changed
                # Asked only when the restore failed (a stat per setting was a fifth of
                # an off beside 20,000 threads): a target that is gone cannot be written.
                if not plugin.exists(target):
                    continue  # the thread/IRQ/device is gone: nothing to restore
                if not isinstance(exc, LatencydError):
                    log.exception("restoring %s", sid)
                problems.append(
                    f"[{sid[0]}] restoring {_what(plugin, target, self.originals[sid])}: {exc}"
                )
        for p in problems:
            log.error("%s", p)
        self._tell(report)
        self.applied.clear()
        self.by_device.clear()
        self.owned_count.clear()
        self.originals.clear()
        self.not_applicable.clear()
        self._changes = None
        self.sections.clear()
        self.profile = None
        self.journal.clear()
        return problems

    def adopt(self) -> JournalState | None:
        """Take over what a previous run left in the journal (a crash, `kill -9`, a restart
        with on_stop = "keep"): we own those settings and know their originals. The next
        apply changes only what it wants differently and restores only what it does not
        want, so a restart flips nothing back, even for a moment. Also what plugins keep on
        disk beyond the journal (ActsAtBoot.kept_elsewhere: the boot configuration after a
        reboot emptied /run). None: nothing to adopt."""
        try:
            state = self.journal.load()
        except JournalError as exc:
            aside = self.journal.set_aside()
            log.error("%s; moved it to %s and started without it", exc, aside)
            state = None
        kept = self._own_kept_elsewhere()
        if state is None:
            return JournalState() if kept else None
        stranded: dict[JournalKey, str] = {}
        for (name, key), original in state.originals.items():
            try:
                data = json.loads(key)
                heir = self._heir(name, data)
                plugin = self.plugins.get(heir)
                if plugin is None:
                    raise ValueError("plugin not installed")
                target = decode_target(target_kinds(plugin), data)
                _check_value(plugin, target, original)
            except (ValueError, RecursionError) as exc:  # any content: never crash at start
                stranded[(name, key)] = f"[{name}] {key}: {exc}"
                continue
            if (heir, target) in kept:
                continue  # its plugin's record on disk says the same
            self.originals[(heir, target)] = original
            self._own((heir, target), ADOPTED)
        self.profile = state.profile
        for line in stranded.values():
            log.error("journal entry cannot be restored: %s", line)
        # The journal, rewritten as what we now own: without the entries set aside. On a
        # full disk it stays as it is, which holds every original we own too.
        try:
            self.journal.save(JournalState(
                {(n, _key(t)): v for (n, t), v in self.originals.items()}, self.profile
            ))  # fmt: skip
        except JournalError as exc:
            log.error("%s; it still holds every original as it was", exc)
        log.warning(
            "adopted %d settings from the journal of a previous run (profile %s)",
            len(self.applied),
            state.profile or "none",
        )
        return state

    def _own_kept_elsewhere(self) -> list[SettingId]:
        """Own, as adopted, what plugins keep on disk beyond the journal (the boot
        configuration, after a reboot emptied /run, or after a write whose failure left
        it unowned), so off and a switch away give it back; those newly owned."""
        found: list[SettingId] = []
        for name, plugin in self.plugins.items():
            if not declares(plugin, ActsAtBoot):
                continue
            try:
                kept = cast(ActsAtBoot[Target, Any], plugin).kept_elsewhere()
            except LatencydError as exc:
                log.error("[%s] reading what it keeps on disk: %s", name, exc)
                continue
            for target, original in kept.items():
                sid = (name, target)
                if sid not in self.applied:
                    self.originals[sid] = original
                    self._own(sid, ADOPTED)
                    found.append(sid)
        if found:
            log.info("adopted %d setting(s) whose plugins keep them on disk", len(found))
            with contextlib.suppress(JournalError):  # off gives them back even so
                self._save(found)
        return found

    def _heir(self, name: str, target: Any) -> str:
        """The plugin a journaled target of plugin `name` belongs to now: `name`, unless
        it no longer has that kind of target and another plugin took it over
        (TookOver)."""
        kind = target.get("kind") if isinstance(target, dict) else None
        plugin = self.plugins.get(name)
        if not isinstance(kind, str) or (plugin and kind in target_kinds(plugin)):
            return name
        for heir, other in self.plugins.items():
            if declares(other, TookOver) and cast(TookOver, other).took_over.get(kind) == name:
                return heir
        return name

    def pending(self) -> list[tuple[SettingId, Value, str]]:
        """Applied settings not in effect yet: each with its value and why (ActsAtBoot.
        pending), asked only of plugins that own settings and can have such ones."""
        asking = {n for n, p in self.plugins.items()
                  if self.owned_count.get(n) and declares(p, ActsAtBoot)}  # fmt: skip
        out: list[tuple[SettingId, Value, str]] = []
        if not asking:
            return out
        for sid, value in list(self.applied.items()):
            if sid[0] in asking:
                plugin = self.plugins[sid[0]]
                shown = value if value is not ADOPTED else _quietly_read(plugin, sid[1])
                why = cast(ActsAtBoot[Target, Any], plugin).pending(sid[1], shown)
                if why is not None:
                    out.append((sid, shown, why))
        return out

    # -- checking -------------------------------------------------------------
    def verify(self, sids: Iterable[SettingId] | None = None) -> list[Drift]:
        """Settings whose kernel value differs from the profile's (vanished ones are dropped)."""
        with self.stepping():
            return self._verify(sids)

    def _verify(self, sids: Iterable[SettingId] | None) -> list[Drift]:
        drifts = []
        for sid in list(self.applied if sids is None else sids):
            wanted = self.applied.get(sid, ADOPTED)
            if wanted is ADOPTED:
                continue
            plugin, target = self.plugins[sid[0]], sid[1]
            try:
                actual = plugin.read(target)
            except LatencydError as exc:
                if not plugin.exists(target):
                    self._disown(sid)
                    continue
                text = plugin.describe(target, wanted)
                drifts.append(Drift(sid[0], target, wanted, f"<unreadable: {exc}>", text))
                continue
            if not plugin.same(target, wanted, actual) and not self._let_go(sid, actual):
                drifts.append(
                    Drift(sid[0], target, wanted, actual, plugin.describe(target, wanted))
                )
        return drifts

    def _own(self, sid: SettingId, value: Value) -> None:
        if sid not in self.applied:
            if self._changes is not None:
                self._changes.add(sid)
            self.owned_count[sid[0]] = self.owned_count.get(sid[0], 0) + 1
            device = sid[1].device()
            if device is not None:
                self.by_device.setdefault((sid[0], device), set()).add(sid[1])
        self.applied[sid] = value

    def _disown(self, sid: SettingId) -> None:
        if sid in self.applied:
            if self._changes is not None:
                self._changes.add(sid)
            self.owned_count[sid[0]] -= 1
            device = sid[1].device()
            if device is not None:
                targets = self.by_device.get((sid[0], device), set())
                targets.discard(sid[1])
                if not targets:
                    self.by_device.pop((sid[0], device), None)
        self.applied.pop(sid, None)
        self.originals.pop(sid, None)

    def take_changes(self) -> set[SettingId] | None:
        """Settings that became or stopped being owned since the last call (None: all may
        have): watchers follow what is owned at the cost of what changed."""
        changes, self._changes = self._changes, set()
        return changes

    def _let_go(self, sid: SettingId, actual: Value) -> bool:
        """Stop owning a setting whose ownership says the change someone made is theirs
        to keep (Ownership.theirs): no restore, no re-apply, out of the journal."""
        if not self.ownership(sid[0]).left(sid[1], actual):
            return False
        self._disown(sid)
        self._save([sid])
        return True

    def on_drift(self, plugin: str) -> str:
        section = self.sections.get(plugin)
        return str(section.options.get("on_drift", "reapply")) if section else "reapply"

    def handle_drift(
        self,
        drifts: Iterable[Drift],
        owners: OwnerIndex | None = None,
        writers: Mapping[SettingId, Writer] | None = None,
    ) -> list[dict[str, Any]]:
        """Put drifted settings back or report them, as each section's `on_drift` says;
        with the machine's `owners`, name the one whose value a setting drifted to, and
        with `writers`, the process seen writing it."""
        records = []
        for d in drifts:
            record = d.as_json() | {"action": "reported"}
            writer = writers.get((d.plugin, d.target)) if writers else None
            if writer is not None:
                record["written_by"] = writer.as_json()
            by = owners.changed_by(d.target.claims(), d.actual) if owners else None
            if by is not None:
                record["changed_by"] = by.as_json()
            if self.on_drift(d.plugin) == "reapply":
                plugin = self.plugins[d.plugin]
                try:
                    plugin.write(d.target, d.wanted)
                    record["action"] = "reapplied"
                except LatencydError as exc:
                    record["action"] = f"failed: {exc}"
            log.warning(
                "drift: [%s] %s, but it is %r%s%s: %s", d.plugin, d.text, d.actual,
                f", written by {writer}" if writer else "",
                f", the value {by.who} sets from {by.where} ({by.when})" if by else "",
                record["action"],
            )  # fmt: skip
            records.append(record)
        return records

    def _save(self, touched: Iterable[SettingId]) -> None:
        """Make the journal hold the current originals of `touched` (and the profile)."""
        updates: dict[JournalKey, Value] = {}
        drops: list[JournalKey] = []
        for sid in touched:
            key = (sid[0], _key(sid[1]))
            if sid in self.originals:
                updates[key] = self.originals[sid]
            else:
                drops.append(key)
        self.journal.record(updates, drops, self.profile)


def _wanted(
    expansions: Mapping[str, Expansion[Any]],
) -> tuple[dict[SettingId, Value], dict[SettingId, Value]]:
    """What the expansions want, and what they read of it on the way (Expansion.current)."""
    wanted = {(n, t): v for n, e in expansions.items() for t, v in e.settings.items()}
    current = {(n, t): v for n, e in expansions.items() for t, v in e.current.items()}
    return wanted, current


def _what(plugin: Plugin[Any, Any, Any], target: Target, value: Value) -> str:
    """A setting in words for an error message, even when its value makes no sense."""
    try:
        return plugin.describe(target, value)
    except Exception:
        return f"{target}"


def _check_value(plugin: Plugin[Any, Any, Any], target: Target, value: Value) -> None:
    """ValueError unless the plugin can compare and describe `value` for `target`: a journal
    value of the wrong kind (another version, a hand edit) is stranded at adoption instead
    of failing every later step."""
    if not _is_json_value(value):
        raise ValueError(f"{value!r} is not a JSON value")
    try:
        plugin.same(target, value, value)
        plugin.describe(target, value)
    except Exception as exc:
        raise ValueError(f"{plugin.name} cannot use the value {value!r}: {exc}") from exc


def _is_json_value(value: Any, depth: int = 0) -> bool:
    if depth > 8:
        return False
    if value is None or isinstance(value, str | int | float | bool):
        return True
    if isinstance(value, list):
        return all(_is_json_value(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json_value(v, depth + 1) for k, v in value.items())
    return False


@functools.lru_cache(maxsize=1 << 16)  # a 50,000-task server's owned settings
def _key(target: Target) -> str:
    """A target's journal key (each encoded once)."""
    return key_of(encode_target(target))


def _not_applicable(target: Target, exc: LatencydError) -> bool:
    return isinstance(exc, NotApplicable) or type(target).refusal_means is not None


def _reason(target: Target, exc: LatencydError) -> str:
    if isinstance(exc, NotApplicable):
        return str(exc)
    reason = exc.reason if isinstance(exc, KernelRefused) else str(exc)
    meaning = type(target).refusal_means
    return f"{meaning}: {reason}" if meaning else reason


def _not_restored(
    sid: SettingId, plugin: Plugin[Any, Any, Any], original: Value, exc: NotApplicable
) -> None:
    """A restore the plugin says cannot apply where the target is now (a task kept in a
    cgroup whose CPUs exclude its original ones): given up, not a failure of the step.
    One refused where it stands (LeftInPlace) is a warning: it stays as latencyd left it."""
    level = logging.WARNING if isinstance(exc, LeftInPlace) else logging.INFO
    log.log(level, "[%s] %s: not restored: %s", sid[0], _what(plugin, sid[1], original), exc)


def _quietly(action: Callable[[], object]) -> None:
    try:
        action()
    except LatencydError as exc:
        log.debug("ignored while backing out a refused setting: %s", exc)


def _quietly_read(plugin: Plugin[Any, Any, Any], target: Target) -> Value:
    try:
        return plugin.read(target)
    except LatencydError:
        return None
