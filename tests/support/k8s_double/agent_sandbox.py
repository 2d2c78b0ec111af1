"""What the agent-sandbox CRDs and their controllers do, for a double made with `agent_sandbox=True`.

From the published definitions of kubernetes-sigs/agent-sandbox at commit
2fd412d55ecae90861a101a5424a75473de97c36: the CRDs in `k8s/crds/`, their types in `api/v1beta1/sandbox_types.go`
and `extensions/api/v1beta1/sandbox{template,warmpool,claim}_types.go`, and what the controllers in
`extensions/controllers/` and `controllers/sandbox_controller.go` do with them. Only the storage version,
v1beta1, is served:

- `SandboxTemplate` (extensions.agents.x-k8s.io): `spec.podTemplate` (`metadata.labels/annotations`, `spec`).
- `SandboxWarmPool`: `spec.sandboxTemplateRef.name`, `spec.replicas` (default 1, minimum 0). The pool keeps that
  many `Sandbox`es made from the template, named `<pool>-<5 random characters>`, controlled by the pool
  (`ownerReferences`) and labelled `agents.x-k8s.io/warm-pool-sandbox`; `status.replicas`, `readyReplicas` and
  `selector` say what it holds. One claimed leaves the pool, which makes another.
- `SandboxClaim`: `spec.warmPoolRef.name`. The claim adopts a sandbox of the pool, a ready one first, else one
  still starting (the sandbox's controller becomes the claim, its pool label goes), or, when the pool has none,
  makes one named as the claim from the pool's template (a cold start). Its sandbox's name is in
  `status.sandbox.name` and in the annotation `agents.x-k8s.io/sandbox-name`; its `Ready` condition mirrors the
  sandbox's (`DependenciesReady` / `DependenciesNotReady`; `WarmPoolNotFound`, `TemplateNotFound` when those are
  missing).
- `Sandbox` (agents.x-k8s.io): `spec.podTemplate`; its pod has its name (annotation `agents.x-k8s.io/pod-name`)
  and is controlled by it; `Ready` is True once the pod runs and is ready. A template's pod spec without
  `automountServiceAccountToken` gets `false`, as the controller defaults it.
- Deletion cascades as the garbage collector does it: an object whose controller is gone is deleted, so deleting a
  claim deletes its sandbox and that sandbox's pod, and deleting a pool its unclaimed sandboxes.

How the double differs from the real controllers: pods have no IP, so a sandbox is Ready without one (the real
one waits for `podIPs`); a sandbox's deleted pod is not made again; no NetworkPolicy is made for a template (as
`networkPolicyManagement: Unmanaged` asks; `Managed`, the default, is stored without effect); `env`,
`volumeClaimTemplates`, `lifecycle`, `additionalPodMetadata`, `updateStrategy`, suspension and the
v1alpha1 versions are not served or have no effect; status is written by the double at once, where the
controllers reconcile within moments.
"""

from __future__ import annotations

import asyncio
import copy
import secrets
from collections.abc import Callable
from typing import Any

from .errors import ApiError, FieldError, invalid
from .objects import JsonObj, as_list, as_obj
from .store import PODS, Event, Resource, Store, now_rfc3339
from .validation import default_pod, validate_pod

EXTENSIONS = "extensions.agents.x-k8s.io"
CORE = "agents.x-k8s.io"
VERSION = "v1beta1"
TEMPLATES = Resource("sandboxtemplates", "SandboxTemplate", group=EXTENSIONS, version=VERSION)
WARM_POOLS = Resource("sandboxwarmpools", "SandboxWarmPool", group=EXTENSIONS, version=VERSION)
CLAIMS = Resource("sandboxclaims", "SandboxClaim", group=EXTENSIONS, version=VERSION)
SANDBOXES = Resource("sandboxes", "Sandbox", group=CORE, version=VERSION)
RESOURCES = (TEMPLATES, WARM_POOLS, CLAIMS, SANDBOXES)
# The short names the CRDs declare, for discovery.
_SHORT_NAMES = {TEMPLATES: "sandboxtemplate", WARM_POOLS: "swp", CLAIMS: "sandboxclaim", SANDBOXES: "sandbox"}

