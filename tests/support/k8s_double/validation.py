"""Defaulting and validation of posted objects, with the API server's field paths and messages.

Only the rules a sandbox backend can trip over are implemented: names, labels, the pod fields the
double runs, quantities, and the security-context combinations the API server rejects. Valid fields the
double does not run (`generateName`, init containers, volume types other than
emptyDir and persistentVolumeClaim, container `stdin`/`tty`, network policy rules and `matchExpressions`)
are refused as 422 Forbidden, never ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from .errors import ApiError, FieldError, bad_request, invalid
from .objects import JsonObj, as_list, as_obj
from .quantity import QuantityError, parse_quantity
from .store import NETWORK_POLICIES, PERSISTENT_VOLUME_CLAIMS, PODS, Resource

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = rf"{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*"
_LABEL_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must "
    "start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    f"'{_DNS1123_SUBDOMAIN}')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and "
    "end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    f"'{_DNS1123_LABEL}')"
)
SUPPORTED_VOLUMES = ("emptyDir", "persistentVolumeClaim")
UNSUPPORTED = "not supported by the k8s test double"
# Valid Kubernetes the double does not run, refused rather than ignored (the backend sends none of them).
_UNSERVED_POD_FIELDS = ("initContainers",)
_UNSERVED_CONTAINER_FIELDS = ("stdin", "tty")


def is_dns1123_label(value: str) -> bool:
    return len(value) <= 63 and re.fullmatch(_DNS1123_LABEL, value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    return len(value) <= 253 and re.fullmatch(_DNS1123_SUBDOMAIN, value) is not None


def check_namespace_name(namespace: str) -> None:
    """Raises: ApiError 404, as the API server answers for an impossible namespace in a URL."""
    if not is_dns1123_label(namespace):
        raise ApiError(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": f'namespaces "{namespace}" not found',
                "reason": "NotFound",
                "details": {"name": namespace, "kind": "namespaces"},
                "code": 404,
            }
        )


def prepare_metadata(resource: Resource, namespace: str, obj: Any) -> JsonObj:
    """Check kind/namespace, validate name and labels.

    Raises:
        ApiError: 400 for a body that is not this resource, 422 for invalid metadata.
    """
    if not isinstance(obj, dict):
        raise bad_request(
            "the body of the request was in an unknown format - accepted media types include: application/json"
        )
    body = as_obj(obj)
    kind = body.get("kind")
    if kind is not None and kind != resource.kind:
        raise bad_request(f'the kind "{kind}" of the provided object does not match the expected "{resource.kind}"')
    meta = body["metadata"] = as_obj(body.get("metadata"))
    if meta.get("namespace") not in (None, "", namespace):
        raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
    name = str(meta.get("name") or "")
    errors: list[FieldError] = []
    if meta.get("generateName"):
        errors.append(FieldError.forbidden("metadata.generateName", UNSUPPORTED))
    elif not name:
        errors.append(FieldError.required("metadata.name", "name or generateName is required"))
    elif not is_dns1123_subdomain(name):
        errors.append(FieldError.invalid("metadata.name", name, SUBDOMAIN_MESSAGE))
    errors += _label_errors(meta.get("labels"), "metadata.labels")
    if errors:
        raise invalid(resource.kind, name, errors, resource.group)
    return body


def _label_errors(labels: Any, path: str) -> list[FieldError]:
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return [FieldError.invalid(path, str(labels), "must be a map of string keys and values")]
    errors: list[FieldError] = []
    for key, value in as_obj(labels).items():
        value = str(value)
        prefix, _, name = key.rpartition("/")
        if (prefix and not is_dns1123_subdomain(prefix)) or len(name) > 63 or not re.fullmatch(_LABEL_NAME, name):
            errors.append(
                FieldError.invalid(
                    path,
                    key,
                    "name part must consist of alphanumeric characters, "
                    "'-', '_' or '.', and must start and end with an alphanumeric character",
                )
            )
        if len(value) > 63 or not re.fullmatch(f"({_LABEL_NAME})?", value):
            errors.append(
                FieldError.invalid(
                    f"{path}",
                    value,
                    "a valid label must be an empty string or consist of "
                    "alphanumeric characters, '-', '_' or '.', and must start and end with "
                    "an alphanumeric character",
                )
            )
    return errors


def _quantity_errors(resources: JsonObj, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    parsed: dict[str, dict[str, Fraction]] = {"limits": {}, "requests": {}}
    for section in ("limits", "requests"):
        for name, value in as_obj(resources.get(section)).items():
            field = f"{path}.{section}[{name}]"
            try:
                amount = parse_quantity(value)
            except QuantityError as exc:
                errors.append(FieldError.invalid(field, value, str(exc)))
                continue
            if amount < 0:
                errors.append(FieldError.invalid(field, value, "must be greater than or equal to 0"))
            parsed[section][name] = amount
    for name, request in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if limit is not None and request > limit:
            value = resources["requests"][name]
            errors.append(
                FieldError.invalid(
                    f"{path}.requests",
                    value,
                    f"must be less than or equal to {name} limit of {resources['limits'][name]}",
                )
            )
    return errors


def default_pod(pod: JsonObj) -> JsonObj:
    """Apply the API server's defaults for the fields the double acts on or reports back."""
    spec = pod["spec"] = as_obj(pod.get("spec"))
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("securityContext", {})
    for container in map(as_obj, as_list(spec.get("containers"))):
        image = str(container.get("image") or "")
        tag = image.rsplit("/", 1)[-1]
        untagged = ":" not in tag and "@" not in image
        container.setdefault("imagePullPolicy", "Always" if untagged or tag.endswith(":latest") else "IfNotPresent")
        resources = container["resources"] = as_obj(container.get("resources"))
        limits = as_obj(resources.get("limits"))
        if limits:
            requests = resources["requests"] = as_obj(resources.get("requests"))
            for name, value in limits.items():
                requests.setdefault(name, value)
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(spec)}
    return pod


