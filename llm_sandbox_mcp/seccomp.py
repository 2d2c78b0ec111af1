"""The one syscall policy of every sandbox, whatever the engine: what is denied, and how each engine gets it.

The policy is stated once here and rendered per engine: as a seccomp profile in the Docker/OCI JSON format (Docker
takes its content, Podman a file on its host, Kubernetes a `Localhost` profile the operator installs on the
nodes), as the classic-BPF filter bubblewrap loads (`seccomp_bpf.py`), and as the Kafel policy
nsjail compiles (`backends/_nsjail/policy.py`).

Shape: allow by default, and deny on top what no sandbox needs. The denials cover what Docker's default
profile refuses a container without capabilities (a profile we pass replaces that default, so its denials
are restated here), plus user namespaces, ptrace, io_uring and the rest of the list below:

- the syscalls in `DENIED` fail with EPERM;
- `clone` and `unshare` fail with EPERM when asked for any new namespace (threads and forks still work);
- `clone3` fails with ENOSYS: its flags live in memory a filter cannot read, and libc then falls back to
  `clone`, whose flags are checked;
- `personality` accepts only the values Docker's default accepts (`PERSONALITY_ALLOWED`), else EPERM;
- `socket` refuses the address families in `SOCKET_FAMILIES_DENIED` (AF_VSOCK: the host's hypervisor).

Architectures: x86_64 and aarch64. Other ABIs of those kernels (i386 and x32 on x86_64, arm32 on aarch64)
are not in the profile, so a syscall cannot dodge the policy through another ABI's numbers.
"""

from __future__ import annotations

import errno
import json
import logging
from collections.abc import Sequence

logger = logging.getLogger(__name__)

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7

# Why each group is denied; every name is denied with EPERM.
DENIED_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("joining another process's namespaces", ("setns",)),
    (
        "mounting, and the new mount API (a way around the read-only root)",
        ("mount", "umount2", "pivot_root", "chroot", "open_tree", "open_tree_attr", "move_mount", "fsopen",
         "fsconfig", "fsmount", "fspick", "mount_setattr"),
    ),
    (
        "reading or steering other processes",
        ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"),
    ),
    (
        "large kernel attack surface a sandbox has no use for",
        ("bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
         "fanotify_init", "lookup_dcookie", "lsm_get_self_attr", "lsm_set_self_attr", "lsm_list_modules"),
    ),
    ("the kernel keyring (not namespaced)", ("keyctl", "add_key", "request_key")),
    (
        "loading kernel code, rebooting",
        ("init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms",
         "kexec_load", "kexec_file_load", "reboot"),
    ),
    (
        "host administration: time, host name, swap, quotas, accounting, the kernel log, I/O ports",
        ("settimeofday", "clock_settime", "sethostname", "setdomainname", "swapon", "swapoff", "quotactl",
         "quotactl_fd", "acct", "syslog", "vhangup", "iopl", "ioperm", "nfsservctl"),
    ),
    ("opening files by handle (escapes a chroot or bind mount)", ("open_by_handle_at", "name_to_handle_at")),
    (
        "NUMA memory placement (other processes' pages)",
        ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node", "migrate_pages", "move_pages"),
    ),
    (
        "obsolete or unimplemented calls",
        ("_sysctl", "sysfs", "ustat", "uselib", "afs_syscall", "getpmsg", "putpmsg", "security", "tuxcall",
         "vserver"),
    ),
)  # fmt: skip

DENIED: tuple[str, ...] = tuple(name for _, names in DENIED_GROUPS for name in names)

# New namespaces: CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME.
NAMESPACE_FLAGS: dict[str, int] = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}
NAMESPACE_MASK = sum(NAMESPACE_FLAGS.values())
FLAG_CHECKED = ("clone", "unshare")
ENOSYS_CALLS = ("clone3",)
# PER_LINUX, PER_LINUX32 (UNAME26 off), ADDR_NO_RANDOMIZE off: 0, 8 (PER_LINUX32), 0x20000 (UNAME26),
# 0x20008, and 0xffffffff (the query). Anything else (ADDR_NO_RANDOMIZE 0x0040000, READ_IMPLIES_EXEC...) fails.
PERSONALITY_ALLOWED = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
SOCKET_FAMILIES_DENIED = (40,)  # AF_VSOCK
# What a zygote's template process needs to make each child's sandbox (new namespaces through unshare only,
# not clone; the child's tmpfs, /proc and mask mounts; its host name). Only templates get these: a bubblewrap
# template's filter and the Docker/Podman template container's profile. Their children stack the whole
# policy on top before any user code runs.
TEMPLATE_PERMITS = frozenset({"unshare", "mount", "sethostname"})

ARCHES: dict[int, str] = {AUDIT_ARCH_X86_64: "SCMP_ARCH_X86_64", AUDIT_ARCH_AARCH64: "SCMP_ARCH_AARCH64"}

# Syscall numbers (Linux UAPI) of every call the policy names. A name missing from an architecture's table
# does not exist there.
SYSCALLS: dict[int, dict[str, int]] = {
    AUDIT_ARCH_X86_64: {
        "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "open_tree": 428,
        "open_tree_attr": 467, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
        "pidfd_getfd": 438, "process_madvise": 440, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "fanotify_init": 300,
        "lookup_dcookie": 212, "lsm_get_self_attr": 459, "lsm_set_self_attr": 460, "lsm_list_modules": 461,
        "keyctl": 250, "add_key": 248, "request_key": 249, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "create_module": 174, "query_module": 178, "get_kernel_syms": 177,
        "kexec_load": 246, "kexec_file_load": 320, "reboot": 169, "settimeofday": 164, "clock_settime": 227,
        "sethostname": 170, "setdomainname": 171, "swapon": 167, "swapoff": 168, "quotactl": 179,
        "quotactl_fd": 443, "acct": 163, "syslog": 103, "vhangup": 153, "iopl": 172, "ioperm": 173,
        "nfsservctl": 180, "open_by_handle_at": 304, "name_to_handle_at": 303, "get_mempolicy": 239, "mbind": 237,
        "set_mempolicy": 238, "set_mempolicy_home_node": 450, "migrate_pages": 256, "move_pages": 279,
        "_sysctl": 156, "sysfs": 139, "ustat": 136, "uselib": 134, "afs_syscall": 183, "getpmsg": 181,
        "putpmsg": 182, "security": 185, "tuxcall": 184, "vserver": 236,
        "clone": 56, "unshare": 272, "clone3": 435, "personality": 135, "socket": 41,
    },
    AUDIT_ARCH_AARCH64: {
        "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "open_tree": 428,
        "open_tree_attr": 467, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
        "pidfd_getfd": 438, "process_madvise": 440, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "fanotify_init": 262,
        "lookup_dcookie": 18, "lsm_get_self_attr": 459, "lsm_set_self_attr": 460, "lsm_list_modules": 461,
        "keyctl": 219, "add_key": 217, "request_key": 218, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "reboot": 142, "settimeofday": 170,
        "clock_settime": 112, "sethostname": 161, "setdomainname": 162, "swapon": 224, "swapoff": 225,
        "quotactl": 60, "quotactl_fd": 443, "acct": 89, "syslog": 116, "vhangup": 58, "nfsservctl": 42,
        "open_by_handle_at": 265, "name_to_handle_at": 264, "get_mempolicy": 236, "mbind": 235,
        "set_mempolicy": 237, "set_mempolicy_home_node": 450, "migrate_pages": 238, "move_pages": 239,
        "clone": 220, "unshare": 97, "clone3": 435, "personality": 92, "socket": 198,
    },
}  # fmt: skip

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
