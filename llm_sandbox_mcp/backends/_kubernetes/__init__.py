"""Kubernetes backend: one hardened pod per sandbox, processes over the `pods/exec` WebSocket.

The pod is made by the server, or, where the cluster serves the agent-sandbox CRDs, claimed from a warm pool of
that same pod (`claims`). The client is wrapped in `api` (typed, blocking, plain JSON) and every call runs in a
worker thread (`Threaded`); the objects come from `pod` and `agent_sandbox`, and exec frames are handled in `exec`.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from llm_sandbox_mcp.backends import VANISHED_EXIT, _owner
from llm_sandbox_mcp.backends._container import CACHE_PREFIX, KILL_REQUEST, KILL_SECONDS
from llm_sandbox_mcp.backends._kubernetes import claims
from llm_sandbox_mcp.backends._kubernetes.api import ApiFailure, Cluster, connect
from llm_sandbox_mcp.backends._kubernetes.claims import WarmPools
from llm_sandbox_mcp.backends._kubernetes.exec import ExecRefused, ExecStream, WebSocketProcess, exit_code, pump, wrap
from llm_sandbox_mcp.backends._kubernetes.pod import (
    CONTAINER,
    EXPIRES,
    POLICY_NAME,
    CacheClaim,
    Json,
    PodOptions,
    cache_claim,
    items,
    load_template,
    network_policy,
    owner_info,
    owner_metadata,
    pending_reason,
    pod_manifest,
    security_context,
    started,
)
from llm_sandbox_mcp.backends._stopping import draining
from llm_sandbox_mcp.backends._threaded import Threaded
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable, SandboxFailure
from llm_sandbox_mcp.models import (
    EGRESS_NETWORK,
    ExecResult,
    HeadTail,
    OutputListener,
    SandboxRef,
    SandboxSpec,
    captures,
)

logger = logging.getLogger(__name__)

_MIN_TTL = 24 * 3600
_RBAC_HINT = "the server's identity needs the Role in deploy/kubernetes/rbac.yaml (docs/engines.md, Kubernetes)"
# How often a library cache claim that is being deleted is checked again before it is made anew.
_CLAIM_POLL_SECONDS = 0.5


class KubernetesEngine:
    """Sandboxes as pods in one namespace, through the synchronous client (`Threaded` makes it a Backend)."""

    name = "kubernetes"
    # Installers and sessions given hosts stay under the deny-all NetworkPolicy like every other pod: the relay's
    # connections reach the proxy through a tunnel over the relay's exec stream, as on every engine.
    install_network = EGRESS_NETWORK
    # A pod cannot be a zygote template container (no unmasked /proc for its children).
    template_containers = False

    def __init__(
        self,
        kubeconfig: Path | None,
        namespace: str,
        pod_options: PodOptions,
        claim: CacheClaim,
        start_timeout: float,
        ttl_seconds: float,
        allow_no_network_policy: bool = False,
        sandbox_claims: Literal["auto", "off"] = "auto",
        pool_size: int = 0,
    ) -> None:
        self.namespace = namespace
        self._allow_no_policy = allow_no_network_policy
        # Why the deny-all NetworkPolicy could not be made, if it could not.
        self._policy_problem: str | None = None
        self._kubeconfig = kubeconfig
        self._pod_options = pod_options
        self._claim = claim
        self._start_timeout = start_timeout
        self._ttl = ttl_seconds
        self._cluster: Cluster | None = None
        self._connect_lock = threading.Lock()
        self._policy_lock = threading.Lock()
        self._policy_ensured = False
        # Sandbox id -> the processes `start` began in it, while they are in use.
        self._started: dict[str, weakref.WeakSet[WebSocketProcess]] = {}
        self._sandbox_claims = sandbox_claims
        self._pool_size = pool_size
        # The claim path, once discovery has said whether the cluster serves it (None: pods of our own).
        self._warm_pools: WarmPools | None = None
        self._discovered = False
        self._discovery_lock = threading.Lock()
        # A claimed sandbox's id is its claim's name -> its pod's name, once the claim has one.
        self._claimed: dict[str, str | None] = {}

    def _connection(self) -> Cluster:
        with self._connect_lock:
            if self._cluster is None:
                self._cluster = connect(self._kubeconfig)
            return self._cluster

    def _call(self, api: str, method: str, *args: Any, **kwargs: Any) -> Json:
        return self._connection().call(api, method, *args, **kwargs)

    def _claim_path(self) -> WarmPools | None:
        """The claim path when the cluster serves the agent-sandbox CRDs (and SANDBOX_K8S_SANDBOX_CLAIMS is not
        off), asked of discovery once."""
        with self._discovery_lock:
            if not self._discovered and self._sandbox_claims != "off":
                try:
                    if claims.served(self._call):
                        self._warm_pools = WarmPools(
                            self._call,
                            self._connection,
                            self.namespace,
                            self._pool_size,
                            self._ttl,
                            _RBAC_HINT,
                        )
                except ApiFailure as exc:
                    logger.warning("Discovery of the agent-sandbox CRDs failed (%s); sandboxes are pods", exc.message)
            self._discovered = True
            return self._warm_pools

    def _pod(self, sandbox_id: str) -> str:
        """The pod of a sandbox: a claimed one's pod has another name than its claim."""
        return self._claimed.get(sandbox_id) or sandbox_id

    def _open_exec(self, sandbox_id: str, argv: Sequence[str], stdin: bool) -> ExecStream:
        """Raises SandboxFailure: the sandbox is gone, or the cluster refuses the exec."""
        pod = self._pod(sandbox_id)
        try:
            return self._connection().open_exec(self.namespace, pod, CONTAINER, argv, stdin)
        except ApiFailure as exc:
            if exc.status == 404:
                raise SandboxFailure(f"The sandbox {pod} is gone (its pod was deleted)") from exc
            hint = f"; {_RBAC_HINT}" if exc.status in (401, 403) else ""
            raise SandboxFailure(f"Kubernetes could not run a process in sandbox {pod}: {exc.message}{hint}") from exc

    # ---- create ---------------------------------------------------------------------------------

    def create(self, spec: SandboxSpec, track: Callable[[str], None]) -> str:
        self._ensure_policy()
        if spec.limits.network_mode == "none" and self._policy_problem is not None and not self._allow_no_policy:
            raise SandboxFailure(
                f"Kubernetes sandboxes have no network only through the NetworkPolicy {POLICY_NAME}, which could not "
                f"be created in namespace {self.namespace} ({self._policy_problem}); {_RBAC_HINT}. An operator who "
                "accepts sandboxes on the cluster's network can set SANDBOX_K8S_ALLOW_NO_NETWORK_POLICY=true."
            )
        if spec.cache is not None and spec.cache.writable:
            self._ensure_claim(spec.cache.key)
        name = f"llm-sandbox-{_owner.INSTANCE_ID}-{secrets.token_hex(4)}"
        labels, annotations = owner_metadata("sandbox", int(time.time() + self._ttl))
        manifest = pod_manifest(name, spec, labels, annotations, self._pod_options)
        warm_pools = self._claim_path()
        if warm_pools is not None:
            return self._create_claimed(warm_pools, spec, manifest, track)
        try:
            created = self._call("core", "create_namespaced_pod", self.namespace, manifest)
        except ApiFailure as exc:
            hint = f"; {_RBAC_HINT}" if exc.status in (401, 403) else ""
            raise SandboxFailure(f"Kubernetes refused the sandbox pod for {spec.image!r}: {exc.message}{hint}") from exc
        except ValueError as exc:  # recent clients validate bodies against their models: SANDBOX_K8S_POD_TEMPLATE
            raise SandboxFailure(f"The Kubernetes client refused the sandbox pod manifest: {exc}") from exc
        track(name)
        try:
            self._wait_running(name, created)
        except BaseException:
            self.remove(name)
            raise
        return name

    def _create_claimed(
        self, warm_pools: WarmPools, spec: SandboxSpec, manifest: Json, track: Callable[[str], None]
    ) -> str:
        """A sandbox claimed from the warm pool of pods like `manifest`; its id is its claim's name."""
        pool = warm_pools.pool_for(manifest, warm=spec.cache is None and not spec.env)

        def tracked(claim: str) -> None:
            self._claimed[claim] = None
            track(claim)

        created = warm_pools.claim(pool, tracked)
        claim = str(created["metadata"]["name"])
        try:
            pod = self._claimed[claim] = warm_pools.pod_of(created, self._start_timeout)
            try:
                found = self._call("core", "read_namespaced_pod", pod, self.namespace)
            except ApiFailure as exc:
                if exc.status != 404:
                    raise SandboxFailure(f"Kubernetes could not read the sandbox pod {pod}: {exc.message}") from exc
                found = {"metadata": {"name": pod}}  # not made yet: the watch sees it come
            self._wait_running(pod, found)
        except BaseException:
            self.remove(claim)
            raise
        return claim

    def _wait_running(self, name: str, pod: Json) -> None:
        """Return once the pod runs; raise ImageMissing/SandboxFailure when it cannot, or at the start timeout."""
        deadline = time.monotonic() + self._start_timeout
        while not started(pod):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxFailure(
                    f"The sandbox pod {name} did not start within {self._start_timeout:g} s "
                    f"(SANDBOX_K8S_START_TIMEOUT): {pending_reason(pod)}"
                )
            pod = self._follow(name, pod, remaining)

    def _follow(self, name: str, pod: Json, timeout: float) -> Json:
        """Watch the pod until it has started (`started` raises when it cannot) or the watch ends; then the
        latest version of the pod."""
        version = str(pod.get("metadata", {}).get("resourceVersion", ""))
        for kind, obj in self._connection().watch_pod(self.namespace, name, version, timeout):
            if kind == "DELETED":
                raise SandboxFailure(f"The sandbox pod {name} was deleted while it started")
            if kind not in ("ADDED", "MODIFIED"):
                break  # ERROR (an expired version): read the pod instead
            if started(obj):
                return obj
        try:
            return self._call("core", "read_namespaced_pod", name, self.namespace)
        except ApiFailure as exc:
            raise SandboxFailure(f"The sandbox pod {name} disappeared while it started: {exc.message}") from exc

    def _ensure_policy(self) -> None:
        """Create the deny-all NetworkPolicy once; when RBAC refuses, say so once and remember why."""
        with self._policy_lock:
            if self._policy_ensured:
                return
            try:
                self._call("networking", "create_namespaced_network_policy", self.namespace, network_policy())
            except ApiFailure as exc:
                if exc.status in (401, 403, 404):
                    self._policy_problem = exc.message
                    logger.warning(
                        "Could not create the NetworkPolicy %s in namespace %s (%s). %s; %s.",
                        POLICY_NAME,
                        self.namespace,
                        exc.message,
                        "Sandbox pods get the cluster's default network (SANDBOX_K8S_ALLOW_NO_NETWORK_POLICY=true)"
                        if self._allow_no_policy
                        else "Sandboxes without network are refused until it exists",
                        _RBAC_HINT,
                    )
                elif exc.status != 409:
                    raise SandboxFailure(f"Kubernetes refused the sandbox NetworkPolicy: {exc.message}") from exc
            self._policy_ensured = True

    def _ensure_claim(self, key: str) -> None:
        """Create the cache's claim unless it exists. A claim still being deleted (a cache dropped after a failed
        or cancelled install, kept by `pvc-protection` until its last pod is gone) is waited out and made anew:
        a pod on it would never be scheduled."""
        name = CACHE_PREFIX + key
        deadline = time.monotonic() + self._start_timeout
        while True:
            try:
                self._call(
                    "core", "create_namespaced_persistent_volume_claim", self.namespace, cache_claim(key, self._claim)
                )
                return
            except ApiFailure as exc:
                if exc.status != 409:
                    raise SandboxFailure(f"Kubernetes refused the library cache volume {name}: {exc.message}") from exc
            try:
                claim = self._call("core", "read_namespaced_persistent_volume_claim", name, self.namespace)
            except ApiFailure as exc:
                if exc.status == 404:
                    continue  # deleted meanwhile: create it now
                raise SandboxFailure(
                    f"Kubernetes could not read the library cache volume {name}: {exc.message}"
                ) from exc
            if not claim.get("metadata", {}).get("deletionTimestamp"):
                return
            if time.monotonic() > deadline:
                raise SandboxFailure(
                    f"The library cache volume {name} was still being deleted after {self._start_timeout:g} s "
                    "(SANDBOX_K8S_START_TIMEOUT); try again later"
                )
            time.sleep(_CLAIM_POLL_SECONDS)

    # ---- processes ------------------------------------------------------------------------------

    def exec(
        self,
        ref: SandboxRef,
        argv: list[str],
        timeout: float,
        stdin: bytes,
        env: dict[str, str],
        workdir: PurePosixPath,
        output_limit: int | None,
        on_output: OutputListener | None = None,
    ) -> ExecResult:
        begun = time.monotonic()
        # Input goes through `head -c N`, so the command sees end of file whatever the protocol: v4 cannot say
        # "end of stdin", and the API servers behind one address may not all speak v5.
        command = wrap(argv, env, workdir, ref.spec.limits.nofile, len(stdin) if stdin else None)
        exec_stream = self._open_exec(ref.id, command, stdin=bool(stdin))
        out, err = captures(output_limit, on_output)
        try:
            status, timed_out = pump(
                exec_stream, stdin or None, out, err, begun + timeout, lambda: self._kill_all(ref.id)
            )
        finally:
            exec_stream.close()
        try:
            code = exit_code(status)
        except ExecRefused as exc:
            raise SandboxFailure(f"Kubernetes could not run {argv[0]!r} in sandbox {ref.id}: {exc}") from exc
        if code is None:  # the stream ended without a status: the pod, or only the connection, went away
            code = VANISHED_EXIT if timed_out or not self._running(self._pod(ref.id)) else -1
        return ExecResult.captured(code, out, err, timed_out=timed_out, started=begun)

    def _running(self, name: str) -> bool:
        """Whether the pod still exists and runs."""
        try:
            pod = self._call("core", "read_namespaced_pod", name, self.namespace)
        except ApiFailure:
            return False
        return pod.get("status", {}).get("phase") == "Running" and not pod.get("metadata", {}).get("deletionTimestamp")

    def start(self, ref: SandboxRef, argv: list[str], env: dict[str, str], workdir: PurePosixPath) -> WebSocketProcess:
        command = wrap(argv, env, workdir, ref.spec.limits.nofile)
        process = WebSocketProcess(self._open_exec(ref.id, command, stdin=True))
        self._started.setdefault(ref.id, weakref.WeakSet()).add(process)
        return process

    def _kill_all(self, name: str) -> None:
        """Every process but PID 1 killed by PID 1 (see `_container.INIT`), asked by a process that dies of it:
        the API cannot signal a container. When that is not proven (the request could not start or was
        stopped), the pod is deleted."""
        try:
            exec_stream = self._open_exec(name, KILL_REQUEST, stdin=False)
        except SandboxFailure as exc:
            logger.warning("Could not kill the processes in %s (%s); deleting it", name, exc)
            self.remove(name)
            return
        try:
            sink = HeadTail(4096)
            # The started processes' output is read on meanwhile, or their kill may not end (see `_stopping`).
            with draining(list(self._started.get(name, ()))):
                status, _ = pump(exec_stream, None, sink, sink, time.monotonic() + KILL_SECONDS, lambda: None)
        finally:
            exec_stream.close()
        try:
            code = exit_code(status)
        except ExecRefused:
            code = None
        if code != VANISHED_EXIT:
            logger.warning("Could not prove the processes in %s were killed (status %s); deleting it", name, code)
            self.remove(name)

    # ---- removal --------------------------------------------------------------------------------

    def kill_all(self, ref: SandboxRef) -> None:
        self._kill_all(ref.id)

    def remove(self, name: str) -> None:
        self._started.pop(name, None)
        if name in self._claimed and self._warm_pools is not None:
            self._warm_pools.release(name)
            self._claimed.pop(name, None)
            return
        try:
            self._call("core", "delete_namespaced_pod", name, self.namespace, grace_period_seconds=0)
        except ApiFailure as exc:
            if exc.status != 404:
                logger.warning("Could not delete sandbox pod %s: %s", name, exc.message)

    def drop_cache(self, key: str) -> None:
        try:
            self._call("core", "delete_namespaced_persistent_volume_claim", CACHE_PREFIX + key, self.namespace)
        except ApiFailure as exc:
            if exc.status != 404:
                logger.warning("Could not delete library cache volume %s: %s", CACHE_PREFIX + key, exc.message)

    def sweep(self) -> int:
        """Pods, and where claims are used the claims, warm pools and templates, of servers that are gone. A pod
        that something else controls (a claimed or pooled Sandbox) goes with its owner instead."""
        listing = self._call("core", "list_namespaced_pod", self.namespace, label_selector=f"{_owner.MANAGED}=true")
        stale = [
            str(pod["metadata"]["name"])
            for pod in items(listing)
            if _is_stale(owner_info(pod)) and not pod["metadata"].get("ownerReferences")
        ]
        for name in stale:
            self.remove(name)
        warm_pools = self._claim_path()
        return len(stale) + (warm_pools.sweep(_is_stale) if warm_pools is not None else 0)

    # ---- about ----------------------------------------------------------------------------------

    def describe(self) -> str:
        try:
            version = self._call("version", "get_code")
        except ApiFailure as exc:
            raise BackendUnavailable(f"The Kubernetes API server refused to say its version: {exc.message}") from exc
        cluster = self._connection()
        source = (
            f"sandboxes claimed from warm pools of {self._pool_size} (agent-sandbox CRDs served)"
            if self._claim_path() is not None
            else "sandboxes as pods of the server's own"
            + (" (SANDBOX_K8S_SANDBOX_CLAIMS=off)" if self._sandbox_claims == "off" else "")
        )
        return (
            f"Kubernetes {version.get('gitVersion', '?')} at {cluster.host} ({cluster.source}), "
            f"namespace {self.namespace}, {self._policy_state()}, {source}"
        )

    def _policy_state(self) -> str:
        try:
            self._call("networking", "read_namespaced_network_policy", POLICY_NAME, self.namespace)
        except ApiFailure as exc:
            if exc.status == 404:
                return f"NetworkPolicy {POLICY_NAME} not yet created (created at first use when RBAC allows)"
            return f"NetworkPolicy {POLICY_NAME} unknown ({exc.message})"
        return f"NetworkPolicy {POLICY_NAME} in place"

    def close(self) -> None:
        if self._warm_pools is not None:
            try:
                self._warm_pools.close()
            except BackendUnavailable as exc:
                logger.warning("Could not remove this server's warm pools: %s", exc)
        with self._connect_lock:
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None


