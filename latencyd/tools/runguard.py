"""What a measurement run started, ended by a process that outlives the run.

measure's own clean-up runs on success, failure, Ctrl-C and SIGTERM, but not when the run
is killed outright: SIGKILL, or a parent's `subprocess.run`, which kills its child 0.25 s
after Ctrl-C. Its load and the sockperf server are outside its process tree on purpose (as
an application started from a shell is, so a hold's exemption does not cover them), so
nothing else would end them: found as a `stress-ng --cpu 2` and a sockperf server running
on, and two namespaces, after an interrupted benchmark.

The guard is started first, in a session of its own (a terminal's Ctrl-C and a kill of the
run's process group miss it), reading a pipe whose writing end only the run holds (Python's
pipes are not inherited). The run writes a line for each process group, namespace and
directory it makes and for each group it ends, and "done" once its clean-up has run. If the
pipe closes without "done", the run died: the guard ends the groups still live (SIGTERM,
SIGKILL after each one's grace: TuneD's rollback takes seconds), then deletes the
namespaces, then the directories (after the groups: TuneD rolls back into its copies).
What a guard killed too leaves, `measure.remove_what_dead_runs_left` removes on the next run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


class Guard:
    """The run's side: start the guard, tell it what to end should the run die. With
    `watch=False`, none is started and what it is told is dropped (`Processes` used outside
    a measurement run, by the benchmarks)."""

    def __init__(self, watch: bool = True) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self._write = -1
        if not watch:
            return
        read, self._write = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "latencyd.tools.runguard"],
                stdin=read,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            os.close(read)

    def tell(self, *words: object) -> None:
        if self._write < 0:
            return
        try:
            os.write(self._write, (" ".join(map(str, words)) + "\n").encode())
        except BrokenPipeError:  # the guard was killed: the run goes on without one
            os.close(self._write)
            self._write = -1

    def group(self, pgid: int, grace: float) -> None:
        self.tell("group", pgid, grace)

    def ended(self, pgid: int) -> None:
        self.tell("ended", pgid)

    def netns(self, name: str) -> None:
        self.tell("netns", name)

    def path(self, path: Path) -> None:
        self.tell("path", path)

    def done(self) -> None:
        """The run cleaned up after itself: the guard exits doing nothing."""
        self.tell("done")
        if self._write >= 0:
            os.close(self._write)
            self._write = -1
        if self.proc is not None:
            self.proc.wait()


@dataclass
class Leftovers:
    """What the run told the guard, not yet ended by the run."""

    groups: dict[int, float] = field(default_factory=dict)  # process group -> grace (s)
    netns: list[str] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)
    done: bool = False

    def read(self, line: str) -> None:
        word, _, arg = line.rstrip("\n").partition(" ")
        if word == "group":
            pgid, grace = arg.split()
            self.groups[int(pgid)] = float(grace)
        elif word == "ended":
            self.groups.pop(int(arg), None)
        elif word == "netns":
            self.netns.append(arg)
        elif word == "path":
            self.paths.append(Path(arg))
        elif word == "done":
            self.done = True


def end_groups(groups: dict[int, float], poll: float = 0.02, reap: float = 5.0) -> list[int]:
    """SIGTERM each group, SIGKILL what is left of it after its grace, and wait until none
    is left (at most `reap` seconds after the SIGKILL: a zombie whose parent never reaps it
    counts as a member); returns those that were live."""
    live = []
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
            live.append(pgid)
    start = time.monotonic()
    killed_at: dict[int, float | None] = dict.fromkeys(live)
    while killed_at:
        now = time.monotonic()
        for pgid, at in list(killed_at.items()):
            try:
                if at is None and now - start > groups[pgid]:
                    os.killpg(pgid, signal.SIGKILL)
                    killed_at[pgid] = now
                elif at is not None and now - at > reap:
                    del killed_at[pgid]
                    continue
                os.killpg(pgid, 0)
            except ProcessLookupError:
                del killed_at[pgid]
        time.sleep(poll)
    return live


def main() -> int:
    # Only the pipe ends it: a terminal's signals are for the run, and the run's end is
    # exactly when the guard must keep going.
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_IGN)
    left = Leftovers()
    for line in sys.stdin:
        left.read(line)
        if left.done:
            return 0
    ended = end_groups(left.groups)
    for name in left.netns:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)
    for path in left.paths:
        shutil.rmtree(path, ignore_errors=True)
    what = [f"{len(ended)} process group(s)"] if ended else []
    what += [*left.netns, *map(str, left.paths)]
    with contextlib.suppress(OSError):  # the terminal may be gone with the run
        if what:
            print(f"latencyctl measure died; its guard removed {', '.join(what)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
