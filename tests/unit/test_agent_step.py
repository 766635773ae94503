"""The agent's choice of how a cluster profile is checked: its checker, told whether the
agent was started with --allow-boot-writes (a fake checker records what it was asked)."""

from __future__ import annotations

from pathlib import Path

from latencyd.agent.agent import Agent
from latencyd.agent.check import Checked
from latencyd.agent.daemon import Daemon
from latencyd.agent.install import ProfileDir
from latencyd.agent.reconcile import wanted
from latencyd.agent.render import ProfileSet
from latencyd.kernel.system import System

PROFILE = {"metadata": {"name": "rt", "namespace": "tuning"}, "spec": {"profile": "[main]\n"}}
RULES = {"metadata": {"name": "r", "namespace": "tuning"}, "spec": {"rules": [{"profile": "rt"}]}}


def test_the_agents_checker_is_told_whether_boot_writes_are_allowed(tmp_path: Path) -> None:
    asked: list[tuple[str, bool]] = []

    def checker(
        name: str, profiles: ProfileSet, staging: Path, system: System, boot: bool
    ) -> Checked:
        asked.append((name, boot))
        staging.rmdir()
        return Checked(name, None)

    want = wanted({}, [PROFILE], [RULES])
    for allowed in (False, True):
        (tmp_path / str(allowed)).mkdir()
        installed = ProfileDir(tmp_path / str(allowed) / "p")
        agent = Agent(None, "n", "tuning", Daemon(), installed, System(str(tmp_path)), None,
                      checker=checker, boot_writes=allowed)  # fmt: skip
        agent.dir.prepare()
        assert agent._check(want) == Checked("rt", None)
        agent._check(want)  # the same set again: checked once
    assert asked == [("rt", False), ("rt", True)]
