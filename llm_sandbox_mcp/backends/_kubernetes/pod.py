"""Kubernetes objects for sandboxes, as plain JSON: the pod, the deny-all NetworkPolicy, the cache claim, and
what a pod's status says about its start.

Pure functions, no client: what the Kubernetes backend sends and reads, readable and testable on its own.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from llm_sandbox_mcp.backends import _owner
from llm_sandbox_mcp.backends._container import CACHE_PREFIX, INIT
from llm_sandbox_mcp.errors import ImageMissing, SandboxFailure
from llm_sandbox_mcp.models import WORKDIR, Limits, SandboxSpec
from llm_sandbox_mcp.seccomp.oci import ours_applies

Json = dict[str, Any]

CONTAINER = "sandbox"
NETWORK_LABEL = f"{_owner.LABEL_PREFIX}.network"
POLICY_NAME = f"{_owner.LABEL_PREFIX}-deny-all"
EXPIRES = f"{_owner.LABEL_PREFIX}/expires-at"
MANAGED_BY = {"app.kubernetes.io/managed-by": _owner.LABEL_PREFIX}
SECURITY_OPTIONS = (
    "no-new-privileges[:true|false], seccomp=unconfined|PROFILE, apparmor=unconfined|PROFILE, label=KEY:VALUE"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SELINUX_KEYS = ("user", "role", "type", "level")
# Pod fields a template may not set: each would hand the sandbox something of the node.
_HOST_FIELDS = ("hostNetwork", "hostPID", "hostIPC")
_IMAGE_REASONS = ("ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName")
_FATAL_REASONS = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError", "CrashLoopBackOff")


@dataclass(frozen=True)
class PodOptions:
    """What the operator adds to every sandbox pod (SANDBOX_K8S_* settings)."""

    runtime_class: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict[str, str])
    template: Json | None = None
    # The project's seccomp profile installed on the nodes: a path under the kubelet's seccomp directory.
    seccomp_profile: str | None = None
    # The cluster ends a pod this long after it started, whatever happens to the server that made it.
    active_deadline: int | None = None
    # False: the pod gets a user namespace of its own (Kubernetes 1.30+ with a runtime that supports it).
    host_users: bool = True


def security_context(options: Sequence[str]) -> Json:
    """Docker-style SANDBOX_SECURITY_OPT values as container securityContext fields. Raises ValueError."""
    context: Json = {"allowPrivilegeEscalation": True, "seccompProfile": {"type": "RuntimeDefault"}}
    for option in options:
        key, _, value = option.partition("=") if "=" in option else option.partition(":")
        if key == "no-new-privileges" and value in ("", "true", "false"):
            context["allowPrivilegeEscalation"] = value == "false"
        elif key in ("seccomp", "apparmor") and value:
            name = "seccompProfile" if key == "seccomp" else "appArmorProfile"
            context[name] = (
                {"type": "Unconfined"} if value == "unconfined" else {"type": "Localhost", "localhostProfile": value}
            )
        elif key == "label" and value.partition(":")[0] in _SELINUX_KEYS and value.partition(":")[2]:
            part, _, setting = value.partition(":")
            context.setdefault("seLinuxOptions", {})[part] = setting
        else:
            raise ValueError(f"SANDBOX_SECURITY_OPT: {option!r} has no Kubernetes equivalent; use {SECURITY_OPTIONS}")
    return context


def _capability(name: str) -> str:
    return name.upper().removeprefix("CAP_")


def _container_security(limits: Limits, seccomp_profile: str | None) -> Json:
    context = security_context(limits.security_opt)
    if seccomp_profile is not None and ours_applies(limits.security_opt, limits.privileged):
        context["seccompProfile"] = {"type": "Localhost", "localhostProfile": seccomp_profile}
    context.update(
        runAsNonRoot=True,
        runAsUser=limits.uid,
        runAsGroup=limits.gid,
        readOnlyRootFilesystem=limits.read_only,
        privileged=limits.privileged,
        capabilities={"drop": [_capability(c) for c in limits.cap_drop]},
    )
    if limits.privileged:
        # The API server refuses `allowPrivilegeEscalation: false` together with `privileged: true`.
        context["allowPrivilegeEscalation"] = True
    return context


def resources(limits: Limits) -> Json:
    """Requests equal limits (Guaranteed QoS). /tmp is disk-backed, so it counts as ephemeral storage."""
    amounts = {
        "cpu": f"{max(1, round(limits.cpus * 1000))}m",
        "memory": str(limits.memory_bytes),
        # /tmp, plus room for the container's writable layer and logs.
        "ephemeral-storage": str(limits.tmp_bytes + limits.workspace_bytes),
    }
    return {"requests": dict(amounts), "limits": dict(amounts)}


def owner_metadata(kind: str, expires_at: int) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that tie a resource to this server; values that are not valid labels go only to
    the annotations, which always carry everything `_owner.owner_is_gone` needs."""
    owner = _owner.owner_labels(kind)
    labels = {key: value for key, value in owner.items() if len(value) <= 63 and _LABEL_VALUE.match(value)}
    return {**labels, **MANAGED_BY}, {**owner, EXPIRES: str(expires_at)}


