"""The REST surface the backend uses: `/version`, and in any namespace pods (+exec), PVCs and network policies.

Handlers run on the double's event loop. Every failure is a `Status` object with the API server's
`code`/`reason`; watches stream newline-delimited `{"type": ..., "object": ...}` events. Any other path
(discovery, `pods/log`, namespaces, other resources) is 404 NotFound, and a verb these resources are not
served with (delete collection, update, patch, deleting a network policy) 405 MethodNotAllowed.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import docker
import docker.errors
from aiohttp import web

from . import agent_sandbox, errors, rbac
from .agent_sandbox import SandboxController
from .docker_api import docker_api
from .errors import ApiError, FieldError, bad_request, invalid, method_not_allowed
from .exec_ws import serve_exec
from .objects import JsonObj, as_obj
from .rbac import Grant
from .runtime import DockerKubelet
from .selectors import matches_fields, matches_labels, parse_selector
from .store import NETWORK_POLICIES, PERSISTENT_VOLUME_CLAIMS, PODS, Resource, Store, now_rfc3339
from .validation import (
    UNSUPPORTED,
    check_namespace_name,
    default_pod,
    prepare_metadata,
    validate_network_policy,
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


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(obj).encode(), status=status, content_type="application/json")


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
        with_agent_sandbox: bool = False,
    ) -> None:
        self._store = store
        self._kubelet = kubelet
        self._docker = client
        self._executor = executor
        self._token = token
        # Tokens bound to a Role (`KubeApiDouble.grant`); the double's own token is an administrator's.
        self.grants: dict[str, Grant] = {}
        # The agent-sandbox CRDs, installed or not, and their controllers when they are.
        self._custom: tuple[Resource, ...] = ()
        if with_agent_sandbox:
            self._custom = agent_sandbox.RESOURCES
            SandboxController(store, kubelet.start_pod, kubelet.delete_pod)

    def application(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=256 * 1024 * 1024)
        add = app.router.add_route
        add("GET", "/version", self._version)
        add("GET", "/version/", self._version)  # the generated client asks for `/version/`
        for prefix, resource in (
            ("/api/v1/namespaces/{namespace}/pods", PODS),
            ("/api/v1/namespaces/{namespace}/persistentvolumeclaims", PERSISTENT_VOLUME_CLAIMS),
            ("/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies", NETWORK_POLICIES),
            *((f"/apis/{r.api_version}/namespaces/{{namespace}}/{r.plural}", r) for r in self._custom),
        ):
            add("*", prefix, self._collection(resource))
            add("*", prefix + "/{name}", self._item(resource))
        add("*", "/api/v1/namespaces/{namespace}/pods/{name}/exec", self._exec)
        add("GET", "/apis", self._groups)
        add("GET", "/apis/", self._groups)  # the generated client asks for `/apis/`
        add("GET", "/apis/{group}/{version}", self._group_resources)
        add("*", "/{tail:.*}", self._no_such_path)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            presented = request.headers.get("Authorization", "")
            grant = self.grants.get(presented.removeprefix("Bearer ")) if presented.startswith("Bearer ") else None
            if grant is not None:
                websocket = request.headers.get("Upgrade", "").lower() == "websocket"
                grant.authorize(rbac.attributes(request.method, request.path, request.query), websocket)
            elif presented != f"Bearer {self._token}":
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

    async def _version(self, request: web.Request) -> web.StreamResponse:
        return json_response(KUBERNETES_VERSION)

    def _served_groups(self) -> dict[str, list[JsonObj]]:
        """Each served group/version of `/apis` and its resources, as discovery lists them."""
        policies: JsonObj = {
            "name": NETWORK_POLICIES.plural,
            "singularName": "networkpolicy",
            "namespaced": True,
            "kind": NETWORK_POLICIES.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": ["netpol"],
        }
        served = {NETWORK_POLICIES.api_version: [policies]}
        for resource in self._custom:
            served[resource.api_version] = agent_sandbox.api_resources(resource.group)
        return served

    async def _groups(self, request: web.Request) -> web.StreamResponse:
        groups: list[JsonObj] = []
        for group_version in self._served_groups():
            group, version = group_version.split("/")
            preferred = {"groupVersion": group_version, "version": version}
            groups.append({"name": group, "versions": [preferred], "preferredVersion": preferred})
        return json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})

    async def _group_resources(self, request: web.Request) -> web.StreamResponse:
        group_version = f"{request.match_info['group']}/{request.match_info['version']}"
        resources = self._served_groups().get(group_version)
        if resources is None:
            raise errors.no_such_path()
        return json_response(
            {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}
        )

    async def _no_such_path(self, request: web.Request) -> web.StreamResponse:
        raise errors.no_such_path()

    def _use_namespace(self, request: web.Request) -> str:
        namespace = request.match_info["namespace"]
        check_namespace_name(namespace)  # every valid name exists
        return namespace

    # ---- collections and items -------------------------------------------------------------------

    def _collection(self, resource: Resource) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            if request.method not in ("GET", "POST"):
                raise method_not_allowed()
            namespace = self._use_namespace(request)
            if request.method == "POST":
                return await self._create(request, resource, namespace)
            labels = parse_selector(request.query.get("labelSelector"))
            fields = parse_selector(request.query.get("fieldSelector"), fields=True)

            def matches(obj: JsonObj) -> bool:
                return matches_labels(labels, as_obj(obj.get("metadata")).get("labels")) and matches_fields(fields, obj)

            if request.query.get("watch") in ("1", "true", "True"):
                return await self._watch(request, resource, namespace, matches)
            return self._list_response(resource, self._store.list(resource, namespace, matches))

        return handler

    def _item(self, resource: Resource) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            if request.method not in ("GET", "DELETE") or (request.method, resource) == ("DELETE", NETWORK_POLICIES):
                raise method_not_allowed()
            obj = self._store.get(resource, self._use_namespace(request), request.match_info["name"])
            if request.method == "GET":
                return json_response(obj)
            if resource in self._custom:
                # What the object controls goes after it, in the controllers' next pass (the garbage collector).
                return json_response(
                    self._store.delete(resource, obj["metadata"]["namespace"], obj["metadata"]["name"])
                )
            if resource is PODS:
                await self._check_immediate(request, obj)
                return json_response(self._kubelet.delete_pod(obj))
            return json_response(await self._delete_pvc(obj))

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
        self, request: web.Request, resource: Resource, namespace: str, matches: Callable[[JsonObj], bool]
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
        if resource in self._custom:
            obj.pop("status", None)  # a subresource of its own: create ignores it
            agent_sandbox.validate(resource, obj)
            return json_response(self._store.create(resource, namespace, obj), 201)
        validate_network_policy(obj)
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

    async def _check_immediate(self, request: web.Request, pod: JsonObj) -> None:
        """Raises: ApiError 422 unless the pod is deleted with grace period 0, the one deletion the double serves."""
        value = request.query.get("gracePeriodSeconds")
        if value is None:
            value = as_obj(await self._read_body(request)).get("gracePeriodSeconds")
        if value is None:
            value = pod["spec"].get("terminationGracePeriodSeconds")
        if str(value) != "0":
            cause = FieldError.invalid("gracePeriodSeconds", value, f"graceful deletion is {UNSUPPORTED}")
            raise invalid(PODS.kind, pod["metadata"]["name"], [cause])

    async def _delete_pvc(self, pvc: JsonObj) -> JsonObj:
        """Delete now, or (`kubernetes.io/pvc-protection`) mark deleting until no pod uses the claim."""
        metadata = pvc["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        if metadata.get("deletionTimestamp"):
            return pvc
        metadata["deletionTimestamp"] = now_rfc3339()
        metadata["deletionGracePeriodSeconds"] = 0
        if self._kubelet.claim_in_use(namespace, name):
            return self._store.replace(PERSISTENT_VOLUME_CLAIMS, pvc) or pvc
        await self._kubelet.remove_pvc_volume(pvc)
        self._store.delete(PERSISTENT_VOLUME_CLAIMS, namespace, name)
        return pvc

    # ---- pods/exec ------------------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        if request.method not in ("GET", "POST"):
            raise method_not_allowed()
        namespace = self._use_namespace(request)
        pod = self._store.get(PODS, namespace, request.match_info["name"])
        container_id = self._kubelet.exec_target(pod, request.query.get("container"))
        return await serve_exec(request, container_id, docker_api(self._docker), self._executor)
