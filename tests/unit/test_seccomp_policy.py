"""The one syscall policy: its JSON rendering (Docker, Podman, Kubernetes) says what the bubblewrap filter says,
and every engine's configuration carries it unless the operator chose otherwise."""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from llm_sandbox_mcp.backends._docker import security_options
from llm_sandbox_mcp.backends._kubernetes.pod import PodOptions, pod_manifest
from llm_sandbox_mcp.backends._podman.libpod import container_spec
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.models import Limits, SandboxSpec
from llm_sandbox_mcp.seccomp import oci
from llm_sandbox_mcp.seccomp.bpf import FILTER, TEMPLATE_FILTER
from llm_sandbox_mcp.seccomp.oci import PROFILE_JSON, oci_profile, personality_denials
from llm_sandbox_mcp.seccomp.policy import (
    AUDIT_ARCH_AARCH64,
    AUDIT_ARCH_X86_64,
    DENIED,
    NAMESPACE_FLAGS,
    PERSONALITY_ALLOWED,
    SYSCALLS,
)
from tests.unit.test_seccomp import SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, run_filter

ARCHES = [pytest.param(AUDIT_ARCH_X86_64, id="x86_64"), pytest.param(AUDIT_ARCH_AARCH64, id="aarch64")]
ALLOW = -1
U64 = (1 << 64) - 1


def json_decision(name: str, arg0: int, profile_json: str = PROFILE_JSON) -> int:
    """What a runtime would do with the JSON profile for one call: an errno, or ALLOW (the default action).

    Rules are ORed; a rule's comparisons are ANDed (the profile never has two on one argument).
    """
    profile: Mapping[str, Any] = json.loads(profile_json)
    for rule in profile["syscalls"]:
        if name not in rule["names"]:
            continue
        if all(_holds(condition, arg0) for condition in rule.get("args", [])):
            assert rule["action"] == "SCMP_ACT_ERRNO"
            return int(rule["errnoRet"])
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    return ALLOW


def _holds(condition: Mapping[str, Any], arg0: int) -> bool:
    assert condition["index"] == 0
    value, op = condition["value"], condition["op"]
    if op == "SCMP_CMP_MASKED_EQ":
        return arg0 & value == condition.get("valueTwo", 0)
    if op == "SCMP_CMP_GT":
        return arg0 > value
    raise AssertionError(f"unexpected comparison {op}")


def bpf_decision(arch: int, name: str, arg0: int, bpf: bytes = FILTER) -> int:
    verdict = run_filter(arch, SYSCALLS[arch][name], arg0, bpf=bpf)
    if verdict == SECCOMP_RET_ALLOW:
        return ALLOW
    assert verdict & 0xFFFF0000 == SECCOMP_RET_ERRNO
    return verdict & 0xFFFF


ARGS = sorted(
    {0, 1, 8, 17, 40, 0x400, 0x003D0F00, 0x20000, 0x20008, 0x40000, 0xFFFFFFFF, 1 << 32, (1 << 32) | 40, U64}
    | set(NAMESPACE_FLAGS.values())
    | {flag | 17 for flag in NAMESPACE_FLAGS.values()}
    | set(PERSONALITY_ALLOWED)
)


@pytest.mark.parametrize("arch", ARCHES)
def test_the_json_profile_and_the_bubblewrap_filter_decide_alike(arch: int) -> None:
    for name in SYSCALLS[arch]:
        for arg0 in ARGS:
            assert json_decision(name, arg0) == bpf_decision(arch, name, arg0), (name, hex(arg0))


@pytest.mark.parametrize("arch", ARCHES)
def test_a_template_containers_profile_lets_through_what_a_bubblewrap_template_may_and_no_more(arch: int) -> None:
    template = oci.TEMPLATE_PROFILE_JSON
    for name in SYSCALLS[arch]:
        for arg0 in ARGS:
            expected = bpf_decision(arch, name, arg0, TEMPLATE_FILTER)
            assert json_decision(name, arg0, template) == expected, (name, hex(arg0))
    assert json_decision("unshare", NAMESPACE_FLAGS["CLONE_NEWUSER"], template) == ALLOW
    assert json_decision("clone", NAMESPACE_FLAGS["CLONE_NEWUSER"] | 17, template) == errno.EPERM
    assert json_decision("setns", 0, template) == json_decision("pivot_root", 0, template) == errno.EPERM


def test_the_profile_denies_every_listed_call_and_answers_clone3_with_enosys() -> None:
    for name in DENIED:
        assert json_decision(name, 0) == errno.EPERM, name
    assert json_decision("clone3", 0) == errno.ENOSYS
    for name in ("read", "write", "execve", "openat", "mmap", "wait4", "futex"):
        assert json_decision(name, 0) == ALLOW


def test_clone_and_unshare_refuse_every_new_namespace_but_allow_threads_and_forks() -> None:
    for name in ("clone", "unshare"):
        for flag in NAMESPACE_FLAGS.values():
            assert json_decision(name, flag | 17) == errno.EPERM, (name, hex(flag))
    assert json_decision("clone", 0x003D0F00) == ALLOW  # glibc's pthread_create
    assert json_decision("clone", 17) == ALLOW  # fork: SIGCHLD
    assert json_decision("unshare", 0x400) == ALLOW  # CLONE_FILES


