"""The `restricted` Pod Security Standard, as its published checks define it, applied to one pod manifest.

What a namespace labelled `pod-security.kubernetes.io/enforce: restricted` admits (the baseline checks and the
restricted ones); each violation is named as the admission controller names its check. Kept to what a pod of
one container without init or ephemeral containers can carry.
"""

from __future__ import annotations

from typing import Any, cast

Json = dict[str, Any]

_VOLUME_TYPES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def _obj(value: Any) -> Json:
    return cast(Json, value) if isinstance(value, dict) else {}


def _list(value: Any) -> list[Json]:
    return [_obj(item) for item in cast(list[Any], value)] if isinstance(value, list) else []


def violations(pod: Json) -> list[str]:
    """The checks the pod fails, empty when the restricted profile admits it."""
    spec = _obj(pod.get("spec"))
    pod_context = _obj(spec.get("securityContext"))
    containers = [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]
    found: list[str] = []
    if any(spec.get(key) for key in ("hostNetwork", "hostPID", "hostIPC")):
        found.append("host namespaces")
    for container in containers:
        context = _obj(container.get("securityContext"))
        name = container.get("name", "?")
        if context.get("privileged"):
            found.append(f"privileged ({name})")
        capabilities = _obj(context.get("capabilities"))
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"capabilities added ({name})")
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"capabilities not dropped to ALL ({name})")
        if any(port.get("hostPort") for port in _list(container.get("ports"))):
            found.append(f"hostPort ({name})")
        if context.get("procMount", "Default") != "Default":
            found.append(f"procMount ({name})")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"allowPrivilegeEscalation != false ({name})")
        if context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is not True:
            found.append(f"runAsNonRoot != true ({name})")
        if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
            found.append(f"runAsUser=0 ({name})")
        seccomp = _obj(context.get("seccompProfile") or pod_context.get("seccompProfile")).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"seccompProfile ({name})")
        if _obj(context.get("appArmorProfile")).get("type") == "Unconfined":
            found.append(f"appArmorProfile ({name})")
        if _obj(context.get("seLinuxOptions")).get("type", "") not in _SELINUX_TYPES:
            found.append(f"seLinuxOptions ({name})")
    if _obj(pod_context.get("seccompProfile")).get("type") == "Unconfined":
        found.append("seccompProfile (pod)")
    for volume in _list(spec.get("volumes")):
        kinds = set(volume) - {"name"}
        if kinds - _VOLUME_TYPES:
            found.append(f"restricted volume types ({volume.get('name')})")
    sysctls = _list(pod_context.get("sysctls"))
    found.extend(f"sysctls ({s.get('name')})" for s in sysctls if s.get("name") not in _SAFE_SYSCTLS)
    return found
