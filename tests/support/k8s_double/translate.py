"""Pod spec -> Docker `containers.create` arguments: what the kubelet would ask its runtime for.

Pure functions; `ContainerConfigError` is the kubelet's `CreateContainerConfigError` (the pod stays
Pending with that waiting reason). Effective security context: the container's field wins over the
pod's, as in `securitycontext.DetermineEffectiveSecurityContext`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from docker.types import Mount

from .objects import JsonObj, as_list, as_obj
from .quantity import to_bytes, to_millicores, to_nano_cpus
from .selectors import matches_labels


class ContainerConfigError(Exception):
    """The kubelet refuses to create the container; `str()` is its message."""


@dataclass(frozen=True)
class VolumeBacking:
    """Where a pod volume lives: a tmpfs (an emptyDir of medium Memory), a host directory (an emptyDir on the
    node's disk: its sizeLimit is no quota; the runtime evicts the pod when it finds it past, as a kubelet), or
    the Docker named volume of a claim."""

    kind: Literal["tmpfs", "disk", "volume"]
    size_bytes: int | None = None
    docker_volume: str = ""
    host_path: str = ""
    read_only: bool = False


@dataclass(frozen=True)
class RuntimeOptions:
    """Node-level kubelet settings the translation depends on."""

    seccomp_root: Path | None = None  # the node's seccomp directory (<kubelet root>/seccomp) for Localhost profiles
    pids_limit: int | None = None  # kubelet --pod-max-pids


def effective_security_context(pod: JsonObj, container: JsonObj) -> JsonObj:
    pod_context = as_obj(as_obj(pod.get("spec")).get("securityContext"))
    merged: JsonObj = {
        k: pod_context[k]
        for k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile", "seLinuxOptions", "appArmorProfile")
        if k in pod_context
    }
    merged.update(as_obj(container.get("securityContext")))
    return merged


def parse_image_user(user: str) -> tuple[int | None, str]:
    """(uid, username) of an image's `USER`, as the CRI reports it: numeric uid, else the name."""
    name = user.split(":", 1)[0]
    if not name:
        return None, ""
    return (int(name), "") if name.isdigit() else (None, name)


def pod_hostname(pod: JsonObj) -> str:
    return str(as_obj(pod.get("metadata")).get("name"))[:63]


def pod_ref(pod: JsonObj) -> str:
    metadata = as_obj(pod.get("metadata"))
    return f"{metadata.get('name')}_{metadata.get('namespace')}({metadata.get('uid')})"


def verify_run_as_non_root(pod: JsonObj, container: JsonObj, image_user: str) -> None:
    """The kubelet's `verifyRunAsNonRoot`, with its messages.

    Raises:
        ContainerConfigError: the container would run as root, or that cannot be verified.
    """
    context = effective_security_context(pod, container)
    if not context.get("runAsNonRoot"):
        return
    where = f'(pod: "{pod_ref(pod)}", container: {container.get("name")})'
    run_as_user = context.get("runAsUser")
    if run_as_user is not None:
        if run_as_user == 0:
            raise ContainerConfigError(f"container's runAsUser breaks non-root policy {where}")
        return
    uid, username = parse_image_user(image_user)
    if uid is None and username:
        raise ContainerConfigError(
            f"container has runAsNonRoot and image has non-numeric user ({username}), "
            f"cannot verify user is non-root {where}"
        )
    if uid is None or uid == 0:
        raise ContainerConfigError(f"container has runAsNonRoot and image will run as root {where}")


def container_env(container: JsonObj, image_env: Sequence[str]) -> dict[str, str]:
    """The container's environment: the image's, then `env` in order.

    Raises:
        ContainerConfigError: `valueFrom` / `envFrom`, which the double cannot resolve.
    """
    env: dict[str, str] = {}
    for item in image_env:
        key, _, value = item.partition("=")
        env[key] = value
    if container.get("envFrom"):
        raise ContainerConfigError("envFrom is not supported by the k8s test double")
    for item in as_list(container.get("env")):
        entry = as_obj(item)
        if entry.get("valueFrom") is not None:
            raise ContainerConfigError(f"env {entry.get('name')}: valueFrom is not supported by the k8s test double")
        env[str(entry["name"])] = str(entry.get("value") or "")
    return env


def _no_references(container: JsonObj) -> None:
    """The kubelet expands `$(VAR)` in command, args and env values; the double does not, so it refuses them.

    Raises:
        ContainerConfigError: some value holds a `$(` reference.
    """
    values = [*as_list(container.get("command")), *as_list(container.get("args"))]
    values += [as_obj(entry).get("value") for entry in as_list(container.get("env"))]
    if any("$(" in str(value) for value in values if value is not None):
        raise ContainerConfigError("$(VAR) references are not expanded by the k8s test double")


def _user(context: JsonObj, image_user: str) -> str | None:
    uid, gid = context.get("runAsUser"), context.get("runAsGroup")
    if uid is None and gid is None:
        return None
    user = str(uid) if uid is not None else (image_user.split(":", 1)[0] or "0")
    return f"{user}:{gid}" if gid is not None else user


def _seccomp(context: JsonObj, options: RuntimeOptions) -> list[str]:
    """The kubelet's default (no `--seccomp-default`): an unset profile is Unconfined, not the runtime's."""
    if context.get("privileged"):
        return []
    profile = as_obj(context.get("seccompProfile"))
    profile_type = profile.get("type")
    if profile_type == "Localhost":
        return [f"seccomp={_localhost_profile(str(profile.get('localhostProfile') or ''), options)}"]
    return [] if profile_type == "RuntimeDefault" else ["seccomp=unconfined"]


def _localhost_profile(relative: str, options: RuntimeOptions) -> str:
    """The profile a node would load: `localhostProfile` under its seccomp directory, read as the runtime does.

    Raises:
        ContainerConfigError: no seccomp directory on this node, a path leaving it, or no such file.
    """
    if options.seccomp_root is None:
        raise ContainerConfigError("Localhost seccomp profiles need a node seccomp directory (seccomp_root)")
    path = PurePosixPath(relative)
    if path.is_absolute() or ".." in path.parts or not path.parts:
        raise ContainerConfigError(f"invalid localhostProfile {relative!r}: must be a path under the seccomp root")
    file = options.seccomp_root / path
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ContainerConfigError(f'cannot load seccomp profile "{file}": {exc.strerror}') from exc


def _resources(container: JsonObj, options: RuntimeOptions) -> dict[str, Any]:
    resources = as_obj(container.get("resources"))
    limits, requests = as_obj(resources.get("limits")), as_obj(resources.get("requests"))
    kwargs: dict[str, Any] = {}
    if "memory" in limits:
        kwargs["mem_limit"] = kwargs["memswap_limit"] = to_bytes(limits["memory"])
    if "cpu" in limits:
        kwargs["nano_cpus"] = to_nano_cpus(limits["cpu"])
    if "cpu" in requests:
        kwargs["cpu_shares"] = max(2, to_millicores(requests["cpu"]) * 1024 // 1000)
    if options.pids_limit is not None:
        kwargs["pids_limit"] = options.pids_limit
    return kwargs


def _mounts(container: JsonObj, backings: Mapping[str, VolumeBacking]) -> dict[str, Any]:
    mounts: list[Mount] = []
    tmpfs: dict[str, str] = {}
    for item in as_list(container.get("volumeMounts")):
        mount = as_obj(item)
        if mount.get("subPath") or mount.get("subPathExpr"):
            raise ContainerConfigError("volumeMounts[].subPath is not supported by the k8s test double")
        backing = backings[str(mount["name"])]  # validation allows only the volumes the kubelet backs
        read_only = bool(mount.get("readOnly")) or backing.read_only
        target = str(mount["mountPath"])
        if backing.kind == "tmpfs":
            opts = ([f"size={backing.size_bytes}"] if backing.size_bytes else []) + ["mode=1777", "exec"]
            tmpfs[target] = ",".join(opts + (["ro"] if read_only else []))
        elif backing.kind == "disk":
            mounts.append(Mount(target, backing.host_path, type="bind", read_only=read_only))
        else:
            mounts.append(Mount(target, backing.docker_volume, type="volume", read_only=read_only))
    return {"mounts": mounts, "tmpfs": tmpfs}


@dataclass(frozen=True)
class ContainerPlan:
    image: str
    kwargs: dict[str, Any]


def plan_container(
    pod: JsonObj,
    container: JsonObj,
    *,
    name: str,
    image_config: Mapping[str, Any],
    backings: Mapping[str, VolumeBacking],
    network_mode: str,
    labels: Mapping[str, str],
    options: RuntimeOptions,
) -> ContainerPlan:
    """Docker create arguments for one pod container.

    Raises:
        ContainerConfigError: what the kubelet reports as `CreateContainerConfigError`.
    """
    spec = as_obj(pod.get("spec"))
    image_user = str(image_config.get("User") or "")
    verify_run_as_non_root(pod, container, image_user)
    _no_references(container)
    context = effective_security_context(pod, container)
    env = container_env(container, as_list(image_config.get("Env")))
    command = [str(c) for c in as_list(container.get("command"))]
    args = [str(a) for a in as_list(container.get("args"))]
    pod_context = as_obj(spec.get("securityContext"))
    groups = [str(g) for g in as_list(pod_context.get("supplementalGroups"))]
    if pod_context.get("fsGroup") is not None:
        groups.append(str(pod_context["fsGroup"]))
    capabilities = as_obj(context.get("capabilities"))
    security_opt = _seccomp(context, options)
    if context.get("allowPrivilegeEscalation") is False:
        security_opt.append("no-new-privileges:true")
    kwargs: dict[str, Any] = {
        "name": name,
        "detach": True,
        "labels": dict(labels),
        "network_mode": network_mode,
        "environment": env,
        "read_only": bool(context.get("readOnlyRootFilesystem")),
        "privileged": bool(context.get("privileged")),
        "cap_add": [str(c) for c in as_list(capabilities.get("add"))] or None,
        "cap_drop": [str(c) for c in as_list(capabilities.get("drop"))] or None,
        "security_opt": security_opt or None,
        "group_add": groups or None,
        **_resources(container, options),
        **_mounts(container, backings),
    }
    if command:
        kwargs["entrypoint"] = command
        kwargs["command"] = args
    elif args:
        kwargs["command"] = args
    if not network_mode.startswith("container:"):  # in a pod sandbox's namespace, the sandbox has the hostname
        kwargs["hostname"] = pod_hostname(pod)
    user = _user(context, image_user)
    if user is not None:
        kwargs["user"] = user
    if container.get("workingDir"):
        kwargs["working_dir"] = str(container["workingDir"])
    return ContainerPlan(str(container["image"]), kwargs)


def egress_denied(pod_labels: Mapping[str, str], policies: Sequence[JsonObj]) -> bool:
    """True when a policy selects the pod for Egress (validation admits only policies without rules)."""
    specs = [as_obj(policy.get("spec")) for policy in policies]
    return any(
        "Egress" in as_list(spec.get("policyTypes"))
        and matches_labels(as_obj(as_obj(spec.get("podSelector")).get("matchLabels")), pod_labels)
        for spec in specs
    )
