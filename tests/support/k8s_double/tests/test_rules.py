"""The double's pure rules, table-driven: selectors, quantities, the kubelet's checks, policies, exec frames."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.support.k8s_double.errors import ApiError
from tests.support.k8s_double.exec_ws import exit_status, negotiate
from tests.support.k8s_double.quantity import QuantityError, to_bytes, to_nano_cpus
from tests.support.k8s_double.selectors import matches_labels, parse_selector
from tests.support.k8s_double.store import PODS, Store
from tests.support.k8s_double.translate import (
    ContainerConfigError,
    RuntimeOptions,
    egress_denied,
    plan_container,
    verify_run_as_non_root,
)


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ("app=web", {"app": "web"}, True),
        ("app==web", {"app": "db"}, False),
        ("app=web", {}, False),
        ("app=web, tier=", {"app": "web", "tier": ""}, True),
        ("example.com/owner=me", {"example.com/owner": "me"}, True),
        ("", {"anything": "at all"}, True),
    ],
)
def test_equality_label_selectors(selector: str, labels: dict[str, str], matches: bool) -> None:
    assert matches_labels(parse_selector(selector), labels) is matches


@pytest.mark.parametrize("selector", ["app in (web)", "app!=web", "tier", "!tier", "n>3", "=x", "a=b=c"])
def test_selectors_other_than_equality_are_a_400(selector: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_selector(selector)

    assert caught.value.code == 400


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        ("128Mi", 128 * 2**20),
        ("1Gi", 2**30),
        ("500k", 500_000),
        ("1M", 10**6),
        ("1e3", 1000),
        (512, 512),
        ("0.5Ki", 512),
    ],
)
def test_memory_quantities_in_bytes(quantity: str | int, expected: int) -> None:
    assert to_bytes(quantity) == expected


@pytest.mark.parametrize(("quantity", "expected"), [("500m", 500_000_000), ("2", 2_000_000_000), ("0.25", 250_000_000)])
def test_cpu_quantities_in_nano_cpus(quantity: str, expected: int) -> None:
    assert to_nano_cpus(quantity) == expected


@pytest.mark.parametrize("quantity", ["128K", "12 Mi", "Mi", "1.2.3", "-"])
def test_quantities_kubernetes_rejects(quantity: str) -> None:
    with pytest.raises(QuantityError):
        to_bytes(quantity)


def _pod(**security: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"securityContext": security, "containers": [{"name": "main", "image": "img"}]},
    }


@pytest.mark.parametrize(
    ("security", "image_user", "message"),
    [
        ({"runAsNonRoot": True}, "", "image will run as root"),
        ({"runAsNonRoot": True}, "0", "image will run as root"),
        ({"runAsNonRoot": True}, "app", "image has non-numeric user (app)"),
        ({"runAsNonRoot": True, "runAsUser": 0}, "1000", "runAsUser breaks non-root policy"),
        ({"runAsNonRoot": True}, "1000:1000", None),
        ({"runAsNonRoot": True, "runAsUser": 10}, "", None),
        ({}, "", None),
    ],
)
def test_run_as_non_root_check_matches_the_kubelet(
    security: dict[str, Any], image_user: str, message: str | None
) -> None:
    pod = _pod(**security)
    if message is None:
        verify_run_as_non_root(pod, pod["spec"]["containers"][0], image_user)
        return
    with pytest.raises(ContainerConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        verify_run_as_non_root(pod, pod["spec"]["containers"][0], image_user)


def _plan(pod: dict[str, Any], **options: Any) -> dict[str, Any]:
    return plan_container(
        pod,
        pod["spec"]["containers"][0],
        name="c",
        image_config={"User": "", "Env": ["PATH=/bin"]},
        backings={},
        network_mode="none",
        labels={},
        options=RuntimeOptions(**options),
    ).kwargs


def test_seccomp_follows_the_kubelet_default_unless_the_pod_asks() -> None:
    assert _plan(_pod())["security_opt"] == ["seccomp=unconfined"]
    assert _plan(_pod(seccompProfile={"type": "RuntimeDefault"}))["security_opt"] is None


@pytest.mark.parametrize("field", ["command", "args", "env"])
def test_variable_references_are_refused_not_expanded(field: str) -> None:
    pod = _pod()
    value = "$(HOME)/x"
    pod["spec"]["containers"][0][field] = [{"name": "X", "value": value}] if field == "env" else [value]

    with pytest.raises(ContainerConfigError, match=r"\$\(VAR\) references are not expanded"):
        _plan(pod)


def test_a_localhost_seccomp_profile_is_read_from_the_nodes_seccomp_directory(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "p.json").write_text('{"defaultAction": "SCMP_ACT_ALLOW"}')
    localhost = {"type": "Localhost", "localhostProfile": "profiles/p.json"}
    kwargs = _plan(_pod(seccompProfile=localhost), seccomp_root=tmp_path)
    assert kwargs["security_opt"] == ['seccomp={"defaultAction": "SCMP_ACT_ALLOW"}']
    with pytest.raises(ContainerConfigError, match="cannot load seccomp profile"):
        _plan(_pod(seccompProfile={**localhost, "localhostProfile": "missing.json"}), seccomp_root=tmp_path)
    with pytest.raises(ContainerConfigError, match="under the seccomp root"):
        _plan(_pod(seccompProfile={**localhost, "localhostProfile": "../p.json"}), seccomp_root=tmp_path)
    with pytest.raises(ContainerConfigError, match="seccomp directory"):
        _plan(_pod(seccompProfile=localhost))


def test_resources_and_user_translate_to_docker_arguments() -> None:
    pod = _pod(runAsUser=1000, runAsGroup=2000, fsGroup=3000)
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"memory": "64Mi", "cpu": "1500m"},
        "requests": {"cpu": "250m"},
    }

    kwargs = _plan(pod, pids_limit=64)

    assert kwargs["user"] == "1000:2000" and kwargs["group_add"] == ["3000"]
    assert kwargs["mem_limit"] == kwargs["memswap_limit"] == 64 * 2**20
    assert kwargs["nano_cpus"] == 1_500_000_000 and kwargs["cpu_shares"] == 256
    assert kwargs["pids_limit"] == 64


EGRESS_CASES: list[tuple[list[dict[str, Any]], bool]] = [
    ([], False),
    ([{"spec": {"podSelector": {}, "policyTypes": ["Egress"]}}], True),
    ([{"spec": {"podSelector": {"matchLabels": {"role": "sandbox"}}, "policyTypes": ["Ingress", "Egress"]}}], True),
    ([{"spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}], False),
    ([{"spec": {"podSelector": {"matchLabels": {"role": "other"}}, "policyTypes": ["Egress"]}}], False),
]


@pytest.mark.parametrize(("policies", "denied"), EGRESS_CASES)
def test_egress_is_denied_when_a_policy_selects_the_pod_for_egress(
    policies: list[dict[str, Any]], denied: bool
) -> None:
    assert egress_denied({"role": "sandbox"}, policies) is denied


def test_sub_protocol_is_the_first_the_client_offers_that_the_double_speaks() -> None:
    assert negotiate("v5.channel.k8s.io,v4.channel.k8s.io") == "v5.channel.k8s.io"
    assert negotiate("base64.channel.k8s.io, v4.channel.k8s.io") == "v4.channel.k8s.io"
    for refused in (None, "channel.k8s.io", "v3.channel.k8s.io,v9.channel.k8s.io"):
        with pytest.raises(ApiError):
            negotiate(refused)


def test_exit_status_frames_are_the_kubelet_v4_status() -> None:
    assert exit_status(["true"], 0) == {"metadata": {}, "status": "Success"}
    failure = exit_status(["sh", "-c", "exit 2"], 2)
    assert failure["reason"] == "NonZeroExitCode"
    assert failure["details"] == {"causes": [{"reason": "ExitCode", "message": "2"}]}


def test_watch_from_a_version_older_than_the_history_is_410_expired() -> None:
    async def scenario() -> None:
        store = Store(history=2)
        for name in ("a", "b", "c"):
            store.create(PODS, "ns", {"metadata": {"name": name}})
        with pytest.raises(ApiError) as caught:
            store.watch(PODS, "ns", lambda _: True, since="1")
        assert caught.value.code == 410
        recent = store.watch(PODS, "ns", lambda _: True, since=str(int(store.resource_version) - 1))
        event = recent.queue.get_nowait()
        assert event is not None and event.object["metadata"]["name"] == "c"

    asyncio.run(scenario())