def pod_manifest(
    name: str, spec: SandboxSpec, labels: Mapping[str, str], annotations: Mapping[str, str], options: PodOptions
) -> Json:
    """The pod for one sandbox: idle PID 1, hardened, limited, with size-limited emptyDirs (and the cache).

    No host path reaches a pod: a sandbox that may use the egress proxy (`spec.egress`) reaches it through the
    tunnel over its relay's exec stream."""
    limits = spec.limits
    pod_labels = dict(labels)
    if limits.network_mode == "none":
        pod_labels[NETWORK_LABEL] = "none"
    mounts: list[Json] = [
        {"name": "workspace", "mountPath": str(WORKDIR)},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    volumes: list[Json] = [
        {"name": "workspace", "emptyDir": {"medium": "Memory", "sizeLimit": str(limits.workspace_bytes)}},
        # Memory, as Docker's tmpfs: a disk emptyDir's sizeLimit is only checked now and then, by eviction.
        {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": str(limits.tmp_bytes)}},
    ]
    if spec.cache is not None:
        read_only = not spec.cache.writable
        mounts.append({"name": "libraries", "mountPath": str(spec.cache.target), "readOnly": read_only})
        volumes.append(
            {
                "name": "libraries",
                "persistentVolumeClaim": {"claimName": CACHE_PREFIX + spec.cache.key, "readOnly": read_only},
            }
        )
    pod_spec: Json = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "shareProcessNamespace": False,
        "hostname": "sandbox",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": limits.uid,
            "runAsGroup": limits.gid,
            "fsGroup": limits.gid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": spec.image,
                "command": list(INIT),
                "workingDir": str(WORKDIR),
                "env": [{"name": "HOME", "value": "/tmp"}],
                "securityContext": _container_security(limits, options.seccomp_profile),
                "resources": resources(limits),
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    for host_field in _HOST_FIELDS:
        pod_spec[host_field] = False
    if options.active_deadline is not None:
        pod_spec["activeDeadlineSeconds"] = options.active_deadline
    if not options.host_users:
        pod_spec["hostUsers"] = False
    if options.runtime_class:
        pod_spec["runtimeClassName"] = options.runtime_class
    if options.node_selector:
        pod_spec["nodeSelector"] = dict(options.node_selector)
    ours: Json = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": pod_labels, "annotations": dict(annotations)},
        "spec": pod_spec,
    }
    return merge(options.template, ours) if options.template else ours


def merge(base: Any, ours: Any) -> Any:
    """`ours` laid over `base`: objects merge key by key, lists of named objects merge by name, and anything
    else of ours replaces the base's. So a template adds fields, and every field we set wins."""
    if isinstance(base, dict) and isinstance(ours, dict):
        merged: Json = copy.deepcopy(cast(Json, base))
        for key, value in cast(Json, ours).items():
            merged[key] = merge(merged[key], value) if key in merged else copy.deepcopy(value)
        return merged
    base_items, our_items = _named(base), _named(ours)
    if base_items is not None and our_items is not None:
        ours_by_name = {item["name"]: item for item in our_items}
        kept = [merge(item, ours_by_name.pop(item["name"], None) or {}) for item in base_items]
        return kept + [copy.deepcopy(item) for item in ours_by_name.values()]
    return copy.deepcopy(ours)


def _named(value: Any) -> list[Json] | None:
    """The items of a list of objects that all have a name; None for anything else."""
    if not isinstance(value, list):
        return None
    items = cast(list[Any], value)
    if not all(isinstance(item, dict) and isinstance(cast(Json, item).get("name"), str) for item in items):
        return None
    return [cast(Json, item) for item in items]


def _object(value: Any) -> Json:
    return cast(Json, value) if isinstance(value, dict) else {}


def _objects(value: Any) -> list[Json]:
    if not isinstance(value, list):
        return []
    return [cast(Json, item) for item in cast(list[Any], value) if isinstance(item, dict)]


def load_template(path: Path) -> Json:
    """A pod template (a Pod or PodTemplate manifest, YAML or JSON). Raises ValueError naming the problem."""
    try:
        document: Any = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"SANDBOX_K8S_POD_TEMPLATE: cannot read {path}: {exc}") from exc
    if isinstance(document, dict) and cast(Json, document).get("kind") == "PodTemplate":
        document = cast(Json, document).get("template")
    if not isinstance(document, dict):
        raise ValueError(f"SANDBOX_K8S_POD_TEMPLATE: {path} is not a Pod manifest (an object with a `spec`)")
    template = cast(Json, document)
    check_template(template, str(path))
    metadata = _object(template.get("metadata"))
    kept = {key: value for key, value in metadata.items() if key in ("labels", "annotations")}
    return {"metadata": kept, "spec": _object(template.get("spec"))}


