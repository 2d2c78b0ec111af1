"""The syscall policy (`policy`) as a seccomp profile in the Docker/OCI JSON format, and which policy a
container gets: Docker takes the profile's content, Podman a file on its host, Kubernetes a `Localhost` profile
the operator installs on the nodes.
"""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Sequence

from llm_sandbox_mcp.seccomp.policy import (
    AUDIT_ARCH_AARCH64,
    AUDIT_ARCH_X86_64,
    DENIED,
    DENIED_GROUPS,
    ENOSYS_CALLS,
    FLAG_CHECKED,
    NAMESPACE_FLAGS,
    PERSONALITY_ALLOWED,
    SOCKET_FAMILIES_DENIED,
    TEMPLATE_PERMITS,
)

logger = logging.getLogger(__name__)

ARCHES: dict[int, str] = {AUDIT_ARCH_X86_64: "SCMP_ARCH_X86_64", AUDIT_ARCH_AARCH64: "SCMP_ARCH_AARCH64"}
_ERRNO = "SCMP_ACT_ERRNO"
_U32 = 0xFFFFFFFF


def _bit(index: int) -> int:
    return 1 << (index % 32)


def personality_denials() -> list[tuple[int, int]]:
    """(mask, value) pairs: `personality(x)` is denied when `x & mask == value` for any pair, or x > 2**32 - 1.

    A profile rule can hold one comparison per argument (runtimes OR several comparisons of one argument), so
    "x is none of the allowed values" is written as a union of bit patterns that each miss every allowed value:
    a set bit followed by a clear one (x is neither 0 nor all ones), lengthened backwards while the pattern
    still matches an allowed value. The unit tests check the union is exactly the 32-bit complement.
    """
    allowed = [value for value in PERSONALITY_ALLOWED if value <= _U32]
    denials: list[tuple[int, int]] = []
    for index in range(32):
        mask, value = _bit(index) | _bit(index + 1), _bit(index)
        back = index
        while any(candidate & mask == value for candidate in allowed):
            back -= 1
            if index - back >= 31:
                raise ValueError(f"no pattern ending at bit {index} misses every allowed personality")
            mask |= _bit(back)
            value |= _bit(back)
        denials.append((mask, value))
    return denials


def _rule(
    names: Sequence[str], *condition: object, errno_ret: int = errno.EPERM, comment: str = ""
) -> dict[str, object]:
    """One profile rule; `condition` is (op, value[, valueTwo]) on the first argument."""
    rule: dict[str, object] = {"names": list(names), "action": "SCMP_ACT_ERRNO", "errnoRet": errno_ret}
    if condition:
        op, value, *two = condition
        rule["args"] = [{"index": 0, "value": value, **({"valueTwo": two[0]} if two else {}), "op": op}]
    if comment:
        rule["comment"] = comment
    return rule


def oci_profile(permit: frozenset[str] = frozenset()) -> dict[str, object]:
    """The policy as a seccomp profile in the Docker/OCI JSON format (Docker, Podman, CRI runtimes).

    Every rule has one comparison at most: a rule's comparisons are ANDed, but runtimes turn several
    comparisons of the same argument into separate rules (ORed), so the policy never relies on either.
    `permit`: calls of the policy let through (a flag-checked call then takes any flags), for zygote template
    containers only (`TEMPLATE_PERMITS`).
    """
    masked = "SCMP_CMP_MASKED_EQ"
    denied = [name for name in DENIED if name not in permit]
    checked = [name for name in FLAG_CHECKED if name not in permit]
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "archMap": [{"architecture": name, "subArchitectures": []} for name in ARCHES.values()],
        "syscalls": [
            _rule(denied, comment="; ".join(reason for reason, _ in DENIED_GROUPS)),
            _rule(
                ENOSYS_CALLS, errno_ret=errno.ENOSYS, comment="flags out of a filter's reach: libc falls back to clone"
            ),
            *(
                _rule(checked, masked, flag, flag, comment=f"no new namespace: {name}")
                for name, flag in NAMESPACE_FLAGS.items()
            ),
            _rule(["personality"], "SCMP_CMP_GT", _U32, comment="personality: only the values Docker allows"),
            *(_rule(["personality"], masked, mask, value) for mask, value in personality_denials()),
            *(_rule(["socket"], masked, _U32, family, comment="address family") for family in SOCKET_FAMILIES_DENIED),
        ],
    }


PROFILE_JSON = json.dumps(oci_profile(), separators=(",", ":"))
"""The profile as compact JSON: what `seccomp=` carries to Docker, and the file Podman and nodes read."""
TEMPLATE_PROFILE_JSON = json.dumps(oci_profile(TEMPLATE_PERMITS), separators=(",", ":"))
"""The profile of a Docker/Podman zygote template container (SANDBOX_ZYGOTE): its kernel may unshare, mount and
set a host name to make each call's sandbox, which then stacks the whole policy (the bubblewrap filter)."""


def operator_choice(options: Sequence[str]) -> str | None:
    """The operator's own `seccomp=` value in SANDBOX_SECURITY_OPT (a profile, or `unconfined`), if any."""
    for option in options:
        key, _, value = option.partition("=") if "=" in option else option.partition(":")
        if key == "seccomp" and value:
            return value
    return None


_warned = False


def ours_applies(options: Sequence[str], privileged: bool) -> bool:
    """Whether a container gets this policy: not when the operator chose a profile (logged once), nor when the
    sandbox is privileged (engines run privileged containers unconfined)."""
    global _warned
    choice = operator_choice(options)
    if choice is not None and not _warned:
        _warned = True
        logger.warning(
            "SANDBOX_SECURITY_OPT sets seccomp=%s, which replaces llm-sandbox-mcp's syscall policy: the sandbox "
            "may create user namespaces, mount, ptrace or use io_uring if that profile allows it",
            choice if len(choice) < 80 else choice[:77] + "...",
        )
    return choice is None and not privileged


def in_force(engine: str, options: Sequence[str], privileged: bool, k8s_profile: str | None = None) -> str:
    """One line for `doctor`: which seccomp policy sandboxes of `engine` get with this configuration."""
    choice = operator_choice(options)
    if engine == "bubblewrap":
        return "seccomp: llm-sandbox-mcp policy (bubblewrap filter)"
    if engine == "nsjail":
        return "seccomp: llm-sandbox-mcp policy (Kafel, loaded by nsjail)"
    if choice is not None:
        return f"seccomp: the operator's (SANDBOX_SECURITY_OPT seccomp={choice[:60]}), not llm-sandbox-mcp's policy"
    if privileged:
        return "seccomp: none (SANDBOX_PRIVILEGED=true runs sandboxes unconfined)"
    if engine == "kubernetes":
        if k8s_profile:
            return (
                f"seccomp: Localhost profile {k8s_profile} (llm-sandbox-mcp policy, which must be installed on "
                "every node: `llm-sandbox-mcp seccomp-profile`)"
            )
        return "seccomp: RuntimeDefault (the container runtime's profile; set SANDBOX_K8S_SECCOMP_PROFILE for ours)"
    return "seccomp: llm-sandbox-mcp policy"
