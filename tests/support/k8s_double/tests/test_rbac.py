"""RBAC in the double: request attributes as the API server reads them, and a Role-bound token's 403."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.support.k8s_double import KubeApiDouble
from tests.support.k8s_double.errors import ApiError
from tests.support.k8s_double.rbac import Attributes, Grant, attributes, rules_of

from .pods import api_client_for, status_code


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/n/pods", {}, ("list", "", "pods", "")),
        ("GET", "/api/v1/namespaces/n/pods", {"watch": "true"}, ("watch", "", "pods", "")),
        ("GET", "/api/v1/namespaces/n/pods/p", {}, ("get", "", "pods", "p")),
        ("POST", "/api/v1/namespaces/n/pods", {}, ("create", "", "pods", "")),
        ("DELETE", "/api/v1/namespaces/n/pods/p", {}, ("delete", "", "pods", "p")),
        ("DELETE", "/api/v1/namespaces/n/pods", {}, ("deletecollection", "", "pods", "")),
        ("PATCH", "/api/v1/namespaces/n/pods/p", {}, ("patch", "", "pods", "p")),
        ("GET", "/api/v1/namespaces/n/pods/p/exec", {}, ("get", "", "pods/exec", "p")),
        (
            "POST",
            "/apis/networking.k8s.io/v1/namespaces/n/networkpolicies",
            {},
            ("create", "networking.k8s.io", "networkpolicies", ""),
        ),
    ],
)
def test_request_attributes_are_read_off_the_method_and_path(
    method: str, path: str, query: dict[str, str], expected: tuple[str, str, str, str]
) -> None:
    verb, group, resource, name = expected
    assert attributes(method, path, query) == Attributes(verb, group, resource, "n", name)
    assert attributes("GET", "/version", {}) is None


ROLE: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "Role",
    "metadata": {"name": "r", "namespace": "n"},
    "rules": [{"apiGroups": [""], "resources": ["pods", "pods/exec"], "verbs": ["get"]}],
}


def test_a_websocket_exec_needs_create_as_well_and_other_namespaces_get_nothing() -> None:
    grant = Grant("u", *rules_of(ROLE), token="t")
    grant.authorize(attributes("GET", "/api/v1/namespaces/n/pods/p", {}), websocket=False)
    with pytest.raises(ApiError) as refused:
        grant.authorize(attributes("GET", "/api/v1/namespaces/n/pods/p/exec", {}), websocket=True)
    assert refused.value.code == 403
    assert refused.value.status["message"] == (
        'pods "p" is forbidden: User "u" cannot create resource "pods/exec" in API group "" in the namespace "n"'
    )
    with pytest.raises(ApiError):
        grant.authorize(attributes("GET", "/api/v1/namespaces/other/pods/p", {}), websocket=False)
    assert [allowed for _, allowed in grant.asked] == [True, True, False, False]


@pytest.mark.parametrize(
    "role",
    [
        {**ROLE, "kind": "ClusterRole"},
        {**ROLE, "metadata": {"name": "r"}},
        {**ROLE, "rules": [{"apiGroups": "", "resources": ["pods"], "verbs": ["get"]}]},
    ],
)
def test_what_is_not_a_namespaced_role_is_refused(role: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="Role"):
        rules_of(role)


def test_a_role_bound_token_gets_the_api_servers_403_over_the_wire(
    kube: KubeApiDouble, namespace: str, tmp_path: Path
) -> None:
    grant = kube.grant({**ROLE, "metadata": {"name": "r", "namespace": namespace}}, "system:serviceaccount:a:b")
    api = api_client_for(str(kube.write_kubeconfig(tmp_path / "kubeconfig", token=grant.token)))
    with api:
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(api).list_namespaced_pod(namespace)
        assert status_code(refused.value) == 403
        status = json.loads(str(refused.value.body))  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
        assert status["reason"] == "Forbidden" and 'cannot list resource "pods"' in status["message"]
    assert [(asked.verb, allowed) for asked, allowed in grant.asked] == [("list", False)]
