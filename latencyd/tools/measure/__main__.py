"""`python -m latencyd.tools.measure REPORT TUNED-ARGV...`: TuneD run under its guard
(tuned.guard_tuned), as TunedDaemon starts it."""

from __future__ import annotations

import sys
from pathlib import Path

from latencyd.kernel.system import System
from latencyd.tools.measure.tuned import guard_tuned

if __name__ == "__main__":
    sys.exit(guard_tuned(System("/"), Path(sys.argv[1]), sys.argv[2:]))
