"""Who a setting belongs to: latencyd alone, or latencyd and the setting's user.

Most settings are latencyd's alone while it owns them: a change by anyone else is drift,
put back or reported. Some are shared with their user (a task's CPUs, which its user may
set with `taskset` at any moment): a value the user chose is theirs to keep, and the
engine must neither overwrite it nor give back over it. The engine asks one Ownership
per plugin for the step (`ownership_of`) at three named points, the same calls for every
plugin:

1. `starts_afresh`: before the section is expanded again, whether what the plugin owns
   must be given back first (the restores change what the expansion reads; asked of a
   plugin that declares StartsAfresh);
2. `claim`: a setting first owned now, before its original is journaled: whether it is
   taken (False: someone else's already, left alone);
3. `write` and `give_back`: the writes, each saying whether it wrote, found the setting
   as wanted already, or left it as its user set it.

Between them `theirs` judges a value read that differs from the one set (after a
write's read-back, at a drift check): the user's to keep, or drift. `Ownership` is the
plain case (latencyd's alone: `theirs` never); `Shared` is a plugin's that declares
SharesWithUser (latencyd.core.capabilities), and judges by the Handover the plugin made
of the rules when the step began: inside a write the engine reaches the plugin only
through its verbs (read, write, write_unless_changed). What is left to its user is said
in the log after the writes (`say`): before the main loop's next turn, while the pid a
setting names is still the task judged, and when the step is done.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, cast

from latencyd.core.capabilities import Handover, SharesWithUser, StartsAfresh, declares
from latencyd.core.plugin import Options, Plugin, Target, Value
from latencyd.errors import LatencydError

log = logging.getLogger(__name__)

T = TypeVar("T", bound=Target)


class Outcome(enum.Enum):
    """What a write or a give-back did."""

    WRITTEN = "written"
    AS_WANTED = "as wanted already"  # nothing written
    LEFT = "left as its user set it"  # nothing written: theirs


class Ownership(Generic[T]):
    """A plugin's settings as latencyd's alone (the default): claimed as they come,
    written when they differ, given back when the kernel does not hold the original,
    never someone else's. One per plugin and step (Engine.ownership)."""

    per_step = False  # one serves every step (Shared: one per step, for what it claims)

    def __init__(self, plugin: Plugin[T, Any, Any], rules: Callable[[bool], Any]) -> None:
        self.plugin = plugin
        # The rules a value is judged by: those being applied, or (True) those that set it.
        self.rules = rules
        self.leaving: list[tuple[T, Value, str]] = []  # left to its user, to say (say)

    # -- 1. before the section is expanded again ----------------------------------------
    def starts_afresh(self, options: Options, owned: Mapping[Target, Value]) -> bool:
        """Whether what the plugin owns must be given back before the section (`options`,
        as the profile holds it) is expanded again (the restores would change what the
        expansion reads): asked of a plugin that declares StartsAfresh."""
        if not declares(self.plugin, StartsAfresh):
            return False
        plugin = cast(StartsAfresh[Any], self.plugin)
        return plugin.starts_afresh(self.plugin.options_of(options), owned)

    # -- 2. a setting first owned now ---------------------------------------------------
    def claim(self, target: T, now: Value, judged_by_expansion: bool) -> bool:
        """Whether the step takes a setting it does not own yet, which holds `now` (read
        by the engine, or, `judged_by_expansion`, by the expansion that wanted it)."""
        return True

    # -- 3. the writes ------------------------------------------------------------------
    def write(self, target: T, value: Value, before: Value, new: bool) -> Outcome:
        """Set `value` over `before` (what the setting held as the engine last knew it:
        its original for a `new` one). A new setting that holds it already is not
        written."""
        if new and self.plugin.same(target, value, before):
            return Outcome.AS_WANTED
        self.plugin.write(target, value)
        return Outcome.WRITTEN

    def give_back(self, target: T, original: Value, set_to: Value, known: bool) -> Outcome:
        """Put the original back, unless the kernel holds it already (a setting found as
        wanted was never written; a NIC or sysctl that is already right is left alone).
        `set_to` is what latencyd set (`known`: not a setting adopted from a journal)."""
        try:
            if self.plugin.same(target, original, self.plugin.read(target)):
                return Outcome.AS_WANTED
        except LatencydError:
            pass  # unreadable now: try the write, which says why if it fails
        self.plugin.write(target, original)
        return Outcome.WRITTEN

    # -- between them: a value read that differs from the one set -----------------------
    def theirs(self, target: T, actual: Value, by_owner: bool = False) -> str | None:
        """Why `actual`, which differs from what latencyd set, is its user's to keep
        (judged by the rules being applied, or `by_owner`: by those that set it); None:
        drift."""
        return None

    def left(self, target: T, actual: Value, by_owner: bool = False) -> bool:
        """`theirs`, kept to be said in the log when so (say)."""
        reason = self.theirs(target, actual, by_owner)
        if reason:
            self.leaving.append((target, actual, reason))
        return bool(reason)

    def say(self) -> None:
        """Log what was left to its user since the last call (Engine: before each turn
        of the main loop, and at the end of the step)."""
        leaving, self.leaving = self.leaving, []
        for target, actual, reason in leaving:
            shown = self.plugin.describe(target, actual)
            log.info("[%s] %s: left as it is, %s", self.plugin.name, shown, reason)


