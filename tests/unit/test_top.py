"""`latencyctl top`'s view of the daemon's Status: each source of noise beside what the
profile did about it."""

from __future__ import annotations

from latencyd.tools.top import format_top, top_view


def test_top_names_what_the_profile_did_about_each_source() -> None:
    status = {
        "holds": [{"pid": 4242, "reason": "latencyctl hold cpu-partitioning -- ./app"}],
        "plugins": {
            "monitor": {
                "facts": {"mechanism": "tracefs instance", "interval_ms": 1000, "budget_us": 500},
                "tables": [
                    {
                        "rows": [
                            ["1", "irq 28 virtio1-input.0", "3", "12.0", "5.0"],
                            ["1", "irq 40 nvme0q1", "1", "2.0", "2.0"],
                            ["1", "task 77 stress-ng", "1", "300.0", "300.0"],
                            ["1", "local timer", "250", "750.0", "4.0"],
                        ]
                    }
                ],
            },
            "irq": {
                "applied": [
                    {
                        "target": {"kind": "irq", "irq": 28},
                        "text": "IRQ 28 (virtio1-input.0) CPUs = 0",
                    }
                ],
                "not_applicable": [
                    {"target": {"kind": "irq", "irq": 40}, "reason": "kernel-managed"}
                ],
            },
            "kthread": {
                "applied": [
                    {
                        "target": {"kind": "task_affinity", "pid": 70, "tid": 77},
                        "text": "user task stress-ng CPUs = 0",
                    }
                ]
            },
        },
    }
    view = top_view(status)
    rows = {r["source"]: r for r in view["cpus"]["1"]}
    assert rows["irq 28 virtio1-input.0"]["profile"] == "IRQ 28 (virtio1-input.0) CPUs = 0 by [irq]"
    assert rows["irq 40 nvme0q1"]["profile"] == "not movable: kernel-managed"
    assert rows["task 77 stress-ng"]["profile"] == "user task stress-ng CPUs = 0 by [kthread]"
    assert "nohz_full" in rows["local timer"]["profile"] and rows["local timer"]["count"] == 250
    assert view["expected"] == ["pid 4242 (latencyctl hold cpu-partitioning -- ./app)"]
    lines = format_top(view)
    assert "CPU 1" in lines and "(budget 500 µs)" in lines[0]
    assert top_view({"plugins": {}}) == {
        "watching": False, "why": "the active profile has no [monitor] section"}  # fmt: skip
