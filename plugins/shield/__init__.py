"""shield: keep user tasks off the CPUs the application runs on.

How the shield is kept is its `mechanism` (latencyd.kernel.cgroups.choose): a cgroup v2
isolated partition, AllowedCPUs= set through systemd where systemd owns the v2 tree, or
v1 exclusive cpusets, which the kernel keeps (tasks are born where their parent is; each
cgroup made, file written and task moved is a setting of its own, journaled), or the
affinity chase. The application is placed inside by `latencyctl run`
and `hold -- CMD` (PlaceHolder), or by name (`apps`) as it execs.

Under the chase, `cpus` shields CPUs from user tasks the way tuna and RedHawk's `shield`
do: a task also allowed on other CPUs is narrowed to those (and logged); a task whose
affinity lies entirely inside the shielded CPUs was put there on purpose (`taskset`, a
container runtime, `latencyctl hold`) and stays, also when someone moves a narrowed task
back inside. New tasks arrive as task events (latencyd.service.taskevents), and a
periodic rescan is the safety net. Tasks named in `allow` and the processes holding a
profile are left alone. `[[shield.rule]]` puts user processes matched by name on CPUs of
their own, as TuneD's scheduler groups can; such a rule wins over the shield.

These options were once [kthread]'s (isolate_tasks, allow, rule with user = true):
profiles that say so still load (Schema.moved), and journals that hold them still
restore (took_over).

The package, a module per idea: plugin.py is the plugin (what the engine, the daemon
and status ask of it), which hands each question to the mechanism chosen or answers it
by the setting's kind; options.py says what the section may hold (ShieldOptions, as
which it is read); rules.py says who a task is to the shield (apps, allow, holds,
rules); targets.py holds the settings' kinds; mechanism.py is the interface every
mechanism keeps, each a module: chase.py, v1.py, partition.py (v2) and systemd.py, the
three cpuset ones sharing cpusets.py. Not here: the machine's cgroup facts, the choice
between the mechanisms and the cpusets each makes, pure functions of the kernel layer
(latencyd.kernel.cgroups).
"""

from .chase import THREAD_CHUNK
from .plugin import ShieldPlugin
from .rules import ShieldRules
from .targets import Cgroup, SlicePartition, TaskAffinity, TaskCgroup, TaskUnit, UnitCpus

__all__ = [
    "THREAD_CHUNK",
    "Cgroup",
    "ShieldPlugin",
    "ShieldRules",
    "SlicePartition",
    "TaskAffinity",
    "TaskCgroup",
    "TaskUnit",
    "UnitCpus",
]
