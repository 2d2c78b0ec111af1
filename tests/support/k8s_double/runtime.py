"""The double's node: a kubelet that runs each pod as one Docker container and reports pod status.

All Docker SDK calls run in the double's thread pool; all store updates happen on its event loop. A
pod's `lock` serialises container creation against deletion, so a deleted pod never leaves a container.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
from docker.models.containers import Container
from docker.types import Mount

from .docker_api import docker_api
from .errors import bad_request
from .objects import JsonObj, as_list, as_obj
from .pod_network import PodNetworkError, node_namespace, pod_sandbox
from .quantity import to_bytes
from .store import NETWORK_POLICIES, PERSISTENT_VOLUME_CLAIMS, PODS, Store, now_rfc3339
from .translate import (
    ContainerConfigError,
    RuntimeOptions,
    VolumeBacking,
    egress_denied,
    plan_container,
    pod_hostname,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

INSTANCE_LABEL = "k8s-double.instance"
OWNER_LABEL = "k8s-double.owner-pid"  # lets a later run remove what a killed run left
_HELPER_MOUNT = "k8s-double-volume"
_NETWORK = "host"  # of every pod that no deny-all egress NetworkPolicy selects
# How often disk emptyDirs are measured against their sizeLimit (a kubelet's eviction manager: every 10 s by
# default; shorter here, so tests wait less for what a node does).
EVICTION_INTERVAL = 1.0


@dataclass(eq=False)
class PodRuntime:
    """What the node knows about one pod while it exists there."""

    namespace: str
    name: str
    uid: str
    claims: frozenset[str]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    task: asyncio.Task[None] | None = None
    deleted: bool = False
    container: str | None = None  # its Docker id, once created
    evicted: str = ""  # the eviction message, once the kubelet's eviction manager evicted the pod


def _condition(type_: str, status: bool, reason: str = "", message: str = "") -> JsonObj:
    condition: JsonObj = {
        "type": type_,
        "status": "True" if status else "False",
        "lastProbeTime": None,
        "lastTransitionTime": now_rfc3339(),
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _container_status(
    container: JsonObj, state: JsonObj, *, ready: bool = False, container_id: str = "", image_id: str = ""
) -> JsonObj:
    status: JsonObj = {
        "name": container["name"],
        "state": state,
        "lastState": {},
        "ready": ready,
        "restartCount": 0,
        "image": container["image"],
        "imageID": image_id,
        "started": "running" in state,
    }
    if container_id:
        status["containerID"] = f"docker://{container_id}"
    return status


def _waiting(reason: str, message: str = "") -> JsonObj:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def _terminated(exit_code: int, reason: str, started_at: str, container_id: str) -> JsonObj:
    state: JsonObj = {
        "exitCode": exit_code,
        "reason": reason,
        "startedAt": started_at,
        "finishedAt": now_rfc3339(),
        "containerID": f"docker://{container_id}",
    }
    return {"terminated": state}


class DockerKubelet:
    """Runs pods and PVC volumes in Docker for the double; every resource carries `INSTANCE_LABEL`."""

    def __init__(
        self,
        store: Store,
        client: docker.DockerClient,
        executor: ThreadPoolExecutor,
        *,
        instance: str,
        runtime_classes: Iterable[str],
        options: RuntimeOptions,
        node_name: str = "k8s-double-node",
    ) -> None:
        self._store = store
        self._docker = client
        self._api = docker_api(client)
        self._executor = executor
        self._instance = instance
        self._runtime_classes = frozenset(runtime_classes)
        self._options = options
        self.node_name = node_name
        self._pods: dict[str, PodRuntime] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._initialised_volumes: set[str] = set()
        # Disk emptyDirs: one host directory per pod and volume, 0777 as a kubelet makes them.
        self._scratch = Path(tempfile.mkdtemp(prefix="k8s-double-emptydir-"))
        # The node side of denied pods' networks (see `pod_network`), made with the first such pod.
        self._node_network: Container | None = None
        self._node_lock = asyncio.Lock()

    async def _run_sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args, **kwargs))

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    @property
    def labels(self) -> dict[str, str]:
        return {INSTANCE_LABEL: self._instance, OWNER_LABEL: str(os.getpid())}

    # ---- PVCs -------------------------------------------------------------------------------------

    def pvc_volume_name(self, pvc: JsonObj) -> str:
        return f"k8sd-{self._instance[:8]}-pvc-{pvc['metadata']['uid']}"

    async def create_pvc_volume(self, pvc: JsonObj) -> None:
        metadata = pvc["metadata"]
        labels = {
            **self.labels,
            "k8s-double.pvc.namespace": metadata["namespace"],
            "k8s-double.pvc.name": metadata["name"],
        }
        await self._run_sync(self._docker.volumes.create, name=self.pvc_volume_name(pvc), driver="local", labels=labels)

    def claim_in_use(self, namespace: str, claim: str) -> bool:
        return any(rt.namespace == namespace and claim in rt.claims for rt in self._pods.values())

    async def remove_pvc_volume(self, pvc: JsonObj) -> None:
        name = self.pvc_volume_name(pvc)
        await self._run_sync(_ignore_gone, self._api.remove_volume, name, force=True)
        self._initialised_volumes.discard(name)

    async def _finalize_claims(self, namespace: str) -> None:
        """Remove PVCs whose deletion waited for their last pod (`kubernetes.io/pvc-protection`)."""
        for pvc in self._store.list(PERSISTENT_VOLUME_CLAIMS, namespace):
            metadata = pvc["metadata"]
            if metadata.get("deletionTimestamp") and not self.claim_in_use(namespace, metadata["name"]):
                await self.remove_pvc_volume(pvc)
                if self._store.find(PERSISTENT_VOLUME_CLAIMS, namespace, metadata["name"]) is not None:
                    self._store.delete(PERSISTENT_VOLUME_CLAIMS, namespace, metadata["name"])

    # ---- pods: public ---------------------------------------------------------------------------

    def start_pod(self, pod: JsonObj) -> None:
        metadata = pod["metadata"]
        claims = frozenset(
            str(as_obj(v.get("persistentVolumeClaim")).get("claimName"))
            for v in as_list(pod["spec"].get("volumes"))
            if "persistentVolumeClaim" in v
        )
        runtime = PodRuntime(metadata["namespace"], metadata["name"], metadata["uid"], claims)
        self._pods[runtime.uid] = runtime
        runtime.task = self._spawn(self._run_pod(runtime))

    def container_id(self, namespace: str, name: str) -> str | None:
        for runtime in self._pods.values():
            if (runtime.namespace, runtime.name) == (namespace, name) and not runtime.deleted:
                return runtime.container
        return None

    def exec_target(self, pod: JsonObj, container: str | None) -> str:
        """The Docker container to exec into, checked as the API server and kubelet check it.

        Raises:
            ApiError: 400 for an unknown container or a pod whose container is not running.
        """
        name, main = pod["metadata"]["name"], pod["spec"]["containers"][0]["name"]
        if container and container != main:
            raise bad_request(f"container {container} is not valid for pod {name}")
        phase = pod["status"].get("phase")
        if phase in ("Succeeded", "Failed"):
            raise bad_request(f"cannot exec into a container in a completed pod; current phase is {phase}")
        runtime = self._pods.get(pod["metadata"]["uid"])
        statuses = as_list(pod["status"].get("containerStatuses"))
        running = any("running" in as_obj(s.get("state")) for s in statuses)
        if runtime is None or runtime.container is None or not running:
            raise bad_request(f'unable to upgrade connection: container not found ("{main}")')
        return runtime.container

    def delete_pod(self, pod: JsonObj) -> JsonObj:
        """Delete a pod as with gracePeriodSeconds 0: the object at once, its container in the background."""
        metadata = pod["metadata"]
        deleted = self._store.delete(PODS, metadata["namespace"], metadata["name"])
        runtime = self._pods.get(metadata["uid"])
        if runtime is not None:
            runtime.deleted = True
            self._spawn(self._remove_pod(runtime))
        return deleted

    async def shutdown(self) -> None:
        """Force-remove everything this node created (containers and volumes with the instance label)."""
        for runtime in self._pods.values():
            runtime.deleted = True
            if runtime.task is not None:
                runtime.task.cancel()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._run_sync(self._sweep)
        shutil.rmtree(self._scratch, ignore_errors=True)

    def _sweep(self) -> None:
        selector = {"label": f"{INSTANCE_LABEL}={self._instance}"}
        for _ in range(100):  # a removal still running in another thread answers 409 until it is done
            containers = self._api.containers(all=True, filters=selector)
            volumes = as_list(self._api.volumes(filters=selector).get("Volumes"))
            if not containers and not volumes:
                return
            for info in containers:
                _ignore_gone(self._api.remove_container, info["Id"], force=True, v=True)
            if not self._api.containers(all=True, filters=selector):
                for volume in volumes:
                    _ignore_gone(self._api.remove_volume, volume["Name"], force=True)
            time.sleep(0.05)
        raise RuntimeError(f"k8s double: could not remove the Docker resources labelled {selector['label']}")

    # ---- pods: lifecycle -------------------------------------------------------------------------

    def _update(self, runtime: PodRuntime, mutate: Callable[[JsonObj], None]) -> bool:
        """Apply `mutate` to the stored pod and write it back; False once the pod is gone or deleting."""
        if runtime.deleted:
            return False
        pod = self._store.find(PODS, runtime.namespace, runtime.name)
        if pod is None or pod["metadata"]["uid"] != runtime.uid:
            return False
        mutate(pod)
        return self._store.replace(PODS, pod) is not None

    async def _run_pod(self, runtime: PodRuntime) -> None:
        try:
            await self._run_pod_steps(runtime)
        except asyncio.CancelledError:
            raise
        except docker.errors.DockerException as exc:
            logger.exception("k8s double: pod %s/%s failed in Docker", runtime.namespace, runtime.name)
            message = str(exc)
            self._update(
                runtime, lambda pod: pod["status"].update(phase="Failed", reason="RunContainerError", message=message)
            )

    async def _run_pod_steps(self, runtime: PodRuntime) -> None:
        pod = self._store.find(PODS, runtime.namespace, runtime.name)
        if pod is None:
            return
        spec = pod["spec"]
        container = spec["containers"][0]
        for claim in sorted(runtime.claims):
            pvc = self._store.find(PERSISTENT_VOLUME_CLAIMS, runtime.namespace, claim)
            problem = (
                "not found" if pvc is None else "is being deleted" if pvc["metadata"].get("deletionTimestamp") else ""
            )
            if problem:
                message = f'0/1 nodes are available: persistentvolumeclaim "{claim}" {problem}.'
                condition = _condition("PodScheduled", False, "Unschedulable", message)
                self._update(runtime, partial(_set_condition, condition=condition))
                return

        def bind(p: JsonObj) -> None:
            p["spec"]["nodeName"] = self.node_name
            unready = f"containers with unready status: [{container['name']}]"
            p["status"].update(
                hostIP="127.0.0.1",
                hostIPs=[{"ip": "127.0.0.1"}],
                startTime=now_rfc3339(),
                conditions=[
                    _condition("PodReadyToStartContainers", False),
                    _condition("Initialized", True),
                    _condition("Ready", False, "ContainersNotReady", unready),
                    _condition("ContainersReady", False, "ContainersNotReady", unready),
                    _condition("PodScheduled", True),
                ],
                containerStatuses=[_container_status(container, _waiting("ContainerCreating"))],
            )

        if not self._update(runtime, bind):
            return
        bound_at = time.monotonic()
        runtime_class = spec.get("runtimeClassName")
        if runtime_class and runtime_class not in self._runtime_classes:
            message = (
                f"Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: "
                f'no runtime for "{runtime_class}" is configured'
            )
            self._update(
                runtime,
                lambda p: _set_condition(
                    p, _condition("PodReadyToStartContainers", False, "FailedCreatePodSandBox", message)
                ),
            )
            return
        backings = await self._prepare_volumes(runtime, pod)
        if backings is None:
            return
        network_mode = _NETWORK
        if self._egress_denied(pod):
            sandbox = await self._pod_sandbox(runtime, pod, container)
            if sandbox is None:
                return
            network_mode = f"container:{sandbox}"
        self._update(runtime, lambda p: _set_condition(p, _condition("PodReadyToStartContainers", True)))
        result = await self._start_container(runtime, pod, container, backings, network_mode)
        if result is None:
            return
        container_id, started_at = result
        deadline = spec.get("activeDeadlineSeconds")
        sized = {name: b for name, b in backings.items() if b.kind == "disk" and b.size_bytes}
        evictions = self._spawn(self._evict_past_size_limits(runtime, pod, container_id, sized)) if sized else None
        try:
            # The kubelet counts the deadline from the pod's start, and then kills it, whatever runs in it.
            remaining = None if deadline is None else max(0.0, bound_at + deadline - time.monotonic())
            exit_code, reason = await asyncio.wait_for(self._wait(container_id), remaining)
        except asyncio.TimeoutError:
            await self._run_sync(_ignore_gone, self._api.kill, container_id)
            if not runtime.deleted:
                self._update(runtime, _deadline_exceeded)
            return
        finally:
            if evictions is not None:
                evictions.cancel()
        if runtime.deleted:
            return
        state = _terminated(exit_code, reason, started_at, container_id)
        if runtime.evicted:
            self._update(runtime, partial(_evicted, state=state, message=runtime.evicted))
            return
        self._update(runtime, partial(_finish, state=state, phase="Succeeded" if exit_code == 0 else "Failed"))

    async def _evict_past_size_limits(
        self, runtime: PodRuntime, pod: JsonObj, container_id: str, sized: Mapping[str, VolumeBacking]
    ) -> None:
        """The kubelet's eviction manager for disk emptyDirs: now and then (every EVICTION_INTERVAL) it measures
        each one, and evicts the pod at once (grace period 0) when one is past its sizeLimit. Writes past the
        limit succeed meanwhile, as on a node: the limit is no quota."""
        volumes = {str(v["name"]): as_obj(v.get("emptyDir")) for v in as_list(pod["spec"].get("volumes"))}
        while not runtime.deleted:
            await asyncio.sleep(EVICTION_INTERVAL)
            for name, backing in sized.items():
                used = await self._run_sync(_disk_usage, Path(backing.host_path))
                if backing.size_bytes is not None and used > backing.size_bytes:
                    limit = volumes[name].get("sizeLimit")
                    runtime.evicted = f'Usage of EmptyDir volume "{name}" exceeds the limit "{limit}". '
                    await self._run_sync(_ignore_gone, self._api.kill, container_id)
                    return

    async def _pod_sandbox(self, runtime: PodRuntime, pod: JsonObj, container: JsonObj) -> str | None:
        """The pod sandbox holding a denied pod's network namespace (see `pod_network`); its id, or None when the
        pod cannot go on (its status then says why)."""
        if await self._image_config(runtime, container) is None:
            return None
        image = str(container["image"])
        labels = {
            **self.labels,
            "io.kubernetes.pod.namespace": runtime.namespace,
            "io.kubernetes.pod.name": runtime.name,
            "io.kubernetes.pod.uid": runtime.uid,
        }
        digest = hashlib.sha256(runtime.uid.encode()).digest()
        address = f"10.244.{digest[0]}.{digest[1] % 254 + 1}"
        try:
            async with self._node_lock:
                if self._node_network is None:
                    self._node_network = await self._run_sync(node_namespace, self._docker, image, self.labels)
            async with runtime.lock:
                if runtime.deleted:
                    return None
                sandbox = await self._run_sync(
                    pod_sandbox,
                    self._docker,
                    image,
                    name=f"k8sd-{self._instance[:8]}-{runtime.uid[:8]}-POD",
                    hostname=pod_hostname(pod),
                    labels=labels,
                    node=self._node_network,
                    address=address,
                    namespace=runtime.namespace,
                )
        except (PodNetworkError, docker.errors.APIError) as exc:
            message = f"Failed to create pod sandbox: {exc}"
            self._update(
                runtime,
                lambda p: _set_condition(
                    p, _condition("PodReadyToStartContainers", False, "FailedCreatePodSandBox", message)
                ),
            )
            return None
        return str(sandbox.id)

    def _egress_denied(self, pod: JsonObj) -> bool:
        policies = self._store.list(NETWORK_POLICIES, pod["metadata"]["namespace"])
        return egress_denied(as_obj(pod["metadata"].get("labels")), policies)

    async def _image_config(self, runtime: PodRuntime, container: JsonObj) -> tuple[JsonObj, str] | None:
        image = str(container["image"])
        try:
            info = await self._run_sync(self._api.inspect_image, image)
        except docker.errors.ImageNotFound:
            never = container.get("imagePullPolicy") == "Never"
            reason = "ErrImageNeverPull" if never else "ErrImagePull"
            message = (
                f'Container image "{image}" is not present with pull policy of Never'
                if never
                else f'failed to pull image "{image}": the k8s test double cannot pull; build or import it locally'
            )
            self._update(runtime, partial(_set_status, state=_waiting(reason, message)))
            return None
        return as_obj(info.get("Config")), str(info.get("Id", ""))

    async def _prepare_volumes(self, runtime: PodRuntime, pod: JsonObj) -> dict[str, VolumeBacking] | None:
        """emptyDirs of medium Memory as tmpfs, others on disk; claims as their Docker volumes, with the kubelet's
        permissions on their root."""
        spec = pod["spec"]
        fs_group = as_obj(spec.get("securityContext")).get("fsGroup")
        backings: dict[str, VolumeBacking] = {}
        to_initialise: list[str] = []
        for volume in as_list(spec.get("volumes")):
            name = str(volume["name"])
            if "emptyDir" in volume:
                empty_dir = as_obj(volume["emptyDir"])
                size = empty_dir.get("sizeLimit")
                size_bytes = to_bytes(size) if size is not None else None
                if empty_dir.get("medium") == "Memory":
                    backings[name] = VolumeBacking("tmpfs", size_bytes=size_bytes)
                else:
                    directory = self._scratch / runtime.uid / name
                    directory.mkdir(parents=True, exist_ok=True)
                    directory.chmod(0o777)
                    backings[name] = VolumeBacking("disk", size_bytes=size_bytes, host_path=str(directory))
                continue
            source = as_obj(volume["persistentVolumeClaim"])  # validation admits no other kind
            pvc = self._store.find(PERSISTENT_VOLUME_CLAIMS, runtime.namespace, str(source.get("claimName")))
            if pvc is None:
                return None
            docker_name = self.pvc_volume_name(pvc)
            backings[name] = VolumeBacking("volume", docker_volume=docker_name, read_only=bool(source.get("readOnly")))
            if docker_name not in self._initialised_volumes or fs_group is not None:
                to_initialise.append(docker_name)
        if to_initialise:
            container = spec["containers"][0]
            if await self._image_config(runtime, container) is None:
                return None
            for docker_name in to_initialise:
                await self._run_sync(self._set_volume_root, str(container["image"]), docker_name, fs_group)
                self._initialised_volumes.add(docker_name)
        return backings

    def _set_volume_root(self, image: str, docker_name: str, fs_group: int | None) -> None:
        """Give a volume's root the kubelet's permissions: 0777, or fsGroup-owned with setgid.

        Uses a created-but-never-started helper container from the pod's own image, so no
        extra image is needed: Docker applies a tar directory entry's mode and owner on copy-in.
        """
        helper = self._docker.containers.create(
            image,
            entrypoint=["/k8s-double-never-started"],
            network_mode="none",
            labels=self.labels,
            mounts=[Mount(f"/{_HELPER_MOUNT}", docker_name, type="volume")],
        )
        try:
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w") as archive:
                entry = tarfile.TarInfo(_HELPER_MOUNT)
                entry.type = tarfile.DIRTYPE
                entry.mode = 0o2777 if fs_group is not None else 0o777
                entry.gid = fs_group if fs_group is not None else 0
                entry.mtime = int(time.time())
                archive.addfile(entry)
            self._api.put_archive(str(helper.id), "/", buffer.getvalue())
        finally:
            helper.remove(force=True)

    async def _start_container(
        self,
        runtime: PodRuntime,
        pod: JsonObj,
        container: JsonObj,
        backings: Mapping[str, VolumeBacking],
        network_mode: str,
    ) -> tuple[str, str] | None:
        """Create and start the pod's container; `(id, startedAt)`, or None when the pod cannot go on."""
        image = await self._image_config(runtime, container)
        if image is None:
            return None
        image_config, image_id = image
        labels = {
            **self.labels,
            "io.kubernetes.pod.namespace": runtime.namespace,
            "io.kubernetes.pod.name": runtime.name,
            "io.kubernetes.pod.uid": runtime.uid,
            "io.kubernetes.container.name": str(container["name"]),
        }
        try:
            plan = plan_container(
                pod,
                container,
                name=f"k8sd-{self._instance[:8]}-{runtime.uid[:8]}-{container['name']}",
                image_config=image_config,
                backings=backings,
                network_mode=network_mode,
                labels=labels,
                options=self._options,
            )
        except ContainerConfigError as exc:
            message = str(exc)
            self._update(runtime, partial(_set_status, state=_waiting("CreateContainerConfigError", message)))
            return None
        async with runtime.lock:
            if runtime.deleted:
                return None
            step = "CreateContainerError"  # the kubelet's waiting reasons when the runtime refuses
            try:
                created: Container = await self._run_sync(self._docker.containers.create, plan.image, **plan.kwargs)
                container_id = runtime.container = str(created.id)
                step = "RunContainerError"
                await self._run_sync(created.start)
            except docker.errors.APIError as exc:
                message = str(exc.explanation or exc)
                self._update(runtime, partial(_set_status, state=_waiting(step, message)))
                return None
            await self._run_sync(_restore_working_dir_mode, created, plan.kwargs)
        started_at = now_rfc3339()
        state = {"running": {"startedAt": started_at}}
        self._update(
            runtime,
            partial(_set_status, state=state, ready=True, container_id=container_id, image_id=image_id, running=True),
        )
        return container_id, started_at

    async def _wait(self, container_id: str) -> tuple[int, str]:
        """Wait for a container to exit: (exit code, terminated reason)."""
        try:
            result = await self._run_sync(self._api.wait, container_id)
        except docker.errors.NotFound:
            return 137, "Error"
        exit_code = int(result.get("StatusCode", -1))
        try:
            state = as_obj((await self._run_sync(self._api.inspect_container, container_id)).get("State"))
        except docker.errors.NotFound:
            return exit_code, "Error"
        if state.get("OOMKilled"):
            return exit_code, "OOMKilled"
        return exit_code, "Completed" if exit_code == 0 else "Error"

    async def _remove_pod(self, runtime: PodRuntime) -> None:
        async with runtime.lock:
            runtime.deleted = True
            if runtime.task is not None:
                runtime.task.cancel()
            await self._run_sync(self._remove_pod_containers, runtime.uid)
            shutil.rmtree(self._scratch / runtime.uid, ignore_errors=True)
        self._pods.pop(runtime.uid, None)
        await self._finalize_claims(runtime.namespace)

    def _remove_pod_containers(self, uid: str) -> None:
        filters = {"label": [f"{INSTANCE_LABEL}={self._instance}", f"io.kubernetes.pod.uid={uid}"]}
        for info in self._api.containers(all=True, filters=filters):
            _ignore_gone(self._api.remove_container, info["Id"], force=True, v=True)


