"""Profiles the VM tests install into the guest's /etc/latencyd/profiles: the shipped ones
with the 4-vCPU VM's CPUs 2-3 isolated, as a user sets isolated_cores for their machine."""

DEFAULT_PROFILE = "latency-performance"  # systemd/latencyd.conf's default_profile

PARTITIONING = """\
[main]
summary = "cpu-partitioning with CPUs 2-3 isolated (the VM tier)"
include = ["cpu-partitioning"]

[variables]
isolated_cores = "2-3"
"""

PARTITIONING_WRITTEN = """\
[main]
summary = "cpu-partitioning with CPUs 2-3 isolated, and boot arguments written (the VM tier)"
include = ["cpu-partitioning"]

[variables]
isolated_cores = "2-3"

[bootloader]
cmdline = ["nohz_full=${isolated_cores}", "rcu_nocbs=${isolated_cores}"]
write = true
"""

REALTIME_WRITTEN = """\
[main]
summary = "realtime with CPUs 2-3 isolated, its boot arguments written (the VM tier)"
include = ["realtime"]

[variables]
isolated_cores = "2-3"

[bootloader]
write = true
"""

E1000E_PER_PACKET = """\
[main]
summary = "latency-performance and an interrupt per packet on the e1000e (the VM tier)"
include = ["latency-performance"]

[[net.nic]]
driver = ["e1000e"]
coalesce = { rx-usecs = 0 }
"""

REALTIME = """\
[main]
summary = "realtime with CPUs 2-3 isolated, its boot arguments shown, not written (the VM tier)"
include = ["realtime"]

[variables]
isolated_cores = "2-3"
"""

PARTITIONING_TWO_NODES = """\
[main]
summary = "cpu-partitioning with CPUs 2-3 and 6-7 isolated: two of each NUMA node (the VM tier)"
include = ["cpu-partitioning"]

[variables]
isolated_cores = "2-3,6-7"
"""
