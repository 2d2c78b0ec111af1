"""`KubeApiDouble`: the API server test double's lifecycle (thread, event loop, kubeconfig)."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import docker
from aiohttp import web

from . import rbac
from .api import ApiServer
from .docker_api import docker_api
from .objects import JsonObj, as_list, as_obj
from .rbac import Grant
from .runtime import INSTANCE_LABEL, OWNER_LABEL, DockerKubelet
from .store import Store
from .translate import RuntimeOptions
from .validation import is_dns1123_label

logger = logging.getLogger(__name__)
T = TypeVar("T")


class KubeApiDouble:
    """A Kubernetes API server on 127.0.0.1 whose pods run as local Docker containers.

    Args:
        docker_client: the engine to run pods on; default `docker.from_env()` (closed by `stop()`).
        namespace: the default namespace of the kubeconfig context.
        token: the bearer token clients must send; random by default.
        runtime_classes: `runtimeClassName`s that start; any other leaves the pod Pending.
        seccomp_root: the node's seccomp directory, where `Localhost` profiles are read (none: they fail).
        pod_pids_limit: kubelet `--pod-max-pids`, applied as the container's pids limit.
        agent_sandbox: the agent-sandbox CRDs are installed, with what their controllers do (`agent_sandbox`).
    """

    def __init__(
        self,
        *,
        docker_client: docker.DockerClient | None = None,
        namespace: str = "default",
        token: str | None = None,
        runtime_classes: Iterable[str] = (),
        seccomp_root: Path | None = None,
        pod_pids_limit: int | None = None,
        agent_sandbox: bool = False,
    ) -> None:
        if not is_dns1123_label(namespace):
            raise ValueError(f"namespace {namespace!r} is not a valid Kubernetes namespace name")
        self.instance_id = str(uuid.uuid4())
        self.namespace = namespace
        self.token = token or secrets.token_urlsafe(24)
        self._own_client = docker_client is None
        self._client = docker_client
        self._runtime_classes = tuple(runtime_classes)
        self.agent_sandbox = agent_sandbox
        self._options = RuntimeOptions(seccomp_root=seccomp_root, pids_limit=pod_pids_limit)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._api: ApiServer | None = None
        self._kubelet: DockerKubelet | None = None
        self._store: Store | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("KubeApiDouble is not started; call start() or use it as a context manager")
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def labels(self) -> dict[str, str]:
        """The label on every Docker container and volume this double creates."""
        return {INSTANCE_LABEL: self.instance_id}

    @staticmethod
    def remove_leftovers(docker_client: docker.DockerClient) -> int:
        """Force-remove containers and volumes of doubles whose process is gone (a run killed before `stop()`).

        Returns how many Docker objects were removed. Doubles of live processes are left alone.
        """
        api = docker_api(docker_client)
        selector = {"label": INSTANCE_LABEL}
        removed = 0
        for info in api.containers(all=True, filters=selector):
            if not _owner_alive(as_obj(info.get("Labels"))):
                api.remove_container(str(info["Id"]), force=True, v=True)
                removed += 1
        for volume in as_list(api.volumes(filters=selector).get("Volumes")):
            if not _owner_alive(as_obj(as_obj(volume).get("Labels"))):
                api.remove_volume(str(volume["Name"]), force=True)
                removed += 1
        return removed

    def __enter__(self) -> KubeApiDouble:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> KubeApiDouble:
        """Bind an ephemeral port and serve from a background thread; returns self."""
        if self._thread is not None:
            return self
        if self._client is None:
            self._client = docker.DockerClient.from_env(max_pool_size=64)
        self._client.ping()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        self._port = int(listener.getsockname()[1])
        self._executor = ThreadPoolExecutor(max_workers=64, thread_name_prefix="k8s-double")
        loop = asyncio.new_event_loop()
        self._loop = loop
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._setup(listener))
            except BaseException as exc:  # reported to start()'s caller below
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=serve, name="k8s-double", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    async def _setup(self, listener: socket.socket) -> None:
        assert self._client is not None and self._executor is not None
        self._store = Store()
        self._kubelet = DockerKubelet(
            self._store,
            self._client,
            self._executor,
            instance=self.instance_id,
            runtime_classes=self._runtime_classes,
            options=self._options,
        )
        api = ApiServer(
            self._store,
            self._kubelet,
            self._client,
            self._executor,
            token=self.token,
            with_agent_sandbox=self.agent_sandbox,
        )
        self._api = api
        # The API server accepts request lines and headers up to 1 MiB (Go's MaxHeaderBytes it sets), so exec
        # commands with long arguments (a script passed to `sh -c`) work; aiohttp's default is 8 KiB.
        self._runner = web.AppRunner(
            api.application(), shutdown_timeout=2.0, access_log=None, max_line_size=1 << 20, max_field_size=1 << 20
        )
        await self._runner.setup()
        await web.SockSite(self._runner, listener).start()

    def run(self, coro_fn: Callable[[], Awaitable[T]], timeout: float = 60) -> T:
        """Run a coroutine on the double's loop from another thread and return its result."""
        if self._loop is None:
            raise RuntimeError("KubeApiDouble is not started")

        async def call() -> T:
            return await coro_fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout)

    def container_id(self, name: str, namespace: str | None = None) -> str | None:
        """The Docker id of a pod's main container, once started (for tests that look behind the API)."""

        async def find() -> str | None:
            assert self._kubelet is not None
            return self._kubelet.container_id(namespace or self.namespace, name)

        return self.run(find)

    def stop(self) -> None:
        """Close watches and exec streams, force-remove every container and volume created, stop serving."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            self.run(self._shutdown, timeout=120)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=30)
            self._thread = self._loop = None
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            if self._own_client and self._client is not None:
                self._client.close()
                self._client = None

    async def _shutdown(self) -> None:
        assert self._store is not None and self._kubelet is not None and self._runner is not None
        self._store.close_watchers()
        try:
            await self._kubelet.shutdown()
        finally:
            await self._runner.cleanup()

    def grant(self, role: JsonObj, user: str) -> Grant:
        """A new token for `user` (a ServiceAccount's name, `system:serviceaccount:NS:NAME`) bound to one Role:
        requests it makes are authorized against the Role's rules and recorded in `Grant.asked`."""
        if self._api is None:
            raise RuntimeError("KubeApiDouble is not started")
        namespace, rules = rbac.rules_of(role)
        granted = Grant(user, namespace, rules, token=secrets.token_urlsafe(24))
        self._api.grants[granted.token] = granted
        return granted

    def write_kubeconfig(self, path: str | Path, token: str | None = None, namespace: str | None = None) -> Path:
        """Write a kubeconfig for this double (cluster, bearer-token user, context with the namespace); by
        default with the double's administrator token and namespace."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(
            "apiVersion: v1\n"
            "kind: Config\n"
            "clusters:\n"
            "- name: k8s-double\n"
            "  cluster:\n"
            f"    server: {self.url}\n"
            "users:\n"
            "- name: k8s-double\n"
            "  user:\n"
            f"    token: '{token or self.token}'\n"
            "contexts:\n"
            "- name: k8s-double\n"
            "  context:\n"
            "    cluster: k8s-double\n"
            "    user: k8s-double\n"
            f"    namespace: {namespace or self.namespace}\n"
            "current-context: k8s-double\n"
            "preferences: {}\n"
        )
        return target


def _owner_alive(labels: JsonObj) -> bool:
    pid = str(labels.get(OWNER_LABEL, ""))
    if not pid.isdigit():
        return True  # no owner recorded: not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
