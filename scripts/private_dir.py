"""Make (mode 0700) or check a directory a root process may keep its files in, by the one
rule latencyd trusts directories by (latencyd/kernel/trust.py): exit 1, saying why, when it
or a directory above it could be changed by another user, or it is a symlink.

    .venv/bin/python -m scripts.private_dir DIR
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from latencyd.errors import UnsafePath
from latencyd.kernel.trust import open_private_dir


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        os.close(open_private_dir(Path(argv[0])))
    except UnsafePath as exc:
        print(f"refusing {exc}: remove it, or choose another directory", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
