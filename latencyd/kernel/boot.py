"""The isolation the machine booted with, and what a profile's shield would gain by more.

Only boot arguments stop the scheduler tick on a CPU (nohz_full), move RCU callbacks off it
(rcu_nocbs) or keep kernel-managed IRQs away (isolcpus=managed_irq): no write at run time
does. So at every start the daemon reads what is in force (`BootReadings`, from the
system facade), and `compare` sets it against the CPUs the profile shields: for each of
these, booted, not booted (with the argument that would add it), or not applicable on
this kernel (with the reason: a kernel built without CONFIG_NO_HZ_FULL ignores
nohz_full= after any reboot).

What is in force is read from the kernel where it says so, not from the command line:
/sys/devices/system/cpu/isolated (scheduler domains), /sys/devices/system/cpu/nohz_full
(present only on kernels built with NO_HZ_FULL), the rcuop/N kthreads; the command line
for the rest (managed_irq has no file). The kthreads alone overstate the offloaded CPUs:
since Linux 5.17 the kernel makes one for every CPU once rcu_nocbs= or nohz_full= is
given (so that offloading can change at run time), offloaded or not (`_offloaded`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from latencyd.cpuset import CpuSet
from latencyd.kernel.cmdline import Isolation, KernelArg, isolation, parse_cmdline

ISOLATION_KEYS = ("isolcpus", "nohz_full", "nohz", "rcu_nocbs", "irqaffinity", "rcu_nocb_poll")
NO_NOHZ_FULL = (
    "this kernel is built without CONFIG_NO_HZ_FULL (it has no "
    "/sys/devices/system/cpu/nohz_full): it ignores nohz_full= even after a reboot"
)
NO_RCU_NOCB = (
    "this kernel is built without CONFIG_RCU_NOCB_CPU (rcutree has no rcu_nocb_gp_stride "
    "parameter): it ignores rcu_nocbs="
)
NO_CPU_ISOLATION = (
    "this kernel is built without CONFIG_CPU_ISOLATION (it has no "
    "/sys/devices/system/cpu/isolated): it ignores isolcpus="
)


@dataclass(frozen=True)
class BootReadings:
    """What the running kernel shows of how it booted (System.boot_readings)."""

    cmdline: str
    possible: CpuSet
    isolated: CpuSet | None  # None: no such file (no CONFIG_CPU_ISOLATION)
    nohz_full: CpuSet | None  # None: no such file (no CONFIG_NO_HZ_FULL)
    rcu_nocb_capable: bool
    rcu_offloaded: CpuSet  # CPUs with an rcuop kthread (more than are offloaded: _offloaded)


@dataclass(frozen=True)
class BootState:
    """The isolation in force, and what the command line asked that the kernel did not
    do (`problems`), in words."""

    args: tuple[KernelArg, ...]  # the isolation arguments as booted
    asked: Isolation
    isolated: CpuSet
    tickless: CpuSet
    rcu_offloaded: CpuSet
    managed_irq: CpuSet
    unsupported: dict[str, str] = field(default_factory=dict)  # argument -> why not here
    problems: tuple[str, ...] = ()

    def as_json(self) -> dict[str, object]:
        return {
            "arguments": [str(a) for a in self.args],
            "isolated": self.isolated.to_list(),
            "nohz_full": self.tickless.to_list(),
            "rcu_nocbs": self.rcu_offloaded.to_list(),
            "managed_irq": self.managed_irq.to_list(),
            "unsupported": dict(self.unsupported),
            "problems": list(self.problems),
        }


def booted(readings: BootReadings) -> BootState:
    args = parse_cmdline(readings.cmdline)
    asked = isolation(args, readings.possible)
    unsupported = {}
    problems = list(asked.problems)
    if readings.nohz_full is None:
        unsupported["nohz_full"] = NO_NOHZ_FULL
        if asked.tickless:
            problems.append(f"nohz_full={asked.tickless.to_list()} was asked: {NO_NOHZ_FULL}")
    if not readings.rcu_nocb_capable:
        unsupported["rcu_nocbs"] = NO_RCU_NOCB
    if readings.isolated is None:
        unsupported["isolcpus"] = NO_CPU_ISOLATION
    kept = [a for a in args if a.key in ISOLATION_KEYS]
    return BootState(
        args=tuple(kept),
        asked=asked,
        isolated=readings.isolated or CpuSet(),
        tickless=readings.nohz_full or CpuSet(),
        rcu_offloaded=_offloaded(readings, asked),
        managed_irq=asked.managed_irq if readings.isolated is not None else CpuSet(),
        unsupported=unsupported,
        problems=tuple(problems),
    )


def _offloaded(readings: BootReadings, asked: Isolation) -> CpuSet:
    """The CPUs whose RCU callbacks the kernel offloads. At boot (rcu_init_nohz) it
    offloads those rcu_nocbs= names (every CPU for a bare rcu_nocbs) and the nohz_full
    CPUs in force; with neither, every CPU on a kernel built RCU_NOCB_CPU_DEFAULT_ALL, and
    none otherwise. Kernels since 5.17 make an rcuop kthread for every CPU as soon as there
    is one to offload, so the kthreads say only which CPUs could be: of the CPUs asked,
    those with a kthread (kernels before 5.17 made one for an offloaded CPU only); with
    none asked, the kthreads (none, or every CPU for DEFAULT_ALL)."""
    kthreads = readings.rcu_offloaded
    asked_cpus = (asked.rcu_nocbs or CpuSet()) | (readings.nohz_full or CpuSet())
    if asked.rcu_nocbs is None and not readings.nohz_full:
        return kthreads
    return asked_cpus & kthreads


@dataclass(frozen=True)
class Finding:
    """One boot-time isolation feature for the shielded CPUs: `state` is "booted", "not
    booted" (`argument` would add it at the next boot), "not applicable" (`detail` says
    why, on this kernel) or "mismatch" (booted for CPUs the profile does not shield)."""

    feature: str
    cpus: str
    state: str
    argument: str
    detail: str

    def as_json(self) -> dict[str, str]:
        return {"feature": self.feature, "cpus": self.cpus, "state": self.state,
                "argument": self.argument, "detail": self.detail}  # fmt: skip


# feature, the argument that adds it for CPUS, the parameter it needs, what it does
_FEATURES = (
    ("tick", "nohz_full={}", "nohz_full",
     "stops the scheduler tick (and moves unbound work and timers) off the CPUs"),
    ("rcu callbacks", "rcu_nocbs={}", "rcu_nocbs",
     "runs their RCU callbacks on other CPUs (rcuop kthreads)"),
    ("managed IRQs", "isolcpus=managed_irq,{}", "isolcpus",
     "keeps kernel-managed IRQs (which no affinity write moves) off the CPUs"),
    ("scheduler domains", "isolcpus=domain,{}", "isolcpus",
     "takes the CPUs out of load balancing (the shield's affinities keep other tasks off "
     "already; without balancing, an application's threads stay where it put them)"),
)  # fmt: skip


def compare(shield: CpuSet, state: BootState) -> list[Finding]:
    """What the booted isolation gives the CPUs a profile shields, feature by feature."""
    if not shield:
        return []
    have = {
        "tick": state.tickless,
        "rcu callbacks": state.rcu_offloaded,
        "managed IRQs": state.managed_irq,
        "scheduler domains": state.isolated,
    }
    findings = []
    for feature, argument, parameter, does in _FEATURES:
        booted_cpus = have[feature]
        missing = shield - booted_cpus
        wanted = argument.format(shield.to_list())
        if parameter in state.unsupported:
            findings.append(Finding(feature, missing.to_list(), "not applicable", wanted,
                                    state.unsupported[parameter]))  # fmt: skip
        elif missing:
            findings.append(Finding(feature, missing.to_list(), "not booted", wanted,
                                    f"{wanted} {does} after a reboot"))  # fmt: skip
        else:
            findings.append(Finding(feature, shield.to_list(), "booted", "", does))
        extra = booted_cpus - shield
        if extra:
            findings.append(Finding(
                feature, extra.to_list(), "mismatch", "",
                f"booted for CPUs {extra.to_list()}, which the profile does not shield "
                f"(it shields {shield.to_list()})",
            ))  # fmt: skip
    return findings


NOT_SHOWN = (
    "this machine does not show how it booted (its /proc/cmdline or "
    "/sys/devices/system/cpu could not be read), so nothing shows the isolation is booted"
)
# The features' arguments in the order they are proposed; isolcpus= once with both flags:
# the parser (and the kernel, for one kind) keeps only one isolcpus= of each kind.
_ARGUMENTS = (
    ({"tick"}, "nohz_full={}"),
    ({"rcu callbacks"}, "rcu_nocbs={}"),
    ({"managed IRQs", "scheduler domains"}, "isolcpus=managed_irq,domain,{}"),
)


def unmet(shield: CpuSet, state: BootState | None) -> str | None:
    """Why the booted isolation does not give `shield` what a profile requiring it needs
    ([main] booted_isolation = "require"), with the arguments to boot with; None if it
    does. Any feature "not booted" or "mismatch" (booted for CPUs not shielded) is unmet;
    "not applicable" is not: no reboot brings it on this kernel. A machine that does not
    show its booted state (`state` None) never passes."""
    if state is None:
        return NOT_SHOWN
    findings = compare(shield, state)
    said = []
    for finding in findings:
        if finding.state == "not booted":
            said.append(f"{finding.feature} not booted for CPUs {finding.cpus}")
        elif finding.state == "mismatch":
            said.append(f"{finding.feature} booted for CPUs {finding.cpus}, not shielded")
    if not said:
        return None
    wrong = {f.feature for f in findings if f.state in ("not booted", "mismatch")}
    args = [arg.format(shield.to_list()) for features, arg in _ARGUMENTS if features & wrong]
    return f"{'; '.join(said)} (boot with {' '.join(args)})"
