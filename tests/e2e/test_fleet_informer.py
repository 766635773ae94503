"""The agent's informer against the real API server: it resumes from bookmarks, and
after `410 Gone` it lists again, so a deletion made while it was away is seen (a watch
from "now", as lightkube's own watch does after a 410, would never deliver it)."""

from __future__ import annotations

import threading
import time

from latencyd.agent.cluster import Informer, LatencyProfile, Node, client
from tests.kube import ControlPlane

NS = "latencyd"


def profile(name: str) -> dict[str, object]:
    return {"apiVersion": "latencyd.org/v1alpha1", "kind": "LatencyProfile",
            "metadata": {"name": name, "namespace": NS}, "spec": {"profile": ""}}  # fmt: skip


def run(informer: Informer) -> threading.Thread:
    t = threading.Thread(target=informer.run, daemon=True)
    t.start()
    return t


def until(check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_quiet_watch_is_kept_current_by_bookmarks(control_plane: ControlPlane) -> None:
    """The agent's Node watch selects one node: other nodes' changes send it nothing, but
    the server's bookmarks (sent before a watch's deadline, when there was progress) move
    its resume version past them, so a later reconnect is not `410 Gone`."""
    control_plane.add_node("bookmarked", {})
    control_plane.add_node("busy", {})
    informer = Informer(
        client(str(control_plane.kubeconfig)), Node, fields={"metadata.name": "bookmarked"},
        watch_seconds=6,
    )  # fmt: skip
    thread = run(informer)
    try:
        until(lambda: informer.synced)
        listed = int(str(informer.version))
        for i in range(40):  # progress the watch is not shown
            control_plane.kubectl("label", "node", "busy", f"step={i}", "--overwrite")
            if informer.bookmarks:
                break
            time.sleep(0.25)
        until(lambda: informer.bookmarks >= 1, timeout=15)
        assert int(str(informer.version)) > listed
        assert informer.lists == 1 and set(informer.objects) == {"bookmarked"}
    finally:
        informer.stop()
        thread.join(10)
        control_plane.kubectl("delete", "node", "bookmarked", "busy")


def test_after_410_gone_the_informer_lists_again_and_sees_deletions(
    control_plane: ControlPlane,
) -> None:
    control_plane.kubectl("delete", "latencyprofiles", "--all", "-n", NS)
    control_plane.apply([profile("fleet-kept"), profile("fleet-deleted")])
    api = client(str(control_plane.kubeconfig))
    informer = Informer(api, LatencyProfile, NS)
    informer._list()
    assert set(informer.objects) == {"fleet-kept", "fleet-deleted"}
    control_plane.kubectl("delete", "latencyprofile", "fleet-deleted", "-n", NS)
    informer.version = "1"  # as after a long absence: older than anything the server keeps
    thread = run(informer)
    try:
        until(lambda: informer.lists == 2)
        assert set(informer.objects) == {"fleet-kept"}
    finally:
        informer.stop()
        thread.join(10)
        control_plane.kubectl("delete", "latencyprofiles", "--all", "-n", NS)
