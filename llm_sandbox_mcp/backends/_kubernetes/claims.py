"""Sandboxes claimed from agent-sandbox warm pools, when the cluster serves those CRDs.

For each kind of pod the server makes (`agent_sandbox.shape`: its labels and spec), one SandboxTemplate carrying
that pod and one SandboxWarmPool of it, both named after this server and labelled as its own; each sandbox is then
a SandboxClaim on that pool, released by deleting it (its Sandbox and pod go with it). Blocking: call from worker
threads.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from llm_sandbox_mcp.backends import _owner
from llm_sandbox_mcp.backends._kubernetes import agent_sandbox as crd
from llm_sandbox_mcp.backends._kubernetes.api import ApiFailure, Cluster
from llm_sandbox_mcp.backends._kubernetes.pod import Json, items, owner_info, owner_metadata
from llm_sandbox_mcp.errors import SandboxFailure

logger = logging.getLogger(__name__)


class Call(Protocol):
    def __call__(self, api: str, method: str, *args: Any, **kwargs: Any) -> Json: ...


def served(call: Call) -> bool:
    """Whether discovery lists every kind the claim path uses. Raises ApiFailure for answers other than 404."""
    for kind in crd.KINDS:
        try:
            resources = call("custom", "get_api_resources", kind[0], kind[1])
        except ApiFailure as exc:
            if exc.status == 404:
                return False
            raise
        if not crd.served(kind, resources):
            return False
    return True


class WarmPools:
    """This server's templates, warm pools and claims in one namespace."""

    def __init__(
        self, call: Call, connection: Callable[[], Cluster], namespace: str, pool_size: int, ttl: float, hint: str
    ) -> None:
        self._call = call
        self._connection = connection
        self.namespace = namespace
        self._pool_size = pool_size
        self._ttl = ttl
        self._hint = hint
        self._lock = threading.Lock()
        # Pod shape -> the warm pool (and template) of that name, once made.
        self._pools: dict[str, str] = {}

    def _custom(self, method: str, kind: tuple[str, str, str], *args: Any, **kwargs: Any) -> Json:
        group, version, plural = kind
        return self._call("custom", method, group, version, self.namespace, plural, *args, **kwargs)

    def _refused(self, what: str, exc: ApiFailure) -> SandboxFailure:
        hint = (
            f"; {self._hint}, or SANDBOX_K8S_SANDBOX_CLAIMS=off for pods of the server's own"
            if exc.status in (401, 403)
            else ""
        )
        return SandboxFailure(f"Kubernetes refused the {what}: {exc.message}{hint}")

    def pool_for(self, pod: Json, warm: bool) -> str:
        """The warm pool of pods like `pod`, made (with its template) on first use. `warm`: keep SANDBOX_POOL_SIZE
        of them ready; otherwise the pool holds none and each claim starts its own (pods with a library cache or
        secrets of their own, which no other call would take)."""
        key = crd.shape(pod)
        with self._lock:
            name = self._pools.get(key)
            if name is not None:
                return name
            name = f"llm-sandbox-{_owner.INSTANCE_ID}-{key}"
            labels, annotations = owner_metadata("warm-pool", int(time.time() + self._ttl))
            for kind, manifest in (
                (crd.TEMPLATES, crd.template_manifest(name, pod, labels, annotations)),
                (crd.WARM_POOLS, crd.pool_manifest(name, name, self._pool_size if warm else 0, labels, annotations)),
            ):
                try:
                    self._custom("create_namespaced_custom_object", kind, manifest)
                except ApiFailure as exc:
                    if exc.status != 409:  # made by an earlier call whose answer was lost
                        raise self._refused(f"sandbox {manifest['kind']} {name}", exc) from exc
            self._pools[key] = name
            return name

    def claim(self, pool: str, track: Callable[[str], None]) -> Json:
        """A new claim on `pool`, tracked (by name) as soon as it exists; the claim as created."""
        name = f"llm-sandbox-{_owner.INSTANCE_ID}-{secrets.token_hex(4)}"
        labels, annotations = owner_metadata("sandbox", int(time.time() + self._ttl))
        manifest = crd.claim_manifest(name, pool, labels, annotations)
        try:
            created = self._custom("create_namespaced_custom_object", crd.CLAIMS, manifest)
        except ApiFailure as exc:
            raise self._refused(f"SandboxClaim on warm pool {pool}", exc) from exc
        track(name)
        return created

    def pod_of(self, obj: Json, timeout: float) -> str:
        """The name of the pod a claim got, once the controller says which (watched from the claim as created).
        Raises SandboxFailure when the claim is refused for good or names none within `timeout`
        (SANDBOX_K8S_START_TIMEOUT)."""
        deadline = time.monotonic() + timeout
        claim = str(obj["metadata"]["name"])
        while (sandbox := crd.claimed_sandbox(obj)) is None:
            refused = crd.claim_refused(obj)
            if refused:
                raise SandboxFailure(f"The SandboxClaim {claim} cannot get a sandbox ({refused})")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxFailure(
                    f"The SandboxClaim {claim} got no sandbox within {timeout:g} s (SANDBOX_K8S_START_TIMEOUT): "
                    f"{crd.claim_state(obj)}"
                )
            obj = self._follow(claim, obj, remaining)
        try:
            return crd.pod_of(self._custom("get_namespaced_custom_object", crd.SANDBOXES, sandbox))
        except ApiFailure as exc:
            raise SandboxFailure(
                f"Kubernetes could not read the Sandbox {sandbox} of claim {claim}: {exc.message}"
            ) from exc

    def _read(self, claim: str) -> Json:
        try:
            return self._custom("get_namespaced_custom_object", crd.CLAIMS, claim)
        except ApiFailure as exc:
            raise SandboxFailure(f"The SandboxClaim {claim} could not be read: {exc.message}") from exc

    def _follow(self, claim: str, obj: Json, timeout: float) -> Json:
        """Watch the claim until it names a sandbox or the watch ends; then its latest version."""
        version = str(obj.get("metadata", {}).get("resourceVersion", ""))
        for kind, event in self._connection().watch_custom(crd.CLAIMS, self.namespace, claim, version, timeout):
            if kind == "DELETED":
                raise SandboxFailure(f"The SandboxClaim {claim} was deleted before it got a sandbox")
            if kind not in ("ADDED", "MODIFIED"):
                break
            if crd.claimed_sandbox(event) or crd.claim_refused(event):
                return event
        return self._read(claim)

    def release(self, claim: str) -> None:
        """Delete a claim; the cluster deletes its Sandbox and pod (owner references). Logs, never raises."""
        try:
            self._custom("delete_namespaced_custom_object", crd.CLAIMS, claim)
        except ApiFailure as exc:
            if exc.status != 404:
                logger.warning("Could not delete SandboxClaim %s: %s", claim, exc.message)

    def sweep(self, stale: Callable[[dict[str, str]], bool]) -> int:
        """Delete the claims, warm pools and templates of servers that `stale` says are gone."""
        removed = 0
        for kind in (crd.CLAIMS, crd.WARM_POOLS, crd.TEMPLATES):
            listing = self._custom("list_namespaced_custom_object", kind, label_selector=f"{_owner.MANAGED}=true")
            for obj in items(listing):
                if stale(owner_info(obj)):
                    removed += self._delete(kind, str(obj["metadata"]["name"]))
        return removed

    def close(self) -> None:
        """Delete everything of this server: its claims first, then its pools (their unclaimed sandboxes go with
        them) and their templates. Logs what it cannot do."""
        for kind in (crd.CLAIMS, crd.WARM_POOLS, crd.TEMPLATES):
            try:
                listing = self._custom(
                    "list_namespaced_custom_object", kind, label_selector=f"{_owner.INSTANCE}={_owner.INSTANCE_ID}"
                )
            except ApiFailure as exc:
                logger.warning("Could not list this server's %s to delete them: %s", kind[2], exc.message)
                continue
            for obj in items(listing):
                self._delete(kind, str(obj["metadata"]["name"]))
        self._pools.clear()

    def _delete(self, kind: tuple[str, str, str], name: str) -> int:
        try:
            self._custom("delete_namespaced_custom_object", kind, name)
        except ApiFailure as exc:
            if exc.status != 404:
                logger.warning("Could not delete %s %s: %s", kind[2], name, exc.message)
            return 0
        return 1
