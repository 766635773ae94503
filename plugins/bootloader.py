"""bootloader: kernel arguments for the next boot (nohz_full, rcu_nocbs, isolcpus, ...).

What only a reboot brings is a setting like any other: journaled, verified, and taken
back by `off` or a switch to a profile without it, which remove exactly the arguments
latencyd added and put back those it removed; a user's own arguments are never touched
unless `remove` names them. Its original is always "none of latencyd's": what latencyd
has in the boot configuration is latencyd's own, never the machine's, also after a
reboot. latencyd's record of it lives on disk (latencyd.paths.BOOT_RECORD), not in /run
with the journal: the engine owns what it says at every start (ActsAtBoot.kept_elsewhere),
and a write cut short is finished or undone by the next (latencyd.kernel.bootloaders).
A stop (SIGTERM at shutdown) leaves it (BootArguments.kept_at_stop): no bootloader
rollback while the machine stops, as TuneD's rule goes. Written through the machine's
own mechanism, and only when the profile says `write = true` (a section only root may
apply: the admin group must not make root run update-grub or kernel-install): otherwise
the arguments are computed and shown, and the boot configuration is left alone. An
argument the running kernel cannot honour after any reboot (nohz_full= on a kernel built
without NO_HZ_FULL) is not applicable, with the reason, and never written. Written but
not yet booted is *pending*, apart from drift.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from latencyd.core.capabilities import ActsAtBoot
from latencyd.core.plugin import Expansion, Plugin, Target, Value
from latencyd.core.schema import Bool, Kind, ListOf, Schema, option
from latencyd.cpuset import CpuSet, CpuSetError
from latencyd.errors import LatencydError
from latencyd.kernel.boot import booted
from latencyd.kernel.bootloaders import Bootloader, detect, in_effect, read_record, write_boot
from latencyd.kernel.cmdline import (
    CPU_LIST_PARAMETERS,
    Change,
    composed_arguments,
    split_isolcpus,
    unsafe,
)
from latencyd.kernel.owners import BOOT, Claim
from latencyd.kernel.system import Machine, System

# write is false by default, by the profile, or fixed by the daemon's config ([plugin.
# bootloader]): the plugin sees only the value; status names the config's line when it fixed it.
NOT_WRITTEN = (
    "not written: [bootloader] write is false (the default, the profile's, or fixed by the "
    "daemon's config), so latencyd shows the argument and leaves the boot configuration alone"
)
# What latencyd's part of the boot configuration reads while a write of it is unfinished
# (cut short by a failure or kill -9): never the same as any value, so the next step
# (a start, a verify, off) writes it, which settles it. Not a kernel argument (it has
# spaces and parentheses, which no argument may have).
UNFINISHED = "(a write latencyd did not finish)"
WRITE_IS_ROOTS = (
    "write = true has root run the machine's bootloader tools (update-grub, "
    "kernel-install, grubby) and changes what every later boot runs"
)


@dataclass(frozen=True)
class KernelArgument:
    """A kernel argument as a profile gives it: `name=value`, a CPU expression where the
    parameter takes a CPU list (`nohz_full=${isolated_cores}`, `irqaffinity=all - 1`),
    written as the kernel's cpulist."""

    @property
    def label(self) -> str:
        return "kernel argument"

    def parse(self, raw: Any, machine: Machine) -> str:
        if not isinstance(raw, str):
            raise ValueError(f'expected a kernel argument like "nohz_full=1", got {raw!r}')
        name, eq, value = raw.partition("=")
        if eq and name.replace("-", "_") in CPU_LIST_PARAMETERS:
            flags, expression = split_isolcpus(value) if name == "isolcpus" else ((), value)
            try:
                cpus = CpuSet.parse(expression, machine.all_cpus)
            except CpuSetError as exc:
                raise ValueError(f"{name}: {exc}") from exc
            if not cpus or not cpus.issubset(machine.all_cpus):
                raise ValueError(f"{name}: {expression!r} names no CPU of this machine's "
                                 f"{machine.all_cpus} or one beyond them")  # fmt: skip
            value = ",".join([*flags, cpus.to_list()])
        text = f"{name}={value}" if eq else name
        why = unsafe(text)
        if why:
            raise ValueError(f"{raw!r}: {why}")
        return text


@dataclass(frozen=True)
class KernelArguments(ListOf[str]):
    """`cmdline`: kernel arguments, of which several holds' compose into one list
    (latencyd.kernel.cmdline.composed_arguments: two realtime holds on CPUs 1 and 2 ask
    nohz_full=1-2, irqaffinity= the CPUs both leave), not a conflict of two lists: a
    Composes[list[str]]."""

    item: Kind[str] = KernelArgument()

    def composed(self, first: list[str], second: list[str]) -> list[str]:
        return composed_arguments(first, second)


