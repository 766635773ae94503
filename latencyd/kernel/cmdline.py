"""The kernel command line: its arguments, and what they say about CPU isolation.

Pure functions over text, as the kernel reads it (kernel/params.c, next_arg): arguments
are separated by spaces, a double-quoted part may hold spaces (`a="b c"`, `"a=b c"`),
`--` ends the kernel's arguments (what follows is init's), and a parameter's `-` and `_`
are the same letter (`rcu-nocbs` is `rcu_nocbs`).

Isolation (kernel/sched/isolation.c): `isolcpus=[flag,...,]CPUS` with the flags `nohz`,
`domain` (the default when none is given) and `managed_irq`; `nohz_full=CPUS` (the tick,
and unbound work, RCU callbacks and timers off those CPUs); `rcu_nocbs[=CPUS]` (every CPU
when given no list); `irqaffinity=CPUS` (the default affinity of IRQs). When `isolcpus=`
and `nohz_full=` both set a kind of housekeeping (`isolcpus=nohz,...` and `nohz_full=` both
stop the tick) with different CPUs, the kernel keeps the first and ignores the second.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from latencyd.cpuset import CpuSet, CpuSetError

ISOLCPUS_FLAGS = ("nohz", "domain", "managed_irq")
# The kinds of housekeeping each argument takes off its CPUs (HK_TYPE_*), for the rule
# that a second argument setting a kind already set must name the same CPUs.
_NOHZ_FULL_KINDS = frozenset({"tick", "wq", "timer", "rcu", "misc", "kthread"})
_ISOLCPUS_KINDS = {"nohz": frozenset({"tick"}), "domain": frozenset({"domain"}),
                   "managed_irq": frozenset({"managed_irq"})}  # fmt: skip


@dataclass(frozen=True)
class KernelArg:
    """One argument as written: `name=value`, or a bare `name` (value None)."""

    name: str
    value: str | None = None

    @property
    def key(self) -> str:
        """The parameter as the kernel compares it: `-` and `_` alike."""
        return self.name.replace("-", "_")

    def __str__(self) -> str:
        if self.value is None:
            return self.name
        value = f'"{self.value}"' if " " in self.value else self.value
        return f"{self.name}={value}"


def parse_cmdline(text: str) -> tuple[KernelArg, ...]:
    """The kernel's own arguments of a command line (up to `--`)."""
    args: list[KernelArg] = []
    for word in _words(text):
        if word == "--":
            break
        name, eq, value = word.partition("=")
        args.append(KernelArg(name, value if eq else None))
    return tuple(args)


def _words(text: str) -> Iterable[str]:
    """Words split at spaces outside double quotes, the quotes removed."""
    word: list[str] = []
    quoted = started = False
    for char in text:
        if char == '"':
            quoted, started = not quoted, True
        elif char.isspace() and not quoted:
            if started:
                yield "".join(word)
            word, started = [], False
        else:
            word.append(char)
            started = True
    if started:
        yield "".join(word)


def find(args: Iterable[KernelArg], key: str) -> KernelArg | None:
    """The last argument of a parameter (where a later one overrides an earlier)."""
    found = None
    for arg in args:
        if arg.key == key:
            found = arg
    return found


@dataclass(frozen=True)
class Isolation:
    """What a command line asks of CPU isolation, on a machine whose CPUs are `possible`
    (None: not asked); `problems`: what the kernel ignores or refuses of it, in words."""

    isolcpus: CpuSet | None = None
    isolcpus_flags: frozenset[str] = frozenset()
    nohz_full: CpuSet | None = None
    rcu_nocbs: CpuSet | None = None
    irqaffinity: CpuSet | None = None
    problems: tuple[str, ...] = field(default=())

    @property
    def domain_isolated(self) -> CpuSet:
        """CPUs taken out of the scheduler's load balancing (/sys/.../cpu/isolated)."""
        if self.isolcpus is None or "domain" not in self.isolcpus_flags:
            return CpuSet()
        return self.isolcpus

    @property
    def managed_irq(self) -> CpuSet:
        """CPUs that kernel-managed IRQs avoid (isolcpus=managed_irq)."""
        if self.isolcpus is None or "managed_irq" not in self.isolcpus_flags:
            return CpuSet()
        return self.isolcpus

    @property
    def tickless(self) -> CpuSet:
        """CPUs asked to run without the periodic tick."""
        tick = self.nohz_full or CpuSet()
        if self.isolcpus is not None and "nohz" in self.isolcpus_flags and not tick:
            tick = self.isolcpus
        return tick


