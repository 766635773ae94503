"""latencyctl's output to a reader that has gone: what `latencyctl status | head` does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def test_a_reader_that_left_ends_latencyctl_as_sigpipe_would_without_a_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-c", "from latencyd.tools.cli import run; run()", "plugins"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if k != "DBUS_SYSTEM_BUS_ADDRESS"},
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 128 + signal.SIGPIPE
