"""The agent-sandbox objects (kubernetes-sigs/agent-sandbox, v1beta1) for sandboxes claimed from warm pools, as
plain JSON: the SandboxTemplate that carries our pod, its SandboxWarmPool, one SandboxClaim per sandbox, and what
a claim and a Sandbox say about the pod they got.

Pure functions, no client, as `pod` is for pods.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, cast

Json = dict[str, Any]

EXTENSIONS = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
# (group, version, plural) of each kind the server uses.
TEMPLATES = (EXTENSIONS, VERSION, "sandboxtemplates")
WARM_POOLS = (EXTENSIONS, VERSION, "sandboxwarmpools")
CLAIMS = (EXTENSIONS, VERSION, "sandboxclaims")
SANDBOXES = ("agents.x-k8s.io", VERSION, "sandboxes")
KINDS = (TEMPLATES, WARM_POOLS, CLAIMS, SANDBOXES)
# Set by the claim controller on the claim, and on a Sandbox whose pod has another name than its own.
SANDBOX_NAME_ANNOTATION = "agents.x-k8s.io/sandbox-name"
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
# A claim whose Ready condition has one of these reasons will not get a sandbox without a change of ours.
_FINAL_REASONS = ("WarmPoolNotFound", "TemplateNotFound", "InvalidMetadata", "EnvVarsInjectionRejected")


def _object(value: Any) -> Json:
    return cast(Json, value) if isinstance(value, dict) else {}


def served(kind: tuple[str, str, str], resource_list: Json) -> bool:
    """Whether an APIResourceList (discovery of the kind's group and version) names the kind's resource."""
    resources = resource_list.get("resources")
    names = [_object(item).get("name") for item in cast(list[Any], resources)] if isinstance(resources, list) else []
    return kind[2] in names


def shape(pod: Json) -> str:
    """What pods of one template share: their labels and spec (annotations carry times). 10 hex digits."""
    labels = _object(pod.get("metadata")).get("labels", {})
    text = json.dumps({"labels": labels, "spec": pod.get("spec")}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _metadata(name: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> Json:
    return {"name": name, "labels": dict(labels), "annotations": dict(annotations)}


def template_manifest(name: str, pod: Json, labels: Mapping[str, str], annotations: Mapping[str, str]) -> Json:
    """Our pod as a SandboxTemplate. `Unmanaged`: the controller makes no NetworkPolicy of its own, since the one it
    makes by default lets sandboxes reach the internet, and policies add up; our deny-all policy stays the rule."""
    pod_metadata = _object(pod.get("metadata"))
    return {
        "apiVersion": f"{EXTENSIONS}/{VERSION}",
        "kind": "SandboxTemplate",
        "metadata": _metadata(name, labels, annotations),
        "spec": {
            "podTemplate": {
                "metadata": {
                    "labels": dict(_object(pod_metadata.get("labels"))),
                    "annotations": dict(_object(pod_metadata.get("annotations"))),
                },
                "spec": pod["spec"],
            },
            "networkPolicyManagement": "Unmanaged",
        },
    }


def pool_manifest(
    name: str, template: str, replicas: int, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> Json:
    return {
        "apiVersion": f"{EXTENSIONS}/{VERSION}",
        "kind": "SandboxWarmPool",
        "metadata": _metadata(name, labels, annotations),
        "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}},
    }


def claim_manifest(name: str, pool: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> Json:
    return {
        "apiVersion": f"{EXTENSIONS}/{VERSION}",
        "kind": "SandboxClaim",
        "metadata": _metadata(name, labels, annotations),
        "spec": {"warmPoolRef": {"name": pool}},
    }


def claimed_sandbox(claim: Json) -> str | None:
    """The name of the Sandbox a claim got, once it has one."""
    named = _object(_object(claim.get("status")).get("sandbox")).get("name")
    if not named:
        named = _object(_object(claim.get("metadata")).get("annotations")).get(SANDBOX_NAME_ANNOTATION)
    return str(named) if named else None


def _ready_condition(claim: Json) -> Json:
    conditions = _object(claim.get("status")).get("conditions")
    for condition in cast(list[Any], conditions) if isinstance(conditions, list) else []:
        if _object(condition).get("type") == "Ready":
            return _object(condition)
    return {}


def claim_refused(claim: Json) -> str | None:
    """Why a claim will not get a sandbox, when its Ready condition says so for good."""
    condition = _ready_condition(claim)
    if condition.get("status") == "False" and condition.get("reason") in _FINAL_REASONS:
        return f"{condition.get('reason')}: {condition.get('message', '')}".rstrip(": ")
    return None


def claim_state(claim: Json) -> str:
    """What a claim's Ready condition says, for error messages."""
    condition = _ready_condition(claim)
    if not condition:
        return "the controller has not reported on it (is the agent-sandbox controller running?)"
    return f"Ready={condition.get('status')} {condition.get('reason', '')}: {condition.get('message', '')}".rstrip(": ")


def pod_of(sandbox: Json) -> str:
    """The name of a Sandbox's pod: its own name, unless the controller tracks another one."""
    metadata = _object(sandbox.get("metadata"))
    return str(_object(metadata.get("annotations")).get(POD_NAME_ANNOTATION) or metadata.get("name"))
