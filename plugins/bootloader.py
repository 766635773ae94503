"""bootloader: kernel arguments for the next boot (nohz_full, rcu_nocbs, isolcpus, ...).

What only a reboot brings is a setting like any other: journaled (its original is what
latencyd had in the boot configuration before, normally nothing), verified, and taken
back by `off`, which removes exactly the arguments latencyd added and puts back those it
removed; a user's own arguments are never touched unless `remove` names them. Written
through the machine's own mechanism (latencyd.kernel.bootloaders), and only when the
profile says `write = true`: otherwise the arguments are computed and shown, and the
boot configuration is left alone. An argument the running kernel cannot honour after any
reboot (nohz_full= on a kernel built without NO_HZ_FULL) is not applicable, with the
reason, and never written. Written but not yet booted is *pending*, apart from drift.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from latencyd.core.plugin import Expansion, Options, Plugin, Target, Value
from latencyd.core.schema import Bool, ListOf, Option, Schema
from latencyd.cpuset import CpuSet, CpuSetError
from latencyd.errors import LatencydError
from latencyd.kernel.boot import booted
from latencyd.kernel.bootloaders import Bootloader, detect, in_effect, read_record, write_record
from latencyd.kernel.cmdline import CPU_LIST_PARAMETERS, Change, split_isolcpus, unsafe
from latencyd.kernel.system import Machine, System

# write is false by default, by the profile, or fixed by the daemon's config ([plugin.
# bootloader]): the plugin sees only the value; status names the config's line when it fixed it.
NOT_WRITTEN = (
    "not written: [bootloader] write is false (the default, the profile's, or fixed by the "
    "daemon's config), so latencyd shows the argument and leaves the boot configuration alone"
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
class BootArguments(Target):
    """latencyd's change to the next boot's command line: its value is the arguments it
    added, then each it removed after a `-` ("" when it changed nothing)."""

    kind: ClassVar[str] = "boot_arguments"
    refusal_means: ClassVar[str | None] = "the boot configuration could not be changed"

    def read(self, system: System) -> Value:
        """latencyd's change as its record keeps it, in the profile's form (the parameters
        asked to be removed by name, whether or not they were there). Written by the
        plugin, through the boot loader it found."""
        change, asked = read_record(system)
        return Change(change.added, asked).as_text()

    def same(self, system: System, wanted: Value, actual: Value) -> bool:
        return Change.from_text(str(wanted)) == Change.from_text(str(actual))

    def describe(self, value: Value) -> str:
        return f"next boot's kernel arguments: {value or 'none of latencyd'}"


@dataclass(frozen=True)
class BootRules:
    added: tuple[str, ...]
    remove: tuple[str, ...]


class BootloaderPlugin(Plugin[BootArguments, BootRules]):
    name = "bootloader"
    summary = "Kernel arguments for the next boot, through the machine's own bootloader tools"
    targets = (BootArguments,)
    example: ClassVar[dict[str, Any]] = {"cmdline": ["skew_tick=1"], "write": True}
    schema = Schema(
        options=(
            Option(
                "cmdline",
                ListOf(KernelArgument()),
                'Arguments to add ("nohz_full=${isolated_cores}", "nosoftlockup"); CPU-list '
                "parameters take CPU expressions",
            ),
            Option(
                "remove",
                ListOf(KernelArgument()),
                "Parameters to take out of the command line (a user's, put back by off)",
            ),
            Option(
                "write",
                Bool(),
                "Write the boot configuration; without it the arguments are only shown",
                default=False,
            ),
        ),
    )

    def __init__(self, system: System) -> None:
        super().__init__(system)
        self._loader: Bootloader | None = None

    @property
    def loader(self) -> Bootloader:
        if self._loader is None:
            self._loader = detect(self.system)
        return self._loader

    def expand(self, options: Options, owned: Mapping[Target, Value]) -> Expansion[BootRules]:
        refused: dict[str, str] = {}
        unsupported = self._unsupported()
        added = []
        for arg in options.get("cmdline", []):
            key = arg.partition("=")[0].replace("-", "_")
            if key in unsupported:
                refused[arg] = unsupported[key]
            else:
                added.append(arg)
        remove = tuple(options.get("remove", []))
        rules = BootRules(tuple(added), remove)
        if not options.get("write", False):
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

    # -- the one target: written through the boot loader found ------------------------------
    def write(self, target: BootArguments, value: Value) -> None:
        wanted = Change.from_text(str(value))
        change = self.loader.apply(read_record(self.system)[0], wanted.added, wanted.removed)
        write_record(self.system, change, wanted.removed)

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
        lacking = in_effect(read_record(self.system)[0], cmdline)
        if not lacking:
            return None
        return f"the next boot brings {' '.join(lacking)} ({self.loader.name})"
