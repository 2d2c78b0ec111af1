"""The pod spec reaches Docker faithfully: security context, resources, env, working dir."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from .conftest import PodFactory
from .pods import exec_in_pod, model, phase_is, run_pod, wait_for_pod

pytestmark = pytest.mark.kubernetes

HARDENED: dict[str, Any] = {
    "runAsUser": 1234,
    "runAsGroup": 2345,
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _status_field(core: client.CoreV1Api, namespace: str, pod: str, field: str) -> str:
    out, _, _ = exec_in_pod(core, namespace, pod, ["grep", f"^{field}:", "/proc/self/status"])
    return out.split(":", 1)[1].strip()


def test_hardened_security_context_is_enforced_inside_the_pod(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    run_pod(core, namespace, make_pod("hardened", container={"securityContext": HARDENED}))

    assert exec_in_pod(core, namespace, "hardened", ["id", "-u"])[0] == "1234\n"
    assert exec_in_pod(core, namespace, "hardened", ["id", "-g"])[0] == "2345\n"
    _, err, returncode = exec_in_pod(core, namespace, "hardened", ["touch", "/probe"])
    assert returncode != 0 and "Read-only file system" in err
    assert _status_field(core, namespace, "hardened", "CapEff") == "0000000000000000"
    assert _status_field(core, namespace, "hardened", "CapBnd") == "0000000000000000"
    assert _status_field(core, namespace, "hardened", "NoNewPrivs") == "1"
    assert _status_field(core, namespace, "hardened", "Seccomp") == "2"


def test_container_security_context_wins_over_the_pod_level(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    manifest = make_pod(
        "layered",
        securityContext={"runAsUser": 1000, "runAsGroup": 1000, "supplementalGroups": [4000]},
        container={"securityContext": {"runAsUser": 2000}},
    )
    run_pod(core, namespace, manifest)

    out, _, _ = exec_in_pod(core, namespace, "layered", ["id"])

    assert out.startswith("uid=2000 gid=1000") and "4000" in out


def test_root_container_without_a_security_context_keeps_default_capabilities_and_no_seccomp(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    run_pod(core, namespace, make_pod("plain"))

    assert exec_in_pod(core, namespace, "plain", ["id", "-u"])[0] == "0\n"
    assert _status_field(core, namespace, "plain", "CapEff") != "0000000000000000"
    # The kubelet's default (no --seccomp-default) is Unconfined, not the runtime's profile.
    assert _status_field(core, namespace, "plain", "Seccomp") == "0"


def test_run_as_non_root_with_a_non_root_user_runs(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    pod = run_pod(core, namespace, make_pod("nonroot", securityContext={"runAsNonRoot": True, "runAsUser": 65534}))

    assert pod.status is not None and pod.status.phase == "Running"


def test_memory_and_cpu_limits_are_the_container_cgroup_limits(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    limits = {"memory": "64Mi", "cpu": "500m", "ephemeral-storage": "1Gi"}
    created = core.create_namespaced_pod(
        namespace, model(client.V1Pod, make_pod("limited", container={"resources": {"limits": limits}}))
    )
    wait_for_pod(core, namespace, "limited", phase_is("Running"))

    memory, _, _ = exec_in_pod(
        core,
        namespace,
        "limited",
        ["sh", "-c", "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"],
    )
    cpu, _, _ = exec_in_pod(
        core,
        namespace,
        "limited",
        ["sh", "-c", "cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us"],
    )

    assert memory.strip() == str(64 * 1024 * 1024)
    assert cpu.split()[0] == "50000"
    assert created.status is not None and created.status.qos_class == "Guaranteed"


def test_memory_limit_kills_a_process_that_exceeds_it(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    # `sed` holds the whole newline-free 100 MB line in memory.
    manifest = make_pod("hungry", command=["sh", "-c", "head -c 100000000 /dev/zero | tr '\\0' x | sed 's/x/y/'"])
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"memory": "16Mi"}}
    core.create_namespaced_pod(namespace, model(client.V1Pod, manifest))

    pod = wait_for_pod(core, namespace, "hungry", phase_is("Failed", "Succeeded"))

    assert pod.status is not None and pod.status.phase == "Failed"
    assert pod.status.container_statuses is not None and pod.status.container_statuses[0].state is not None
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated is not None and terminated.exit_code == 137


def test_env_and_working_dir_reach_the_processes_of_the_pod(
    core: client.CoreV1Api, namespace: str, make_pod: PodFactory
) -> None:
    env = [{"name": "WHO", "value": "pod"}, {"name": "GREETING", "value": "hi"}]
    run_pod(core, namespace, make_pod("env", container={"env": env, "workingDir": "/tmp"}))

    out, _, _ = exec_in_pod(core, namespace, "env", ["sh", "-c", 'echo "$GREETING $WHO"; pwd'])

    assert out == "hi pod\n/tmp\n"