def test_personality_allows_exactly_dockers_values() -> None:
    """The union of the deny patterns is exactly the complement of the allowed values, over all 2**32 values
    (checked by splitting the space on one bit at a time, not by enumerating it)."""
    allowed = set(PERSONALITY_ALLOWED)
    patterns = personality_denials()
    assert all(value & mask != pattern for mask, pattern in patterns for value in allowed)

    def covered(fixed_mask: int, fixed: int, bit: int) -> bool:
        """Every value whose bits under `fixed_mask` are `fixed` is either denied or allowed."""
        touching = [(m, p) for m, p in patterns if fixed & m & fixed_mask == p & m & fixed_mask]
        if any(m & ~fixed_mask == 0 for m, _ in touching):
            return True  # one pattern denies the whole subspace
        if bit == 32:
            return fixed in allowed
        if not touching:
            return False  # 2**(32 - bit) values, none denied: more than could all be allowed
        below = fixed_mask | 1 << bit
        return covered(below, fixed, bit + 1) and covered(below, fixed | 1 << bit, bit + 1)

    assert covered(0, 0, 0)
    assert json_decision("personality", (1 << 32) | 8) == errno.EPERM  # the kernel would see 8: refused anyway


def test_the_profile_is_valid_for_docker_and_podman() -> None:
    profile = oci_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert profile["archMap"] == [
        {"architecture": "SCMP_ARCH_X86_64", "subArchitectures": []},
        {"architecture": "SCMP_ARCH_AARCH64", "subArchitectures": []},
    ]
    assert "architectures" not in profile  # Docker refuses both keys
    names_everywhere = set(SYSCALLS[AUDIT_ARCH_X86_64]) | set(SYSCALLS[AUDIT_ARCH_AARCH64])
    rules: list[dict[str, Any]] = profile["syscalls"]  # type: ignore[assignment]
    for rule in rules:
        assert rule["action"] == "SCMP_ACT_ERRNO" and rule["errnoRet"] in (errno.EPERM, errno.ENOSYS)
        assert len(rule.get("args", [])) <= 1
        assert set(rule["names"]) <= names_everywhere
    assert all(name in SYSCALLS[AUDIT_ARCH_X86_64] for name in DENIED)
    assert len(PROFILE_JSON) < 16 * 1024


# ---- every engine carries it ---------------------------------------------------------------------


def limits(*security_opt: str, privileged: bool = False) -> Limits:
    return Limits(security_opt=("no-new-privileges:true", *security_opt), privileged=privileged)


@pytest.fixture(autouse=True)
def _warn_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oci, "_warned", False)


def test_docker_adds_the_profile_content_unless_the_operator_chose_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert security_options(limits()) == ["no-new-privileges:true", f"seccomp={PROFILE_JSON}"]
    assert security_options(limits(privileged=True)) == ["no-new-privileges:true"]
    with caplog.at_level(logging.WARNING):
        assert security_options(limits("seccomp=unconfined")) == ["no-new-privileges:true", "seccomp=unconfined"]
        own = tmp_path / "own.json"
        own.write_text('{"defaultAction": "SCMP_ACT_ERRNO"}')
        # The Docker API takes content: a path (the CLI's form) is read.
        assert security_options(limits(f"seccomp={own}"))[-1] == 'seccomp={"defaultAction": "SCMP_ACT_ERRNO"}'
    warnings = [r for r in caplog.records if "replaces llm-sandbox-mcp's syscall policy" in r.getMessage()]
    assert len(warnings) == 1  # once


def test_podman_gets_the_profile_as_a_path_unless_the_operator_chose_one() -> None:
    def path(options: Limits) -> object:
        return container_spec(SandboxSpec("img", options), {}, "/run/ours.json").get("seccomp_profile_path")

    assert path(limits()) == "/run/ours.json"
    assert path(limits("seccomp=/etc/theirs.json")) == "/etc/theirs.json"
    assert path(limits("seccomp=unconfined")) == "unconfined"
    assert path(limits(privileged=True)) is None


def test_kubernetes_uses_the_localhost_profile_when_installed_else_runtime_default() -> None:
    def profile(options: Limits, installed: str | None) -> object:
        manifest = pod_manifest("p", SandboxSpec("img", options), {}, {}, PodOptions(seccomp_profile=installed))
        assert manifest["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        return manifest["spec"]["containers"][0]["securityContext"]["seccompProfile"]

    assert profile(limits(), None) == {"type": "RuntimeDefault"}
    assert profile(limits(), "llm-sandbox-mcp.json") == {
        "type": "Localhost",
        "localhostProfile": "llm-sandbox-mcp.json",
    }
    assert profile(limits("seccomp=unconfined"), "llm-sandbox-mcp.json") == {"type": "Unconfined"}


@pytest.mark.parametrize(
    "value", ["llm-sandbox-mcp.json", "localhost/", "localhost//etc/x.json", "localhost/../x.json", "localhost/a/./b"]
)
def test_a_kubernetes_profile_must_be_a_path_under_the_nodes_seccomp_directory(value: str) -> None:
    with pytest.raises(ValueError, match="SANDBOX_K8S_SECCOMP_PROFILE"):
        Settings(sandbox_k8s_seccomp_profile=value)


def test_doctor_says_which_policy_is_in_force() -> None:
    opts = ("no-new-privileges:true",)
    assert oci.in_force("docker", opts, False) == "seccomp: llm-sandbox-mcp policy"
    assert "RuntimeDefault" in oci.in_force("kubernetes", opts, False)
    assert "Localhost profile localhost/x.json" in oci.in_force("kubernetes", opts, False, "localhost/x.json")
    assert "operator's" in oci.in_force("podman", (*opts, "seccomp=unconfined"), False)
    assert "none" in oci.in_force("docker", opts, True)
    assert "bubblewrap filter" in oci.in_force("bubblewrap", opts, False)
