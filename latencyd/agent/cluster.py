"""The agent's side of the Kubernetes API, through lightkube: its Node, the LatencyProfiles
and LatencyRecommends of its namespace, kept current by list-then-watch (`Informer`), and
the writes it makes (its Node's conditions and annotations, Events).

Why the watch stream is driven here rather than by `lightkube.Client.watch` (lightkube
1.0.1, pinned): that method takes no `allowWatchBookmarks`, waits on a silent stream
forever (its read timeout is None), and on `410 Gone` watches again from "now", which
delivers the objects that exist but never the deletions made meanwhile. An informer must
list again instead. The request, its authentication, TLS and decoding stay lightkube's
(`prepare_request`, `send`, `decoders`); only the loop over the stream's lines is ours.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2
from lightkube import ApiError, Client, KubeConfig
from lightkube.core import decoders
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Event, Node
from lightkube.types import PatchType

__all__ = ["Informer", "LatencyProfile", "LatencyRecommend", "Node", "client"]

log = logging.getLogger(__name__)

GROUP, VERSION = "latencyd.org", "v1alpha1"
LatencyProfile = create_namespaced_resource(GROUP, VERSION, "LatencyProfile", "latencyprofiles")
LatencyRecommend = create_namespaced_resource(
    GROUP, VERSION, "LatencyRecommend", "latencyrecommends"
)

Object = dict[str, Any]  # an API object as JSON: the pure parts read it as a Mapping

# The server ends each watch after this long (with jitter, so a fleet's agents do not
# reconnect in step); a stream silent for longer than that plus a margin is dead (a
# partition sends no RST), and is dropped and resumed.
WATCH_SECONDS = 300
READ_MARGIN_S = 30.0
BACKOFF_FIRST_S, BACKOFF_CAP_S = 0.5, 30.0


def backoff(failures: int, rng: random.Random) -> float:
    """Capped exponential backoff with full jitter (the AWS architecture blog's): the
    first retry within half a second, never more than 30 s, a fleet's retries spread."""
    return rng.uniform(0, min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2 ** max(0, failures - 1)))


def client(kubeconfig: str | None) -> Client:
    """In the pod: its ServiceAccount; elsewhere (tests, a bench), a kubeconfig file."""
    config = KubeConfig.from_file(kubeconfig) if kubeconfig else KubeConfig.from_service_account()
    return Client(config, timeout=httpx2.Timeout(10.0))


