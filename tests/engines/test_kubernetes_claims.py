"""Sandboxes claimed from agent-sandbox warm pools: where the cluster serves the CRDs, the server's sandboxes are
SandboxClaims on a warm pool of its own hardened pod, as hardened from inside as the pods it makes itself; claims
go with their sandboxes, the pool refills, and shutdown and the sweep leave nothing of the server's behind.

Runs against a second API server double with the agent-sandbox CRDs installed (`kube.double(agent_sandbox=True)`);
what those resources do is tested on the double itself (tests/support/k8s_double/tests/test_agent_sandbox.py).
About 10 s in all, the hardening probe's 2 s connection timeout twice among them: the claim path is a second way
every sandbox on a cluster can be made, and these are its only end-to-end proofs in CI.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client, config

from llm_sandbox_mcp.backends import _owner, load_backend
from llm_sandbox_mcp.backends._kubernetes import agent_sandbox as crd
from llm_sandbox_mcp.backends._kubernetes.pod import EXPIRES, PodOptions, pod_manifest
from llm_sandbox_mcp.backends._threaded import Threaded
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.models import SandboxRef, SandboxSpec
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.sessions import SessionRegistry
from tests.engines import kube
from tests.engines.conftest import RecordingBackend, engine_settings, require_now
from tests.engines.test_kubernetes import dead_pid, read
from tests.engines.test_kubernetes_rbac import AGENT_SANDBOX_GROUPS, deployed_role, granted

pytestmark = [pytest.mark.anyio, pytest.mark.kubernetes]

Json = dict[str, Any]
IMAGE = "python:3.12-slim"
# What a sandbox says of itself: who it runs as, what it may do, what it can write, what it can reach.
PROBE = r"""
import json, os, socket
status = dict(line.split(':\t', 1) for line in open('/proc/self/status').read().splitlines() if ':\t' in line)
def attempt(action):
    try:
        action()
        return 'allowed'
    except OSError as exc:
        return type(exc).__name__ + (':' + str(exc.errno) if exc.errno else '')
limits = ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes')  # cgroup v2, v1
def connect():
    with socket.create_connection(('192.0.2.1', 80), timeout=2):
        pass
