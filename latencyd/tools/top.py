"""`latencyctl top` (and the noise lines of `verify` and `status`'s boot section): the
noise watch's last interval, read from the daemon's Status, beside what the profile did
about each source.

Status is the service's answer, shaped by the plugins that made it: its sections are
named for them ("monitor" holds the watch's table, "irq", "kthread" and "shield" the
moves). Reading it is a tool's business, so the kernel layer (which decodes what the
kernel reports) and the framework name no plugin."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from latencyd.kernel.noise import task_of

_SOURCE_IRQ = re.compile(r"irq (\d+) ")
WHAT_THE_KERNEL_MUST_DO = {
    "local timer": "the scheduler tick: it stops on a CPU running one task only with "
    "nohz_full, which is a boot parameter (not something a daemon can set)",
    "IPI reschedule": "another CPU woke a task here",
    "IPI function call": "another CPU asked this one to run a function (TLB flush, ...)",
    "irq work": "deferred kernel work raised on this CPU",
}


def top_view(status: Mapping[str, Any]) -> dict[str, Any]:
    """From the daemon's Status: per watched CPU its sources (count, time, worst single)
    with what the profile did about each, the expected tasks, the mechanism."""
    plugins = status.get("plugins")
    plugins = plugins if isinstance(plugins, dict) else {}
    monitor = plugins.get("monitor")
    if not isinstance(monitor, dict):
        return {"watching": False, "why": "the active profile has no [monitor] section"}
    facts = monitor.get("facts", {})
    rows = monitor["tables"][0]["rows"] if monitor.get("tables") else []
    did = _what_the_profile_did(plugins)
    cpus: dict[str, list[dict[str, Any]]] = {}
    for cpu, source, count, total_us, max_us in rows:
        irq, task = _SOURCE_IRQ.match(source), task_of(source)
        about = (
            did.get(("irq", int(irq[1])), "not steered by the profile") if irq
            else did.get(("task", task[0]), "not moved by the profile") if task
            else WHAT_THE_KERNEL_MUST_DO.get(source, "")
        )  # fmt: skip
        cpus.setdefault(str(cpu), []).append({
            "source": source, "count": int(count), "total_us": float(total_us),
            "max_us": float(max_us), "profile": about,
        })  # fmt: skip
    holds = status.get("holds")
    return {
        "watching": True,
        "mechanism": facts.get("mechanism", ""),
        "interval_ms": facts.get("interval_ms"),
        "budget_us": facts.get("budget_us"),
        "expected": [
            _held_by(h) for h in holds or [] if isinstance(h, dict)
        ] if isinstance(holds, list) else [],
        "cpus": cpus,
    }  # fmt: skip


def _held_by(hold: Mapping[str, Any]) -> str:
    """A hold's application: its pid and reason, which Status gives root and the admin
    group only."""
    who = f"pid {hold['pid']}" if hold.get("pid") else f"hold {hold['cookie']}"
    return f"{who} ({hold['reason']})" if hold.get("reason") is not None else who


def _what_the_profile_did(plugins: Mapping[str, Any]) -> dict[tuple[str, int], str]:
    out: dict[tuple[str, int], str] = {}
    for name in ("irq", "kthread", "shield"):
        section = plugins.get(name)
        if not isinstance(section, dict):
            continue
        for row in section.get("applied", []):
            target = row.get("target") or {}
            if target.get("kind") == "irq":
                out[("irq", int(target["irq"]))] = f"{row['text']} by [irq]"
            elif target.get("kind") in ("thread_affinity", "task_affinity"):
                by = f"{row['text']} by [{name}]"
                out[("task", int(target.get("tid", target["pid"])))] = by
        for row in section.get("not_applicable", []):
            target = row.get("target") or {}
            if target.get("kind") == "irq":
                out[("irq", int(target["irq"]))] = f"not movable: {row['reason']}"
    return out


def format_top(view: Mapping[str, Any]) -> list[str]:
    """`top_view` as lines, for latencyctl to print (it escapes each, as all its output)."""
    if not view.get("watching"):
        return [f"not watching: {view.get('why')}"]
    lines = [f"noise on the watched CPUs, last {view['interval_ms']} ms interval "
             f"(budget {view['budget_us'] or 'none'} µs): {view['mechanism']}"]  # fmt: skip
    expected = view.get("expected") or []
    lines.append(f"expected there: {', '.join(expected) if expected else 'none held'}")
    cpus = view.get("cpus")
    for cpu, sources in cpus.items() if isinstance(cpus, dict) else []:
        lines.append(f"CPU {cpu}")
        lines.append(f"  {'source':32} {'count':>7} {'total µs':>10} {'max µs':>9}  profile")
        for s in sources:
            lines.append(f"  {s['source'][:32]:32} {s['count']:>7} {s['total_us']:>10.1f} "
                         f"{s['max_us']:>9.1f}  {s['profile']}")  # fmt: skip
    if not cpus:
        lines.append("nothing interrupted the watched CPUs in the last interval")
    return lines