def isolation(args: Iterable[KernelArg], possible: CpuSet) -> Isolation:
    """The isolation the arguments ask for, in the order the kernel applies them."""
    problems: list[str] = []
    isolcpus: CpuSet | None = None
    flags: frozenset[str] = frozenset()
    nohz_full = rcu_nocbs = irqaffinity = None
    kinds: dict[str, tuple[str, CpuSet]] = {}  # housekeeping kind -> (argument, its CPUs)

    def cpus(arg: KernelArg, text: str) -> CpuSet | None:
        try:
            return _cpulist(text, possible)
        except CpuSetError as exc:
            problems.append(f"{arg}: the kernel ignores it ({exc})")
            return None

    def claim(arg: KernelArg, taken: frozenset[str], value: CpuSet) -> bool:
        for kind in sorted(taken):
            if kind in kinds and kinds[kind][1] != value:
                first = kinds[kind][0]
                problems.append(
                    f"{arg}: the kernel ignores it, {first} already isolates "
                    f"{kinds[kind][1].to_list() or 'no CPU'} (they must name the same CPUs)"
                )
                return False
        kinds.update(dict.fromkeys(taken, (str(arg), value)))
        return True

    for arg in args:
        if arg.key == "isolcpus" and arg.value is not None:
            parsed = _isolcpus(arg, possible, problems)
            if parsed is not None:
                taken = frozenset().union(*(_ISOLCPUS_KINDS[f] for f in parsed[0]))
                if claim(arg, taken, parsed[1]):
                    flags, isolcpus = parsed
        elif arg.key == "nohz_full" and arg.value is not None:
            value = cpus(arg, arg.value)
            if value is not None and claim(arg, _NOHZ_FULL_KINDS, value):
                nohz_full = value
        elif arg.key == "rcu_nocbs":
            rcu_nocbs = possible if not arg.value else cpus(arg, arg.value)
        elif arg.key == "irqaffinity" and arg.value is not None:
            irqaffinity = cpus(arg, arg.value)
    if nohz_full is not None and nohz_full == possible:
        problems.append("nohz_full names every CPU: the kernel keeps the boot CPU for housekeeping")
    return Isolation(isolcpus, flags, nohz_full, rcu_nocbs, irqaffinity, tuple(problems))


def split_isolcpus(value: str) -> tuple[tuple[str, ...], str]:
    """isolcpus's leading known flags, and the rest (its CPUs, or an unknown flag first).
    Only known flags: a profile's CPU expression may itself start with a word
    (`managed_irq,all - 0`)."""
    words = value.split(",")
    count = 0
    while count < len(words) - 1 and words[count] in ISOLCPUS_FLAGS:
        count += 1
    return tuple(words[:count]), ",".join(words[count:])


def _isolcpus(
    arg: KernelArg, possible: CpuSet, problems: list[str]
) -> tuple[frozenset[str], CpuSet] | None:
    """isolcpus's flags (`domain` when none is named) and CPUs."""
    assert arg.value is not None
    rest, flags = arg.value, set[str]()
    while True:  # a word before a comma is a flag; the kernel skips one it does not know
        known, rest = split_isolcpus(rest)
        flags.update(known)
        word, comma, after = rest.partition(",")
        if not (comma and word[:1].isalpha() and word != "N"):
            break
        problems.append(f"{arg}: the kernel skips the unknown flag {word!r}")
        rest = after
    try:
        return frozenset(flags or {"domain"}), _cpulist(rest, possible)
    except CpuSetError as exc:
        problems.append(f"{arg}: the kernel ignores it ({exc})")
        return None


def _cpulist(text: str, possible: CpuSet) -> CpuSet:
    """A cpulist as the kernel's bitmap_parselist reads it: also `all`, and `N` for the
    last CPU."""
    if text == "all":
        return possible
    last = str(max(possible)) if possible else "0"
    cpus = CpuSet.from_list(",".join(last if part == "N" else part for part in text.split(",")))
    if not cpus.issubset(possible):
        raise CpuSetError(f"CPUs {(cpus - possible).to_list()} are not this machine's")
    return cpus


# -- arguments latencyd writes ---------------------------------------------------------------