def _is_stale(metadata: Mapping[str, str]) -> bool:
    """Owned by a server on this host that is gone, or by one elsewhere (unverifiable) and past its TTL."""
    if _owner.owner_is_gone(metadata):
        return True
    if metadata.get(_owner.INSTANCE) == _owner.INSTANCE_ID or metadata.get(_owner.HOST) == socket.gethostname():
        return False
    try:
        return int(metadata.get(EXPIRES, "")) < time.time()
    except ValueError:
        return False


def from_settings(settings: Settings) -> Threaded:
    """Raises BackendUnavailable for a SANDBOX_SECURITY_OPT or pod template that cannot apply to pods."""
    try:
        security_context(settings.sandbox_security_opt)
        template = load_template(settings.sandbox_k8s_pod_template) if settings.sandbox_k8s_pod_template else None
    except ValueError as exc:
        raise BackendUnavailable(str(exc)) from exc
    profile = settings.sandbox_k8s_seccomp_profile
    ttl = max(_MIN_TTL, settings.sandbox_session_max_lifetime + 3600)
    options = PodOptions(
        settings.sandbox_k8s_runtime_class,
        dict(settings.sandbox_k8s_node_selector),
        template,
        profile.removeprefix("localhost/") if profile else None,
        active_deadline=int(ttl),
        host_users=settings.sandbox_k8s_host_users,
    )
    claim = CacheClaim(
        settings.sandbox_k8s_cache_size,
        settings.sandbox_k8s_cache_storage_class,
        settings.sandbox_k8s_cache_access_mode,
    )
    return Threaded(
        KubernetesEngine(
            settings.kubeconfig,
            settings.namespace,
            options,
            claim,
            settings.sandbox_k8s_start_timeout,
            ttl,
            settings.sandbox_k8s_allow_no_network_policy,
            settings.sandbox_k8s_sandbox_claims,
            settings.sandbox_pool_size,
        )
    )
