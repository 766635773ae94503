"""The agent's choice of how a cluster profile is checked: its checker, told whether the
agent was started with --allow-boot-writes (a fake checker records what it was asked)."""

from __future__ import annotations

from pathlib import Path

from latencyd.agent.agent import Agent
from latencyd.agent.check import Checked
from latencyd.agent.daemon import Daemon, DaemonRefused, DaemonState
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
        assert {p.name for p in staging.iterdir()} == {"rt.toml"}  # the set, staged whole
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
        assert [p.name for p in (tmp_path / str(allowed)).iterdir()] == ["p"]  # no stage left
    assert asked == [("rt", False), ("rt", True)]


class RecordingDaemon:
    """The daemon's side as the agent sees it: what it was asked, and the files it would
    load at each switch (read from the directory then, as the daemon reads them)."""

    def __init__(self, directory: Path, refuse: bool = False, host: Path | None = None) -> None:
        self.directory, self.refuse, self.host = directory, refuse, host
        self.base = ""
        self.loaded: list[dict[str, bytes]] = []

    def state(self) -> DaemonState:
        return DaemonState(self.base, self.base, (), "")

    def reload(self) -> None:
        pass

    def profile_file(self, name: str) -> str | None:
        if self.host is not None and (self.host / f"{name}.toml").is_file():
            return str(self.host / f"{name}.toml")
        found = self.directory / f"{name}.toml"
        return str(found) if found.is_file() else None

    def switch(self, name: str) -> None:
        self.loaded.append({p.name: p.read_bytes() for p in self.directory.glob("*.toml")})
        if self.refuse:
            raise DaemonRefused("org.latencyd.Error.PermissionDenied", "refused")
        self.base = name


def agent_for(tmp_path: Path, daemon: RecordingDaemon, directory: Path) -> Agent:
    agent = Agent(None, "n", "tuning", daemon, ProfileDir(directory),  # type: ignore[arg-type]
                  System("/"), None, boot_writes=False)  # fmt: skip
    agent._event = lambda *args, **kwargs: None  # type: ignore[method-assign]
    agent.dir.prepare()
    return agent


def objects(**texts: str) -> list[dict[str, object]]:
    return [
        {"metadata": {"name": n, "namespace": "tuning"}, "spec": {"profile": t}}
        for n, t in texts.items()
    ]


def test_what_is_checked_is_exactly_the_set_the_daemon_then_loads(tmp_path: Path) -> None:
    """An include by path could name a file of the installed set, checked as it was, then
    replaced by the new set before the daemon loads it: boot writes got past the agent
    started without --allow-boot-writes that way (issue 50)."""
    directory = tmp_path / "cluster" / "profiles"
    daemon = RecordingDaemon(directory)
    agent = agent_for(tmp_path, daemon, directory)
    harmless = objects(b="[main]\n", a="[main]\n")
    agent._switch({}, wanted({}, harmless, [rules("a")]), daemon.state())
    assert daemon.base == "a"
    evil = objects(
        b='[bootloader]\nwrite = true\ncmdline = ["quiet"]\n',
        a=f'[main]\ninclude = ["{directory}/b.toml"]\n',
    )
    tuned, _ = agent._switch({}, wanted({}, evil, [rules("a")]), daemon.state())
    assert tuned.status is False and "includes by name only" in tuned.message
    assert len(daemon.loaded) == 1  # the daemon was not asked to load the new set
    assert agent.dir.files() == {"a.toml": b"[main]\n", "b.toml": b"[main]\n"}


def test_a_refused_set_is_swapped_back_whole(tmp_path: Path) -> None:
    directory = tmp_path / "cluster" / "profiles"
    daemon = RecordingDaemon(directory)
    agent = agent_for(tmp_path, daemon, directory)
    first = objects(a='[main]\nsummary = "one"\n')
    agent._switch({}, wanted({}, first, [rules("a")]), daemon.state())
    before = (agent.dir.files(), agent.dir.digest())
    daemon.refuse = True
    second = objects(a='[main]\nsummary = "two"\n', c="[main]\n")
    tuned, _ = agent._switch({}, wanted({}, second, [rules("a")]), daemon.state())
    assert tuned.reason == "SwitchFailed"
    # the daemon saw the new set whole, and the old one is back whole
    assert daemon.loaded[-1] == {n: t.encode() for n, t in (
        ("a.toml", '[main]\nsummary = "two"\n'), ("c.toml", "[main]\n"))}  # fmt: skip
    assert (agent.dir.files(), agent.dir.digest()) == before
    assert sorted(p.name for p in directory.parent.iterdir()) == ["profiles"]


def test_a_host_profile_of_the_same_name_is_not_replaced(tmp_path: Path) -> None:
    directory = tmp_path / "cluster" / "profiles"
    host = tmp_path / "etc"
    host.mkdir()
    (host / "site.toml").write_text("[main]\n")
    daemon = RecordingDaemon(directory, host=host)
    agent = agent_for(tmp_path, daemon, directory)
    tuned, _ = agent._switch(
        {}, wanted({}, objects(site="[main]\n"), [rules("site")]), daemon.state()
    )
    assert tuned.reason == "ProfileRefused"
    assert f"the host's profile {host}/site.toml has the name 'site'" in tuned.message
    assert daemon.loaded == [] and agent.dir.files() == {}


def rules(profile: str) -> dict[str, object]:
    return {"metadata": {"name": "r", "namespace": "tuning"},
            "spec": {"rules": [{"profile": profile}]}}  # fmt: skip