@dataclass
class Informer:
    """One kind's objects (in a namespace, or matching a field selector), current: listed,
    then watched from the list's resourceVersion; resumed from the last version seen (an
    event's or a bookmark's) after a dropped stream; listed again after `410 Gone`.
    `on_change` is called after every change to `objects` (from the informer's thread)."""

    client: Client
    kind: type[Any]
    namespace: str | None = None
    fields: dict[str, Any] | None = None
    on_change: Callable[[], None] = lambda: None
    watch_seconds: int = WATCH_SECONDS
    objects: dict[str, Object] = field(default_factory=dict)  # by name
    version: str | None = None  # of the last list, event or bookmark
    synced: bool = False  # listed at least once
    connected: bool = False  # the last request succeeded
    lists: int = 0
    watches: int = 0
    bookmarks: int = 0
    failures: int = 0  # in a row
    lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _rng: random.Random = field(default_factory=random.Random)

    def snapshot(self) -> list[Object]:
        with self.lock:
            return list(self.objects.values())

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.version is None:
                    self._list()
                self._watch()
                self.failures = 0
            except ApiError as exc:
                if exc.status.code == 410:  # too old: list again, from now
                    log.info("%s: resource version too old, listing again", self._what)
                    self.version = None
                    continue
                self._failed(exc)
            except (httpx2.HTTPError, OSError, ValueError) as exc:
                self._failed(exc)

    @property
    def _what(self) -> str:
        return self.kind.__name__ + (f" in {self.namespace}" if self.namespace else "")

    def _failed(self, exc: Exception) -> None:
        self.connected = False
        self.failures += 1
        pause = backoff(self.failures, self._rng)
        log.warning("%s: %s; again in %.1f s", self._what, str(exc)[:200], pause)
        self._stop.wait(pause)

    def _list(self) -> None:
        listed = self.client.list(self.kind, namespace=self.namespace, fields=self.fields)
        objects = {o["metadata"]["name"]: o for o in (item.to_dict() for item in listed)}
        with self.lock:
            self.objects = objects
            self.version = listed.resourceVersion  # known once iterated, even when empty
            self.synced = self.connected = True
            self.lists += 1
        self.on_change()

    def _selector(self) -> dict[str, str]:
        if not self.fields:
            return {}
        return {"fieldSelector": ",".join(f"{k}={v}" for k, v in self.fields.items())}

    def _watch(self) -> None:
        for kind, obj in self._stream():
            meta = obj.get("metadata", {})
            with self.lock:
                self.version = meta.get("resourceVersion", self.version)
                if kind == "BOOKMARK":
                    self.bookmarks += 1
                    continue
                if kind == "DELETED":
                    self.objects.pop(meta.get("name"), None)
                else:
                    self.objects[meta.get("name")] = obj
            self.on_change()

    def _stream(self) -> Iterator[tuple[str, Object]]:
        inner = self.client._client
        seconds = max(1, int(self.watch_seconds * self._rng.uniform(0.8, 1.0)))
        params = self._selector() | {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.version or "",
            "timeoutSeconds": str(seconds),
        }
        br = inner.prepare_request("list", res=self.kind, namespace=self.namespace, params=params)
        br.timeout = httpx2.Timeout(10.0, read=seconds + READ_MARGIN_S)
        resp = inner.send(inner.build_adapter_request(br), stream=True)
        try:
            if resp.status_code >= 300:
                resp.read()
                raise ApiError(request=resp.request, response=resp)
            self.connected = True
            self.watches += 1
            for line in resp.iter_lines():
                if self._stop.is_set():
                    return
                if not line:
                    continue
                event = decoders.decode_watch_event(line)
                if event.type == "ERROR":
                    raise ApiError(status=decoders.decode_status(event.object))
                yield event.type, json.loads(bytes(event.object))
        finally:
            resp.close()


def patch_node(api: Client, node: str, annotations: Mapping[str, str | None]) -> None:
    """Annotations (None removes one), by a JSON merge patch of the Node's metadata."""
    api.patch(
        Node, node, {"metadata": {"annotations": dict(annotations)}}, patch_type=PatchType.MERGE
    )


def patch_conditions(api: Client, node: str, conditions: list[dict[str, str]]) -> None:
    """Conditions on the Node's status; a strategic merge keys them by type, so the
    kubelet's own conditions are left as they are."""
    api.patch(Node.Status, node, {"status": {"conditions": conditions}})


EVENTS_NAMESPACE = "default"  # an Event about a cluster-scoped object must be here


def post_event(api: Client, node: Object, reason: str, message: str, warning: bool) -> None:
    """An Event about the Node (kubectl describe node shows it)."""
    meta = node.get("metadata", {})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    api.create(
        Event.from_dict(  # type: ignore[call-overload]
            {
                "metadata": {
                    "generateName": f"{meta.get('name')}.latencyd-",
                    "namespace": EVENTS_NAMESPACE,
                },
                "involvedObject": {
                    "kind": "Node",
                    "apiVersion": "v1",
                    "name": meta.get("name"),
                    "uid": meta.get("uid"),
                },
                "reason": reason,
                "message": message[:1024],
                "type": "Warning" if warning else "Normal",
                "source": {"component": "latencyd-agent", "host": meta.get("name")},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
        ),
        namespace=EVENTS_NAMESPACE,
    )