def _restore_working_dir_mode(container: Container, kwargs: Mapping[str, Any]) -> None:
    """Docker forces a tmpfs mounted at the working directory to 0755 root; the kubelet's emptyDir stays
    world-writable. Restored (as root, with the image's `chmod`) before the pod is reported Running."""
    working_dir = kwargs.get("working_dir")
    tmpfs: Mapping[str, str] = kwargs.get("tmpfs") or {}
    options = str(tmpfs.get(str(working_dir), "")).split(",")
    mode = next((o.removeprefix("mode=") for o in options if o.startswith("mode=")), None)
    if working_dir and mode and "ro" not in options:
        container.exec_run(["chmod", mode, str(working_dir)], user="0")


def _ignore_gone(remove: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Remove a Docker object; already gone or being removed elsewhere (404/409) is fine."""
    try:
        remove(*args, **kwargs)
    except docker.errors.APIError as exc:
        if exc.status_code not in (404, 409):
            raise


def _set_condition(pod: JsonObj, condition: JsonObj) -> None:
    conditions = [c for c in as_list(pod["status"].get("conditions")) if c.get("type") != condition["type"]]
    pod["status"]["conditions"] = [*conditions, condition]


def _set_status(
    pod: JsonObj,
    *,
    state: JsonObj,
    ready: bool = False,
    container_id: str = "",
    image_id: str = "",
    running: bool = False,
) -> None:
    container = pod["spec"]["containers"][0]
    previous = as_obj((as_list(pod["status"].get("containerStatuses")) or [{}])[0])
    status = _container_status(
        container,
        state,
        ready=ready,
        container_id=container_id or str(previous.get("containerID", "")).removeprefix("docker://"),
        image_id=image_id or str(previous.get("imageID", "")),
    )
    pod["status"]["containerStatuses"] = [status]
    if running:
        pod["status"]["phase"] = "Running"
        for type_ in ("Ready", "ContainersReady"):
            _set_condition(pod, _condition(type_, True))


def _disk_usage(root: Path) -> int:
    """Bytes of disk the tree under `root` holds (allocated blocks, as `du` and the kubelet count), read as root."""
    total = 0
    for directory, subdirectories, files in os.walk(root):
        for name in [*subdirectories, *files]:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                continue  # removed meanwhile
    return total


def _evicted(pod: JsonObj, *, state: JsonObj, message: str) -> None:
    """What a kubelet reports of a pod it evicted: Failed, reason Evicted, and why."""
    _set_status(pod, state=state)
    pod["status"].update(phase="Failed", reason="Evicted", message=message)
    _set_condition(pod, _condition("DisruptionTarget", True, "TerminationByKubelet", message))
    for type_ in ("Ready", "ContainersReady"):
        _set_condition(pod, _condition(type_, False, "PodFailed"))


def _deadline_exceeded(pod: JsonObj) -> None:
    pod["status"].update(
        phase="Failed",
        reason="DeadlineExceeded",
        message="Pod was active on the node longer than the specified deadline",
    )
    for type_ in ("Ready", "ContainersReady"):
        _set_condition(pod, _condition(type_, False, "PodFailed"))


def _finish(pod: JsonObj, *, state: JsonObj, phase: str) -> None:
    _set_status(pod, state=state)
    pod["status"]["phase"] = phase
    for type_ in ("Ready", "ContainersReady"):
        _set_condition(pod, _condition(type_, False, "PodCompleted"))
