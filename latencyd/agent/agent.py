"""The node agent's step: from what the cluster says (its Node, the LatencyProfiles and
LatencyRecommends of its namespace, as the informers hold them) and what the daemon
holds, one move toward the cluster's choice, then the Node's report brought up to date.

The daemon owns the machine: the agent only installs profile files, asks the daemon to
reload and switch, and reports. A profile latencyd's loader refuses never reaches the
daemon's directory; a switch the daemon refuses is undone (the previous files put back),
and neither is tried again until the cluster's choice changes. Nothing is asked of the
daemon while the cluster cannot be read (the node keeps its profile)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from latencyd.agent import cluster
from latencyd.agent.check import Checked, check, shadowed
from latencyd.agent.conditions import (
    CPUS_CONFLICT,
    DIGEST_ANNOTATION,
    KERNEL_ARGS_ANNOTATION,
    PROFILE_ANNOTATION,
    TUNED,
    Breach,
    Condition,
    annotations_patch,
    conditions_patch,
    cpus_condition,
    iso,
    reboot_condition,
    shield_condition,
)
from latencyd.agent.daemon import Daemon, DaemonRefused, DaemonState
from latencyd.agent.install import ProfileDir
from latencyd.agent.reconcile import Held, Step, Wanted, plan, wanted
from latencyd.agent.render import ProfileSet, in_cluster_terms
from latencyd.kernel.system import System
from latencyd.text import printable

log = logging.getLogger(__name__)


class Agent:
    def __init__(
        self,
        api: Any,
        node: str,
        namespace: str,
        daemon: Daemon,
        profile_dir: ProfileDir,
        system: System,
        kubelet_config: Path | None,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        checker: Callable[[str, ProfileSet, Path, System, bool], Checked] = check,
        boot_writes: bool = False,
    ) -> None:
        self.api, self.node_name, self.namespace = api, node, namespace
        self.daemon, self.dir, self.system = daemon, profile_dir, system
        self.kubelet_config = kubelet_config
        self.clock = clock
        self.checker = checker  # bench/fleet.py shares one among simulated agents
        self.boot_writes = boot_writes
        self.nodes = cluster.Informer(
            api, cluster.Node, fields={"metadata.name": node}, on_change=wake
        )
        self.profiles = cluster.Informer(api, cluster.LatencyProfile, namespace, on_change=wake)
        self.recommends = cluster.Informer(api, cluster.LatencyRecommend, namespace, on_change=wake)
        self.breach: Breach | None = None
        self._checked: dict[tuple[str, str], Checked] = {}  # by (digest, profile)
        self._refused: dict[tuple[str | None, str | None], Condition] = {}
        self.switches = 0  # daemon switches asked (the e2e tests count reverts by these)

    @property
    def informers(self) -> tuple[cluster.Informer, ...]:
        return (self.nodes, self.profiles, self.recommends)

    def noise(self, cpu: int, sources: str) -> None:
        self.breach = Breach(self.clock(), cpu, sources)

    # -- one step ------------------------------------------------------------------
    def step(self) -> None:
        if not all(i.synced for i in self.informers):
            return
        node = self.nodes.objects.get(self.node_name)
        if node is None:
            log.warning("node %s not found: nothing to report on", printable(self.node_name))
            return
        labels = node.get("metadata", {}).get("labels") or {}
        want = wanted(labels, self.profiles.snapshot(), self.recommends.snapshot())
        try:
            state = self.daemon.state()
        except DaemonRefused as exc:
            why = f"latencyd does not answer: {exc}"
            self._report(node, [Condition(TUNED, None, "DaemonUnreachable", why)], {})
            return
        held = Held(state.base, self.dir.digest())
        step = plan(want, held)
        if step is Step.REFUSE:
            tuned = self._refuse(node, want, "ClusterConfigInvalid", str(want.error))
        elif step is Step.SWITCH:
            tuned, state = self._switch(node, want, state)
        elif want.profile is None:
            tuned = Condition(
                TUNED,
                False,
                "NoMatchingRule",
                f"no LatencyRecommend rule matches this node's labels; latencyd keeps "
                f"{state.base or 'no profile'}",
            )
        else:
            tuned = Condition(TUNED, True, "Applied", self._applied(want, state))
        checked = self._held_profile(want, state)
        conditions = [
            tuned,
            reboot_condition(state.reboot_pending),
            shield_condition(self.breach, self.clock()),
            *self._kubelet(checked),
        ]
        annotations: dict[str, str | None] = {
            PROFILE_ANNOTATION: state.base or None,
            DIGEST_ANNOTATION: self.dir.digest(),
        }
        if checked is not None:
            annotations[KERNEL_ARGS_ANNOTATION] = " ".join(checked.kernel_args) or None
        self._report(node, conditions, annotations)

    def _applied(self, want: Wanted, state: DaemonState) -> str:
        held = f" (a hold has {state.active} in force)" if state.active != state.base else ""
        return f"profile {state.base} in force, verified by latencyd; {want.why}{held}"

    def _held_profile(self, want: Wanted, state: DaemonState) -> Checked | None:
        """The cluster's profile the daemon holds, as latencyd's loader reads it."""
        if want.profiles is None or want.profile != state.base or want.digest != self.dir.digest():
            return None
        return self._check(want)

    def _check(self, want: Wanted, staged: Path | None = None) -> Checked:
        """The cluster's chosen profile as latencyd's loader reads it from the set staged
        whole (in `staged`, the very directory a switch then swaps in), once per set."""
        assert want.profiles is not None and want.profile is not None
        key = (want.profiles.digest, want.profile)
        if key not in self._checked:
            directory = staged or self.dir.stage(want.profiles.files())
            try:
                checked = self.checker(
                    want.profile, want.profiles, directory, self.system, self.boot_writes
                )
            finally:
                if staged is None:
                    self.dir.discard(directory)
            self._checked = {key: checked}
        return self._checked[key]

    def _refuse(
        self, node: Mapping[str, Any], want: Wanted, reason: str, message: str
    ) -> Condition:
        """Said once per cluster state (an Event), kept until the cluster's choice changes."""
        key = (want.digest, want.profile)
        if key not in self._refused:
            self._refused = {key: Condition(TUNED, False, reason, message)}
            self._event(node, reason, message, warning=True)
        return self._refused[key]

    def _switch(
        self, node: Mapping[str, Any], want: Wanted, state: DaemonState
    ) -> tuple[Condition, DaemonState]:
        assert want.profiles is not None and want.profile is not None
        key = (want.digest, want.profile)
        if key in self._refused:
            return self._refused[key], state
        keeps = f"latencyd keeps {state.base or 'no profile'}"
        staged = self.dir.stage(want.profiles.files())
        try:
            checked = self._check(want, staged)
            if checked.error is None:
                checked = self._not_shadowed(want.profile, checked)
            if checked.error is not None:
                return self._refuse(
                    node, want, "ProfileRefused", f"{checked.error}; {keeps}"
                ), state
            self.dir.swap(staged)  # now `staged` holds the set installed before
            try:
                self.switches += 1
                self.daemon.reload()
                self.daemon.switch(want.profile)
            except DaemonRefused as exc:
                self.dir.swap(staged)
                with contextlib.suppress(DaemonRefused):
                    self.daemon.reload()
                message = in_cluster_terms(str(exc), self.dir.path, want.profiles)
                if exc.unreachable:  # tried again at the next resync
                    return Condition(TUNED, None, "DaemonUnreachable", message), state
                return self._refuse(node, want, "SwitchFailed", f"{message}; {keeps}"), state
        finally:
            self.dir.discard(staged)
        self.dir.set_digest(str(want.digest))
        before = state.base
        state = self.daemon.state()
        digest = str(want.digest)[:12]
        message = f"switched to {want.profile} (set {digest}) from {before or 'none'}: {want.why}"
        log.info("%s", printable(message))
        self._event(node, "Switched", message, warning=False)
        return Condition(TUNED, True, "Applied", self._applied(want, state)), state

    def _not_shadowed(self, name: str, checked: Checked) -> Checked:
        """The daemon resolves `name` to the cluster's file, not to a host profile that
        the agent cannot see from its pod (/etc/latencyd/profiles is not mounted)."""
        found = self.daemon.profile_file(name)
        if found is None or Path(found).parent == self.dir.path:
            return checked
        return Checked(name, shadowed(name, found))

    def _kubelet(self, checked: Checked | None) -> list[Condition]:
        if self.kubelet_config is None or checked is None:
            return []
        try:
            import yaml

            config = yaml.safe_load(self.kubelet_config.read_text()) or {}
            if not isinstance(config, dict):
                raise ValueError("not a KubeletConfiguration (a mapping)")
        except (OSError, ValueError) as exc:  # yaml.YAMLError is a ValueError
            return [Condition(CPUS_CONFLICT, None, "KubeletConfigUnreadable", str(exc))]
        return [cpus_condition(checked.isolated, config)]

    # -- the report ----------------------------------------------------------------
    def _report(
        self,
        node: Mapping[str, Any],
        conditions: list[Condition],
        annotations: dict[str, str | None],
    ) -> None:
        meta = node.get("metadata", {})
        current = (node.get("status") or {}).get("conditions") or []
        changed = conditions_patch(conditions, current, iso(self.clock()))
        notes = annotations_patch(annotations, meta.get("annotations") or {})
        try:
            if notes:
                cluster.patch_node(self.api, self.node_name, notes)
            if changed:
                cluster.patch_conditions(self.api, self.node_name, changed)
        except Exception as exc:  # the API server away: the next resync says it again
            log.warning(
                "node %s: report not written: %s", printable(self.node_name), str(exc)[:200]
            )

    def _event(self, node: Mapping[str, Any], reason: str, message: str, warning: bool) -> None:
        try:
            cluster.post_event(self.api, dict(node), reason, message, warning)
        except Exception as exc:
            log.warning("event %s not written: %s", reason, str(exc)[:200])