def qos_class(spec: JsonObj) -> str:
    requests_any = False
    guaranteed = True
    for container in map(as_obj, as_list(spec.get("containers"))):
        resources = as_obj(container.get("resources"))
        limits, requests = as_obj(resources.get("limits")), as_obj(resources.get("requests"))
        requests_any = requests_any or bool(limits) or bool(requests)
        for name in ("cpu", "memory"):
            if name not in limits or str(requests.get(name, limits[name])) != str(limits[name]):
                guaranteed = False
    if not requests_any:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def validate_pod(pod: JsonObj) -> None:
    """Raises: ApiError 422 Invalid listing every broken field."""
    errors = _pod_errors(as_obj(pod.get("spec")))
    if errors:
        raise invalid(PODS.kind, pod["metadata"]["name"], errors)


def _pod_errors(spec: JsonObj) -> list[FieldError]:
    errors: list[FieldError] = []
    containers = as_list(spec.get("containers"))
    if not containers:
        errors.append(FieldError.required("spec.containers"))
    elif len(containers) > 1:
        errors.append(FieldError.forbidden("spec.containers", "the k8s test double runs exactly one container per pod"))
    errors += [FieldError.forbidden(f"spec.{name}", UNSUPPORTED) for name in _UNSERVED_POD_FIELDS if name in spec]
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (type(deadline) is not int or deadline <= 0):
        errors.append(FieldError.invalid("spec.activeDeadlineSeconds", deadline, "must be greater than 0"))
    if "hostUsers" in spec and type(spec["hostUsers"]) is not bool:
        errors.append(FieldError.invalid("spec.hostUsers", spec["hostUsers"], "must be a boolean"))
    if spec.get("restartPolicy") not in ("Always", "OnFailure", "Never"):
        errors.append(
            FieldError.unsupported(
                "spec.restartPolicy", str(spec.get("restartPolicy")), ["Always", "OnFailure", "Never"]
            )
        )
    volumes: dict[str, JsonObj] = {}
    for i, volume in enumerate(as_list(spec.get("volumes"))):
        errors += _volume_errors(as_obj(volume), f"spec.volumes[{i}]", volumes)
    errors += _security_context_errors(as_obj(spec.get("securityContext")), "spec.securityContext", pod_level=True)
    names: set[str] = set()
    for i, container in enumerate(containers):
        errors += _container_errors(as_obj(container), f"spec.containers[{i}]", names, volumes)
    return errors


