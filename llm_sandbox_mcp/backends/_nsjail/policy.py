"""The project's syscall policy (`llm_sandbox_mcp.seccomp`) in NsJail's Kafel language, for `--seccomp_string`.

NsJail takes no raw BPF, so the policy the bubblewrap filter encodes is restated as Kafel, rule for rule, by
number (Kafel's own name table may lack the newest calls). Kafel kills a process whose syscall comes from
another architecture than NsJail's own (i386 on x86_64); x32 numbers on x86_64 it does not cover, which is
why the backend refuses a kernel that runs x32 system calls (`x32_enabled`).
"""

from __future__ import annotations

import ctypes
import errno
import platform

from llm_sandbox_mcp.seccomp.policy import (
    AUDIT_ARCH_AARCH64,
    AUDIT_ARCH_X86_64,
    DENIED,
    ENOSYS_CALLS,
    FLAG_CHECKED,
    NAMESPACE_MASK,
    PERSONALITY_ALLOWED,
    SOCKET_FAMILIES_DENIED,
    SYSCALLS,
    TEMPLATE_PERMITS,
)

_ARCHES = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}
_X32_GETPID = 0x40000000 | 39
_U32 = 0xFFFFFFFF


def native_arch() -> int | None:
    return _ARCHES.get(platform.machine())


def kafel_policy(arch: int, permit: frozenset[str] = frozenset()) -> str:
    """One Kafel policy, allow by default, with the same answers as the bubblewrap filter on `arch`. `permit`:
    calls of the policy let through (a flag-checked call then takes any flags), for zygote templates only
    (`TEMPLATE_PERMITS`, as the bubblewrap template's filter)."""
    table = SYSCALLS[arch]
    eperm = [f"SYSCALL[{table[name]}]" for name in DENIED if name in table and name not in permit]
    checked = [name for name in FLAG_CHECKED if name not in permit]
    eperm += [f"SYSCALL[{table[name]}](flags) {{ (flags & {NAMESPACE_MASK:#x}) != 0 }}" for name in checked]
    # personality takes an unsigned int: any high bit is denied too, as the filter does.
    allowed = " && ".join(f"persona != {value:#x}" for value in PERSONALITY_ALLOWED)
    eperm.append(f"SYSCALL[{table['personality']}](persona) {{ {allowed} }}")
    # socket's family is an int: compare the low 32 bits, as the kernel reads it.
    families = " || ".join(f"(family & {_U32:#x}) == {value}" for value in SOCKET_FAMILIES_DENIED)
    eperm.append(f"SYSCALL[{table['socket']}](family) {{ {families} }}")
    enosys = [f"SYSCALL[{table[name]}]" for name in ENOSYS_CALLS]
    return (
        "POLICY llm_sandbox_mcp {\n"
        f"  ERRNO({errno.EPERM}) {{\n    " + ",\n    ".join(eperm) + "\n  },\n"
        f"  ERRNO({errno.ENOSYS}) {{ " + ", ".join(enosys) + " }\n"
        "}\nUSE llm_sandbox_mcp DEFAULT ALLOW\n"
    )


def template_policy(arch: int) -> str:
    """The Kafel policy of a zygote's template process: it may unshare, mount and set a host name to make each
    call's sandbox, whose child then stacks the whole policy (the bubblewrap filter, which also kills x32 calls)
    before any user code runs."""
    return kafel_policy(arch, TEMPLATE_PERMITS)


def x32_enabled() -> bool:
    """Whether this kernel runs x32 system calls (the policy does not list their numbers)."""
    if platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    result: int = libc.syscall(ctypes.c_long(_X32_GETPID))
    return result >= 0 or ctypes.get_errno() != errno.ENOSYS
