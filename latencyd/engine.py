"""Engine: turns "what the profile wants" into kernel state as one transaction.

plan = diff(applied, wanted) -> journal originals (fsync) -> apply -> read back
-> verify; any failure rolls back everything changed in the step. Switching
profiles is the same diff, so settings two profiles share are never touched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from latencyd.errors import ApplyFailed, KernelRefused, LatencydError, NotApplicable
from latencyd.journal import Journal, JournalState, SettingId
from latencyd.plugin import Plugin, Value
from latencyd.profile import Profile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Drift:
    plugin: str
    key: str
    wanted: Value
    actual: Value


@dataclass
class Plan:
    """What one step will do; computed without touching the kernel."""

    restore: list[SettingId] = field(default_factory=list)
    apply: dict[SettingId, Value] = field(default_factory=dict)
    keep: list[SettingId] = field(default_factory=list)


def plan(
    applied: Mapping[SettingId, Value],
    wanted: Mapping[SettingId, Value],
    scope: Iterable[str] | None = None,
) -> Plan:
    """Pure diff: restore what is no longer wanted, apply what is new or different."""
    in_scope = set(scope) if scope is not None else None
    result = Plan()
    if in_scope is None or in_scope:  # an empty scope (new targets only) restores nothing
        for sid in applied:
            if (in_scope is None or sid[0] in in_scope) and sid not in wanted:
                result.restore.append(sid)
    for sid, value in wanted.items():
        if sid in applied and applied[sid] == value:
            result.keep.append(sid)
        else:
            result.apply[sid] = value
    return result


@dataclass
class StepReport:
    applied: int = 0
    restored: int = 0
    unchanged: int = 0
    not_applicable: dict[SettingId, str] = field(default_factory=dict)
    seconds: float = 0.0


class Engine:
    def __init__(self, plugins: Mapping[str, Plugin], journal: Journal) -> None:
        self.plugins = plugins
        self.journal = journal
        self.applied: dict[SettingId, Value] = {}
        self.originals: dict[SettingId, Value] = {}
        self.not_applicable: dict[SettingId, str] = {}
        self.profile: str | None = None
        self.last_step: StepReport | None = None

    # -- what a profile wants -------------------------------------------------
    def wanted(self, profile: Profile, only: Iterable[str] | None = None) -> dict[SettingId, Value]:
        sections = profile.sections
        names = list(sections) if only is None else [n for n in only if n in sections]
        result: dict[SettingId, Value] = {}
        for name in names:
            try:
                settings = self.plugins[name].expand(sections[name])
            except LatencydError as exc:
                raise ApplyFailed(f"[{name}]: {exc}") from exc
            for key, value in settings.items():
                result[(name, key)] = value
        return result

    # -- one transaction ------------------------------------------------------
    def switch(
        self,
        wanted: Mapping[SettingId, Value],
        profile: str | None,
        scope: Iterable[str] | None = None,
        recheck: bool = False,
    ) -> StepReport:
        """Make the kernel match `wanted` (for plugins in `scope`, or all); all or nothing.

        With `recheck`, settings the plan would keep are read back and re-applied if
        the kernel lost them (an IRQ that vanished and came back with a default mask).
        """
        started = time.perf_counter()
        step = plan(self.applied, wanted, scope)
        if recheck:
            self._recheck(step)
        report = StepReport(unchanged=len(step.keep))
        try:
            self._capture_originals(step, report)
        except Exception:
            self._forget_unapplied()  # originals read for a step that never ran
            raise
        previous_profile = self.profile

        undo: list[Callable[[], None]] = []
        try:
            self.profile = profile
            self._save()
            for sid in step.restore:
                self._restore_one(sid, undo)
                report.restored += 1
            for sid, value in step.apply.items():
                if sid in report.not_applicable:
                    continue
                if self._apply_one(sid, value, undo, report):
                    report.applied += 1
        except Exception as exc:  # a plugin's bug must not leave a half-applied step either
            self._roll_back(undo)
            self.profile = previous_profile
            self._forget_unapplied()
            self._save()
            what = exc if isinstance(exc, LatencydError) else f"{type(exc).__name__}: {exc}"
            raise ApplyFailed(f"{what}. Nothing was changed: the step was rolled back.") from exc

        for sid in step.restore:
            self.applied.pop(sid, None)
            self.originals.pop(sid, None)
        for sid, value in step.apply.items():
            if sid in report.not_applicable:
                self.applied.pop(sid, None)
                self.originals.pop(sid, None)
            else:
                self.applied[sid] = value
        in_scope = set(scope) if scope is not None else None
        self.not_applicable = {
            s: r
            for s, r in self.not_applicable.items()
            if in_scope is not None and s[0] not in in_scope
        } | {s: r for s, r in report.not_applicable.items()}
        self._save()
        report.seconds = time.perf_counter() - started
        self.last_step = report
        return report

    def extend(self, wanted: Mapping[SettingId, Value]) -> StepReport:
        """Settings for new targets (a thread, an IRQ): applied, nothing else touched."""
        return self.switch(wanted, self.profile, scope=())

    def _recheck(self, step: Plan) -> None:
        for sid in list(step.keep):
            plugin, key = self.plugins[sid[0]], sid[1]
            try:
                actual = plugin.capture(key)
            except LatencydError:
                continue
            if not plugin.same(key, self.applied[sid], actual):
                step.keep.remove(sid)
                step.apply[sid] = self.applied[sid]

    def _forget_unapplied(self) -> None:
        self.originals = {s: v for s, v in self.originals.items() if s in self.applied}

    def _capture_originals(self, step: Plan, report: StepReport) -> None:
        for sid, _ in step.apply.items():
            if sid in self.originals:
                continue
            plugin, key = self.plugins[sid[0]], sid[1]
            try:
                self.originals[sid] = plugin.capture(key)
            except (KernelRefused, NotApplicable) as exc:
                if isinstance(exc, NotApplicable) or plugin.optional(key):
                    report.not_applicable[sid] = _reason(exc)
                    continue
                raise ApplyFailed(
                    f"[{sid[0]}] cannot read {key} before changing it: {exc}"
                ) from exc

    def _apply_one(
        self, sid: SettingId, value: Value, undo: list[Callable[[], None]], report: StepReport
    ) -> bool:
        plugin, key = self.plugins[sid[0]], sid[1]
        original = self.originals[sid]
        previous = self.applied.get(sid, original)
        if sid not in self.applied and plugin.same(key, value, original):
            report.unchanged += 1  # already as wanted: record it, write nothing
            return False
        wrote = False
        try:
            plugin.apply(key, value)
            wrote = True
            undo.append(lambda: plugin.apply(key, previous))
            actual = plugin.capture(key)
            if not plugin.same(key, value, actual):
                raise KernelRefused(
                    f"[{sid[0]}] {plugin.describe(key, value)}",
                    f"the kernel accepted the write but kept {actual!r}",
                )
        except (KernelRefused, NotApplicable) as exc:
            if isinstance(exc, NotApplicable) or plugin.optional(key):
                report.not_applicable[sid] = _reason(exc)
                if wrote:
                    undo.pop()
                # The step drops this setting: put the original back (also when an earlier
                # step applied it), or it would stay changed with nobody tracking it.
                if wrote or sid in self.applied:
                    _quietly(lambda: plugin.restore(key, original))
                if sid in self.applied:
                    undo.append(lambda: plugin.apply(key, previous))
                return False
            if isinstance(exc, KernelRefused) and not exc.what.startswith("["):
                raise KernelRefused(f"[{sid[0]}] {plugin.describe(key, value)}", str(exc)) from exc
            raise
        return True

    def _restore_one(self, sid: SettingId, undo: list[Callable[[], None]]) -> None:
        plugin, key = self.plugins[sid[0]], sid[1]
        current = self.applied[sid]
        if not plugin.exists(key):
            return
        plugin.restore(key, self.originals[sid])
        undo.append(lambda: plugin.apply(key, current))

    def _roll_back(self, undo: list[Callable[[], None]]) -> None:
        for action in reversed(undo):
            try:
                action()
            except LatencydError as exc:
                log.error("rollback step failed: %s", exc)

    # -- restoring everything ---------------------------------------------------
    def off(self) -> list[str]:
        """Restore every original, newest first; empty the journal. Returns problems, if any."""
        problems = self._restore_all(reversed(list(self.applied)), self.originals)
        self.applied.clear()
        self.originals.clear()
        self.not_applicable.clear()
        self.profile = None
        self.journal.clear()
        return problems

    def recover(self) -> list[str] | None:
        """After an unclean exit: restore what the journal holds. None if there was nothing."""
        state = self.journal.load()
        if state is None:
            return None
        log.warning(
            "found a journal from an unclean exit (profile %s): restoring %d originals",
            state.profile,
            len(state.originals),
        )
        problems = self._restore_all(list(state.originals), state.originals)
        self.journal.clear()
        return problems

    def _restore_all(
        self, sids: Iterable[SettingId], originals: Mapping[SettingId, Any]
    ) -> list[str]:
        problems = []
        for sid in sids:
            plugin = self.plugins.get(sid[0])
            if plugin is None:
                problems.append(f"[{sid[0]}] {sid[1]}: plugin not installed, cannot restore")
                continue
            if not plugin.exists(sid[1]):
                continue  # the thread/IRQ/device is gone: nothing to restore
            try:
                plugin.restore(sid[1], originals[sid])
            except LatencydError as exc:
                problems.append(f"[{sid[0]}] restoring {sid[1]}: {exc}")
        for p in problems:
            log.error("%s", p)
        return problems

    # -- checking -------------------------------------------------------------
    def verify(self, scope: Iterable[str] | None = None) -> list[Drift]:
        in_scope = set(scope) if scope is not None else None
        drifts = []
        for sid, wanted in list(self.applied.items()):
            if in_scope is not None and sid[0] not in in_scope:
                continue
            plugin, key = self.plugins[sid[0]], sid[1]
            try:
                actual = plugin.capture(key)
            except LatencydError as exc:
                if not plugin.exists(key):
                    self.applied.pop(sid)
                    self.originals.pop(sid, None)
                    continue
                actual = f"<unreadable: {exc}>"
            if not plugin.same(key, wanted, actual):
                drifts.append(Drift(sid[0], key, wanted, actual))
        return drifts

    def reapply(self, drifts: Iterable[Drift]) -> list[str]:
        problems = []
        for d in drifts:
            try:
                self.plugins[d.plugin].apply(d.key, d.wanted)
            except LatencydError as exc:
                problems.append(f"[{d.plugin}] re-applying {d.key}: {exc}")
        return problems

    def _save(self) -> None:
        """Make the journal hold the current originals (it writes only what changed)."""
        if self.originals:
            self.journal.save(JournalState(dict(self.originals), self.profile))
        else:
            self.journal.clear()


def _reason(exc: LatencydError) -> str:
    return exc.reason if isinstance(exc, KernelRefused) else str(exc)


def _quietly(action: Callable[[], None]) -> None:
    try:
        action()
    except LatencydError as exc:
        log.debug("ignored while backing out a refused setting: %s", exc)
