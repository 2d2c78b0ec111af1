"""The REST surface: discovery, namespaces, pods (+exec, +log), PVCs and network policies.

Handlers run on the double's event loop. Every failure is a `Status` object with the API server's
`code`/`reason`; watches stream newline-delimited `{"type": ..., "object": ...}` events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import docker.errors
from aiohttp import web

from . import errors
from .docker_api import docker_api
from .errors import ApiError, bad_request, method_not_allowed
from .exec_ws import serve_exec
from .objects import JsonObj, as_obj
from .runtime import DockerKubelet
from .selectors import parse_field_selector, parse_label_selector
from .store import NAMESPACES, NETWORK_POLICIES, PERSISTENT_VOLUME_CLAIMS, PODS, Resource, Store, now_rfc3339
from .validation import (
    check_namespace_name,
    default_network_policy,
    default_pod,
    prepare_metadata,
    validate_pod,
    validate_pvc,
)

logger = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

KUBERNETES_VERSION = {
    "major": "1",
    "minor": "33",
    "gitVersion": "v1.33.0-k8s-double",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-04-23T00:00:00Z",
    "goVersion": "go1.24.2",
    "compiler": "gc",
    "platform": "linux/amd64",
}
_BUILTIN_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
_CRUD = ["create", "delete", "deletecollection", "get", "list", "watch"]


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(obj).encode(), status=status, content_type="application/json")


def _api_resource(resource: Resource, singular: str, verbs: list[str]) -> JsonObj:
    entry: JsonObj = {
        "name": resource.plural,
        "singularName": singular,
        "namespaced": resource.namespaced,
        "kind": resource.kind,
        "verbs": verbs,
    }
    if resource.short_names:
        entry["shortNames"] = list(resource.short_names)
    return entry


class ApiServer:
    """Builds the aiohttp application; `store` and `kubelet` hold all state."""

    def __init__(
        self,
        store: Store,
        kubelet: DockerKubelet,
        client: docker.DockerClient,
        executor: ThreadPoolExecutor,
        *,
        token: str,
        address: str,
        started: str,
    ) -> None:
        self._store = store
        self._kubelet = kubelet
        self._docker = client
        self._executor = executor
        self._token = token
        self._address = address
        self._started = started
        self._namespaces: set[str] = set(_BUILTIN_NAMESPACES)

    def application(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=256 * 1024 * 1024)
        add = app.router.add_route
        discovery: dict[str, Handler] = {
            "/version": self._version,
            "/api": self._core_versions,
            "/api/v1": self._core_resources,
            "/apis": self._groups,
            "/apis/networking.k8s.io": self._networking_group,
            "/apis/networking.k8s.io/v1": self._networking_resources,
        }
        for path, discover in discovery.items():
            add("GET", path, discover)
            add("GET", path + "/", discover)  # the generated client asks for `/version/`, `/api/v1/`, ...
        add("*", "/api/v1/namespaces", self._namespace_list)
        add("*", "/api/v1/namespaces/{namespace}", self._namespace_get)
        add("*", "/api/v1/pods", self._collection(PODS, all_namespaces=True))
        for prefix, resource in (
            ("/api/v1/namespaces/{namespace}/pods", PODS),
            ("/api/v1/namespaces/{namespace}/persistentvolumeclaims", PERSISTENT_VOLUME_CLAIMS),
            ("/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies", NETWORK_POLICIES),
        ):
            add("*", prefix, self._collection(resource))
            add("*", prefix + "/{name}", self._item(resource))
        add("*", "/api/v1/namespaces/{namespace}/pods/{name}/exec", self._exec)
        add("*", "/api/v1/namespaces/{namespace}/pods/{name}/log", self._log)
        add("*", "/{tail:.*}", self._no_such_path)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if request.headers.get("Authorization") != f"Bearer {self._token}":
                raise errors.unauthorized()
            return await handler(request)
        except ApiError as exc:
            return json_response(exc.status, exc.code)
        except web.HTTPException:
            raise
        except Exception as exc:  # top-level handler: the client must get a Status, not a dropped connection
            logger.exception("k8s double: %s %s failed", request.method, request.path)
            error = errors.internal_error(str(exc))
            return json_response(error.status, error.code)

    # ---- discovery -------------------------------------------------------------------------------

    async def _version(self, request: web.Request) -> web.StreamResponse:
        return json_response(KUBERNETES_VERSION)

    async def _core_versions(self, request: web.Request) -> web.StreamResponse:
        return json_response(
            {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": self._address}],
            }
        )

    async def _core_resources(self, request: web.Request) -> web.StreamResponse:
        resources = [
            _api_resource(NAMESPACES, "namespace", ["get", "list"]),
            _api_resource(PERSISTENT_VOLUME_CLAIMS, "persistentvolumeclaim", _CRUD),
            _api_resource(PODS, "pod", _CRUD),
            {
                "name": "pods/exec",
                "singularName": "",
                "namespaced": True,
                "kind": "PodExecOptions",
                "verbs": ["create", "get"],
            },
            {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
        ]
        return json_response({"kind": "APIResourceList", "groupVersion": "v1", "resources": resources})

    def _networking_group_object(self) -> JsonObj:
        version = {"groupVersion": "networking.k8s.io/v1", "version": "v1"}
        return {"name": "networking.k8s.io", "versions": [version], "preferredVersion": version}

    async def _groups(self, request: web.Request) -> web.StreamResponse:
        return json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [self._networking_group_object()]})

    async def _networking_group(self, request: web.Request) -> web.StreamResponse:
        return json_response({"kind": "APIGroup", "apiVersion": "v1", **self._networking_group_object()})

    async def _networking_resources(self, request: web.Request) -> web.StreamResponse:
        return json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "networking.k8s.io/v1",
                "resources": [_api_resource(NETWORK_POLICIES, "networkpolicy", _CRUD)],
            }
        )

    async def _no_such_path(self, request: web.Request) -> web.StreamResponse:
        raise errors.no_such_path()

    # ---- namespaces ------------------------------------------------------------------------------

    def _namespace_object(self, name: str) -> JsonObj:
        return {
            "kind": "Namespace",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.k8s-double")),
                "resourceVersion": "1",
                "creationTimestamp": self._started,
                "labels": {"kubernetes.io/metadata.name": name},
            },
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    def _use_namespace(self, request: web.Request) -> str:
        namespace = request.match_info["namespace"]
        check_namespace_name(namespace)
        self._namespaces.add(namespace)
        return namespace

    async def _namespace_list(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            raise method_not_allowed()
        items = [self._namespace_object(n) for n in sorted(self._namespaces)]
        for item in items:
            del item["kind"], item["apiVersion"]
        return json_response(
            {
                "kind": "NamespaceList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": self._store.resource_version},
                "items": items,
            }
        )

    async def _namespace_get(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            raise method_not_allowed()
        return json_response(self._namespace_object(self._use_namespace(request)))

    # ---- collections and items -------------------------------------------------------------------

    def _collection(self, resource: Resource, *, all_namespaces: bool = False) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            namespace = None if all_namespaces else self._use_namespace(request)
            labels = parse_label_selector(request.query.get("labelSelector"))
            fields = parse_field_selector(request.query.get("fieldSelector"), resource.field_selectors)

            def matches(obj: JsonObj) -> bool:
                return labels.matches(as_obj(obj.get("metadata")).get("labels")) and fields.matches(obj)

            if request.method == "GET":
                if request.query.get("watch") in ("1", "true", "True"):
                    return await self._watch(request, resource, namespace, matches)
                return self._list_response(resource, self._store.list(resource, namespace, matches))
            if request.method == "POST" and namespace is not None:
                return await self._create(request, resource, namespace)
            if request.method == "DELETE" and namespace is not None:
                objects = self._store.list(resource, namespace, matches)
                return self._list_response(resource, [await self._delete(request, resource, obj) for obj in objects])
            raise method_not_allowed()

        return handler

    def _item(self, resource: Resource) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            namespace = self._use_namespace(request)
            obj = self._store.get(resource, namespace, request.match_info["name"])
            if request.method == "GET":
                return json_response(obj)
            if request.method == "DELETE":
                result = await self._delete(request, resource, obj)
                if resource is NETWORK_POLICIES:
                    metadata = obj["metadata"]
                    return json_response(
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "metadata": {},
                            "status": "Success",
                            "details": {
                                "name": metadata["name"],
                                "group": resource.group,
                                "kind": resource.plural,
                                "uid": metadata["uid"],
                            },
                        }
                    )
                return json_response(result)
            raise method_not_allowed()

        return handler

    def _list_response(self, resource: Resource, items: list[JsonObj]) -> web.StreamResponse:
        for item in items:
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return json_response(
            {
                "kind": f"{resource.kind}List",
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": self._store.resource_version},
                "items": items,
            }
        )

    async def _watch(
        self, request: web.Request, resource: Resource, namespace: str | None, matches: Callable[[JsonObj], bool]
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        timeout = request.query.get("timeoutSeconds")
        try:
            watcher = self._store.watch(resource, namespace, matches, request.query.get("resourceVersion"))
        except ApiError as exc:
            await response.prepare(request)
            await response.write(json.dumps({"type": "ERROR", "object": exc.status}).encode() + b"\n")
            await response.write_eof()
            return response
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(timeout) if timeout else None
        try:
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
                if event is None:
                    break
                await response.write(json.dumps({"type": event.type, "object": event.object}).encode() + b"\n")
            await response.write_eof()
        except ConnectionError:
            pass
        finally:
            self._store.unwatch(watcher)
        return response

    async def _read_body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc

    async def _create(self, request: web.Request, resource: Resource, namespace: str) -> web.StreamResponse:
        obj = prepare_metadata(resource, namespace, await self._read_body(request))
        for field in ("uid", "resourceVersion", "creationTimestamp", "deletionTimestamp"):
            obj["metadata"].pop(field, None)
        if resource is PODS:
            pod = default_pod(obj)
            validate_pod(pod)
            created = self._store.create(PODS, namespace, pod)
            self._kubelet.start_pod(created)
            return json_response(created, 201)
        if resource is PERSISTENT_VOLUME_CLAIMS:
            return json_response(await self._create_pvc(namespace, obj), 201)
        default_network_policy(obj)
        obj.pop("status", None)
        return json_response(self._store.create(resource, namespace, obj), 201)

    async def _create_pvc(self, namespace: str, pvc: JsonObj) -> JsonObj:
        validate_pvc(pvc)
        spec = pvc["spec"]
        spec.setdefault("volumeMode", "Filesystem")
        spec.setdefault("storageClassName", "standard")
        pvc["metadata"]["finalizers"] = ["kubernetes.io/pvc-protection"]
        pvc["status"] = {"phase": "Pending"}
        created = self._store.create(PERSISTENT_VOLUME_CLAIMS, namespace, pvc)
        try:
            await self._kubelet.create_pvc_volume(created)
        except docker.errors.DockerException:
            self._store.delete(PERSISTENT_VOLUME_CLAIMS, namespace, created["metadata"]["name"])
            raise
        created["spec"]["volumeName"] = f"pvc-{created['metadata']['uid']}"
        storage = spec["resources"]["requests"]["storage"]
        created["status"] = {"phase": "Bound", "accessModes": spec["accessModes"], "capacity": {"storage": storage}}
        return self._store.replace(PERSISTENT_VOLUME_CLAIMS, created) or created

    async def _grace_period(self, request: web.Request) -> int | None:
        value = request.query.get("gracePeriodSeconds")
        if value is None:
            body = as_obj(await self._read_body(request))
            value = body.get("gracePeriodSeconds")
        if value is None:
            return None
        try:
            return max(0, int(value))
        except ValueError as exc:
            raise bad_request(f"gracePeriodSeconds: invalid value {value!r}") from exc

    async def _delete(self, request: web.Request, resource: Resource, obj: JsonObj) -> JsonObj:
        metadata = obj["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        if resource is PODS:
            return await self._kubelet.delete_pod(obj, await self._grace_period(request))
        if resource is PERSISTENT_VOLUME_CLAIMS:
            if metadata.get("deletionTimestamp"):
                return obj
            metadata["deletionTimestamp"] = now_rfc3339()
            metadata["deletionGracePeriodSeconds"] = 0
            if self._kubelet.claim_in_use(namespace, name):
                return self._store.replace(resource, obj) or obj
            await self._kubelet.remove_pvc_volume(obj)
            self._store.delete(resource, namespace, name)
            return obj
        return self._store.delete(resource, namespace, name)

    # ---- pods/exec and pods/log ------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "POST"):
            raise method_not_allowed()
        namespace = self._use_namespace(request)
        pod = self._store.get(PODS, namespace, request.match_info["name"])
        container_id = self._kubelet.exec_target(pod, request.query.get("container"))
        return await serve_exec(request, container_id, docker_api(self._docker), self._executor)

    async def _log(self, request: web.Request) -> web.StreamResponse:
        if request.method != "GET":
            raise method_not_allowed()
        namespace = self._use_namespace(request)
        pod = self._store.get(PODS, namespace, request.match_info["name"])
        tail = request.query.get("tailLines")
        logs = await self._kubelet.logs(pod, request.query.get("container"), int(tail) if tail else None)
        return web.Response(body=logs, content_type="text/plain")
