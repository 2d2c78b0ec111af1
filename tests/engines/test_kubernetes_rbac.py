"""The Role in deploy/kubernetes/rbac.yaml is what the Kubernetes backend needs, all of it and no more.

The API double authorizes a token bound to a Role as the API server's RBAC authorizer does (403 `Forbidden`
with its message), and records each request's verb and resource. Every call the server makes to the API is in
the backend, so exercising each backend operation under the deployed Role proves the Role sufficient, and
comparing what was asked with what the Role grants proves each rule used: by pods of the server's own, or, on a
double with the agent-sandbox CRDs installed, by sandboxes claimed from warm pools (each path uses part of the Role,
and between them all of it).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_sandbox_mcp.backends import load_backend
from llm_sandbox_mcp.backends._threaded import Threaded
from llm_sandbox_mcp.models import CacheMount, SandboxSpec
from tests.engines import kube
from tests.engines.conftest import engine_settings, require_now
from tests.support.k8s_double.rbac import Grant

pytestmark = [pytest.mark.anyio, pytest.mark.kubernetes]

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "python:3.12-slim"
# Asked only when the API stops answering mid-way, which this test cannot make happen: the pod is read when an
# exec stream ends without a status (a dropped connection) or the watch of a starting pod ends early.
ONLY_WHEN_A_CONNECTION_FAILS = {
    ("get", "", "pods"): "KubernetesEngine._running, KubernetesEngine._follow",
    ("get", "extensions.agents.x-k8s.io", "sandboxclaims"): "WarmPools._follow",
}
AGENT_SANDBOX_GROUPS = ("extensions.agents.x-k8s.io", "agents.x-k8s.io")
# What the claim path never asks: it makes and deletes no pod itself (the controller does, and deletes them with
# their claim). The pod path asks nothing of the agent-sandbox groups.
POD_PATH_ONLY = {("create", "", "pods"), ("delete", "", "pods")}
SERVICE_ACCOUNT = "system:serviceaccount:llm-sandbox-mcp:llm-sandbox-mcp"


def deployed_role() -> dict[str, Any]:
    documents = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/rbac.yaml").read_text()))
    (role,) = [document for document in documents if document["kind"] == "Role"]
    (binding,) = [document for document in documents if document["kind"] == "RoleBinding"]
    (account,) = [document for document in documents if document["kind"] == "ServiceAccount"]
    # The binding ties this Role to the ServiceAccount the server's StatefulSet runs as.
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": account["metadata"]["namespace"]}
    ]
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
    return role


def granted(role: dict[str, Any], namespace: str, tmp_path: Path, agent_sandbox: bool = False) -> tuple[Grant, Path]:
    """The Role, moved to the test's own namespace, bound to a new token; and a kubeconfig that uses it."""
    role = copy.deepcopy(role)
    role["metadata"]["namespace"] = namespace
    double = kube.double(agent_sandbox)
    grant = double.grant(role, SERVICE_ACCOUNT)
    return grant, double.write_kubeconfig(tmp_path / "kubeconfig", token=grant.token, namespace=namespace)


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    require_now(request, "kubernetes")
    return f"r-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["pods", "claims"])
def path(request: pytest.FixtureRequest) -> str:
    """How sandboxes are made: pods of the server's own, or claims on a double with the agent-sandbox CRDs."""
    return str(request.param)


@pytest.fixture
async def under_role(namespace: str, tmp_path: Path, path: str) -> AsyncIterator[tuple[Threaded, Grant]]:
    grant, kubeconfig = granted(deployed_role(), namespace, tmp_path, agent_sandbox=path == "claims")
    backend = load_backend("kubernetes", engine_settings("kubernetes", namespace=namespace, kubeconfig=kubeconfig))
    assert isinstance(backend, Threaded)
    try:
        yield backend, grant
    finally:
        await backend.aclose()


def spec(namespace: str, cache: CacheMount | None = None) -> SandboxSpec:
    return SandboxSpec(IMAGE, engine_settings("kubernetes", namespace=namespace).limits(), cache)


def _expanded(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (verb, group, resource)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


async def test_under_the_deployed_role_every_operation_works_and_every_rule_is_used(
    under_role: tuple[Threaded, Grant], namespace: str, path: str
) -> None:
    backend, grant = under_role
    installer = await backend.create(spec(namespace, CacheMount("rbac", writable=True)))
    assert (await backend.exec(installer, ["sh", "-c", "echo x > /opt/llm-sandbox/libs/x"], timeout=30)).exit_code == 0
    await backend.destroy(installer)
    # A second installer of the same set finds the claim there (a 409, then the claim read back).
    await backend.destroy(await backend.create(spec(namespace, CacheMount("rbac", writable=True))))
    runner = await backend.create(spec(namespace, CacheMount("rbac")))
    process = await backend.start(runner, ["cat"])
    await process.aclose()
    await backend.kill_all(runner)
    assert (await backend.exec(runner, ["cat", "/opt/llm-sandbox/libs/x"], timeout=30)).stdout == b"x\n"
    assert "in place" in await backend.describe()
    await backend.sweep()
    await backend.destroy(runner)
    await backend.drop_cache("rbac")
    if path == "claims":
        assert "claimed from warm pools" in await backend.describe()
    await backend.aclose()  # the claim path lists and deletes its pools and templates

    refused = [attributes.describe() for attributes, allowed in grant.asked if not allowed]
    assert refused == []
    asked = {(attributes.verb, attributes.group, attributes.resource) for attributes, _ in grant.asked}
    role = _expanded(deployed_role())
    claim_path_only = {rule for rule in role if rule[1] in AGENT_SANDBOX_GROUPS}
    not_asked = claim_path_only if path == "pods" else POD_PATH_ONLY
    assert role >= POD_PATH_ONLY and claim_path_only  # between them, the two paths use every rule
    assert asked | (set(ONLY_WHEN_A_CONNECTION_FAILS) - not_asked) == role - not_asked