WARM_POOL_LABEL = "agents.x-k8s.io/warm-pool-sandbox"
LAUNCH_TYPE_LABEL = "agents.x-k8s.io/launch-type"
CLAIM_UID_LABEL = "agents.x-k8s.io/claim-uid"
SANDBOX_NAME_ANNOTATION = "agents.x-k8s.io/sandbox-name"
POD_NAME_ANNOTATION = "agents.x-k8s.io/pod-name"
TEMPLATE_REF_ANNOTATION = "agents.x-k8s.io/sandbox-template-ref"
# The characters the API server's generateName draws its suffix from.
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"


def api_resources(group: str) -> list[JsonObj]:
    """The APIResourceList entries of one group, as discovery says them."""
    verbs = ["delete", "deletecollection", "get", "list", "patch", "create", "update", "watch"]
    found: list[JsonObj] = []
    for resource in RESOURCES:
        if resource.group != group:
            continue
        found.append(
            {
                "name": resource.plural,
                "singularName": resource.kind.lower(),
                "namespaced": True,
                "kind": resource.kind,
                "verbs": verbs,
                "shortNames": [_SHORT_NAMES[resource]],
                "storageVersionHash": "",
            }
        )
        if resource is not TEMPLATES:
            status = {"name": f"{resource.plural}/status", "singularName": "", "kind": resource.kind}
            found.append({**status, "namespaced": True, "verbs": ["get", "patch", "update"]})
    return found


def validate(resource: Resource, obj: JsonObj) -> None:
    """The CRDs' schema where the controllers depend on it. Raises: ApiError 422 Invalid."""
    spec = obj.get("spec")
    errors: list[FieldError] = []
    if not isinstance(spec, dict):
        errors.append(FieldError.required("spec", ""))
    elif resource is TEMPLATES or resource is SANDBOXES:
        if not isinstance(as_obj(as_obj(spec).get("podTemplate")).get("spec"), dict):
            errors.append(FieldError.required("spec.podTemplate.spec", ""))
    elif resource is WARM_POOLS:
        pool = as_obj(spec)
        if not as_obj(pool.get("sandboxTemplateRef")).get("name"):
            errors.append(FieldError.required("spec.sandboxTemplateRef.name", ""))
        replicas = pool.setdefault("replicas", 1)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            errors.append(FieldError.invalid("spec.replicas", replicas, "should be greater than or equal to 0"))
    elif not as_obj(as_obj(spec).get("warmPoolRef")).get("name"):
        errors.append(FieldError.required("spec.warmPoolRef.name", ""))
    if errors:
        raise invalid(resource.kind, str(obj["metadata"]["name"]), errors, resource.group)


def _controller_ref(owner: JsonObj) -> JsonObj:
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _controller_uid(obj: JsonObj) -> str | None:
    for reference in map(as_obj, as_list(obj["metadata"].get("ownerReferences"))):
        if reference.get("controller"):
            return str(reference.get("uid"))
    return None


def _condition(ready: bool, reason: str, message: str = "") -> JsonObj:
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now_rfc3339(),
        "observedGeneration": 1,
    }


def _same_condition(old: JsonObj, new: JsonObj) -> bool:
    keep = ("type", "status", "reason", "message")
    return [old.get(key) for key in keep] == [new.get(key) for key in keep]


