"""Every process a measurement starts is ended: its tools, its load, TuneD, each in a
process group of its own, and told to the run's guard (runguard) should the run die."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from latencyd.kernel.system import System
from latencyd.tools.measure import MeasureError
from latencyd.tools.runguard import Guard


class Processes:
    """Children each in a process group of its own, so each can be ended with all it
    started. They stay in this process's session, as the load does: processes started from
    one shell share a session, and so an autogroup (kernel.sched_autogroup_enabled), and
    compete task by task. Separate sessions would give the tools a CPU share of their own
    against the load and hide what the load does to them."""

    def __init__(self, system: System, guard: Guard | None = None) -> None:
        # told of each group, to end it should this process die
        self.guard = guard if guard is not None else Guard(watch=False)
        self.running: list[subprocess.Popen[str]] = []
        self.detached: list[int] = []  # process groups started outside our tree
        # What a shell here would start things with: measure keeps itself to the
        # housekeeping CPUs once it runs, and what it detaches must not inherit that.
        self.shell_cpus = system.affinity(0)

    def start(self, argv: list[str], grace: float = 3.0, **kwargs: Any) -> subprocess.Popen[str]:
        """Start `argv` in a process group of its own; `grace`: the seconds it gets to exit
        after SIGTERM, here and by the guard."""
        proc = subprocess.Popen(
            argv, process_group=0, text=True, stdin=subprocess.DEVNULL, **kwargs
        )
        self.running.append(proc)
        self.guard.group(proc.pid, grace)
        return proc

    def run(self, argv: list[str], timeout: float) -> str:
        proc = self.start(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise MeasureError(f"{argv[0]} did not finish within {timeout:.0f} s") from exc
        finally:  # ended whatever happened (a timeout, Ctrl-C), then forgotten
            self.end(proc)
            with contextlib.suppress(ValueError):
                self.running.remove(proc)
        if proc.returncode != 0:
            raise MeasureError(
                f"{' '.join(argv[:3])}... failed ({proc.returncode}): {err.strip()[-300:]}"
            )
        return out

    def end(self, proc: subprocess.Popen[str], grace: float = 3.0) -> None:
        """SIGTERM its process group; SIGKILL what is left after `grace` seconds."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(3)
        self.guard.ended(proc.pid)

    def detach(self, argv: list[str], workdir: Path, name: str = "load") -> int:
        """Start `argv` outside this process tree, as a load or an application started from
        a shell would be: a shell in a process group of its own starts it in the
        background and exits, so it is re-parented and a hold's exemption (this process
        and its children) does not cover it; it stays in this session. Returns its
        process group; ended in end_all (or by the caller, with killpg)."""
        pidfile = workdir / f"{name}.pid"
        script = f'"$@" </dev/null >/dev/null 2>&1 & echo $$ > {shlex.quote(str(pidfile))}'
        argv = ["taskset", "-c", self.shell_cpus.to_list(), *argv]
        subprocess.run(["sh", "-c", script, "sh", *argv], check=True, process_group=0,
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)  # fmt: skip
        pgid = int(pidfile.read_text())
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            raise MeasureError(f"the {name} did not start: {' '.join(argv)}") from None
        self.detached.append(pgid)
        self.guard.group(pgid, 0.0)  # SIGKILL at once, as end_group does
        return pgid

    def end_group(self, pgid: int, timeout: float = 5.0) -> None:
        """End one detached process group (SIGKILL: nothing of it needs to clean up), and
        wait until init has reaped it, so its port and CPU are free for the next round."""
        with contextlib.suppress(ValueError):
            self.detached.remove(pgid)
        deadline = time.monotonic() + timeout
        try:
            os.killpg(pgid, signal.SIGKILL)
            while time.monotonic() < deadline:
                os.killpg(pgid, 0)  # ProcessLookupError once no member is left, zombie or not
                time.sleep(0.005)
        except ProcessLookupError:
            pass
        self.guard.ended(pgid)

    def end_all(self) -> None:
        for proc in reversed(self.running):
            self.end(proc)
        self.running.clear()
        for pgid in list(self.detached):  # its group holds all it started; gone on return
            self.end_group(pgid)
