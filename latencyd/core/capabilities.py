"""What some plugins can do beyond the contract every plugin keeps (latencyd.core.plugin).

Each capability is a Protocol a plugin declares by naming it among its bases, which also
gives it the defaults written here. The engine and the daemon look for it there
(`declares`), never by a plugin's name, by comparing its methods with a base class's, or
by the names of its methods: a plugin without the base is never asked, whatever methods
it has. One line each (docs/architecture.md has them too):

- FollowsTasks: settings for tasks as they are created or renamed (task events).
- FollowsDevices: settings for one device at a udev event, without re-expanding.
- SharesWithUser: settings their user may set too (a task's CPUs): what the user set
  stays theirs, by the plugin's Handover rule (the engine's Shared ownership,
  latencyd.core.sharing).
- StartsAfresh: what it owns is given back before its section is expanded again.
- ReportsGrouped: says a step's changes in few lines, and shows settings of one group
  (the threads of a process) as one status row.
- ProvidesNoiseWatch: its section has the daemon watch CPUs for noise, and is told what
  the watch saw.
- ActsAtBoot: settings that act from the next boot on (kernel arguments): pending until
  then, kept on disk beyond the journal, and named by a plan.
- PlacesApplications: puts a held application on CPUs of its own; is told the holders.
- RemembersInStep: keeps what it read of the machine for one step (which task a pid is).
- FindsDeviceFiles: the files to watch for a target follow its device's current name.
- TookOver: holds target kinds another plugin had (journals that plugin's versions wrote).
- HoldsResources: holds something to release when the daemon stops (perf counters).

The capabilities are not runtime-checkable, so `isinstance` cannot be asked by mistake:
of a runtime Protocol it only compares the names of members (a plugin with a `report`
method of its own would pass for ReportsGrouped), and on Python 3.11 it inspects each
member, tens of microseconds a time, where the question is asked for each task event
and each of 50,000 settings of a plan; `declares` is a lookup in the class's bases.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, cast

from latencyd.core.plugin import DeviceEvent, Plugin, Settings, Target, TaskEvent, Value
from latencyd.cpuset import CpuSet

if TYPE_CHECKING:  # only the noise watch's hooks name them
    from latencyd.kernel.noise import LastInterval, WatchPlan


def declares(plugin: object, capability: type) -> bool:
    """Whether the plugin's class names `capability` among its bases (a parametrised one,
    FollowsTasks[IrqRules, IrqOptions], too)."""
    return capability in type(plugin).__mro__


T = TypeVar("T", bound=Target, contravariant=True)
R = TypeVar("R", contravariant=True)  # the plugin's rules (Expansion.rules)
Opt = TypeVar("Opt", contravariant=True)  # the plugin's options (Plugin.options_of)
G = TypeVar("G", bound=Target)  # ReportsGrouped's targets (in a list: invariant)


class FollowsTasks(Protocol[R, Opt]):
    """Settings for tasks as they come: the daemon reads task events from the kernel
    (latencyd.service.taskevents) while the section is in force and hands each here."""

    def on_task(self, rules: R | None, event: TaskEvent, owned: Mapping[Target, Value]) -> Settings:
        """Settings a just-created or renamed task needs."""
        ...

    def started_meanwhile(self, rules: R | None, owned: Mapping[Target, Value]) -> Settings:
        """Asked once the settings on_task returned for a batch are written (and again
        while this returns settings, a few rounds): what the tasks started before the
        write, and so did not inherit, needs. Default: nothing."""
        return {}

    def follows_user_tasks(self, options: Opt) -> bool:
        """Whether this section needs exec events of user tasks, not just new kthreads."""
        return False

    def follows_renames(self, options: Opt) -> bool:
        """Whether this section needs to hear of tasks renamed (prctl PR_SET_NAME, or a
        kernel naming its new kthreads after the fork). Any user may rename a task as
        fast as a CPU allows: where no section follows renames, the kernel drops them
        before they reach the daemon."""
        return False


class FollowsDevices(Protocol[R]):
    """Settings for one device at a udev event of what the plugin `follows` (a CPU event
    re-resolves the whole profile instead, and never reaches here)."""

    def on_device(
        self, rules: R | None, event: DeviceEvent, owned: Mapping[Target, Value]
    ) -> tuple[Settings, set[Target]] | None:
        """(settings for the device, owned targets the event may have reset or that
        belong to the device), or None to re-expand the whole section."""
        ...


class Handover(Protocol[T]):
    """The rule by which a value a setting's user set is theirs to keep: a pure judgment
    of the target and the value (data made from the section's rules, no state of its
    plugin's), which the engine's Shared ownership holds for the step and asks inside its
    writes without returning into the plugin."""

    def theirs(self, target: T, actual: Value) -> str | None:
        """Why `actual`, set by someone else on `target`, is theirs to keep; None: drift."""
        ...


class SharesWithUser(Protocol[T, R]):
    """Settings their user may set too (a task's CPUs). The engine owns them through
    latencyd.core.sharing.Shared: each new one is written with write_unless_changed,
    and each owned one given back with it; what the handover calls theirs is not
    written, or left as they set it, and no longer owned."""

    def handover(self, rules: R | None) -> Handover[T] | None:
        """The rule by which a value someone else set is theirs while the section,
        expanded to `rules`, is applied or in force (asked once per step, before
        anything is written); None: every change is drift."""
        ...

    def write_unless_changed(self, target: T, value: Value, judged: Value) -> Value | None:
        """Write `value` only if the target still holds `judged` (what it held when the
        plugin judged it, or what latencyd set) and not already `value`; None once
        written, else what it holds, unwritten (latencyd.core.sharing.read_then_write
        where the kernel offers nothing closer)."""
        ...


class StartsAfresh(Protocol[Opt]):
    """A section whose expansion reads what the plugin's own settings changed (a cgroup
    tree it made): the engine gives back what it owns, in a step of its own, before it
    expands the section again when the plugin says so (latencyd.core.sharing.Ownership,
    the first of its three points)."""

    def starts_afresh(self, options: Opt, owned: Mapping[Target, Value]) -> bool:
        """Whether what the plugin owns must be given back before the section is expanded
        again: the restores would change what the expansion reads."""
        ...


class ReportsGrouped(Protocol[G]):
    """A plugin with many settings of one kind (the threads of a process): says what a
    step wrote in few lines, and status shows a group's settings as one row."""

    def report(self, changes: list[tuple[G, Value, Value]]) -> None:
        """Say what a step wrote, as (target, before, after) each, after the step is done
        (before is None for a setting adopted from the journal). One call per step."""
        ...

    def group(self, target: G) -> Hashable | None:
        """Key of targets `status` shows as one row when they also share value and
        original, or None: a row of its own."""
        ...

    def describe_group(self, targets: Sequence[G], value: Value) -> str:
        """One status row for several targets of one `group` set to the same value."""
        ...


class ProvidesNoiseWatch(Protocol[R]):
    """Its section has the daemon watch CPUs for noise (tracing every interruption,
    latencyd.service.noisewatch); the daemon finds the plugin by this, never by name."""

    def noise_watch(self, rules: R | None) -> WatchPlan | None:
        """What the noise watch is to watch while the section, expanded to `rules`, is in
        force (asked after every step); None: nothing."""
        ...

    def noise_seen(self, last: LastInterval) -> None:
        """What the watch saw in its last interval and the tick since it began, or why it
        does not run: told after each interval, for `monitor` to show."""
        ...


class ActsAtBoot(Protocol[T, R]):
    """Settings that act from the next boot on (kernel arguments)."""

    def pending(self, target: T, value: Value) -> str | None:
        """Why an applied setting is not in effect yet (until the next boot), or None: it
        acts now. Pending is not drift: the setting is as wanted."""
        ...

    def kept_elsewhere(self) -> Mapping[Target, Value]:
        """Settings this plugin made that a record of its own keeps on disk beyond the
        journal, each with its original: the engine owns them at every start and gives
        them back at `off`, also when its journal lost them."""
        ...

    def needs_boot(self, rules: R | None) -> list[str]:
        """What of the section, expanded to `rules`, only a boot brings that the running
        kernel lacks, whether or not it is written: a plan names them."""
        ...


class PlacesApplications(Protocol[R]):
    """Puts the application on CPUs of its own. The daemon tells it the holders (after
    every change to the holds), and after a hold that asked to be placed (HoldAndPlace:
    `latencyctl run`, `hold -- CMD`) is applied, asks whether the holder is there: an
    application that runs elsewhere is a request not done, never a silent success."""

    def holders(self, exempt: frozenset[int], placed: Mapping[int, CpuSet]) -> None:
        """The processes holding a profile (they and what they start are never moved),
        and of those the ones to place, each with its hold's CPUs."""
        ...

    def not_placed(self, rules: R | None, pid: int) -> str | None:
        """Why the process `pid` is not on the CPUs this section's `rules` keep for the
        application, with what to do instead; None when it is (or the section keeps none)."""
        ...


class RemembersInStep(Protocol):
    """Keeps what it read of the machine that cannot change within a step (which process
    a pid is: latencyd.core.movable.TaskMover) instead of reading it again for each of
    thousands of targets. A long step ends and begins anew each time it gives the main
    loop a turn; the engine tells only the plugins that declare this."""

    def begin_step(self) -> None:
        """A step (an apply, a verify, an off) begins: until end_step, keep what was read."""
        ...

    def end_step(self) -> None:
        """The step is over: forget what begin_step allowed to keep."""
        ...


class FindsDeviceFiles(Protocol[T]):
    """Targets whose files are named after a device's current name (a NIC's, which a
    rename changes): the plugin, which keeps the name, says which files a write to makes
    the daemon check the target at once. Other plugins' targets name theirs
    (Target.watch_files; files_to_watch asks the right one)."""

    def watch_files(self, target: T) -> tuple[str, ...]:
        """Files (under the System root) whose modification can change this target; none:
        polled instead."""
        ...


class TookOver(Protocol):
    """Target kinds this plugin took over from another: a journal an older version wrote
    keys them by that plugin, and the engine's adopt gives them to this one, so a kill -9
    across the upgrade still restores them."""

    took_over: ClassVar[Mapping[str, str]]  # kind -> the plugin that had it


class HoldsResources(Protocol):
    """Holds something the kernel keeps for it (perf counters) beyond a step: released
    when the daemon stops."""

    def close(self) -> None:
        """Release what it holds."""
        ...


def files_to_watch(plugin: Plugin[Any, Any, Any], target: Target) -> tuple[str, ...]:
    """Files (under the System root) a write to makes the daemon check `target` at once:
    its plugin's word where it declares FindsDeviceFiles, else the target's own."""
    if declares(plugin, FindsDeviceFiles):
        return cast(FindsDeviceFiles[Target], plugin).watch_files(target)
    return target.watch_files(plugin.system)