# What an argument latencyd writes may contain: a boot configuration is often a shell
# script (/etc/default/grub.d/*.cfg is sourced by grub-mkconfig, as root), so no quote,
# space, `$`, backtick or backslash ever reaches one.
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.,:=+/@%-]*")
# Parameters whose value is a CPU list (isolcpus's after its flags): a profile may give a
# CPU expression there, written as the kernel's cpulist.
CPU_LIST_PARAMETERS = frozenset(
    {"isolcpus", "nohz_full", "rcu_nocbs", "irqaffinity", "kthread_cpus", "systemd.cpu_affinity"}
)


# Of those, the ones naming the CPUs kept for applications (isolated); the others name the
# CPUs left to other work (housekeeping: IRQs, kernel threads, PID 1 and what it starts).
ISOLATING_PARAMETERS = frozenset({"isolcpus", "nohz_full", "rcu_nocbs"})


class ArgumentsDiffer(ValueError):
    """Two lists of kernel arguments that cannot be one: which parameter, in words."""


def composed_arguments(first: Sequence[str], second: Sequence[str]) -> list[str]:
    """Two holds' kernel arguments (as a profile's [bootloader] cmdline gives them) as
    one list: every argument of either, the first's in their order, then the second's
    new ones. A parameter both give with different values is one argument only where its
    value is a CPU list: where it isolates CPUs (nohz_full, rcu_nocbs, isolcpus with the
    same flags), the CPUs either isolates; where it names housekeeping (irqaffinity,
    systemd.cpu_affinity, kthread_cpus), the CPUs both leave to it. Otherwise
    ArgumentsDiffer names the parameter and both arguments."""
    out = list(dict.fromkeys(first))
    at = {_key(arg): i for i, arg in enumerate(out)}
    for arg in dict.fromkeys(second):
        i = at.get(_key(arg))
        if i is None:
            at[_key(arg)] = len(out)
            out.append(arg)
        elif out[i] != arg:
            out[i] = _one_argument(out[i], arg)
    return out


def _key(arg: str) -> str:
    return arg.partition("=")[0].replace("-", "_")


def _one_argument(first: str, second: str) -> str:
    """One parameter's two arguments as one (composed_arguments)."""
    key, name = _key(first), first.partition("=")[0]
    a, b = first.partition("=")[2], second.partition("=")[2]
    if key not in CPU_LIST_PARAMETERS or not a or not b:
        raise ArgumentsDiffer(f"set {name} two ways ({second} against {first})")
    (flags_a, cpus_a), (flags_b, cpus_b) = (
        split_isolcpus(v) if key == "isolcpus" else ((), v) for v in (a, b)
    )
    if (set(flags_a) or {"domain"}) != (set(flags_b) or {"domain"}):  # none: domain
        raise ArgumentsDiffer(f"ask {name} for other kinds of isolation ({second} against {first})")
    try:
        mine, theirs = CpuSet.from_list(cpus_a), CpuSet.from_list(cpus_b)
    except CpuSetError as exc:
        raise ArgumentsDiffer(f"set {name} two ways ({second} against {first}: {exc})") from exc
    if key in ISOLATING_PARAMETERS:
        cpus = mine | theirs
    elif not (cpus := mine & theirs):
        raise ArgumentsDiffer(
            f"leave no CPU in common to {name} ({second} against {first}: these CPUs are "
            "other work's)"
        )
    return f"{name}={','.join([*flags_a, cpus.to_list()])}"


# Parameters that choose what the machine boots into rather than how its kernel runs: the
# program run as init (init=, rdinit=, a runlevel or target handed to it, a command run
# at boot, a debug shell), the root filesystem or initramfs it comes from, an image to
# resume, the modules refused, the security modules that confine it. Whoever may write a
# profile must not choose these for root (init=/bin/sh is a root shell at the next boot),
# so no profile may have latencyd write them, whatever else it is allowed.
BOOT_CHOOSING = frozenset({
    "init", "rdinit", "root", "rootfstype", "rootflags", "nfsroot", "nfsrootdebug",
    "initrd", "noinitrd", "resume", "resume_offset", "noresume", "hibernate",
    "single", "s", "emergency", "rescue", "1", "2", "3", "4", "5", "6",
    "systemd.unit", "rd.systemd.unit", "systemd.run", "systemd.run_success_action",
    "systemd.run_failure_action", "systemd.debug_shell", "rd.systemd.debug_shell",
    "systemd.wants", "rd.systemd.wants", "systemd.mask", "rd.systemd.mask",
    "rd.break", "rd.shell", "rd.emergency",
    "rd.rescue", "rd.init", "module_blacklist", "modprobe.blacklist", "rd.driver.blacklist",
    "initcall_blacklist", "security", "lsm", "selinux", "enforcing", "apparmor",
    "lockdown", "module.sig_enforce", "ima_appraise", "ima_policy", "kexec_load_disabled",
})  # fmt: skip


