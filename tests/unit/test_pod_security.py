"""Sandbox pods meet the `restricted` Pod Security Standard that deploy/kubernetes/namespaces.yaml enforces on the
sandboxes' namespace, with every setting that keeps the defaults' hardening; loosening settings fail it (and the
namespace's admission then refuses those pods, which is the point of the label)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_sandbox_mcp.backends._kubernetes.agent_sandbox import shape, template_manifest
from llm_sandbox_mcp.backends._kubernetes.pod import PodOptions, pod_manifest
from llm_sandbox_mcp.config import Settings, env_name
from llm_sandbox_mcp.models import CacheMount, SandboxSpec
from llm_sandbox_mcp.server.http import check_authentication, parse_listen
from tests.support.pod_security import violations

ROOT = Path(__file__).resolve().parents[2]


def _pod(settings: Settings, options: PodOptions | None = None, cache: CacheMount | None = None) -> dict[str, Any]:
    spec = SandboxSpec("python:3.12-slim", settings.limits(), cache)
    return pod_manifest("sandbox", spec, {}, {}, options or PodOptions())


@pytest.mark.parametrize(
    ("settings", "options", "cache"),
    [
        (Settings(), None, None),
        (Settings(), PodOptions(seccomp_profile="llm-sandbox-mcp.json", host_users=False), None),
        (Settings(), None, CacheMount("k", writable=True)),
        (Settings(sandbox_network_mode="bridge", sandbox_read_only=False), None, CacheMount("k")),
        (Settings(sandbox_security_opt=["no-new-privileges", "label=type:container_t"]), None, None),
    ],
    ids=["defaults", "localhost-seccomp-own-user-namespace", "installer", "network-and-writable-root", "selinux"],
)
def test_sandbox_pods_meet_the_restricted_standard(
    settings: Settings, options: PodOptions | None, cache: CacheMount | None
) -> None:
    assert violations(_pod(settings, options, cache)) == []


@pytest.mark.parametrize(
    ("settings", "failed"),
    [
        (Settings(sandbox_privileged=True), "privileged"),
        (Settings(sandbox_cap_drop=["NET_RAW"]), "capabilities not dropped to ALL"),
        (Settings(sandbox_security_opt=["seccomp=unconfined"]), "seccompProfile"),
        (Settings(sandbox_security_opt=["apparmor=unconfined"]), "appArmorProfile"),
    ],
)
def test_settings_that_give_hardening_away_fail_it(settings: Settings, failed: str) -> None:
    assert any(found.startswith(failed) for found in violations(_pod(settings))), violations(_pod(settings))


def test_the_deployed_namespaces_enforce_it_and_deny_the_sandboxes_all_traffic() -> None:
    documents = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/namespaces.yaml").read_text()))
    namespaces = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Namespace"}
    for namespace in namespaces.values():
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    (policy,) = [d for d in documents if d["kind"] == "NetworkPolicy"]
    assert policy["metadata"]["namespace"] in namespaces
    assert policy["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    role = next(yaml.safe_load_all((ROOT / "deploy/kubernetes/rbac.yaml").read_text()))
    assert role["metadata"]["namespace"] in namespaces


def test_the_servers_deployment_is_restricted_runs_as_the_bound_account_and_points_at_the_sandboxes() -> None:
    documents = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/server.yaml").read_text()))
    rbac = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/rbac.yaml").read_text())}
    (deployment,) = [d for d in documents if d["kind"] == "StatefulSet"]
    pod = deployment["spec"]["template"]
    assert violations(pod) == []
    account = rbac["ServiceAccount"]["metadata"]
    assert deployment["metadata"]["namespace"] == account["namespace"]
    assert pod["spec"]["serviceAccountName"] == account["name"]
    (container,) = pod["spec"]["containers"]
    env = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert env["BACKEND"] == "kubernetes" and env["NAMESPACE"] == rbac["Role"]["metadata"]["namespace"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The tokens come from a Secret no one but the server's group reads; the server answers only with them.
    (tokens,) = [v for v in pod["spec"]["volumes"] if v.get("secret", {}).get("secretName") == "llm-sandbox-mcp-tokens"]
    assert tokens["secret"]["defaultMode"] == 0o400 and "optional" not in tokens["secret"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == tokens["name"]]
    assert env["SANDBOX_HTTP_TOKENS_FILE"].startswith(mount["mountPath"] + "/")
    probes = {kind: container[f"{kind}Probe"]["httpGet"] for kind in ("readiness", "liveness")}
    assert probes == {"readiness": {"path": "/readyz", "port": "mcp"}, "liveness": {"path": "/healthz", "port": "mcp"}}
    services = {d["metadata"]["name"]: d["spec"] for d in documents if d["kind"] == "Service"}
    for service in services.values():
        assert service["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # Replicas: each pod's name is its replica id, and the peer URL is its name under the headless Service.
    (replica_id,) = [v["valueFrom"]["fieldRef"]["fieldPath"] for v in container["env"] if "valueFrom" in v]
    assert replica_id == "metadata.name" and env["SANDBOX_HTTP_REPLICA_ID"] is None
    peers = services[deployment["spec"]["serviceName"]]
    assert peers["clusterIP"] == "None"
    namespace = deployment["metadata"]["namespace"]
    assert (
        env["SANDBOX_HTTP_PEER_URL"] == f"http://{{replica}}.{deployment['spec']['serviceName']}.{namespace}.svc:8080"
    )
    assert peers["ports"][0]["port"] == 8080 and container["args"][-1].endswith(":8080")
    assert (env["SANDBOX_HTTP_PEER_SECRET_FILE"] or "").startswith(mount["mountPath"] + "/")


def test_oauth_comes_from_a_configmap_the_deployment_reads_and_its_client_secret_from_a_secret_it_mounts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/server.yaml").read_text())}
    (config_map,) = yaml.safe_load_all((ROOT / "deploy/kubernetes/oauth.yaml").read_text())
    deployment = server["StatefulSet"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    # Optional: without the ConfigMap (or the Secret) the pod starts all the same, on the tokens file.
    assert {"configMapRef": {"name": config_map["metadata"]["name"], "optional": True}} in container["envFrom"]
    data: dict[str, str] = config_map["data"]
    settings_names = {env_name(field) for field in Settings.model_fields}
    assert all(name.startswith("SANDBOX_HTTP_OAUTH_") and name in settings_names for name in data), data
    (client,) = [v for v in pod["spec"]["volumes"] if v["name"] == "oauth-client"]
    assert client["secret"]["defaultMode"] == 0o400 and client["secret"]["optional"] is True
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "oauth-client"]
    assert mount["readOnly"] is True
    assert data["SANDBOX_HTTP_OAUTH_CLIENT_SECRET_FILE"].startswith(mount["mountPath"] + "/")
    # The ConfigMap's settings as the server reads them from its environment: accepted, OAuth on both ways.
    secret = tmp_path / "client-secret"
    secret.write_text("the-client-secret\n")
    secret.chmod(0o600)
    for name, value in {**data, "SANDBOX_HTTP_OAUTH_CLIENT_SECRET_FILE": str(secret)}.items():
        monkeypatch.setenv(name, value)
    oauth = check_authentication(Settings(), parse_listen("0.0.0.0:8080"), unauthenticated_loopback=False).oauth
    assert oauth is not None and oauth.jwks_url is not None and oauth.introspection_url is not None
    assert oauth.client_secret == "the-client-secret" and oauth.resource.endswith("/mcp")


def test_a_warm_pools_template_carries_the_pod_unchanged_and_asks_for_no_network_policy_of_the_controllers() -> None:
    pod = _pod(Settings())
    template = template_manifest("llm-sandbox-x", pod, {}, {})
    carried = template["spec"]["podTemplate"]
    assert carried["spec"] == pod["spec"] and carried["metadata"]["labels"] == pod["metadata"]["labels"]
    assert violations({"metadata": carried["metadata"], "spec": carried["spec"]}) == []
    # The controller's default policy lets sandboxes reach the internet; policies add up.
    assert template["spec"]["networkPolicyManagement"] == "Unmanaged"
    # One template per kind of pod: the same pod has the same shape, another pod another one.
    assert shape(pod) == shape(_pod(Settings())) != shape(_pod(Settings(), cache=CacheMount("k")))
