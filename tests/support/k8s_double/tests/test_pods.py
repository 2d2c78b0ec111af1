"""Pods through the real client: lifecycle, validation, selectors, watch, deletion, auth, what is not served."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, cast

import docker
import pytest
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.support.k8s_double import KubeApiDouble

from .conftest import PodFactory
from .pods import (
    WAIT_SECONDS,
    api_client_for,
    exec_in_pod,
    model,
    phase_is,
    run_pod,
    status_code,
    wait_for_pod,
    waiting_reason,
    watch_events,
)

pytestmark = pytest.mark.kubernetes


def _status(exc: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(str(cast(Any, exc).body))
    return body


def test_created_pod_is_pending_then_running_in_a_labelled_docker_container(
    kube: KubeApiDouble,
    core: client.CoreV1Api,
    namespace: str,
    make_pod: PodFactory,
    docker_client: docker.DockerClient,
) -> None:
    created = core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("web")))

    assert created.status is not None and created.status.phase == "Pending"
    assert created.metadata is not None and created.metadata.uid and created.metadata.resource_version
    assert created.metadata.creation_timestamp is not None
    running = wait_for_pod(core, namespace, "web", phase_is("Running"))
    assert running.status is not None and running.status.container_statuses is not None
    main = running.status.container_statuses[0]
    assert main.ready and main.state is not None and main.state.running is not None
    assert main.container_id is not None and main.container_id.startswith("docker://")
    conditions = {c.type: c.status for c in running.status.conditions or []}
    assert conditions["Ready"] == "True" and conditions["PodScheduled"] == "True"
    container = docker_client.containers.get(main.container_id.removeprefix("docker://"))
    assert container.labels["k8s-double.instance"] == kube.instance_id
    assert container.labels["io.kubernetes.pod.name"] == "web"
    assert kube.container_id("web", namespace) == container.id


def test_pod_whose_command_exits_zero_succeeds_and_non_zero_fails(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("ok", command=["true"])))
    core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("bad", command=["sh", "-c", "exit 7"])))

    ok = wait_for_pod(core, namespace, "ok", phase_is("Succeeded", "Failed"))
    bad = wait_for_pod(core, namespace, "bad", phase_is("Succeeded", "Failed"))

    assert ok.status is not None and ok.status.phase == "Succeeded"
    assert bad.status is not None and bad.status.phase == "Failed"
    assert bad.status.container_statuses is not None and bad.status.container_statuses[0].state is not None
    terminated = bad.status.container_statuses[0].state.terminated
    assert terminated is not None and terminated.exit_code == 7 and terminated.reason == "Error"


def test_reading_a_missing_pod_is_404_not_found_status(core: client.CoreV1Api, namespace: str) -> None:
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod("ghost", namespace)

    assert status_code(caught.value) == 404
    status = _status(caught.value)
    assert status["kind"] == "Status" and status["reason"] == "NotFound"
    assert status["message"] == 'pods "ghost" not found'
    assert status["details"] == {"name": "ghost", "kind": "pods"}


def test_creating_a_pod_twice_is_409_already_exists(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("twice")))

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("twice")))

    assert status_code(caught.value) == 409
    assert _status(caught.value)["reason"] == "AlreadyExists"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param({"metadata": {"name": "Bad_Name"}}, "metadata.name", id="name-not-dns1123"),
        pytest.param({"metadata": {"generateName": "sandbox-"}}, "metadata.generateName", id="generate-name"),
        pytest.param({"container": {"image": ""}}, "spec.containers[0].image", id="image-missing"),
        pytest.param(
            {"container": {"resources": {"limits": {"memory": "128K"}}}},
            "spec.containers[0].resources.limits[memory]",
            id="memory-suffix-K-is-not-kubernetes",
        ),
        pytest.param(
            {"container": {"resources": {"limits": {"cpu": "1"}, "requests": {"cpu": "2"}}}},
            "spec.containers[0].resources.requests",
            id="request-above-limit",
        ),
        pytest.param(
            {"container": {"securityContext": {"privileged": True, "allowPrivilegeEscalation": False}}},
            "spec.containers[0].securityContext",
            id="privileged-without-escalation",
        ),
        pytest.param(
            {"container": {"volumeMounts": [{"name": "nowhere", "mountPath": "/x"}]}},
            "spec.containers[0].volumeMounts[0].name",
            id="mount-of-undeclared-volume",
        ),
        pytest.param({"restartPolicy": "Sometimes"}, "spec.restartPolicy", id="restart-policy"),
        pytest.param({"extra_container": True}, "spec.containers", id="second-container"),
        pytest.param({"initContainers": [{"name": "i", "image": "x"}]}, "spec.initContainers", id="init-container"),
        pytest.param({"activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", id="active-deadline-zero"),
        pytest.param(
            {"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, "spec.volumes[0].hostPath", id="host-path-volume"
        ),
        pytest.param({"container": {"tty": True}}, "spec.containers[0].tty", id="tty"),
    ],
)
def test_invalid_pod_is_rejected_with_422_naming_the_field(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory, change: dict[str, Any], field: str
) -> None:
    manifest = make_pod("invalid", container=change.pop("container", {}))
    manifest["metadata"].update(change.pop("metadata", {}))
    if change.pop("extra_container", False):
        manifest["spec"]["containers"].append({**manifest["spec"]["containers"][0], "name": "sidecar"})
    manifest["spec"].update(change)

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(namespace, model(client.V1Pod, manifest))

    assert status_code(caught.value) == 422
    status = _status(caught.value)
    assert status["reason"] == "Invalid" and status["code"] == 422
    assert field in [cause["field"] for cause in status["details"]["causes"]]


def test_object_whose_namespace_differs_from_the_url_is_400(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    manifest = make_pod("elsewhere")
    manifest["metadata"]["namespace"] = "other"

    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(namespace, model(client.V1Pod, manifest))

    assert status_code(caught.value) == 400


def test_run_as_non_root_without_run_as_user_stays_pending_with_create_container_config_error(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    manifest = make_pod("rootless", securityContext={"runAsNonRoot": True})
    core.create_namespaced_pod(namespace, model(client.V1Pod, manifest))

    pod = wait_for_pod(core, namespace, "rootless", lambda p: waiting_reason(p) == "CreateContainerConfigError")

    assert pod.status is not None and pod.status.phase == "Pending"
    assert pod.status.container_statuses is not None and pod.status.container_statuses[0].state is not None
    waiting = pod.status.container_statuses[0].state.waiting
    assert waiting is not None and waiting.message is not None
    assert "container has runAsNonRoot and image will run as root" in waiting.message


def test_a_pod_past_its_active_deadline_fails_and_its_container_is_killed(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory, docker_client: docker.DockerClient
) -> None:
    manifest = make_pod("deadline", command=["sleep", "300"])
    manifest["spec"]["activeDeadlineSeconds"] = 2
    core.create_namespaced_pod(namespace, model(client.V1Pod, manifest))

    failed = wait_for_pod(core, namespace, "deadline", phase_is("Failed", "Succeeded"))

    assert failed.status is not None and failed.status.phase == "Failed"
    assert failed.status.reason == "DeadlineExceeded"
    statuses = failed.status.container_statuses or []
    container_id = statuses[0].container_id if statuses else None
    assert container_id is not None
    assert docker_client.containers.get(container_id.removeprefix("docker://")).status != "running"


def test_missing_image_reports_err_image_pull(core: client.CoreV1Api, namespace: str, make_pod: PodFactory) -> None:
    missing = make_pod("nopull", container={"image": "k8s-double-test:does-not-exist"})
    core.create_namespaced_pod(namespace, model(client.V1Pod, missing))

    pod = wait_for_pod(
        core, namespace, "nopull", lambda p: waiting_reason(p) is not None and waiting_reason(p) != "ContainerCreating"
    )

    assert waiting_reason(pod) == "ErrImagePull"
    assert pod.status is not None and pod.status.phase == "Pending"


def test_container_the_runtime_cannot_create_reports_create_container_error(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    manifest = make_pod("nocmd")
    del manifest["spec"]["containers"][0]["command"]  # the busybox image has no CMD either
    core.create_namespaced_pod(namespace, model(client.V1Pod, manifest))

    pod = wait_for_pod(core, namespace, "nocmd", lambda p: waiting_reason(p) == "CreateContainerError")

    assert pod.status is not None and pod.status.phase == "Pending"


def test_runtime_class_not_given_to_the_double_leaves_the_pod_pending(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("kata", runtimeClassName="kata")))
    core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("gvisor", runtimeClassName="gvisor")))

    def sandbox_failed(pod: client.V1Pod) -> bool:
        conditions = pod.status.conditions if pod.status else None
        return any(c.reason == "FailedCreatePodSandBox" for c in conditions or [])

    pending = wait_for_pod(core, namespace, "kata", sandbox_failed)
    running = wait_for_pod(core, namespace, "gvisor", phase_is("Running"))

    assert pending.status is not None and pending.status.phase == "Pending"
    assert pending.spec is not None and pending.spec.runtime_class_name == "kata"
    assert running.spec is not None and running.spec.runtime_class_name == "gvisor"


def test_accepted_fields_without_runtime_effect_are_echoed_back(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    manifest = make_pod(
        "echoed",
        automountServiceAccountToken=False,
        enableServiceLinks=False,
        nodeSelector={"kubernetes.io/os": "linux"},
        tolerations=[{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
    )

    created = core.create_namespaced_pod(namespace, model(client.V1Pod, manifest))

    spec = created.spec
    assert spec is not None
    assert spec.automount_service_account_token is False and spec.enable_service_links is False
    assert spec.node_selector == {"kubernetes.io/os": "linux"}
    assert spec.tolerations is not None and spec.tolerations[0].key == "sandbox"


def test_equality_selectors_select_the_matching_pods(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    for name, labels in (("a", {"app": "x", "tier": "web"}), ("b", {"app": "y"}), ("c", {"app": "x"})):
        core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod(name, labels=labels, command=["true"])))

    def names(labels: str | None = None, fields: str | None = None) -> list[str]:
        pods = core.list_namespaced_pod(namespace, label_selector=labels, field_selector=fields).items
        return sorted(p.metadata.name for p in pods if p.metadata is not None and p.metadata.name)

    assert names("app=x") == ["a", "c"]
    assert names("app==x,tier=web") == ["a"]
    assert names("") == ["a", "b", "c"]
    assert names(fields="metadata.name=b") == ["b"]


@pytest.mark.parametrize(
    ("labels", "fields"),
    [
        pytest.param("app in (x)", None, id="set-based"),
        pytest.param("app!=x", None, id="inequality"),
        pytest.param(None, "status.phase=Running", id="field-label"),
    ],
)
def test_selectors_the_double_does_not_serve_are_400(
    core: client.CoreV1Api, namespace: str, labels: str | None, fields: str | None
) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod(namespace, label_selector=labels, field_selector=fields)

    assert status_code(caught.value) == 400
    assert _status(caught.value)["reason"] == "BadRequest"


def test_watch_reports_added_modified_and_deleted(core: client.CoreV1Api, namespace: str, make_pod: PodFactory) -> None:
    start = core.list_namespaced_pod(namespace).metadata
    assert start is not None
    core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("watched", command=["true"])))
    wait_for_pod(core, namespace, "watched", phase_is("Succeeded"))
    core.delete_namespaced_pod("watched", namespace, grace_period_seconds=0)

    seen: list[tuple[str, str | None]] = []
    watcher = watch.Watch()
    for kind, pod in watch_events(
        watcher,
        core.list_namespaced_pod,
        namespace,
        resource_version=start.resource_version,
        timeout_seconds=WAIT_SECONDS,
    ):
        assert isinstance(pod, client.V1Pod) and pod.status is not None
        seen.append((kind, pod.status.phase))
        if kind == "DELETED":
            watcher.stop()

    types = [t for t, _ in seen]
    assert types[0] == "ADDED" and types[-1] == "DELETED"
    assert "MODIFIED" in types
    assert ("MODIFIED", "Running") in seen or ("MODIFIED", "Succeeded") in seen


def test_watch_without_resource_version_starts_with_the_current_objects_and_honours_timeout(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("existing")))

    events = list(watch_events(watch.Watch(), core.list_namespaced_pod, namespace, timeout_seconds=1))

    # list() returned: the stream ended after timeoutSeconds; the pod's startup may add MODIFIED events.
    assert [(kind, pod.metadata.name) for kind, pod in events][0] == ("ADDED", "existing")
    assert {kind for kind, _ in events} <= {"ADDED", "MODIFIED"}


def test_graceful_deletion_is_422_and_leaves_the_pod(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    core.create_namespaced_pod(namespace, model(client.V1Pod, make_pod("graceful")))

    with pytest.raises(ApiException) as caught:
        core.delete_namespaced_pod("graceful", namespace, grace_period_seconds=5)

    assert status_code(caught.value) == 422
    assert _status(caught.value)["details"]["causes"][0]["field"] == "gracePeriodSeconds"
    assert core.read_namespaced_pod("graceful", namespace).metadata is not None


def _request(kube: KubeApiDouble, method: str, path: str, *, auth: bool = True) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {kube.token}"} if auth else {}
    request = urllib.request.Request(f"{kube.url}{path}", method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=WAIT_SECONDS) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        ("GET", "/api/v1/namespaces/default/pods/any/log", 404),
        ("GET", "/api/v1", 404),
        ("GET", "/api/v1/namespaces/default", 404),
        ("GET", "/api/v1/namespaces/default/services", 404),
        ("DELETE", "/api/v1/namespaces/default/pods", 405),
        ("PATCH", "/api/v1/namespaces/default/pods/any", 405),
        ("DELETE", "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies/any", 405),
    ],
)
def test_what_the_double_does_not_serve_is_a_404_or_405_status(
    kube: KubeApiDouble, method: str, path: str, code: int
) -> None:
    answer, body = _request(kube, method, path)

    assert (answer, body["kind"], body["code"]) == (code, "Status", code)
    assert body["reason"] == {404: "NotFound", 405: "MethodNotAllowed"}[code]


def test_request_without_the_bearer_token_is_401_status(kube: KubeApiDouble) -> None:
    answer, body = _request(kube, "GET", "/api/v1/namespaces/default/pods", auth=False)

    assert answer == 401
    assert body["kind"] == "Status" and body["reason"] == "Unauthorized" and body["code"] == 401


def test_client_with_a_wrong_token_gets_401(kube: KubeApiDouble) -> None:
    configuration = client.Configuration(host=kube.url, api_key={"authorization": "Bearer wrong"})
    with client.ApiClient(configuration) as api, pytest.raises(ApiException) as caught:
        client.CoreV1Api(api).list_namespaced_pod("default")

    assert status_code(caught.value) == 401


def test_version_is_the_only_discovery_served(api_client: client.ApiClient) -> None:
    assert client.VersionApi(api_client).get_code().major == "1"


def test_stop_removes_every_container_and_volume_it_created(
    docker_client: docker.DockerClient, busybox_image: str, tmp_path: Any, make_pod: PodFactory
) -> None:
    double = KubeApiDouble(docker_client=docker_client).start()
    label = f"k8s-double.instance={double.instance_id}"
    try:
        api = api_client_for(str(double.write_kubeconfig(tmp_path / "config")))
        core = client.CoreV1Api(api)
        claim = {
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }
        core.create_namespaced_persistent_volume_claim("default", model(client.V1PersistentVolumeClaim, claim))
        manifest = make_pod(
            "busy",
            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            container={"volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        )
        run_pod(core, "default", manifest)
        assert exec_in_pod(core, "default", "busy", ["touch", "/data/ready"])[2] == 0
        api.close()
        assert docker_client.containers.list(all=True, filters={"label": label})
        assert docker_client.volumes.list(filters={"label": label})
    finally:
        double.stop()

    assert docker_client.containers.list(all=True, filters={"label": label}) == []
    assert docker_client.volumes.list(filters={"label": label}) == []


LEFTOVER_SCRIPT = """
import json, sys, time, urllib.request
from tests.support.k8s_double import KubeApiDouble

