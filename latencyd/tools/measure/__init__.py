"""`latencyctl measure`: what a profile buys, as the field's standard tools see it.

- sockperf UDP ping-pong over a veth pair between two network namespaces made for the
  run (server on the application CPUs, client on housekeeping): RTT/2 per packet. The
  client stands in for the remote peer, so it runs at SCHED_FIFO 1: a load on the
  housekeeping CPUs must not slow the peer, or a 2-CPU machine measures the load's CPU
  instead of the application's;
- cyclictest timer wake-up latency on the application CPUs (`--default-system`, so
  the profile, not the tool, holds PM QoS);
- oslat (OS noise seen by a busy loop) where it is installed.

Scenarios alternate in short rounds (A B A B ...: the machine is noisy, alternation is
what makes a ratio fair). A scenario is a latencyd profile, held through the daemon
while it is measured (a hold ends by itself if this process dies), "untuned" (the empty
profile of that name: every original), "current" (nothing switched), or "tuned:NAME"
(TuneD applies NAME while latencyd holds "untuned": for comparisons only).

Nothing but this run's own namespaces, veth pair and processes, and the profile holds
it announces, is changed; all of it is undone on success, failure and Ctrl-C (and, if
the run is killed outright, by its guard: runguard), and every tool runs under a time
limit. Attribution (what ran or interrupted on the measured CPUs) comes from
/proc/interrupts, /proc/softirqs, /proc/schedstat and per-task schedstat. Where a
scenario's profile shields CPUs, the scheduler tick there during its tools, as the
daemon's noise watch counted it, beside what nohz_full= would remove after a reboot
(latencyd.tools.ticks). The kernel is read through one System, handed down from the caller.

One idea a module:
- plan: what a run measures (scenarios, CPUs, tools, rounds) and the time it may take;
- runner: the run itself, round by round;
- scenarios: putting a scenario in force (holds through the daemon, TuneD);
- tuned: TuneD in the foreground for comparisons, and what its rollback leaves, put back;
- tools: the latency tools, how each is run and how its output is read;
- network: the two namespaces and the veth pair sockperf runs over;
- load: what runs beside the tools (a CPU load, the control hog);
- processes: every process the run starts, ended;
- scratch: where the run's temporary files go, and what dead runs left, removed;
- counters: what interfered on the measured CPUs;
- idle_cost: what a scenario costs while nothing happens;
- result: the rounds' histograms pooled, and the ratios to the baseline;
- report: the result as lines for the terminal.
"""

from __future__ import annotations

from latencyd.errors import LatencydError


class MeasureError(LatencydError):
    dbus_name = "org.latencyd.Error.MeasureFailed"