def _volume_errors(volume: JsonObj, path: str, seen: dict[str, JsonObj]) -> list[FieldError]:
    errors: list[FieldError] = []
    name = str(volume.get("name") or "")
    if not name:
        errors.append(FieldError.required(f"{path}.name"))
    elif not is_dns1123_label(name):
        errors.append(FieldError.invalid(f"{path}.name", name, LABEL_MESSAGE))
    elif name in seen:
        errors.append(FieldError.duplicate(f"{path}.name", name))
    else:
        seen[name] = volume
    sources = [key for key in volume if key != "name"]
    if not sources:
        errors.append(FieldError.required(path, "must specify a volume type"))
    elif len(sources) > 1:
        errors.append(FieldError.forbidden(f"{path}.{sources[1]}", "may not specify more than 1 volume type"))
    elif sources[0] not in SUPPORTED_VOLUMES:
        errors.append(FieldError.forbidden(f"{path}.{sources[0]}", UNSUPPORTED))
    if "persistentVolumeClaim" in volume and not as_obj(volume["persistentVolumeClaim"]).get("claimName"):
        errors.append(FieldError.required(f"{path}.persistentVolumeClaim.claimName"))
    empty_dir = as_obj(volume.get("emptyDir"))
    if empty_dir.get("sizeLimit") is not None:
        try:
            parse_quantity(empty_dir["sizeLimit"])
        except QuantityError as exc:
            errors.append(FieldError.invalid(f"{path}.emptyDir.sizeLimit", empty_dir["sizeLimit"], str(exc)))
    return errors


def _security_context_errors(context: JsonObj, path: str, *, pod_level: bool) -> list[FieldError]:
    errors: list[FieldError] = []
    for field in ("runAsUser", "runAsGroup") + (("fsGroup",) if pod_level else ()):
        value = context.get(field)
        if value is not None and (not isinstance(value, int) or not 0 <= value <= 2147483647):
            errors.append(FieldError.invalid(f"{path}.{field}", value, "must be between 0 and 2147483647, inclusive"))
    seccomp = as_obj(context.get("seccompProfile"))
    if "seccompProfile" in context:
        profile_type = seccomp.get("type")
        if profile_type not in ("RuntimeDefault", "Unconfined", "Localhost"):
            errors.append(
                FieldError.unsupported(
                    f"{path}.seccompProfile.type", str(profile_type), ["Localhost", "RuntimeDefault", "Unconfined"]
                )
            )
        elif profile_type == "Localhost" and not seccomp.get("localhostProfile"):
            errors.append(
                FieldError.required(
                    f"{path}.seccompProfile.localhostProfile", "must be set when seccomp type is Localhost"
                )
            )
    if not pod_level and context.get("allowPrivilegeEscalation") is False:
        if context.get("privileged"):
            errors.append(
                FieldError.invalid(path, "", "cannot set `allowPrivilegeEscalation` to false and `privileged` to true")
            )
        added = {str(c).upper().removeprefix("CAP_") for c in as_list(as_obj(context.get("capabilities")).get("add"))}
        if "SYS_ADMIN" in added:
            errors.append(
                FieldError.invalid(
                    path, "", "cannot set `allowPrivilegeEscalation` to false and `capabilities.Add` CAP_SYS_ADMIN"
                )
            )
    return errors


