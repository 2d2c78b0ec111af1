"""The official `kubernetes` client behind a few typed, blocking calls that take and return plain JSON.

Objects go out as dicts and come back unparsed (`_preload_content=False`), so the client's models, which differ
between its releases, never reach the backend. Call from worker threads.
"""

# The client's generated API is typed loosely, and differently between releases: it stays in this module.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false
# pyright: reportAttributeAccessIssue=false

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import urllib3.exceptions
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.stream import stream
from kubernetes.watch import Watch
from websocket import WebSocket

from llm_sandbox_mcp.backends._kubernetes.exec import ExecStream
from llm_sandbox_mcp.backends._kubernetes.pod import Json
from llm_sandbox_mcp.errors import BackendUnavailable

_TIMEOUT = (10, 60)  # connect, read (seconds)
_DEFAULT_KUBECONFIG = Path("~/.kube/config")
_HANDSHAKE = re.compile(r"Handshake status (\d{3})")


class ApiFailure(Exception):
    """An API server answer other than success, as its `Status` says it."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message

    @classmethod
    def from_exception(cls, exc: ApiException) -> ApiFailure:
        text = str(exc.reason or exc)
        status, reason, message = int(exc.status or 0), text, text
        handshake = _HANDSHAKE.search(text)  # a refused WebSocket upgrade comes back as status 0
        if not status and handshake:
            status = int(handshake.group(1))
        with contextlib.suppress(TypeError, ValueError):
            body: Any = json.loads(exc.body or "")
            if isinstance(body, dict):
                reason = str(cast(Json, body).get("reason") or reason)
                message = str(cast(Json, body).get("message") or message)
        return cls(status, reason, message[:2000])


class Cluster:
    """One configured connection to an API server."""

    def __init__(self, api_client: Any, source: str) -> None:
        self._api_client = api_client
        self._configuration = api_client.configuration
        # Building the API objects imports the client's models: seconds, once, here rather than in a sandbox.
        self._apis: dict[str, Any] = {
            "core": k8s.CoreV1Api(api_client),
            "networking": k8s.NetworkingV1Api(api_client),
            "version": k8s.VersionApi(api_client),
            "custom": k8s.CustomObjectsApi(api_client),
        }
        self.host = str(self._configuration.host)
        self.source = source

    def call(self, api: str, method: str, *args: Any, **kwargs: Any) -> Json:
        """One REST call (`api`: core, networking, version or custom); the answer as JSON.

        Raises:
            ApiFailure: the API server answered with an error.
            BackendUnavailable: it did not answer.
        """
        target = getattr(self._apis[api], method)
        try:
            response = target(*args, _preload_content=False, _request_timeout=_TIMEOUT, **kwargs)
            data: bytes = response.data
        except ApiException as exc:
            raise ApiFailure.from_exception(exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise BackendUnavailable(
                f"The Kubernetes API server at {self.host} ({self.source}) does not answer ({exc}). Check the "
                "cluster and KUBECONFIG; `llm-sandbox-mcp doctor` checks it."
            ) from exc
        return cast(Json, json.loads(data)) if data else {}

    def open_exec(self, namespace: str, pod: str, container: str, argv: Sequence[str], stdin: bool) -> ExecStream:
        """A process started over the exec WebSocket. Raises ApiFailure (404: no such pod)."""
        # `stream` swaps the request function of the client it is given for the WebSocket one: a client of its
        # own keeps that swap away from REST calls running in other threads.
        api_client = k8s.ApiClient(self._configuration)
        try:
            ws: Any = stream(
                k8s.CoreV1Api(api_client).connect_get_namespaced_pod_exec,
                pod,
                namespace,
                command=list(argv),
                container=container,
                stdin=stdin,
                stdout=True,
                stderr=True,
                tty=False,
                binary=True,
                _preload_content=False,
            )
        except ApiException as exc:
            raise ApiFailure.from_exception(exc) from exc
        finally:
            api_client.close()
        protocol = ws.subprotocol
        return ExecStream(cast(WebSocket, ws.sock), str(protocol) if protocol else None)

    def watch_pod(self, namespace: str, name: str, resource_version: str, timeout: float) -> Iterator[tuple[str, Json]]:
        """(event type, pod) for each change of one pod after `resource_version`, until `timeout` or the API server
        ends the watch (an expired version ends it too: read the pod then)."""
        return self._watch(self._apis["core"].list_namespaced_pod, (namespace,), name, resource_version, timeout)

    def watch_custom(
        self, kind: tuple[str, str, str], namespace: str, name: str, resource_version: str, timeout: float
    ) -> Iterator[tuple[str, Json]]:
        """As `watch_pod`, for one custom object of `kind` (group, version, plural)."""
        group, version, plural = kind
        list_call = self._apis["custom"].list_namespaced_custom_object
        return self._watch(list_call, (group, version, namespace, plural), name, resource_version, timeout)

    def _watch(
        self, list_call: Any, args: tuple[str, ...], name: str, resource_version: str, timeout: float
    ) -> Iterator[tuple[str, Json]]:
        watcher = Watch()
        events = watcher.stream(
            list_call,
            *args,
            field_selector=f"metadata.name={name}",
            resource_version=resource_version,
            timeout_seconds=max(1, int(timeout)),
            deserialize=False,
            _request_timeout=(_TIMEOUT[0], timeout + 10),
        )
        try:
            with contextlib.closing(events):
                for event in events:
                    obj = event.get("object")
                    yield str(event.get("type")), cast(Json, obj) if isinstance(obj, dict) else {}
        except (ApiException, urllib3.exceptions.HTTPError, OSError):
            return
        finally:
            watcher.stop()

    def close(self) -> None:
        self._api_client.close()


def connect(kubeconfig: Path | None) -> Cluster:
    """KUBECONFIG (or ~/.kube/config when present), else the pod's service account. Raises BackendUnavailable."""
    path = kubeconfig or _DEFAULT_KUBECONFIG.expanduser()
    try:
        if kubeconfig is not None or path.is_file():
            api_client = k8s_config.new_client_from_config(config_file=str(path), persist_config=False)
            source = f"kubeconfig {path}"
        else:
            configuration = k8s.Configuration()
            k8s_config.load_incluster_config(client_configuration=configuration)
            api_client = k8s.ApiClient(configuration)
            source = "in-cluster service account"
    except (ConfigException, OSError, ValueError, yaml.YAMLError) as exc:
        where = f"KUBECONFIG={kubeconfig}" if kubeconfig else "No kubeconfig (KUBECONFIG unset, no ~/.kube/config)"
        raise BackendUnavailable(
            f"{where}: cannot configure the Kubernetes client ({exc}). Set KUBECONFIG to a kubeconfig for the "
            "cluster, or run the server in a pod with a service account; `llm-sandbox-mcp doctor` checks it."
        ) from exc
    return Cluster(api_client, source)
