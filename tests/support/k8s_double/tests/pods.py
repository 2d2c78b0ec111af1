"""Helpers that drive pods through the real client: wait on a watch, exec and collect the result."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar, cast

import pytest
from kubernetes import client, config, watch
from kubernetes import stream as stream_module
from kubernetes.client.exceptions import ApiException

WAIT_SECONDS = 60
Model = TypeVar("Model")


def model(cls: type[Model], manifest: dict[str, Any]) -> Model:
    """A client model (`V1Pod`, ...) from a manifest, as a typed backend would send it."""
    obj = cast(Any, cls).from_dict(manifest)
    assert isinstance(obj, cls)
    return obj


def watch_events(
    watcher: watch.Watch, list_fn: Callable[..., object], *args: Any, **kwargs: Any
) -> Iterator[tuple[str, Any]]:
    """`Watch.stream` with its events unpacked to (type, object)."""
    events: Iterator[dict[str, Any]] = cast(Any, watcher).stream(list_fn, *args, **kwargs)
    for event in events:
        yield str(event["type"]), event["object"]


def api_client_for(kubeconfig: str) -> client.ApiClient:
    api = cast(Any, config).new_client_from_config(config_file=kubeconfig)
    assert isinstance(api, client.ApiClient)
    return api


def status_code(exc: ApiException) -> int:
    return int(cast(Any, exc).status)


def failure_reason(exc: ApiException) -> str:
    """The text of a failed exec handshake, which the client reports as `reason` with status 0."""
    return str(cast(Any, exc).reason)


def wait_for_pod(
    core: client.CoreV1Api, namespace: str, name: str, done: Callable[[client.V1Pod], bool]
) -> client.V1Pod:
    """Watch one pod until `done(pod)`; fails after WAIT_SECONDS instead of hanging."""
    watcher = watch.Watch()
    try:
        for _, pod in watch_events(
            watcher,
            core.list_namespaced_pod,
            namespace,
            field_selector=f"metadata.name={name}",
            timeout_seconds=WAIT_SECONDS,
        ):
            assert isinstance(pod, client.V1Pod)
            if done(pod):
                return pod
    finally:
        watcher.stop()
    pytest.fail(f"pod {namespace}/{name} did not reach the expected state in {WAIT_SECONDS}s")


def phase_is(*phases: str) -> Callable[[client.V1Pod], bool]:
    def check(pod: client.V1Pod) -> bool:
        return pod.status is not None and pod.status.phase in phases

    return check


def waiting_reason(pod: client.V1Pod, init: bool = False) -> str | None:
    statuses = (pod.status.init_container_statuses if init else pod.status.container_statuses) if pod.status else None
    if not statuses or statuses[0].state is None or statuses[0].state.waiting is None:
        return None
    return statuses[0].state.waiting.reason


def run_pod(core: client.CoreV1Api, namespace: str, manifest: dict[str, Any]) -> client.V1Pod:
    """Create a pod and wait until it runs (or finishes)."""
    core.create_namespaced_pod(namespace, model(client.V1Pod, manifest))
    return wait_for_pod(core, namespace, manifest["metadata"]["name"], phase_is("Running", "Succeeded", "Failed"))


def open_exec(core: client.CoreV1Api, namespace: str, name: str, argv: list[str], **flags: Any) -> Any:
    """An exec WebSocket (`WSClient`) as a backend opens it: `stream(..., _preload_content=False)`."""
    options: dict[str, Any] = {"stdin": True, "stdout": True, "stderr": True, "tty": False, **flags}
    stream: Any = cast(Any, stream_module).stream
    return stream(
        core.connect_get_namespaced_pod_exec, name, namespace, command=argv, _preload_content=False, **options
    )


@contextlib.contextmanager
def exec_stream(
    core: client.CoreV1Api, namespace: str, name: str, argv: list[str], **flags: Any
) -> Generator[Any, None, None]:
    """`open_exec`, closed afterwards.

    websocket-client leaves its socket open when the server closed first (as the API server does after the
    status frame): `WSClient.close()` is then a no-op, so the socket is shut down explicitly.
    """
    ws = open_exec(core, namespace, name, argv, **flags)
    try:
        yield ws
    finally:
        ws.close()
        ws.sock.shutdown()


def exec_in_pod(
    core: client.CoreV1Api, namespace: str, name: str, argv: list[str], stdin: str | None = None
) -> tuple[str, str, int]:
    """Run `argv` in the pod; (stdout, stderr, returncode)."""
    with exec_stream(core, namespace, name, argv, stdin=stdin is not None) as ws:
        if stdin is not None:
            ws.write_stdin(stdin)
            ws.close_channel(0)
        ws.run_forever(timeout=WAIT_SECONDS)
        assert not ws.is_open(), f"exec {argv} still running after {WAIT_SECONDS}s"
        return str(ws.read_stdout()), str(ws.read_stderr()), int(ws.returncode)
