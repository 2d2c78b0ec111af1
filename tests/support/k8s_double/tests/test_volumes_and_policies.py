"""Volumes (emptyDir tmpfs, PVCs on Docker volumes) and NetworkPolicies (deny-all egress drops what a pod sends,
as a cluster's CNI does)."""

from __future__ import annotations

from typing import Any, cast

import docker
import docker.errors
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.support.k8s_double import KubeApiDouble

from .conftest import PodFactory
from .pods import WAIT_SECONDS, exec_in_pod, model, run_pod, status_code, wait_for_pod, watch_events

pytestmark = pytest.mark.kubernetes


def _pvc(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def _interfaces(core: client.CoreV1Api, namespace: str, pod: str) -> list[str]:
    out, _, _ = exec_in_pod(core, namespace, pod, ["cat", "/proc/net/dev"])
    return sorted(line.split(":")[0].strip() for line in out.splitlines()[2:])


def test_empty_dir_is_a_tmpfs_of_its_size_limit_writable_by_a_non_root_user(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    manifest = make_pod(
        "scratch",
        securityContext={"runAsUser": 1000, "runAsGroup": 1000},
        volumes=[{"name": "work", "emptyDir": {"medium": "Memory", "sizeLimit": "8Mi"}}],
        container={
            "volumeMounts": [{"name": "work", "mountPath": "/work"}],
            "securityContext": {"readOnlyRootFilesystem": True},
        },
    )
    run_pod(core, namespace, manifest)

    mounts, _, _ = exec_in_pod(core, namespace, "scratch", ["grep", " /work ", "/proc/mounts"])
    small = exec_in_pod(core, namespace, "scratch", ["dd", "if=/dev/zero", "of=/work/small", "bs=1M", "count=4"])
    big = exec_in_pod(core, namespace, "scratch", ["dd", "if=/dev/zero", "of=/work/big", "bs=1M", "count=16"])
    exec_in_pod(core, namespace, "scratch", ["rm", "/work/big"])
    script = exec_in_pod(
        core, namespace, "scratch", ["sh", "-c", "printf '#!/bin/sh\\necho ran' > /work/s; chmod +x /work/s; /work/s"]
    )

    assert mounts.startswith("tmpfs /work tmpfs") and "size=8192k" in mounts and "noexec" not in mounts
    assert small[2] == 0
    assert big[2] != 0 and "No space left on device" in big[1]
    assert script[0] == "ran\n"


def test_an_empty_dir_on_disk_is_no_tmpfs_and_past_its_size_limit_the_pod_is_evicted(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    """As on a node: without medium Memory an emptyDir is a directory on the node's disk, writable by any user;
    writing past its sizeLimit succeeds (it is no quota), and the kubelet's next look evicts the pod."""
    manifest = make_pod(
        "scratch-disk",
        securityContext={"runAsUser": 1000, "runAsGroup": 1000},
        volumes=[{"name": "work", "emptyDir": {"sizeLimit": "1Mi"}}],
        container={"volumeMounts": [{"name": "work", "mountPath": "/work"}]},
    )
    run_pod(core, namespace, manifest)
    mounts, _, _ = exec_in_pod(core, namespace, "scratch-disk", ["grep", " /work ", "/proc/mounts"])
    past = exec_in_pod(core, namespace, "scratch-disk", ["dd", "if=/dev/zero", "of=/work/big", "bs=1M", "count=4"])
    assert not mounts.startswith("tmpfs") and past[2] == 0, (mounts, past)
    evicted = wait_for_pod(core, namespace, "scratch-disk", lambda p: bool(p.status and p.status.phase == "Failed"))
    assert evicted.status is not None and evicted.status.reason == "Evicted"
    assert evicted.status.message == 'Usage of EmptyDir volume "work" exceeds the limit "1Mi". '


def test_pvc_is_bound_and_backed_by_a_labelled_docker_volume_that_delete_removes(
    kube: KubeApiDouble, core: client.CoreV1Api, namespace: str, docker_client: docker.DockerClient
) -> None:
    created = core.create_namespaced_persistent_volume_claim(
        namespace, model(client.V1PersistentVolumeClaim, _pvc("store"))
    )

    assert created.status is not None and created.status.phase == "Bound"
    assert created.status.capacity == {"storage": "1Gi"}
    assert created.spec is not None and created.spec.volume_name
    listed = core.list_namespaced_persistent_volume_claim(namespace).items
    assert [p.metadata.name for p in listed if p.metadata] == ["store"]
    volumes = docker_client.volumes.list(filters={"label": "k8s-double.pvc.name=store"})
    mine = [v for v in volumes if v.attrs["Labels"].get("k8s-double.pvc.namespace") == namespace]
    assert len(mine) == 1 and mine[0].attrs["Labels"]["k8s-double.instance"] == kube.instance_id

    core.delete_namespaced_persistent_volume_claim("store", namespace)

    with pytest.raises(docker.errors.NotFound):
        docker_client.volumes.get(str(mine[0].name))
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_persistent_volume_claim("store", namespace)
    assert status_code(caught.value) == 404


def test_pvc_without_storage_request_is_422(core: client.CoreV1Api, namespace: str) -> None:
    manifest = _pvc("bad")
    del manifest["spec"]["resources"]

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_persistent_volume_claim(namespace, model(client.V1PersistentVolumeClaim, manifest))

    assert status_code(caught.value) == 422


def test_pvc_is_shared_between_pods_and_writable_by_non_root_unless_the_volume_is_read_only(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    core.create_namespaced_persistent_volume_claim(namespace, model(client.V1PersistentVolumeClaim, _pvc("cache")))

    def with_claim(name: str, read_only: bool) -> dict[str, Any]:
        return make_pod(
            name,
            securityContext={"runAsUser": 1000},
            volumes=[{"name": "c", "persistentVolumeClaim": {"claimName": "cache", "readOnly": read_only}}],
            container={"volumeMounts": [{"name": "c", "mountPath": "/cache"}]},
        )

    run_pod(core, namespace, with_claim("filler", read_only=False))
    run_pod(core, namespace, with_claim("user", read_only=True))

    assert exec_in_pod(core, namespace, "filler", ["sh", "-c", "echo lib > /cache/lib"])[2] == 0
    assert exec_in_pod(core, namespace, "user", ["cat", "/cache/lib"])[0] == "lib\n"
    assert exec_in_pod(core, namespace, "user", ["touch", "/cache/x"])[2] != 0


def test_pvc_deleted_while_in_use_waits_for_its_pod(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    core.create_namespaced_persistent_volume_claim(namespace, model(client.V1PersistentVolumeClaim, _pvc("busy")))
    volumes = [{"name": "b", "persistentVolumeClaim": {"claimName": "busy"}}]
    run_pod(core, namespace, make_pod("holder", volumes=volumes))

    answer = core.delete_namespaced_persistent_volume_claim("busy", namespace)

    assert answer.metadata is not None and answer.metadata.deletion_timestamp is not None
    terminating = core.read_namespaced_persistent_volume_claim("busy", namespace)
    assert terminating.metadata is not None and terminating.metadata.finalizers == ["kubernetes.io/pvc-protection"]
    core.delete_namespaced_pod("holder", namespace, grace_period_seconds=0)
    watcher = watch.Watch()
    for kind, _ in watch_events(
        watcher,
        core.list_namespaced_persistent_volume_claim,
        namespace,
        resource_version=terminating.metadata.resource_version,
        timeout_seconds=WAIT_SECONDS,
    ):
        if kind == "DELETED":
            watcher.stop()
            break
    else:
        pytest.fail("the PVC was not deleted after its last pod went away")


def test_pod_using_a_missing_pvc_stays_pending_unschedulable(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    manifest = make_pod("orphan", volumes=[{"name": "x", "persistentVolumeClaim": {"claimName": "absent"}}])
    core.create_namespaced_pod(namespace, model(client.V1Pod, manifest))

    def unschedulable(pod: client.V1Pod) -> bool:
        return any(c.reason == "Unschedulable" for c in (pod.status.conditions if pod.status else None) or [])

    pod = wait_for_pod(core, namespace, "orphan", unschedulable)

    assert pod.status is not None and pod.status.phase == "Pending"


def test_network_policy_create_read_list_with_api_server_defaults(api_client: client.ApiClient, namespace: str) -> None:
    networking = client.NetworkingV1Api(api_client)
    policy: dict[str, Any] = {
        "metadata": {"name": "deny-egress"},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"]},
    }
    ingress_only = {"metadata": {"name": "defaults"}, "spec": {"podSelector": {"matchLabels": {"a": "b"}}}}

    created = networking.create_namespaced_network_policy(namespace, model(client.V1NetworkPolicy, policy))
    defaulted = networking.create_namespaced_network_policy(namespace, model(client.V1NetworkPolicy, ingress_only))

    assert created.spec is not None and created.spec.policy_types == ["Egress"]
    assert defaulted.spec is not None and defaulted.spec.policy_types == ["Ingress"]
    listed = networking.list_namespaced_network_policy(namespace).items
    assert sorted(p.metadata.name for p in listed if p.metadata and p.metadata.name) == ["defaults", "deny-egress"]
    assert networking.read_namespaced_network_policy("deny-egress", namespace).metadata is not None


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({"policyTypes": ["Egress"], "egress": [{"ports": [{"port": 53}]}]}, "spec.egress", id="egress"),
        pytest.param(
            {"policyTypes": ["Ingress"], "ingress": [{"ports": [{"port": 80}]}]}, "spec.ingress", id="ingress"
        ),
        pytest.param(
            {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}},
            "spec.podSelector.matchExpressions",
            id="match-expressions",
        ),
    ],
)
def test_network_policy_the_double_cannot_enforce_is_422(
    api_client: client.ApiClient, namespace: str, spec: dict[str, Any], field: str
) -> None:
    policy: dict[str, Any] = {"metadata": {"name": "partial"}, "spec": {"podSelector": {}, **spec}}

    with pytest.raises(ApiException) as caught:
        client.NetworkingV1Api(api_client).create_namespaced_network_policy(
            namespace, model(client.V1NetworkPolicy, policy)
        )

    assert status_code(caught.value) == 422
    assert field in str(cast(Any, caught.value).body)


def test_deny_all_egress_policy_keeps_the_interface_and_drops_what_leaves_it(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    """As on a cluster: the selected pod keeps eth0, an address and a default route, and nothing it sends
    arrives (the connection and the cluster DNS lookup time out); the installer pod is on the host network."""
    policy: dict[str, Any] = {
        "metadata": {"name": "sandbox-no-egress"},
        "spec": {"podSelector": {"matchLabels": {"role": "sandbox"}}, "policyTypes": ["Ingress", "Egress"]},
    }
    client.NetworkingV1Api(api_client).create_namespaced_network_policy(
        namespace, model(client.V1NetworkPolicy, policy)
    )
    run_pod(core, namespace, make_pod("isolated", labels={"role": "sandbox"}))
    run_pod(core, namespace, make_pod("installer", labels={"role": "installer"}))

    assert _interfaces(core, namespace, "isolated") == ["eth0", "lo"]
    routes, _, _ = exec_in_pod(core, namespace, "isolated", ["cat", "/proc/net/route"])
    assert any(line.split()[:2] == ["eth0", "00000000"] for line in routes.splitlines()), routes  # a default route
    out, err, code = exec_in_pod(core, namespace, "isolated", ["busybox", "nc", "-w", "2", "1.1.1.1", "80"])
    assert code != 0 and "timed out" in err, (out, err)  # dropped, not refused or unreachable
    out, err, code = exec_in_pod(core, namespace, "isolated", ["busybox", "nslookup", "example.com"])
    assert code != 0 and "no servers could be reached" in out + err, (out, err)
    resolver, _, _ = exec_in_pod(core, namespace, "isolated", ["cat", "/etc/resolv.conf"])
    assert "nameserver 10.96.0.10" in resolver  # the cluster's DNS server, which the policy keeps out of reach
    assert len(_interfaces(core, namespace, "installer")) > 1