print(json.dumps({
    'uid': os.getuid(), 'gid': os.getgid(),
    'CapEff': status['CapEff'].strip(), 'NoNewPrivs': status['NoNewPrivs'].strip(),
    'Seccomp': status['Seccomp'].strip(),
    'root': attempt(lambda: open('/probe', 'w')),
    'workspace': attempt(lambda: open('/workspace/probe', 'w')),
    'token': os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token'),
    'memory': open(next(path for path in limits if os.path.exists(path))).read().strip(),
    'network': attempt(connect),
}))
"""
HARDENED = {
    "uid": 65534,
    "gid": 65534,
    "CapEff": "0000000000000000",
    "NoNewPrivs": "1",
    "Seccomp": "2",
    "root": "OSError:30",  # EROFS
    "workspace": "allowed",
    "token": False,
    "memory": str(512 * 1024**2),
    "network": "TimeoutError",  # dropped under the deny-all NetworkPolicy
}


@pytest.fixture
def namespace(request: pytest.FixtureRequest) -> str:
    require_now(request, "kubernetes")
    return f"c-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def api() -> Iterator[client.ApiClient]:
    made = config.new_client_from_config(config_file=str(kube.kubeconfig(agent_sandbox=True)))  # pyright: ignore[reportUnknownMemberType]
    try:
        yield made
    finally:
        made.close()


def settings(namespace: str, agent_sandbox: bool = True, **overrides: Any) -> Settings:
    return engine_settings(
        "kubernetes", **{"namespace": namespace, "kubeconfig": kube.kubeconfig(agent_sandbox), **overrides}
    )


def backend_for(namespace: str, agent_sandbox: bool = True, **overrides: Any) -> Threaded:
    made = load_backend("kubernetes", settings(namespace, agent_sandbox, **overrides))
    assert isinstance(made, Threaded)
    return made


def spec(namespace: str) -> SandboxSpec:
    return SandboxSpec(IMAGE, settings(namespace).limits())


def listed(api: client.ApiClient, kind: tuple[str, str, str], namespace: str) -> list[Json]:
    group, version, plural = kind
    return cast(
        list[Json],
        read(client.CustomObjectsApi(api).list_namespaced_custom_object, group, version, namespace, plural)["items"],
    )


def names(api: client.ApiClient, kind: tuple[str, str, str], namespace: str) -> set[str]:
    return {str(obj["metadata"]["name"]) for obj in listed(api, kind, namespace)}


def pods(api: client.ApiClient, namespace: str) -> list[Json]:
    return cast(list[Json], read(client.CoreV1Api(api).list_namespaced_pod, namespace)["items"])


def eventually(check: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.parametrize("path", ["pods", "claims"])
async def test_a_claimed_sandbox_is_as_hardened_from_inside_as_a_pod_of_the_servers_own(
    namespace: str, path: str
) -> None:
    backend = backend_for(namespace, agent_sandbox=path == "claims")
    try:
        ref = await backend.create(spec(namespace))
        assert ("claimed from warm pools" in await backend.describe()) == (path == "claims")
        result = await backend.exec(ref, ["python3", "-c", PROBE], timeout=60)
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout) == HARDENED
    finally:
        await backend.aclose()


class Claims(RecordingBackend):
    """Records the sandboxes made and destroyed, and checks each is a claim that names its pod when made."""

    def __init__(self, inner: Threaded, api: client.ApiClient, namespace: str) -> None:
        super().__init__(inner)
        self.api, self.namespace = api, namespace
        self.live: set[str] = set()
        self.released: set[str] = set()
        self.made: list[str] = []
        # How the controller gave each claim its sandbox: "warm" (adopted from the pool) or "cold" (started for it).
        self.launches: list[str] = []

    async def create(self, spec: SandboxSpec) -> SandboxRef:
        ref = await super().create(spec)
        claim = next(c for c in listed(self.api, crd.CLAIMS, self.namespace) if c["metadata"]["name"] == ref.id)
        sandbox = crd.claimed_sandbox(claim)
        assert sandbox, claim
        (got,) = [s for s in listed(self.api, crd.SANDBOXES, self.namespace) if s["metadata"]["name"] == sandbox]
        assert [r["uid"] for r in got["metadata"]["ownerReferences"]] == [claim["metadata"]["uid"]]
        self.launches.append(got["metadata"]["labels"]["agents.x-k8s.io/launch-type"])
        self.live.add(ref.id)
        self.made.append(ref.id)
        return ref

    async def destroy(self, ref: SandboxRef) -> None:
        await super().destroy(ref)
        self.live.discard(ref.id)
        self.released.add(ref.id)

    def check(self) -> None:
        """Every sandbox in use is a claim, and no released one is (the server's pool may be claiming ahead)."""
        claims = names(self.api, crd.CLAIMS, self.namespace)
        assert self.live <= claims and not self.released & claims, (self.live, self.released, claims)


async def test_calls_and_a_session_run_in_claims_that_go_with_them_from_a_pool_that_refills(
    namespace: str, api: client.ApiClient
) -> None:
    """One warm sandbox per pool (SANDBOX_POOL_SIZE=1): the server's own pool claims it ahead, the warm pool makes
    another, and what the calls used is released claim by claim."""
    backend = Claims(backend_for(namespace, sandbox_pool_size=1), api, namespace)
    try:
        async with Executor(settings(namespace, sandbox_pool_size=1), backend) as executor:
            first = await executor.execute("print('one')")
            second = await executor.execute("print('two')")
            assert (first.stdout, second.stdout) == ("one\n", "two\n")
            registry = SessionRegistry(executor.settings, executor)
            try:
                session = await registry.create("python", [])
                result = await registry.execute(session.id, "x = 41\nprint(x + 1)", [], 30)
                assert result.stdout == "42\n"
                backend.check()
                await registry.close(session.id)
            finally:
                await registry.aclose()
            backend.check()
            assert backend.released  # the calls' sandboxes and the session's
            # One pool (and template) per kind of pod: the one-shot calls' and the session's, if it differs.
            assert {pool["spec"]["replicas"] for pool in listed(api, crd.WARM_POOLS, namespace)} == {1}

            def refilled() -> bool:
                return all(
                    p.get("status", {}).get("readyReplicas") == 1 for p in listed(api, crd.WARM_POOLS, namespace)
                )

            eventually(refilled, "a warm pool did not make a ready sandbox again after its one was claimed")
            assert "warm" in backend.launches  # claims took the pool's sandboxes
            for template in listed(api, crd.TEMPLATES, namespace):
                labels = template["metadata"]["labels"]
                assert labels[_owner.MANAGED] == "true" and labels[_owner.INSTANCE] == _owner.INSTANCE_ID
                assert template["spec"]["networkPolicyManagement"] == "Unmanaged"
            assert len(backend.made) >= 4  # two calls, the session, and at least one made ahead
    finally:
        await backend.aclose()
    for kind in (crd.CLAIMS, crd.WARM_POOLS, crd.TEMPLATES):
        assert listed(api, kind, namespace) == []
    eventually(lambda: pods(api, namespace) == [], "the pods of released claims and of the pool were not deleted")


async def test_the_sweep_removes_claims_pools_and_templates_of_dead_servers_and_off_makes_pods(
    namespace: str, api: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(api)
    owner = _owner.owner_labels()
    dead = {**owner, _owner.INSTANCE: "dead00000000", _owner.PID: str(dead_pid()), _owner.STARTED: "1"}
    foreign = {**owner, _owner.INSTANCE: "elsewhere000", _owner.HOST: "another-host"}
    expires = str(int(time.time()) + 3600)
    pod = pod_manifest("unused", spec(namespace), {}, {}, PodOptions())
    for who, labels in (("dead", dead), ("foreign", foreign)):
        annotations = {**labels, EXPIRES: expires}
        for kind, manifest in (
            (crd.TEMPLATES, crd.template_manifest(who, pod, labels, annotations)),
            (crd.WARM_POOLS, crd.pool_manifest(who, who, 0, labels, annotations)),
            (crd.CLAIMS, crd.claim_manifest(who, "no-such-pool", labels, annotations)),  # so it makes no pod
        ):
            custom.create_namespaced_custom_object(*kind[:2], namespace, kind[2], manifest)  # pyright: ignore[reportUnknownMemberType]
    backend = backend_for(namespace)
    try:
        assert await backend.sweep() == 3
        for kind in (crd.CLAIMS, crd.WARM_POOLS, crd.TEMPLATES):
            assert names(api, kind, namespace) == {"foreign"}
    finally:
        await backend.aclose()

    off = backend_for(namespace, sandbox_k8s_sandbox_claims="off")
    try:
        ref = await off.create(spec(namespace))
        assert "SANDBOX_K8S_SANDBOX_CLAIMS=off" in await off.describe()
        (made,) = [p for p in pods(api, namespace) if p["metadata"]["name"] == ref.id]
        assert not made["metadata"].get("ownerReferences")  # a pod of the server's own
        assert names(api, crd.CLAIMS, namespace) == {"foreign"}
    finally:
        await off.aclose()


async def test_a_role_without_the_claim_rules_is_a_clear_error_naming_the_way_back_to_pods(
    namespace: str, tmp_path: Path
) -> None:
    role = deployed_role()
    role["rules"] = [rule for rule in role["rules"] if not set(rule["apiGroups"]) & set(AGENT_SANDBOX_GROUPS)]
    _, kubeconfig = granted(role, namespace, tmp_path, agent_sandbox=True)
    backend = backend_for(namespace, kubeconfig=kubeconfig)
    try:
        with pytest.raises(SandboxFailure) as refused:
            await backend.create(spec(namespace))
        message = str(refused.value)
        assert "is forbidden" in message and "deploy/kubernetes/rbac.yaml" in message
        assert "SANDBOX_K8S_SANDBOX_CLAIMS=off" in message
    finally:
        await backend.aclose()