def _container_errors(
    container: JsonObj, path: str, names: set[str], volumes: Mapping[str, JsonObj]
) -> list[FieldError]:
    errors: list[FieldError] = []
    name = str(container.get("name") or "")
    if not name:
        errors.append(FieldError.required(f"{path}.name"))
    elif not is_dns1123_label(name):
        errors.append(FieldError.invalid(f"{path}.name", name, LABEL_MESSAGE))
    elif name in names:
        errors.append(FieldError.duplicate(f"{path}.name", name))
    names.add(name)
    errors += [FieldError.forbidden(f"{path}.{f}", UNSUPPORTED) for f in _UNSERVED_CONTAINER_FIELDS if container.get(f)]
    image = container.get("image")
    if not image:
        errors.append(FieldError.required(f"{path}.image"))
    elif image != image.strip():
        errors.append(FieldError.invalid(f"{path}.image", image, "must not have leading or trailing whitespace"))
    for field in ("command", "args"):
        shown = str(container.get(field))
        value = container.get(field)
        strings = isinstance(value, list) and all(isinstance(v, str) for v in as_list(value))
        if value is not None and not strings:
            errors.append(FieldError.invalid(f"{path}.{field}", shown, "must be a list of strings"))
    for i, env in enumerate(as_list(container.get("env"))):
        if not as_obj(env).get("name"):
            errors.append(FieldError.required(f"{path}.env[{i}].name"))
    mount_paths: set[str] = set()
    for i, item in enumerate(as_list(container.get("volumeMounts"))):
        mount = as_obj(item)
        mount_name, mount_path = str(mount.get("name") or ""), str(mount.get("mountPath") or "")
        if not mount_name:
            errors.append(FieldError.required(f"{path}.volumeMounts[{i}].name"))
        elif mount_name not in volumes:
            errors.append(FieldError.not_found(f"{path}.volumeMounts[{i}].name", mount_name))
        if not mount_path:
            errors.append(FieldError.required(f"{path}.volumeMounts[{i}].mountPath"))
        elif mount_path in mount_paths:
            errors.append(FieldError.invalid(f"{path}.volumeMounts[{i}].mountPath", mount_path, "must be unique"))
        mount_paths.add(mount_path)
    errors += _quantity_errors(as_obj(container.get("resources")), f"{path}.resources")
    errors += _security_context_errors(
        as_obj(container.get("securityContext")), f"{path}.securityContext", pod_level=False
    )
    return errors


def validate_pvc(pvc: JsonObj) -> None:
    """Raises: ApiError 422 Invalid (access modes and a storage request are required)."""
    spec = as_obj(pvc.get("spec"))
    errors: list[FieldError] = []
    modes = [str(m) for m in as_list(spec.get("accessModes"))]
    supported = ["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"]
    if not modes:
        errors.append(FieldError.required("spec.accessModes", "at least 1 access mode is required"))
    errors += [FieldError.unsupported("spec.accessModes", m, supported) for m in modes if m not in supported]
    storage = as_obj(as_obj(spec.get("resources")).get("requests")).get("storage")
    if storage is None:
        errors.append(FieldError.required("spec.resources[storage]"))
    else:
        try:
            if parse_quantity(storage) <= 0:
                errors.append(
                    FieldError.invalid("spec.resources.requests[storage]", storage, "must be greater than zero")
                )
        except QuantityError as exc:
            errors.append(FieldError.invalid("spec.resources.requests[storage]", storage, str(exc)))
    if errors:
        raise invalid(PERSISTENT_VOLUME_CLAIMS.kind, pvc["metadata"]["name"], errors)


def validate_network_policy(policy: JsonObj) -> None:
    """Default `podSelector` and `policyTypes` as the API server does.

    Raises:
        ApiError: 422 Invalid for rules and `matchExpressions`, which the double cannot enforce: it gives a pod
            that a policy selects for Egress no network at all, and every other pod the host network.
    """
    spec = policy["spec"] = as_obj(policy.get("spec"))
    selector = spec.setdefault("podSelector", {})
    spec["policyTypes"] = spec.get("policyTypes") or ["Ingress"]
    errors = [FieldError.forbidden(f"spec.{rules}", UNSUPPORTED) for rules in ("ingress", "egress") if spec.get(rules)]
    if as_obj(selector).get("matchExpressions"):
        errors.append(FieldError.forbidden("spec.podSelector.matchExpressions", UNSUPPORTED))
    if errors:
        raise invalid(NETWORK_POLICIES.kind, policy["metadata"]["name"], errors, NETWORK_POLICIES.group)