class SandboxController:
    """The sandbox, warm pool and claim controllers and the garbage collector, for one double.

    Runs on the double's event loop: every change of an object it cares for schedules one pass over its namespace,
    and a pass writes only what changed, so passes stop once the namespace agrees with its specs.
    """

    def __init__(self, store: Store, start_pod: Callable[[JsonObj], None], delete_pod: Callable[[JsonObj], Any]):
        self._store = store
        self._start_pod = start_pod
        self._delete_pod = delete_pod
        self._pending: set[str] = set()
        store.listeners.append(self._changed)

    def _changed(self, event: Event) -> None:
        if (event.resource in RESOURCES or event.resource is PODS) and event.namespace not in self._pending:
            self._pending.add(event.namespace)
            asyncio.get_running_loop().call_soon(self._pass, event.namespace)

    def _pass(self, namespace: str) -> None:
        self._pending.discard(namespace)
        self._collect_garbage(namespace)
        self._sandboxes(namespace)
        self._pools(namespace)
        self._claims(namespace)

    # ---- the garbage collector ------------------------------------------------------------------

    def _collect_garbage(self, namespace: str) -> None:
        uids = {obj["metadata"]["uid"] for resource in RESOURCES for obj in self._store.list(resource, namespace)}
        for resource in (SANDBOXES, PODS):
            for obj in self._store.list(resource, namespace):
                owner = _controller_uid(obj)
                if owner is None or owner in uids:
                    continue
                if resource is PODS:
                    self._delete_pod(obj)
                else:
                    self._store.delete(resource, namespace, obj["metadata"]["name"])

    # ---- sandboxes ------------------------------------------------------------------------------

    def _make_sandbox(self, namespace: str, name: str, template: JsonObj, owner: JsonObj, labels: JsonObj) -> None:
        pod_template = copy.deepcopy(as_obj(template["spec"].get("podTemplate")))
        sandbox: JsonObj = {
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {TEMPLATE_REF_ANNOTATION: template["metadata"]["name"]},
                "ownerReferences": [_controller_ref(owner)],
            },
            "spec": {"podTemplate": pod_template, "operatingMode": "Running"},
            "status": {},
        }
        created = self._store.create(SANDBOXES, namespace, sandbox)
        metadata = as_obj(pod_template.get("metadata"))
        spec = copy.deepcopy(as_obj(pod_template.get("spec")))
        spec.setdefault("automountServiceAccountToken", False)
        pod = default_pod(
            {
                "metadata": {
                    "name": name,
                    "labels": dict(as_obj(metadata.get("labels"))),
                    "annotations": dict(as_obj(metadata.get("annotations"))),
                    "ownerReferences": [_controller_ref(created)],
                },
                "spec": spec,
            }
        )
        try:
            validate_pod(pod)
            made = self._store.create(PODS, namespace, pod)
        except ApiError as exc:
            created["status"] = {"conditions": [_condition(False, "ReconcilerError", str(exc.status["message"]))]}
            self._store.replace(SANDBOXES, created)
            return
        self._start_pod(made)
        created["metadata"]["annotations"][POD_NAME_ANNOTATION] = name
        self._store.replace(SANDBOXES, created)

    def _sandboxes(self, namespace: str) -> None:
        """Each sandbox's Ready condition from its pod."""
        for sandbox in self._store.list(SANDBOXES, namespace):
            pod_name = as_obj(sandbox["metadata"].get("annotations")).get(POD_NAME_ANNOTATION)
            if not pod_name:
                continue  # its pod could not be made: its status says why
            pod = self._store.find(PODS, namespace, str(pod_name))
            status = as_obj(pod.get("status")) if pod else {}
            ready = status.get("phase") == "Running" and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in map(as_obj, as_list(status.get("conditions")))
            )
            condition = _condition(ready, "DependenciesReady" if ready else "DependenciesNotReady")
            old = [as_obj(c) for c in as_list(as_obj(sandbox.get("status")).get("conditions"))]
            if old and _same_condition(old[0], condition):
                continue
            sandbox["status"] = {"conditions": [condition]}
            if pod is not None and pod["spec"].get("nodeName"):
                sandbox["status"]["nodeName"] = pod["spec"]["nodeName"]
            self._store.replace(SANDBOXES, sandbox)

    # ---- warm pools -----------------------------------------------------------------------------

    def _members(self, pool: JsonObj) -> list[JsonObj]:
        namespace, uid = pool["metadata"]["namespace"], pool["metadata"]["uid"]
        return [s for s in self._store.list(SANDBOXES, namespace) if _controller_uid(s) == uid]

    def _pools(self, namespace: str) -> None:
        for pool in self._store.list(WARM_POOLS, namespace):
            name = pool["metadata"]["name"]
            members = self._members(pool)
            wanted = int(pool["spec"].get("replicas", 1))
            template = self._store.find(TEMPLATES, namespace, str(pool["spec"]["sandboxTemplateRef"]["name"]))
            for _ in range(wanted - len(members) if template is not None else 0):
                labels = {WARM_POOL_LABEL: name, LAUNCH_TYPE_LABEL: "warm"}
                self._make_sandbox(namespace, f"{name}-{_suffix()}", template or {}, pool, labels)
            for extra in members[wanted:]:
                self._store.delete(SANDBOXES, namespace, extra["metadata"]["name"])
            members = self._members(pool)
            status = {
                "replicas": len(members),
                "readyReplicas": sum(1 for member in members if _ready(member)),
                "selector": f"{WARM_POOL_LABEL}={name}",
                "observedGeneration": 1,
            }
            if pool.get("status") != status:
                pool["status"] = status
                self._store.replace(WARM_POOLS, pool)

    # ---- claims ---------------------------------------------------------------------------------

    def _claims(self, namespace: str) -> None:
        for claim in self._store.list(CLAIMS, namespace):
            name = str(as_obj(as_obj(claim.get("status")).get("sandbox")).get("name") or "")
            condition = _condition(False, "SandboxNotReady")
            if not name:
                name, condition = self._bind(namespace, claim)
            if name:
                sandbox = self._store.find(SANDBOXES, namespace, name)
                if sandbox is None:
                    condition = _condition(False, "SandboxMissing", f'sandbox "{name}" not found')
                else:
                    conditions = [as_obj(c) for c in as_list(as_obj(sandbox.get("status")).get("conditions"))]
                    condition = conditions[0] if conditions else _condition(False, "SandboxNotReady")
            status = {"conditions": [condition], "sandbox": {"name": name} if name else {}}
            old = as_obj(claim.get("status"))
            old_conditions = [as_obj(c) for c in as_list(old.get("conditions"))]
            if (
                old.get("sandbox", {}) == status["sandbox"]
                and old_conditions
                and _same_condition(old_conditions[0], condition)
            ):
                continue
            claim = self._store.get(CLAIMS, namespace, claim["metadata"]["name"])  # the pass may have annotated it
            claim["status"] = status
            self._store.replace(CLAIMS, claim)

    def _bind(self, namespace: str, claim: JsonObj) -> tuple[str, JsonObj]:
        """Adopt a ready sandbox of the claim's pool, or make one from its template; (its name, or "" and why not)."""
        pool_name = str(claim["spec"]["warmPoolRef"]["name"])
        pool = self._store.find(WARM_POOLS, namespace, pool_name)
        if pool is None:
            return "", _condition(False, "WarmPoolNotFound", f'sandboxwarmpool "{pool_name}" not found')
        claim_name = claim["metadata"]["name"]
        identity = {CLAIM_UID_LABEL: claim["metadata"]["uid"]}
        # A ready member first; else one still starting (the controller waits for a warm one rather than start
        # another); a cold start only when the pool has none.
        members = sorted(self._members(pool), key=lambda member: not _ready(member))
        adopted = members[0] if members else None
        if adopted is not None:
            adopted["metadata"]["ownerReferences"] = [_controller_ref(claim)]
            labels = adopted["metadata"]["labels"]
            labels.pop(WARM_POOL_LABEL, None)
            labels.update(identity)
            self._store.replace(SANDBOXES, adopted)
            name = adopted["metadata"]["name"]
        elif self._store.find(SANDBOXES, namespace, claim_name) is None:
            template_name = str(pool["spec"]["sandboxTemplateRef"]["name"])
            template = self._store.find(TEMPLATES, namespace, template_name)
            if template is None:
                return "", _condition(False, "TemplateNotFound", f'sandboxtemplate "{template_name}" not found')
            self._make_sandbox(namespace, claim_name, template, claim, {**identity, LAUNCH_TYPE_LABEL: "cold"})
            name = claim_name
        else:
            return "", _condition(False, "SandboxCreatePending", f'sandbox "{claim_name}" already exists')
        claim["metadata"].setdefault("annotations", {})[SANDBOX_NAME_ANNOTATION] = name
        self._store.replace(CLAIMS, claim)
        return name, _condition(False, "DependenciesNotReady")


def _ready(sandbox: JsonObj) -> bool:
    conditions = as_list(as_obj(sandbox.get("status")).get("conditions"))
    return any(as_obj(c).get("type") == "Ready" and as_obj(c).get("status") == "True" for c in conditions)


def _suffix() -> str:
    return "".join(secrets.choice(_SUFFIX) for _ in range(5))
