"""The agent-sandbox CRDs on a double that has them installed: discovery, warm pools that keep their sandboxes
ready and refill, claims that adopt one (or start their own from an empty pool) and say which, and deletion that
cascades from a claim or a pool to its sandboxes and their pods."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import docker
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.support.k8s_double import KubeApiDouble
from tests.support.k8s_double.agent_sandbox import CLAIMS, SANDBOXES, TEMPLATES, WARM_POOLS
from tests.support.k8s_double.store import Resource

from .pods import api_client_for, status_code, watch_events

pytestmark = pytest.mark.kubernetes

Json = dict[str, Any]


@pytest.fixture(scope="module")
def crd_kubeconfig(
    docker_client: docker.DockerClient, busybox_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    with KubeApiDouble(docker_client=docker_client, agent_sandbox=True) as double:
        yield double.write_kubeconfig(tmp_path_factory.mktemp("crds") / "config")


@pytest.fixture
def custom(crd_kubeconfig: Path) -> Iterator[client.CustomObjectsApi]:
    api = api_client_for(str(crd_kubeconfig))
    try:
        yield client.CustomObjectsApi(api)
    finally:
        api.close()


@pytest.fixture
def crd_core(crd_kubeconfig: Path) -> Iterator[client.CoreV1Api]:
    api = api_client_for(str(crd_kubeconfig))
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


@pytest.fixture
def ns() -> str:
    return f"a-{uuid.uuid4().hex[:10]}"


def _args(resource: Resource, namespace: str) -> tuple[str, str, str, str]:
    return resource.group, resource.version, namespace, resource.plural


def create(custom: client.CustomObjectsApi, resource: Resource, namespace: str, name: str, spec: Json) -> Json:
    body = {"apiVersion": resource.api_version, "kind": resource.kind, "metadata": {"name": name}, "spec": spec}
    return cast(Json, custom.create_namespaced_custom_object(*_args(resource, namespace), body))  # pyright: ignore[reportUnknownMemberType]


def get(custom: client.CustomObjectsApi, resource: Resource, namespace: str, name: str) -> Json:
    return cast(Json, custom.get_namespaced_custom_object(*_args(resource, namespace), name))  # pyright: ignore[reportUnknownMemberType]


def listed(custom: client.CustomObjectsApi, resource: Resource, namespace: str) -> list[Json]:
    answer = custom.list_namespaced_custom_object(*_args(resource, namespace))  # pyright: ignore[reportUnknownMemberType]
    return cast(list[Json], cast(Json, answer)["items"])


def pod_names(core: client.CoreV1Api, namespace: str) -> set[str]:
    return {str(pod.metadata.name) for pod in core.list_namespaced_pod(namespace).items if pod.metadata}


def eventually(check: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def ready(obj: Json) -> bool:
    conditions = obj.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def template_spec(image: str) -> Json:
    pod = {"containers": [{"name": "main", "image": image, "command": ["sleep", "3600"]}]}
    return {"podTemplate": {"metadata": {"labels": {"app": "sleeper"}}, "spec": {**pod, "restartPolicy": "Never"}}}


def test_discovery_lists_the_crds_only_where_they_are_installed(kube: KubeApiDouble, crd_kubeconfig: Path) -> None:
    api = api_client_for(str(crd_kubeconfig))
    plain = api_client_for(str(kube.write_kubeconfig(crd_kubeconfig.parent / "plain")))
    try:
        resources = client.CustomObjectsApi(api).get_api_resources("extensions.agents.x-k8s.io", "v1beta1")  # pyright: ignore[reportUnknownMemberType]
        assert {"sandboxtemplates", "sandboxwarmpools", "sandboxclaims"} <= {r.name for r in resources.resources}
        core = client.CustomObjectsApi(api).get_api_resources("agents.x-k8s.io", "v1beta1")  # pyright: ignore[reportUnknownMemberType]
        assert "sandboxes" in {r.name for r in core.resources}
        groups = {group.name for group in client.ApisApi(api).get_api_versions().groups}
        assert {"extensions.agents.x-k8s.io", "agents.x-k8s.io"} <= groups
        with pytest.raises(ApiException) as missing:
            client.CustomObjectsApi(plain).get_api_resources("extensions.agents.x-k8s.io", "v1beta1")  # pyright: ignore[reportUnknownMemberType]
        assert status_code(missing.value) == 404
        assert "agents.x-k8s.io" not in {group.name for group in client.ApisApi(plain).get_api_versions().groups}
        with pytest.raises(ApiException) as unserved:
            client.CustomObjectsApi(plain).list_namespaced_custom_object(*_args(CLAIMS, "default"))  # pyright: ignore[reportUnknownMemberType]
        assert status_code(unserved.value) == 404
    finally:
        api.close()
        plain.close()


def test_a_pool_keeps_ready_sandboxes_a_claim_adopts_one_the_pool_refills_and_deletion_cascades(
    custom: client.CustomObjectsApi, crd_core: client.CoreV1Api, ns: str, busybox_image: str
) -> None:
    create(custom, TEMPLATES, ns, "sleeper", template_spec(busybox_image))
    create(custom, WARM_POOLS, ns, "pool", {"replicas": 2, "sandboxTemplateRef": {"name": "sleeper"}})

    def pool_ready(count: int) -> Callable[[], bool]:
        return lambda: get(custom, WARM_POOLS, ns, "pool").get("status", {}).get("readyReplicas") == count

    eventually(pool_ready(2), "the pool did not make two ready sandboxes")
    warm = {s["metadata"]["name"] for s in listed(custom, SANDBOXES, ns)}
    assert len(warm) == 2 and all(name.startswith("pool-") for name in warm)
    assert pod_names(crd_core, ns) == warm  # each sandbox's pod has its name
    pod = crd_core.read_namespaced_pod(next(iter(warm)), ns)
    assert pod.spec is not None and pod.spec.automount_service_account_token is False
    assert pod.metadata is not None and pod.metadata.labels == {"app": "sleeper"}
    assert [(r.kind, r.controller) for r in pod.metadata.owner_references or []] == [("Sandbox", True)]
    assert get(custom, WARM_POOLS, ns, "pool")["status"]["selector"] == "agents.x-k8s.io/warm-pool-sandbox=pool"

    created = create(custom, CLAIMS, ns, "mine", {"warmPoolRef": {"name": "pool"}})
    version = created["metadata"]["resourceVersion"]
    events = watch_events(
        watch.Watch(),
        custom.list_namespaced_custom_object,
        *_args(CLAIMS, ns),
        resource_version=version,
        timeout_seconds=5,
    )
    named: Json = next(obj for _, obj in events if obj.get("status", {}).get("sandbox", {}).get("name"))
    adopted = str(named["status"]["sandbox"]["name"])
    assert adopted in warm and named["metadata"]["annotations"]["agents.x-k8s.io/sandbox-name"] == adopted
    claim = get(custom, CLAIMS, ns, "mine")
    assert ready(claim) and claim["status"]["conditions"][0]["reason"] == "DependenciesReady"
    sandbox = get(custom, SANDBOXES, ns, adopted)
    assert [r["uid"] for r in sandbox["metadata"]["ownerReferences"]] == [claim["metadata"]["uid"]]
    assert "agents.x-k8s.io/warm-pool-sandbox" not in sandbox["metadata"]["labels"]
    assert sandbox["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "warm"

    eventually(pool_ready(2), "the pool did not refill after a claim took one of its sandboxes")
    assert len(listed(custom, SANDBOXES, ns)) == 3

    custom.delete_namespaced_custom_object(*_args(CLAIMS, ns), "mine")  # pyright: ignore[reportUnknownMemberType]
    eventually(lambda: adopted not in pod_names(crd_core, ns), "the claim's pod outlived the claim")
    assert adopted not in {s["metadata"]["name"] for s in listed(custom, SANDBOXES, ns)}
    custom.delete_namespaced_custom_object(*_args(WARM_POOLS, ns), "pool")  # pyright: ignore[reportUnknownMemberType]
    eventually(lambda: not pod_names(crd_core, ns), "the pool's pods outlived the pool")
    assert listed(custom, SANDBOXES, ns) == []


def test_a_claim_on_an_empty_pool_starts_its_own_and_says_why_when_it_cannot(
    custom: client.CustomObjectsApi, crd_core: client.CoreV1Api, ns: str, busybox_image: str
) -> None:
    create(custom, TEMPLATES, ns, "sleeper", template_spec(busybox_image))
    create(custom, WARM_POOLS, ns, "empty", {"replicas": 0, "sandboxTemplateRef": {"name": "sleeper"}})
    create(custom, CLAIMS, ns, "cold", {"warmPoolRef": {"name": "empty"}})
    eventually(lambda: ready(get(custom, CLAIMS, ns, "cold")), "the claim on an empty pool got no ready sandbox")
    assert get(custom, CLAIMS, ns, "cold")["status"]["sandbox"]["name"] == "cold"
    assert get(custom, SANDBOXES, ns, "cold")["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "cold"
    assert pod_names(crd_core, ns) == {"cold"}

    create(custom, CLAIMS, ns, "orphan", {"warmPoolRef": {"name": "no-such-pool"}})
    eventually(
        lambda: (
            get(custom, CLAIMS, ns, "orphan").get("status", {}).get("conditions", [{}])[0].get("reason")
            == "WarmPoolNotFound"
        ),
        "a claim on a missing pool did not say so",
    )
    with pytest.raises(ApiException) as refused:
        create(custom, WARM_POOLS, ns, "nameless", {"replicas": 1})
    assert status_code(refused.value) == 422
    assert "spec.sandboxTemplateRef.name" in json.loads(str(cast(Any, refused.value).body))["message"]
    custom.delete_namespaced_custom_object(*_args(CLAIMS, ns), "cold")  # pyright: ignore[reportUnknownMemberType]
    eventually(lambda: not pod_names(crd_core, ns), "the cold claim's pod outlived it")