class Shared(Ownership[T]):
    """Settings shared with their user (SharesWithUser): a new one is written only if it
    still holds what it held when claimed, an owned one given back only if it still holds
    what latencyd set, and what its user set meanwhile stays theirs."""

    per_step = True

    def __init__(self, plugin: Plugin[T, Any, Any], rules: Callable[[bool], Any]) -> None:
        super().__init__(plugin, rules)
        sharer = self.sharer = cast(SharesWithUser[T, Any], plugin)  # see ownership_of
        # The plugin's rule of what is theirs, by the rules being applied and by those in
        # force: made once, before anything is written.
        self.judges: tuple[Handover[T] | None, Handover[T] | None] = (
            sharer.handover(rules(False)),
            sharer.handover(rules(True)),
        )
        # What each setting claimed in this step held then: its write is judged by it.
        self.claimed: dict[T, Value] = {}

    def claim(self, target: T, now: Value, judged_by_expansion: bool) -> bool:
        # Without the expansion's read, the plugin judged one the engine did not see (an
        # event's): a value it calls theirs now came since (`taskset -c 1 app`).
        if not judged_by_expansion and self.left(target, now):
            return False
        self.claimed[target] = now
        return True

    def write(self, target: T, value: Value, before: Value, new: bool) -> Outcome:
        """A claimed setting was judged before the journal's fsync, on an event maybe
        milliseconds old under load: written only if it still holds what it held then.
        Changed since: as wanted already (a task born of a narrowed one), theirs (left),
        or else written as any setting is."""
        if target not in self.claimed:
            return super().write(target, value, before, new)
        found = self.sharer.write_unless_changed(target, value, self.claimed[target])
        if found is None:
            return Outcome.WRITTEN
        if self.plugin.same(target, value, found):
            return Outcome.AS_WANTED
        if self.left(target, found):
            return Outcome.LEFT
        self.plugin.write(target, value)
        return Outcome.WRITTEN

    def give_back(self, target: T, original: Value, set_to: Value, known: bool) -> Outcome:
        """Given back only if it still holds what latencyd set: a task its user confined to
        the isolated CPUs since the last check stays there, and a rollback must not move
        it either."""
        if known:
            found = self.sharer.write_unless_changed(target, original, set_to)
            if found is None:
                return Outcome.WRITTEN
            if self.plugin.same(target, original, found):
                return Outcome.AS_WANTED
            if self.left(target, found, by_owner=True):
                return Outcome.LEFT
        return super().give_back(target, original, set_to, known)

    def theirs(self, target: T, actual: Value, by_owner: bool = False) -> str | None:
        judge = self.judges[by_owner]
        return judge.theirs(target, actual) if judge is not None else None


def ownership_of(plugin: Plugin[T, Any, Any], rules: Callable[[bool], Any]) -> Ownership[T]:
    """The Ownership of `plugin`'s settings for one step: Shared if it declares
    SharesWithUser, else latencyd's alone. `rules(by_owner)`: the rules its values are
    judged by (see Ownership.theirs)."""
    if declares(plugin, SharesWithUser):
        return Shared(plugin, rules)
    return Ownership(plugin, rules)


def read_then_write(
    plugin: Plugin[T, Any, Any], target: T, value: Value, judged: Value
) -> Value | None:
    """SharesWithUser.write_unless_changed where the kernel offers nothing closer: read,
    then write `value` if the setting still holds `judged` and not already `value`; None
    once written, else what it holds, unwritten."""
    now = plugin.read(target)
    if not plugin.same(target, judged, now) or plugin.same(target, value, now):
        return now
    plugin.write(target, value)
    return None
