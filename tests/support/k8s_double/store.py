"""The in-memory object store: one `resourceVersion` counter, an event history and watchers.

Every method runs on the double's event loop thread, so no locking is needed. Stored objects
are never mutated in place: callers pass a new dict to `replace`, and readers get deep copies.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

from .errors import already_exists, gone, not_found
from .objects import JsonObj

EventType = Literal["ADDED", "MODIFIED", "DELETED", "ERROR"]
Matcher = Callable[[JsonObj], bool]


@dataclass(frozen=True)
class Resource:
    """A namespaced REST resource: `pods` in core/v1, `networkpolicies` in networking.k8s.io/v1, ..."""

    plural: str
    kind: str
    group: str = ""
    version: str = "v1"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


PODS = Resource("pods", "Pod")
PERSISTENT_VOLUME_CLAIMS = Resource("persistentvolumeclaims", "PersistentVolumeClaim")
NETWORK_POLICIES = Resource("networkpolicies", "NetworkPolicy", group="networking.k8s.io")


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Event:
    resource_version: int
    resource: Resource
    namespace: str
    type: EventType
    object: JsonObj


@dataclass(eq=False)
class Watcher:
    """One open watch; `queue` yields events, `None` once the store shuts down."""

    resource: Resource
    namespace: str
    matches: Matcher
    queue: asyncio.Queue[Event | None] = field(default_factory=lambda: asyncio.Queue[Event | None]())

    def wants(self, event: Event) -> bool:
        return (event.resource, event.namespace) == (self.resource, self.namespace) and self.matches(event.object)


class Store:
    """Objects keyed by (resource, namespace, name), with `watch=true` semantics of the API server."""

    def __init__(self, history: int = 10_000) -> None:
        self._objects: dict[tuple[Resource, str, str], JsonObj] = {}
        self._revision = 1
        self._history: deque[Event] = deque(maxlen=history)
        self._watchers: set[Watcher] = set()
        # Called with every event after the watchers got it: the double's controllers (`agent_sandbox`).
        self.listeners: list[Callable[[Event], None]] = []

    @property
    def resource_version(self) -> str:
        return str(self._revision)

    def _bump(self, obj: JsonObj) -> JsonObj:
        self._revision += 1
        obj["metadata"]["resourceVersion"] = str(self._revision)
        return obj

    def _emit(self, resource: Resource, namespace: str, type_: EventType, obj: JsonObj) -> None:
        event = Event(self._revision, resource, namespace, type_, copy.deepcopy(obj))
        self._history.append(event)
        for watcher in self._watchers:
            if watcher.wants(event):
                watcher.queue.put_nowait(event)
        for listener in self.listeners:
            listener(event)

    def create(self, resource: Resource, namespace: str, obj: JsonObj) -> JsonObj:
        """Store a new object, filling `uid`, `creationTimestamp`, `resourceVersion`.

        Raises:
            ApiError: 409 AlreadyExists.
        """
        obj = copy.deepcopy(obj)
        metadata = obj.setdefault("metadata", {})
        name = metadata["name"]
        key = (resource, namespace, name)
        if key in self._objects:
            raise already_exists(resource.plural, name, resource.group)
        metadata["namespace"] = namespace
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = now_rfc3339()
        obj["kind"] = resource.kind
        obj["apiVersion"] = resource.api_version
        self._objects[key] = self._bump(obj)
        self._emit(resource, namespace, "ADDED", obj)
        return copy.deepcopy(obj)

    def find(self, resource: Resource, namespace: str, name: str) -> JsonObj | None:
        obj = self._objects.get((resource, namespace, name))
        return None if obj is None else copy.deepcopy(obj)

    def get(self, resource: Resource, namespace: str, name: str) -> JsonObj:
        """Raises: ApiError 404 NotFound."""
        obj = self.find(resource, namespace, name)
        if obj is None:
            raise not_found(resource.plural, name, resource.group)
        return obj

    def list(self, resource: Resource, namespace: str, matches: Matcher = lambda _: True) -> list[JsonObj]:
        return [copy.deepcopy(obj) for obj in self._iter(resource, namespace) if matches(obj)]

    def _iter(self, resource: Resource, namespace: str) -> Iterator[JsonObj]:
        for (res, ns, _), obj in sorted(self._objects.items(), key=lambda item: item[0][1:]):
            if (res, ns) == (resource, namespace):
                yield obj

    def replace(self, resource: Resource, obj: JsonObj) -> JsonObj | None:
        """Store a new version of an existing object; `None` if it was deleted meanwhile."""
        metadata = obj["metadata"]
        key = (resource, metadata["namespace"], metadata["name"])
        current = self._objects.get(key)
        if current is None or current["metadata"]["uid"] != metadata["uid"]:
            return None
        obj = self._bump(copy.deepcopy(obj))
        self._objects[key] = obj
        self._emit(resource, key[1], "MODIFIED", obj)
        return copy.deepcopy(obj)

    def delete(self, resource: Resource, namespace: str, name: str) -> JsonObj:
        """Remove an object and emit DELETED.

        Raises:
            ApiError: 404 NotFound.
        """
        obj = self._objects.pop((resource, namespace, name), None)
        if obj is None:
            raise not_found(resource.plural, name, resource.group)
        obj = self._bump(obj)
        self._emit(resource, namespace, "DELETED", obj)
        return copy.deepcopy(obj)

    def watch(self, resource: Resource, namespace: str, matches: Matcher, since: str | None) -> Watcher:
        """Open a watch: current objects as ADDED when `since` is empty or "0", else history after `since`.

        Raises:
            ApiError: 410 Expired when `since` is older than the kept history.
        """
        watcher = Watcher(resource, namespace, matches)
        if since in (None, "", "0"):
            for obj in self._iter(resource, namespace):
                if matches(obj):
                    watcher.queue.put_nowait(Event(self._revision, resource, namespace, "ADDED", copy.deepcopy(obj)))
        else:
            revision = int(since) if since.isdigit() else -1
            oldest = self._history[0].resource_version if self._history else self._revision + 1
            if revision < 0 or revision < oldest - 1:
                raise gone(f"too old resource version: {since} ({oldest - 1})")
            for event in self._history:
                if event.resource_version > revision and watcher.wants(event):
                    watcher.queue.put_nowait(event)
        self._watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)

    def close_watchers(self) -> None:
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)
        self._watchers.clear()