def unsafe(text: str) -> str | None:
    """Why `text` cannot be a kernel argument latencyd writes, or None."""
    if len(text) > 1024:
        return "longer than 1024 characters"
    if not _SAFE.fullmatch(text):
        return (
            "only letters, digits and _ . , : = + / @ % - may be used (no space, quote or $: "
            "boot configurations are often shell scripts)"
        )
    name = text.partition("=")[0]
    if name.replace("-", "_").lower() in BOOT_CHOOSING:
        return (
            f"{name} chooses what the machine boots into (its init, root filesystem, "
            "initramfs, boot target, modules or security modules), not how the kernel runs "
            "it: latencyd never writes it"
        )
    return None


@dataclass(frozen=True)
class Change:
    """What latencyd did to a command line: arguments it added, and the users' arguments
    it removed (as they were, to be put back)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def as_text(self) -> str:
        """One line: the added arguments, then each removed one after a `-`."""
        return " ".join([*self.added, *(f"-{r}" for r in self.removed)])

    @classmethod
    def from_text(cls, text: str) -> Change:
        words = text.split()
        return cls(tuple(w for w in words if not w.startswith("-")),
                   tuple(w[1:] for w in words if w.startswith("-")))  # fmt: skip

    def merged(self, other: Change) -> Change:
        """Both changes as one to undo: what either added, what either removed (when a
        write was cut short, the boot configuration holds some of each)."""
        return Change(tuple(dict.fromkeys([*self.added, *other.added])),
                      tuple(dict.fromkeys([*self.removed, *other.removed])))  # fmt: skip

    @property
    def removed_keys(self) -> tuple[str, ...]:
        """The parameters of the removed arguments (to remove them again)."""
        return tuple(dict.fromkeys(a.key for r in self.removed for a in parse_cmdline(r)[:1]))


def rewritten(
    text: str, before: Change, added: Sequence[str], remove: Sequence[str]
) -> tuple[str, Change]:
    """The command line `text` (a file's content: its trailing newline is kept) with
    latencyd's earlier change `before` undone, then `added` appended and the parameters
    named in `remove` taken out: the new text and the change made. Everything else stays
    byte for byte, so adding then undoing gives the text back (a removed argument comes
    back at the end). A parameter `text` holds that latencyd did not put there is the
    user's: it is left as it is (ValueError) unless `remove` names it. Undoing tolerates
    a change only partly made (a write cut short): an added argument not there is not
    taken out, a removed one whose parameter is there already is not put back."""
    line = text.rstrip("\n")
    newline = text[len(line) :]
    for arg in before.added:
        line = _drop_word(line, arg)
    for arg in before.removed:
        if find(parse_cmdline(line), parse_cmdline(arg)[0].key) is None:
            line = _append(line, arg)
    removing = {k.replace("-", "_") for k in remove}
    taken = tuple(str(a) for a in parse_cmdline(line) if a.key in removing)
    for arg in taken:
        line = _drop_word(line, arg)
    left = parse_cmdline(line)
    for key in removing:
        if find(left, key) is not None:
            raise ValueError(f"{find(left, key)} is written in a form latencyd does not rewrite")
    for arg in added:
        theirs = find(left, parse_cmdline(arg)[0].key)
        if theirs is not None:
            raise ValueError(
                f"the boot configuration has {theirs} already, not latencyd's: it is left as "
                f"it is (name {theirs.key!r} in remove to have latencyd replace it)"
            )
        line = _append(line, arg)
    return line + newline, Change(tuple(added), taken)


def _drop_word(line: str, word: str) -> str:
    """`line` without one whole-word occurrence of `word` and the space before it."""
    match = re.search(rf"(^|\s){re.escape(word)}(?=\s|$)", line)
    if match is None:
        return line
    end = match.end()
    if not match.group(1) and line[end : end + 1].isspace():
        end += 1  # the first word: the space after it goes with it
    return line[: match.start()] + line[end:]


def _append(line: str, word: str) -> str:
    return f"{line} {word}" if line.strip() else word