@dataclass(frozen=True)
class BootArguments(Target[str]):
    """latencyd's change to the next boot's command line: its value is the arguments it
    added, then each it removed after a `-` ("" when it changed nothing)."""

    kind: ClassVar[str] = "boot_arguments"
    refusal_means: ClassVar[str | None] = "the boot configuration could not be changed"
    kept_at_stop: ClassVar[bool] = True

    def claims(self) -> tuple[Claim, ...]:
        return (Claim(BOOT),)

    def read(self, system: System) -> str:
        """latencyd's change as its record keeps it, in the profile's form (the parameters
        asked to be removed by name, whether or not they were there); UNFINISHED while a
        write is. Written by the plugin, through the boot loader it found."""
        record = read_record(system)
        if record.writing is not None:
            return UNFINISHED
        return Change(record.done.added, record.asked).as_text()

    def same(self, system: System, wanted: str, actual: str) -> bool:
        if UNFINISHED in (wanted, actual):
            return False
        return Change.from_text(str(wanted)) == Change.from_text(str(actual))

    def describe(self, value: str) -> str:
        return f"next boot's kernel arguments: {value or 'none of latencyd'}"


@dataclass(frozen=True)
class BootRules:
    added: tuple[str, ...]
    remove: tuple[str, ...]


@dataclass(frozen=True)
class BootOptions:
    cmdline: list[str] | None = option(
        KernelArguments(),
        'Arguments to add ("nohz_full=${isolated_cores}", "nosoftlockup"); CPU-list '
        "parameters take CPU expressions",
    )
    remove: list[str] | None = option(
        ListOf(KernelArgument()),
        "Parameters to take out of the command line (a user's, put back by off)",
    )
    write: bool = option(
        Bool(),
        "Write the boot configuration; without it the arguments are only shown",
        default=False,
    )


class BootloaderPlugin(
    Plugin[BootArguments, BootRules, BootOptions], ActsAtBoot[BootArguments, BootRules]
):
    name = "bootloader"
    summary = "Kernel arguments for the next boot, through the machine's own bootloader tools"
    targets = (BootArguments,)
    example: ClassVar[dict[str, Any]] = {"cmdline": ["skew_tick=1"], "write": True}
    schema = Schema(section=BootOptions)

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self._loader: Bootloader | None = None

    @property
    def loader(self) -> Bootloader:
        if self._loader is None:
            self._loader = detect(self.system)
        return self._loader

    def expand(self, options: BootOptions, owned: Mapping[Target, Value]) -> Expansion[BootRules]:
        refused: dict[str, str] = {}
        unsupported = self._unsupported()
        added = []
        for arg in options.cmdline or []:
            key = arg.partition("=")[0].replace("-", "_")
            if key in unsupported:
                refused[arg] = unsupported[key]
            else:
                added.append(arg)
        remove = tuple(options.remove or [])
        rules = BootRules(tuple(added), remove)
        if not options.write:
            refused.update(dict.fromkeys([*added, *(f"-{r}" for r in remove)], NOT_WRITTEN))
            return Expansion({}, rules, refused=refused)
        value = Change(tuple(added), remove).as_text()
        return Expansion({BootArguments(): value} if value else {}, rules, refused=refused)

    def _unsupported(self) -> dict[str, str]:
        """Parameters this kernel ignores after any reboot, with why (BootState's)."""
        try:
            return booted(self.system.boot_readings()).unsupported
        except LatencydError:
            return {}

    def root_only(self, options: BootOptions) -> str | None:
        return WRITE_IS_ROOTS if options.write else None

    # -- the one target: written through the boot loader found ------------------------------
    def write(self, target: BootArguments, value: Value) -> None:
        """The boot configuration as `value` asks, unless it is so already (a start after a
        reboot runs no tool for arguments written before it)."""
        text = str(value)  # its kind's: a Change's text
        if target.same(self.system, text, target.read(self.system)):
            return
        wanted = Change.from_text(text)
        write_boot(self.system, self.loader, wanted.added, wanted.removed)

    def original(
        self,
        target: BootArguments,
        current: Value,
        owned: Callable[[Target], tuple[Value, Value] | None],
    ) -> Value:
        """None of latencyd's, whatever the record holds now: arguments latencyd wrote
        (before a reboot that emptied the journal, say) are never the machine's own."""
        return ""

    def kept_elsewhere(self) -> dict[Target, Value]:
        """latencyd's change to the boot configuration, from its record on disk, which a
        reboot does not erase as it does the journal: owned at every start, taken out by
        off even when the journal has lost it."""
        return {} if read_record(self.system).empty else {BootArguments(): ""}

    def needs_boot(self, rules: BootRules | None) -> list[str]:
        """The section's arguments the running kernel did not boot with (written or not):
        what a plan says a reboot would need."""
        if rules is None:
            return []
        try:
            cmdline = self.system.read("proc/cmdline")
        except LatencydError:
            return []
        return in_effect(Change(rules.added, rules.remove), cmdline)

    def pending(self, target: BootArguments, value: Value) -> str | None:
        """Written, not booted: which arguments the running kernel lacks."""
        try:
            cmdline = self.system.read("proc/cmdline")
        except LatencydError:
            return None
        lacking = in_effect(read_record(self.system).done, cmdline)
        if not lacking:
            return None
        return f"the next boot brings {' '.join(lacking)} ({self.loader.name})"
