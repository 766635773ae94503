"""Kernel access: the system facade (`latencyd.kernel.system.System`, the one way anything
in latencyd reads or writes a kernel setting, a task or a cgroup) and the decoders of what
the kernel reports (cgroups, cpuidle, /proc/stat and interrupts, the booted command line,
ethtool's netlink, the noise watch's counters, systemd's manager). Knows nothing of
profiles, plugins or the engine: imports only the top package's vocabulary
(tests/unit/test_layout.py)."""
