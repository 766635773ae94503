"""Where latencyd's files are: the daemon's configuration, the profiles the machine's
admin writes and those that come with latencyd, and the daemon's state. One place for the
daemon and its tools (the config's contents are latencyd.service.config's)."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

CONFIG_FILE = Path("/etc/latencyd/latencyd.conf")
ETC_PROFILES = Path("/etc/latencyd/profiles")
DEFAULT_STATE_DIR = Path("/run/latencyd")
# The node agent installs the cluster's profiles here, and the daemon searches it last (its
# config's cluster_profiles). Not under the daemon's state directory: the agent's pod
# mounts the parent (it swaps in a new set beside it), and must not see the journal.
CLUSTER_PROFILES = Path("/run/latencyd-cluster/profiles")
KUBELET_CONFIG = Path("/var/lib/kubelet/config.yaml")
# What outlasts a reboot (StateDirectory= of the unit): the base profile the last `switch`
# or `off` chose, which every start resumes (latencyd.core.journal.BASE_FILE in it, as
# TuneD keeps /etc/tuned/active_profile), and the boot record below. The daemon's
# --keep-dir.
DEFAULT_KEEP_DIR = Path("/var/lib/latencyd")
# What latencyd wrote to the boot configuration (kernel arguments) and any write of it in
# progress: on disk, not in /run, since the arguments outlast a reboot and so must the
# record of them (latencyd.kernel.bootloaders). Its first line is latencyd's arguments,
# for a boot configuration to include where no bootloader tool is found.
BOOT_RECORD = DEFAULT_KEEP_DIR / "bootcmdline"


def shipped_profiles_dir() -> Path:
    """Profiles that come with latencyd: next to the source tree, or installed under share/."""
    candidates = [
        Path(__file__).resolve().parents[1] / "profiles",
        # pip's data directory: sys.prefix in a venv, /usr/local for Debian's python3
        Path(sysconfig.get_path("data")) / "share" / "latencyd" / "profiles",
        Path(sys.prefix) / "share" / "latencyd" / "profiles",
        Path("/usr/share/latencyd/profiles"),
    ]
    return next((c for c in candidates if c.is_dir()), candidates[-1])
