"""The project's syscall policy (`seccomp.policy`) as a classic-BPF filter, built here with no native
dependency: what bubblewrap loads with `--seccomp FD`, and what a zygote child installs on every engine (so it
lives outside the Linux-only engines' folders).

Any other ABI than x86_64 or aarch64 (i386 or x32 on x86_64, arm32 on aarch64) kills the process, so a
syscall cannot dodge the table by using another ABI's numbers.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Mapping

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

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian on both arches).
_NR, _ARCH, _ARG0_LOW, _ARG0_HIGH = 0, 4, 16, 20
_X32_BIT = 0x40000000

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

# Classic BPF opcodes.
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_INSN = struct.Struct("<HBBI")

_Insn = tuple[int, "str | None", "str | None", int]


class _Program:
    """Straight-line BPF with forward jumps to named labels, resolved when assembled."""

    def __init__(self) -> None:
        self.insns: list[_Insn | str] = []

    def load(self, offset: int) -> None:
        self.insns.append((_LD_W_ABS, None, None, offset))

    def jump(self, op: int, k: int, true: str | None, false: str | None = None) -> None:
        self.insns.append((op, true, false, k))

    def ret(self, value: int) -> None:
        self.insns.append((_RET_K, None, None, value))

    def label(self, name: str) -> None:
        self.insns.append(name)

    def assemble(self) -> bytes:
        positions: dict[str, int] = {}
        index = 0
        for item in self.insns:
            if isinstance(item, str):
                positions[item] = index
            else:
                index += 1
        out = bytearray()
        index = 0
        for item in self.insns:
            if isinstance(item, str):
                continue
            code, true, false, k = item
            out += _INSN.pack(code, _offset(positions, true, index), _offset(positions, false, index), k)
            index += 1
        return bytes(out)


def _offset(positions: Mapping[str, int], label: str | None, index: int) -> int:
    if label is None:
        return 0
    distance = positions[label] - index - 1
    if not 0 <= distance <= 255:
        raise ValueError(f"seccomp jump to {label!r} out of range ({distance})")
    return distance


def build_filter(permit: frozenset[str] = frozenset()) -> bytes:
    """The filter as a packed `struct sock_filter[]`, ready to write to bwrap's `--seccomp` descriptor.

    `permit`: calls of the policy let through (a flag-checked call then takes any flags), for the template
    process of `zygote` only, whose children stack the whole filter on top before any user code runs.
    """
    program = _Program()
    program.load(_ARCH)
    program.jump(_JEQ_K, AUDIT_ARCH_X86_64, "x86_64")
    program.jump(_JEQ_K, AUDIT_ARCH_AARCH64, "aarch64", "kill")
    for arch, name in ((AUDIT_ARCH_X86_64, "x86_64"), (AUDIT_ARCH_AARCH64, "aarch64")):
        table = SYSCALLS[arch]
        program.label(name)
        program.load(_NR)
        if arch == AUDIT_ARCH_X86_64:
            program.jump(_JGE_K, _X32_BIT, "kill")
        for syscall in DENIED:
            if syscall in table and syscall not in permit:
                program.jump(_JEQ_K, table[syscall], "eperm")
        for syscall in (name for name in FLAG_CHECKED if name not in permit):
            program.jump(_JEQ_K, table[syscall], "namespaces")
        for syscall in ENOSYS_CALLS:
            program.jump(_JEQ_K, table[syscall], "enosys")
        program.jump(_JEQ_K, table["personality"], "personality")
        program.jump(_JEQ_K, table["socket"], "socket")
        program.ret(SECCOMP_RET_ALLOW)
    program.label("namespaces")
    program.load(_ARG0_LOW)
    program.jump(_JSET_K, NAMESPACE_MASK, "eperm")
    program.ret(SECCOMP_RET_ALLOW)
    # personality takes an unsigned int: a value with high bits is denied, as the JSON profile's `> 2**32-1`.
    program.label("personality")
    program.load(_ARG0_HIGH)
    program.jump(_JEQ_K, 0, None, "eperm")
    program.load(_ARG0_LOW)
    for value in PERSONALITY_ALLOWED:
        program.jump(_JEQ_K, value, "allow")
    program.ret(SECCOMP_RET_ERRNO | errno.EPERM)
    program.label("socket")
    program.load(_ARG0_LOW)
    for family in SOCKET_FAMILIES_DENIED:
        program.jump(_JEQ_K, family, "eperm")
    program.label("allow")
    program.ret(SECCOMP_RET_ALLOW)
    program.label("eperm")
    program.ret(SECCOMP_RET_ERRNO | errno.EPERM)
    program.label("enosys")
    program.ret(SECCOMP_RET_ERRNO | errno.ENOSYS)
    program.label("kill")
    program.ret(SECCOMP_RET_KILL_PROCESS)
    return program.assemble()


FILTER = build_filter()
TEMPLATE_FILTER = build_filter(TEMPLATE_PERMITS)