def check_template(template: Json, where: str) -> None:
    """Refuse what would weaken the sandbox whatever we set: extra containers, host namespaces, host paths."""
    if not isinstance(template.get("spec", {}), dict):
        raise ValueError(f"SANDBOX_K8S_POD_TEMPLATE: {where}: `spec` must be an object")
    spec = _object(template.get("spec"))
    problems: list[str] = []
    others = [str(c.get("name")) for c in _objects(spec.get("containers")) if c.get("name") != CONTAINER]
    if others:
        problems.append(
            f"containers other than {CONTAINER!r} ({', '.join(others)}) would share the sandbox's network; "
            f"name the container to customise {CONTAINER!r}"
        )
    problems += [f"`{name}` must not be set" for name in _HOST_FIELDS if spec.get(name)]
    problems += [
        f"volume {v.get('name')!r} is a hostPath; no host path is ever mounted"
        for v in _objects(spec.get("volumes"))
        if "hostPath" in v
    ]
    if problems:
        raise ValueError(f"SANDBOX_K8S_POD_TEMPLATE: {where}: " + "; ".join(problems))


def network_policy() -> Json:
    """Deny all ingress and egress for pods labelled network=none (no rules of either type = nothing allowed)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {_owner.MANAGED: "true", **MANAGED_BY}},
        "spec": {"podSelector": {"matchLabels": {NETWORK_LABEL: "none"}}, "policyTypes": ["Ingress", "Egress"]},
    }


@dataclass(frozen=True)
class CacheClaim:
    """How library caches are provisioned (SANDBOX_K8S_CACHE_* settings)."""

    size_bytes: int
    storage_class: str | None
    access_mode: str


def cache_claim(key: str, claim: CacheClaim) -> Json:
    """The PersistentVolumeClaim of one library cache."""
    spec: Json = {"accessModes": [claim.access_mode], "resources": {"requests": {"storage": str(claim.size_bytes)}}}
    if claim.storage_class:
        spec["storageClassName"] = claim.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": CACHE_PREFIX + key,
            "labels": {_owner.MANAGED: "true", _owner.KIND: "library-cache", **MANAGED_BY},
        },
        "spec": spec,
    }


def _container_state(pod: Json) -> Json:
    for status in _objects(_object(pod.get("status")).get("containerStatuses")):
        if status.get("name") == CONTAINER:
            return _object(status.get("state"))
    return {}


def started(pod: Json) -> bool:
    """True once the sandbox container runs. Raises ImageMissing/SandboxFailure when it never will.

    Unschedulable and sandbox-creation problems are not final (an autoscaler may add a node): they show in
    `pending_reason` when the start times out.
    """
    name = str(_object(pod.get("metadata")).get("name", "?"))
    status = _object(pod.get("status"))
    state = _container_state(pod)
    if "running" in state and status.get("phase") == "Running":
        return True
    waiting = _object(state.get("waiting"))
    reason, message = str(waiting.get("reason", "")), str(waiting.get("message", ""))
    if reason in _IMAGE_REASONS:
        containers = _objects(_object(pod.get("spec")).get("containers"))
        image = next((str(c.get("image")) for c in containers if c.get("name") == CONTAINER), "?")
        raise ImageMissing(
            f"The cluster cannot pull image {image!r} for sandbox pod {name} ({reason}: {message}). Push it to a "
            "registry the nodes can pull from (with imagePullSecrets in SANDBOX_K8S_POD_TEMPLATE if it is "
            "private), or point the language's SANDBOX_IMAGE_* variable at one."
        )
    if reason in _FATAL_REASONS:
        raise SandboxFailure(f"The sandbox pod {name} cannot start its container ({reason}: {message})")
    terminated = _object(state.get("terminated"))
    if status.get("phase") in ("Succeeded", "Failed") or terminated:
        why = status.get("message") or terminated.get("reason") or status.get("phase")
        raise SandboxFailure(f"The sandbox pod {name} ended before it could be used ({why})")
    return False


def pending_reason(pod: Json) -> str:
    """Why a pod is not running, from its container state and conditions, for error messages."""
    status = _object(pod.get("status"))
    waiting = _object(_container_state(pod).get("waiting"))
    reasons = [f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")] if waiting.get("reason") else []
    reasons += [
        f"{condition.get('reason')}: {condition.get('message', '')}".rstrip(": ")
        for condition in _objects(status.get("conditions"))
        if condition.get("status") == "False" and condition.get("reason") not in (None, "ContainersNotReady")
    ]
    if status.get("message"):
        reasons.append(str(status["message"]))
    return "; ".join(reasons) or f"phase {status.get('phase', 'unknown')}"


def items(listing: Json) -> list[Json]:
    """The objects of a list answer."""
    return _objects(listing.get("items"))


def owner_info(obj: Json) -> dict[str, str]:
    """An object's labels and annotations together: what `_owner.owner_is_gone` and the TTL check read."""
    metadata = _object(obj.get("metadata"))
    merged = {**_object(metadata.get("labels")), **_object(metadata.get("annotations"))}
    return {str(key): str(value) for key, value in merged.items()}
