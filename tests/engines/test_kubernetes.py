"""What is specific to the Kubernetes backend, read back from the API: the pod we send, the NetworkPolicy, the
library cache claim, exec over both WebSocket protocols, pods that cannot start, the sweep.

Runs against the API server test double (tests/support/k8s_double) with the real `kubernetes` client; the contract and
sessions suites cover everything the backend shares with the other engines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, cast

import anyio
import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import ws_client

from llm_sandbox_mcp.backends import _owner, load_backend
from llm_sandbox_mcp.backends._container import CACHE_PREFIX, INIT
from llm_sandbox_mcp.backends._kubernetes import KubernetesEngine
from llm_sandbox_mcp.backends._kubernetes import api as k8s_api
from llm_sandbox_mcp.backends._kubernetes.exec import ExecStream
from llm_sandbox_mcp.backends._kubernetes.pod import EXPIRES, NETWORK_LABEL, POLICY_NAME, PodOptions, pod_manifest
from llm_sandbox_mcp.backends._threaded import Threaded
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable, ImageMissing, SandboxFailure
from llm_sandbox_mcp.models import CacheMount, SandboxSpec
from tests.engines import kube
from tests.engines.conftest import engine_settings, require_now
from tests.engines.test_kubernetes_rbac import deployed_role, granted
from tests.hostile.test_boundary import STOP_NEWCOMERS
from tests.support.survivors import LISTING, survivors

pytestmark = [pytest.mark.anyio, pytest.mark.kubernetes]

Json = dict[str, Any]
IMAGE = "python:3.12-slim"


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    """A namespace of its own (every name exists in the double), so lists and policies see only this test."""
    require_now(request, "kubernetes")
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def core(namespace: str) -> Iterator[Any]:
    api = config.new_client_from_config(config_file=str(kube.kubeconfig()))  # pyright: ignore[reportUnknownMemberType]
    core = client.CoreV1Api(api)
    try:
        yield core
    finally:
        # Pods a test made itself (as a foreign server would) go with the test, not at the end of the run.
        for pod in read(core.list_namespaced_pod, namespace)["items"]:
            with contextlib.suppress(ApiException):  # already gone
                core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)
        api.close()


def settings(namespace: str, **overrides: Any) -> Settings:
    return engine_settings("kubernetes", namespace=namespace, **overrides)


@pytest.fixture
async def backend(namespace: str) -> AsyncIterator[Threaded]:
    made = load_backend("kubernetes", settings(namespace))
    assert isinstance(made, Threaded) and isinstance(made.engine, KubernetesEngine)
    try:
        yield made
    finally:
        await made.aclose()


def spec(namespace: str, **overrides: Any) -> SandboxSpec:
    return SandboxSpec(IMAGE, settings(namespace, **overrides).limits())


def read(call: Any, *args: Any) -> Json:
    return cast(Json, json.loads(call(*args, _preload_content=False).data))


def container_of(pod: Json) -> Json:
    (container,) = pod["spec"]["containers"]
    return cast(Json, container)


async def test_the_pod_is_hardened_limited_and_labelled(backend: Threaded, core: Any, namespace: str) -> None:
    ref = await backend.create(spec(namespace))
    pod = read(core.read_namespaced_pod, ref.id, namespace)
    pod_spec, container = pod["spec"], container_of(pod)

    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["automountServiceAccountToken"] is False and pod_spec["enableServiceLinks"] is False
    assert not pod_spec["hostNetwork"] and not pod_spec["hostPID"] and not pod_spec["hostIPC"]
    assert pod_spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65534,
        "runAsGroup": 65534,
        "fsGroup": 65534,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["command"] == INIT and container["workingDir"] == "/workspace"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "seccompProfile": {"type": "Localhost", "localhostProfile": "llm-sandbox-mcp.json"},
        "runAsNonRoot": True,
        "runAsUser": 65534,
        "runAsGroup": 65534,
        "readOnlyRootFilesystem": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    amounts = {"cpu": "1000m", "memory": str(512 * 1024**2), "ephemeral-storage": str((64 + 256) * 1024**2)}
    assert container["resources"] == {"requests": amounts, "limits": amounts}
    assert pod["status"]["qosClass"] == "Guaranteed"
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    assert volumes["workspace"]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(256 * 1024**2)}
    assert volumes["tmp"]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(64 * 1024**2)}
    assert {(m["name"], m["mountPath"]) for m in container["volumeMounts"]} == {
        ("workspace", "/workspace"),
        ("tmp", "/tmp"),
    }
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels[_owner.MANAGED] == "true" and labels[_owner.INSTANCE] == _owner.INSTANCE_ID
    assert labels[NETWORK_LABEL] == "none"
    assert annotations[_owner.PID] == labels[_owner.PID]
    assert int(annotations[EXPIRES]) >= time.time() + 24 * 3600 - 60


async def test_sandbox_settings_map_to_the_pod_spec(core: Any, namespace: str) -> None:
    loose = settings(
        namespace,
        sandbox_read_only=False,
        sandbox_network_mode="bridge",
        sandbox_cap_drop=["NET_RAW", "cap_mknod"],
        sandbox_security_opt=["seccomp=unconfined"],
        sandbox_cpus=0.5,
        sandbox_mem_limit="256m",
    )
    backend = load_backend("kubernetes", loose)
    try:
        ref = await backend.create(SandboxSpec(IMAGE, loose.limits()))
        pod = read(core.read_namespaced_pod, ref.id, namespace)
    finally:
        await backend.aclose()
    context, resources = container_of(pod)["securityContext"], container_of(pod)["resources"]["limits"]
    assert context["readOnlyRootFilesystem"] is False and context["allowPrivilegeEscalation"] is True
    assert context["capabilities"] == {"drop": ["NET_RAW", "MKNOD"]}
    assert context["seccompProfile"] == {"type": "Unconfined"}
    assert resources["cpu"] == "500m" and resources["memory"] == str(256 * 1024**2)
    assert NETWORK_LABEL not in pod["metadata"]["labels"]


async def test_a_seccomp_profile_missing_from_the_node_stops_the_pod_with_the_reason(namespace: str) -> None:
    missing = settings(namespace, sandbox_k8s_seccomp_profile="localhost/not-installed.json")
    backend = load_backend("kubernetes", missing)
    try:
        with pytest.raises(SandboxFailure, match=r"cannot start its container .*not-installed\.json"):
            await backend.create(SandboxSpec(IMAGE, missing.limits()))
    finally:
        await backend.aclose()


async def test_runtime_class_node_selector_and_template_merge_under_our_security_fields(
    core: Any, namespace: str, tmp_path: Path
) -> None:
    template = tmp_path / "pod.yaml"
    template.write_text(
        "apiVersion: v1\nkind: Pod\n"
        "metadata:\n  name: ignored\n  labels: {team: data, llm-sandbox-mcp.managed: 'no'}\n"
        "  annotations: {owner: platform}\n"
        "spec:\n"
        "  priorityClassName: ''\n"
        "  tolerations: [{key: sandbox, operator: Equal, value: 'true', effect: NoSchedule}]\n"
        "  nodeSelector: {disk: ssd, pool: general}\n"
        "  securityContext: {runAsUser: 0, supplementalGroups: [4242]}\n"
        "  containers:\n"
        "  - name: sandbox\n"
        "    imagePullPolicy: Never\n"
        "    env: [{name: TEAM, value: data}, {name: HOME, value: /root}]\n"
        "    securityContext: {readOnlyRootFilesystem: false, privileged: true, runAsUser: 0}\n"
        "    resources: {limits: {memory: 64Gi, example.com/widget: '1'}}\n"
    )
    configured = settings(
        namespace,
        sandbox_k8s_runtime_class="gvisor",
        sandbox_k8s_node_selector="pool=sandbox,kubernetes.io/arch=amd64",
        sandbox_k8s_pod_template=template,
    )
    backend = load_backend("kubernetes", configured)
    try:
        ref = await backend.create(SandboxSpec(IMAGE, configured.limits()))
        pod = read(core.read_namespaced_pod, ref.id, namespace)
        result = await backend.exec(ref, ["sh", "-c", "id -G; echo $TEAM $HOME"], timeout=30)
    finally:
        await backend.aclose()
    pod_spec, container = pod["spec"], container_of(pod)
    assert pod_spec["runtimeClassName"] == "gvisor"
    assert pod_spec["nodeSelector"] == {"disk": "ssd", "pool": "sandbox", "kubernetes.io/arch": "amd64"}
    assert pod_spec["tolerations"] == [{"key": "sandbox", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]
    assert pod_spec["securityContext"]["runAsUser"] == 65534 and pod_spec["securityContext"]["supplementalGroups"] == [
        4242
    ]
    assert container["imagePullPolicy"] == "Never"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["privileged"] is False and container["securityContext"]["runAsUser"] == 65534
    assert container["env"] == [{"name": "TEAM", "value": "data"}, {"name": "HOME", "value": "/tmp"}]
    assert container["resources"]["limits"]["memory"] == str(512 * 1024**2)
    assert container["resources"]["limits"]["example.com/widget"] == "1"
    assert pod["metadata"]["name"] == ref.id
    assert pod["metadata"]["labels"]["team"] == "data" and pod["metadata"]["labels"][_owner.MANAGED] == "true"
    assert pod["metadata"]["annotations"]["owner"] == "platform"
    assert result.stdout.decode().split() == ["65534", "4242", "data", "/tmp"]


@pytest.mark.parametrize(
    ("manifest", "problem"),
    [
        ("spec: {containers: [{name: sidecar, image: proxy}]}", "containers other than 'sandbox' (sidecar)"),
        ("spec: {hostNetwork: true}", "`hostNetwork` must not be set"),
        ("spec: {volumes: [{name: docker, hostPath: {path: /var/run}}]}", "'docker' is a hostPath"),
        ("[1, 2]", "is not a Pod manifest"),
    ],
)
def test_a_template_that_would_weaken_the_sandbox_is_refused_at_start(
    tmp_path: Path, manifest: str, problem: str
) -> None:
    template = tmp_path / "pod.yaml"
    template.write_text(manifest)
    with pytest.raises(BackendUnavailable, match="SANDBOX_K8S_POD_TEMPLATE") as caught:
        load_backend("kubernetes", Settings(backend="kubernetes", sandbox_k8s_pod_template=template))
    assert problem in str(caught.value)


def test_a_security_option_without_a_kubernetes_meaning_is_refused_at_start() -> None:
    with pytest.raises(BackendUnavailable, match="'label=disable' has no Kubernetes equivalent"):
        load_backend("kubernetes", Settings(backend="kubernetes", sandbox_security_opt=["label=disable"]))


def test_node_selector_is_key_value_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SANDBOX_K8S_NODE_SELECTOR", "pool=sandbox, kubernetes.io/arch=amd64")
    assert Settings().sandbox_k8s_node_selector == {"pool": "sandbox", "kubernetes.io/arch": "amd64"}
    monkeypatch.setenv("SANDBOX_K8S_NODE_SELECTOR", "pool")
    with pytest.raises(ValueError, match="key=value pairs"):
        Settings()


async def test_the_deny_all_network_policy_is_created_at_first_use(
    backend: Threaded, core: Any, namespace: str
) -> None:
    assert "not yet created" in await backend.describe()
    await backend.create(spec(namespace))
    networking = client.NetworkingV1Api(core.api_client)
    policy = read(networking.read_namespaced_network_policy, POLICY_NAME, namespace)
    assert policy["spec"]["podSelector"] == {"matchLabels": {NETWORK_LABEL: "none"}}
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]
    description = await backend.describe()
    assert description.startswith("Kubernetes v1.") and f"namespace {namespace}" in description
    assert f"NetworkPolicy {POLICY_NAME} in place" in description


def _without_leave_for_network_policies(namespace: str, tmp_path: Path, **overrides: Any) -> Threaded:
    """A backend whose identity has the deployed Role but for the NetworkPolicy rule: the double answers 403."""
    role = deployed_role()
    role["rules"] = [rule for rule in role["rules"] if "networkpolicies" not in rule["resources"]]
    _, kubeconfig = granted(role, namespace, tmp_path)
    made = load_backend("kubernetes", settings(namespace, kubeconfig=kubeconfig, **overrides))
    assert isinstance(made, Threaded)
    return made


async def test_without_the_network_policy_sandboxes_meant_to_have_no_network_are_refused(
    namespace: str, tmp_path: Path, core: Any
) -> None:
    backend = _without_leave_for_network_policies(namespace, tmp_path)
    try:
        with pytest.raises(SandboxFailure, match="SANDBOX_K8S_ALLOW_NO_NETWORK_POLICY=true") as refused:
            await backend.create(spec(namespace))
        assert "is forbidden" in str(refused.value) and "deploy/kubernetes/rbac.yaml" in str(refused.value)
        assert read(core.list_namespaced_pod, namespace)["items"] == []
        # A sandbox given network on purpose (an installer given SANDBOX_INSTALL_NETWORK_MODE) does not depend on it.
        installer = await backend.create(spec(namespace, sandbox_network_mode="bridge"))
        assert (await backend.exec(installer, ["true"], timeout=30)).exit_code == 0
    finally:
        await backend.aclose()


async def test_an_operator_who_accepts_the_clusters_network_is_warned_once_and_sandboxes_start(
    namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = _without_leave_for_network_policies(namespace, tmp_path, sandbox_k8s_allow_no_network_policy=True)
    try:
        with caplog.at_level(logging.WARNING):
            first = await backend.create(spec(namespace))
            await backend.create(spec(namespace))
        warnings = [r.getMessage() for r in caplog.records if "NetworkPolicy" in r.getMessage()]
        assert len(warnings) == 1 and "default network" in warnings[0]
        assert "deploy/kubernetes/rbac.yaml" in warnings[0]
        assert (await backend.exec(first, ["true"], timeout=30)).exit_code == 0
    finally:
        await backend.aclose()


async def test_sandbox_pods_end_at_their_deadline_and_can_ask_for_their_own_user_namespace(
    namespace: str, core: Any
) -> None:
    backend = load_backend("kubernetes", settings(namespace, sandbox_k8s_host_users=False))
    try:
        ref = await backend.create(spec(namespace))
        pod = read(core.read_namespaced_pod, ref.id, namespace)
        assert pod["spec"]["activeDeadlineSeconds"] >= 24 * 3600
        assert pod["spec"]["hostUsers"] is False
    finally:
        await backend.aclose()


@pytest.mark.parametrize("code", [0, 3, 137])
async def test_exit_codes_come_from_the_status_channel(backend: Threaded, namespace: str, code: int) -> None:
    ref = await backend.create(spec(namespace))
    script = "kill -9 $$" if code == 137 else f"echo out; echo err >&2; exit {code}"
    result = await backend.exec(ref, ["sh", "-c", script], timeout=30)
    assert result.exit_code == code and not result.timed_out
    if code != 137:
        assert (result.stdout, result.stderr) == (b"out\n", b"err\n")


async def test_env_and_workdir_reach_the_process_uninterpreted(backend: Threaded, namespace: str) -> None:
    ref = await backend.create(spec(namespace))
    tricky = "$(id) `id` ; rm -rf / | & $HOME 'quoted' \"dq\"\nline2"
    await backend.exec(ref, ["mkdir", "-p", "/workspace/a dir; $(x)"], timeout=30)
    result = await backend.exec(
        ref,
        [
            "python3",
            "-c",
            "import os, sys; print(os.getcwd()); print(os.environ['TRICKY']); print(sys.argv[1:])",
            tricky,
        ],
        env={"TRICKY": tricky},
        workdir=PurePosixPath("/workspace/a dir; $(x)"),
        timeout=30,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode() == f"/workspace/a dir; $(x)\n{tricky}\n{[tricky]!r}\n"
    missing = await backend.exec(ref, ["true"], workdir=PurePosixPath("/nowhere"), timeout=30)
    assert missing.exit_code == 126 and b"nowhere" in missing.stderr


async def test_stdin_ends_over_the_v5_and_the_v4_protocol(
    backend: Threaded, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    protocols: list[str | None] = []

    class Recording(ExecStream):
        def __init__(self, ws: Any, protocol: str | None) -> None:
            protocols.append(protocol)
            super().__init__(ws, protocol)

    monkeypatch.setattr(k8s_api, "ExecStream", Recording)
    ref = await backend.create(spec(namespace))
    payload = bytes(range(256)) * 4096  # 1 MiB, every byte value
    v5 = await backend.exec(ref, ["sh", "-c", "wc -c"], stdin=payload, timeout=30)
    assert (v5.exit_code, v5.stdout.strip()) == (0, str(len(payload)).encode())
    # An older API server speaks v4, which cannot signal end of stdin; the command still gets end of file.
    monkeypatch.setattr(ws_client, "V5_CHANNEL_PROTOCOL", ws_client.V4_CHANNEL_PROTOCOL)
    v4 = await backend.exec(ref, ["sh", "-c", "wc -c"], stdin=payload, timeout=30)
    assert (v4.exit_code, v4.stdout.strip(), v4.timed_out) == (0, str(len(payload)).encode(), False)
    echoed = await backend.exec(ref, ["cat"], stdin=b"no newline at the end", timeout=30)
    assert echoed.stdout == b"no newline at the end"
    assert protocols == ["v5.channel.k8s.io", "v4.channel.k8s.io", "v4.channel.k8s.io"]


async def test_a_missing_image_is_a_clear_error_and_leaves_no_pod(backend: Threaded, core: Any, namespace: str) -> None:
    with pytest.raises(ImageMissing, match="cannot pull image 'no-such-image:1' .*ErrImagePull"):
        await backend.create(SandboxSpec("no-such-image:1", settings(namespace).limits()))
    assert read(core.list_namespaced_pod, namespace)["items"] == []


async def test_a_pod_that_cannot_be_scheduled_fails_at_the_start_timeout_with_the_reason(
    core: Any, namespace: str
) -> None:
    backend = load_backend("kubernetes", settings(namespace, sandbox_k8s_start_timeout=2))
    try:
        with pytest.raises(
            SandboxFailure, match=r"did not start within 2 s .*Unschedulable.*llm-sandbox-mcp-libs-gone"
        ):
            await backend.create(SandboxSpec(IMAGE, settings(namespace).limits(), CacheMount("gone")))
    finally:
        await backend.aclose()
    assert read(core.list_namespaced_pod, namespace)["items"] == []


async def test_the_library_cache_is_a_claim_mounted_read_write_to_install_and_read_only_to_run(
    backend: Threaded, core: Any, namespace: str
) -> None:
    limits = settings(namespace).limits()
    installer = await backend.create(SandboxSpec(IMAGE, limits, CacheMount("k1", writable=True)))
    written = await backend.exec(installer, ["sh", "-c", "echo lib > /opt/llm-sandbox/libs/x && id -u"], timeout=30)
    assert written.exit_code == 0, written.stderr
    await backend.destroy(installer)
    runner = await backend.create(SandboxSpec(IMAGE, limits, CacheMount("k1")))
    read_back = await backend.exec(
        runner, ["sh", "-c", "cat /opt/llm-sandbox/libs/x; touch /opt/llm-sandbox/libs/y"], timeout=30
    )
    assert read_back.stdout == b"lib\n" and b"Read-only file system" in read_back.stderr

    claim = read(core.read_namespaced_persistent_volume_claim, CACHE_PREFIX + "k1", namespace)
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == str(2 * 1024**3)
    assert claim["metadata"]["labels"][_owner.KIND] == "library-cache"
    pod = read(core.read_namespaced_pod, runner.id, namespace)
    (volume,) = [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert volume["persistentVolumeClaim"] == {"claimName": CACHE_PREFIX + "k1", "readOnly": True}

    await backend.destroy(runner)
    await backend.drop_cache("k1")
    await backend.drop_cache("k1")  # idempotent
    # Deleted, or (pvc-protection) deleting until the last pod that used it is gone.
    claims = read(core.list_namespaced_persistent_volume_claim, namespace)["items"]
    assert all(claim["metadata"].get("deletionTimestamp") for claim in claims)


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


async def test_sweep_removes_pods_of_dead_owners_and_expired_foreign_ones_only(
    backend: Threaded, core: Any, namespace: str
) -> None:
    now = int(time.time())
    owner = _owner.owner_labels()
    dead = {**owner, _owner.INSTANCE: "dead00000000", _owner.PID: str(dead_pid()), _owner.STARTED: "1"}
    foreign = {**owner, _owner.INSTANCE: "elsewhere000", _owner.HOST: "another-host"}
    pods = {
        "dead-owner": (dead, now + 3600),
        "foreign-expired": (foreign, now - 60),
        "foreign-current": (foreign, now + 3600),
    }
    for name, (labels, expires) in pods.items():
        manifest = pod_manifest(name, spec(namespace), labels, {**labels, EXPIRES: str(expires)}, PodOptions())
        core.create_namespaced_pod(namespace, manifest, _preload_content=False)
    mine = await backend.create(spec(namespace))

    assert await backend.sweep() == 2
    remaining = {p["metadata"]["name"] for p in read(core.list_namespaced_pod, namespace)["items"]}
    assert remaining == {"foreign-current", mine.id}


async def test_destroy_is_idempotent_and_a_destroyed_sandbox_is_gone(backend: Threaded, namespace: str) -> None:
    ref = await backend.create(spec(namespace))
    await backend.destroy(ref)
    await backend.destroy(ref)
    with pytest.raises(SandboxFailure, match="is gone"):
        await backend.exec(ref, ["true"], timeout=10)
    with pytest.raises(SandboxFailure, match="is gone"):
        await backend.start(ref, ["cat"])


async def test_a_process_keeps_its_pipes_open_until_closed(backend: Threaded, namespace: str) -> None:
    ref = await backend.create(spec(namespace))
    process = await backend.start(ref, ["sh", "-c", "echo ready; echo warn >&2; cat"], env={"X": "1"})
    try:
        assert await process.receive(10) == b"ready\n"
        assert await process.receive(0.2) is None
        await process.send(b"ping\n")
        assert await process.receive(10) == b"ping\n"
        assert process.stderr_tail() == b"warn\n"
    finally:
        await process.aclose()
    await backend.kill_all(ref)
    listing = await backend.exec(ref, ["sh", "-c", LISTING], timeout=10)
    assert survivors(listing.stdout) == []


def test_unreachable_or_unconfigured_clusters_are_unavailable(tmp_path: Path) -> None:
    missing = load_backend("kubernetes", Settings(backend="kubernetes", kubeconfig=tmp_path / "nope"))
    with pytest.raises(BackendUnavailable, match="KUBECONFIG=.*nope"):
        anyio.run(missing.describe)
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    down = load_backend("kubernetes", Settings(backend="kubernetes", kubeconfig=kubeconfig))
    with pytest.raises(BackendUnavailable, match=r"API server at http://127.0.0.1:9 .* does not answer"):
        anyio.run(down.describe)
    anyio.run(down.aclose)


async def test_a_kill_that_the_pods_own_code_stops_still_ends_everything(
    backend: Threaded, core: Any, namespace: str
) -> None:
    """The API cannot signal a container, so the kill of a timed-out call is a request run inside the pod, which
    the pod's code may stop (SIGSTOP) like every new process. The kill does not depend on it: stopped before it
    becomes the request, PID 1 lets it go on (a stopped `runc init` held every call on the container, the
    request's own included); stopped after, it is not proven within its bound and the pod is deleted (grace 0).
    Either way nothing of the code is left, and the kill returns."""
    ref = await backend.create(spec(namespace))
    stopper = await backend.start(ref, ["python3", "-u", "-c", "print('armed')\n" + STOP_NEWCOMERS])
    try:
        heard = b""
        while b"armed" not in heard:
            chunk = await stopper.receive(30)
            assert chunk, "the stopper did not start"
            heard += chunk
        with anyio.fail_after(120):  # a bound on a hang, not a timing assertion
            await backend.kill_all(ref)
            while await stopper.receive(1) != b"":  # until the stopper's stream ends: it was killed
                pass
    finally:
        await stopper.aclose()
    pods = read(core.list_namespaced_pod, namespace)["items"]
    if not any(p["metadata"]["name"] == ref.id and not p["metadata"].get("deletionTimestamp") for p in pods):
        return  # deleted
    listing = await backend.exec(ref, ["sh", "-c", LISTING], timeout=30)
    assert survivors(listing.stdout) == []
