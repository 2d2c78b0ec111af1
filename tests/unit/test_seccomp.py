"""The bubblewrap seccomp filter, run through a small classic-BPF interpreter for both architectures."""

from __future__ import annotations

import errno
import struct

import pytest

from llm_sandbox_mcp.seccomp.bpf import (
    FILTER,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    SECCOMP_RET_KILL_PROCESS,
    TEMPLATE_FILTER,
)
from llm_sandbox_mcp.seccomp.policy import AUDIT_ARCH_AARCH64, AUDIT_ARCH_X86_64, DENIED, SYSCALLS, TEMPLATE_PERMITS

AUDIT_ARCH_I386 = 0x40000003
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_THREAD_FLAGS = 0x003D0F00  # what glibc's pthread_create passes
SIGCHLD = 17


def run_filter(arch: int, nr: int, arg0: int = 0, bpf: bytes = FILTER) -> int:
    """What the kernel would decide for one syscall: classic BPF over struct seccomp_data."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    program = [struct.unpack_from("<HBBI", bpf, offset) for offset in range(0, len(bpf), 8)]
    accumulator, pc = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:  # ld [k]
            accumulator = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            taken = {0x15: accumulator == k, 0x35: accumulator >= k, 0x45: bool(accumulator & k)}[code]
            pc += 1 + (jt if taken else jf)
        elif code == 0x06:  # ret k
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


ARCHES = [pytest.param(AUDIT_ARCH_X86_64, id="x86_64"), pytest.param(AUDIT_ARCH_AARCH64, id="aarch64")]


@pytest.mark.parametrize("arch", ARCHES)
def test_every_denied_syscall_fails_with_eperm(arch: int) -> None:
    table = SYSCALLS[arch]
    for name in DENIED:
        if name in table:
            assert run_filter(arch, table[name]) == SECCOMP_RET_ERRNO | errno.EPERM, name


@pytest.mark.parametrize("arch", ARCHES)
def test_ordinary_syscalls_are_allowed(arch: int) -> None:
    denied = set(SYSCALLS[arch].values())
    for nr in range(0, 460):
        if nr not in denied:
            assert run_filter(arch, nr) == SECCOMP_RET_ALLOW, nr


@pytest.mark.parametrize("arch", ARCHES)
def test_new_namespaces_are_refused_but_threads_and_forks_are_not(arch: int) -> None:
    table = SYSCALLS[arch]
    for name in ("clone", "unshare"):
        assert run_filter(arch, table[name], CLONE_NEWUSER) == SECCOMP_RET_ERRNO | errno.EPERM
        assert run_filter(arch, table[name], CLONE_NEWNET | SIGCHLD) == SECCOMP_RET_ERRNO | errno.EPERM
    assert run_filter(arch, table["clone"], CLONE_THREAD_FLAGS) == SECCOMP_RET_ALLOW
    assert run_filter(arch, table["clone"], SIGCHLD) == SECCOMP_RET_ALLOW
    assert run_filter(arch, table["unshare"], 0x400) == SECCOMP_RET_ALLOW  # CLONE_FILES
    # clone3 keeps its flags in memory the filter cannot read: ENOSYS makes libc fall back to clone.
    assert run_filter(arch, table["clone3"]) == SECCOMP_RET_ERRNO | errno.ENOSYS


def test_other_abis_are_killed() -> None:
    assert run_filter(AUDIT_ARCH_I386, 26) == SECCOMP_RET_KILL_PROCESS  # i386 ptrace via int 0x80
    assert run_filter(AUDIT_ARCH_X86_64, 0x40000000 | 101) == SECCOMP_RET_KILL_PROCESS  # x32 ptrace
    assert run_filter(AUDIT_ARCH_X86_64, 0x40000000) == SECCOMP_RET_KILL_PROCESS


@pytest.mark.parametrize("arch", ARCHES)
def test_a_zygote_template_is_let_through_only_what_its_children_need(arch: int) -> None:
    table = SYSCALLS[arch]
    eperm = SECCOMP_RET_ERRNO | errno.EPERM
    assert {"unshare", "mount", "sethostname"} == TEMPLATE_PERMITS
    for name in DENIED:
        if name in table:
            expected = SECCOMP_RET_ALLOW if name in TEMPLATE_PERMITS else eperm
            assert run_filter(arch, table[name], bpf=TEMPLATE_FILTER) == expected, name
    assert run_filter(arch, table["unshare"], CLONE_NEWUSER | CLONE_NEWNET, bpf=TEMPLATE_FILTER) == SECCOMP_RET_ALLOW
    # clone keeps its flag check: only unshare, which a child calls before any user code, may make namespaces.
    assert run_filter(arch, table["clone"], CLONE_NEWUSER | SIGCHLD, bpf=TEMPLATE_FILTER) == eperm
    assert run_filter(arch, table["clone"], SIGCHLD, bpf=TEMPLATE_FILTER) == SECCOMP_RET_ALLOW
    assert run_filter(arch, table["clone3"], bpf=TEMPLATE_FILTER) == SECCOMP_RET_ERRNO | errno.ENOSYS
    assert run_filter(AUDIT_ARCH_I386, 1, bpf=TEMPLATE_FILTER) == SECCOMP_RET_KILL_PROCESS