double = KubeApiDouble().start()
container = {"name": "main", "image": sys.argv[1], "command": ["sleep", "3600"]}
pod = {"metadata": {"name": "orphan"}, "spec": {"containers": [container]}}
request = urllib.request.Request(
    f"{double.url}/api/v1/namespaces/default/pods", data=json.dumps(pod).encode(), method="POST",
    headers={"Authorization": f"Bearer {double.token}", "Content-Type": "application/json"},
)
urllib.request.urlopen(request).close()
deadline = time.monotonic() + 60
while double.container_id("orphan") is None:
    if time.monotonic() > deadline:
        sys.exit("the pod did not start")
    time.sleep(0.05)
print(double.instance_id, flush=True)
time.sleep(3600)
"""


def test_remove_leftovers_cleans_up_after_a_double_whose_process_was_killed(
    docker_client: docker.DockerClient, busybox_image: str
) -> None:
    root = Path(__file__).resolve().parents[4]
    child = subprocess.Popen(
        [sys.executable, "-c", LEFTOVER_SCRIPT, busybox_image], cwd=root, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        instance = child.stdout.readline().strip()
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    label: dict[str, str | list[str] | bool] = {"label": f"k8s-double.instance={instance}"}
    assert instance and docker_client.containers.list(all=True, filters=label)

    removed = KubeApiDouble.remove_leftovers(docker_client)

    assert removed >= 1
    assert docker_client.containers.list(all=True, filters=label) == []
