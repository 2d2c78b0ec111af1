"""A seccomp filter for bubblewrap's `--seccomp FD`: classic BPF, built here with no native dependency.

Syscalls a sandbox never needs fail with EPERM; `clone`/`unshare` fail when asked for a new namespace;
`clone3` fails with ENOSYS (its flags live in memory a filter cannot read, and libc then falls back to
`clone`). Any other ABI than x86_64 or aarch64 (i386 or x32 on x86_64, arm32 on aarch64) kills the
process, so a syscall cannot dodge the table by using another ABI's numbers.
"""

from __future__ import annotations

import errno
import struct
from collections.abc import Mapping

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian on both arches).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16
_X32_BIT = 0x40000000

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000

# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET, and CLONE_NEWTIME.
NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80

DENIED = (
    "ptrace", "mount", "umount2", "pivot_root", "keyctl", "add_key", "request_key", "bpf", "perf_event_open",
    "userfaultfd", "setns", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
    "reboot", "swapon", "swapoff", "acct", "open_by_handle_at", "name_to_handle_at", "process_vm_readv",
    "process_vm_writev", "iopl", "ioperm",
    # The new mount API, and other ways into the kernel or other processes a sandbox has no use for.
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "pidfd_getfd",
    "kcmp", "io_uring_setup", "io_uring_enter", "io_uring_register", "syslog", "lookup_dcookie", "quotactl",
    "quotactl_fd", "uselib",
)  # fmt: skip

SYSCALLS: dict[int, dict[str, int]] = {
    AUDIT_ARCH_X86_64: {
        "ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "keyctl": 250, "add_key": 248,
        "request_key": 249, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "setns": 308,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
        "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "process_vm_readv": 310, "process_vm_writev": 311, "iopl": 172, "ioperm": 173,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "pidfd_getfd": 438, "kcmp": 312, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "syslog": 103, "lookup_dcookie": 212, "quotactl": 179, "quotactl_fd": 443,
        "uselib": 134, "clone": 56, "clone3": 435, "unshare": 272,
    },
    AUDIT_ARCH_AARCH64: {
        "ptrace": 117, "mount": 40, "umount2": 39, "pivot_root": 41, "keyctl": 219, "add_key": 217,
        "request_key": 218, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "setns": 268,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294,
        "reboot": 142, "swapon": 224, "swapoff": 225, "acct": 89, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "process_vm_readv": 270, "process_vm_writev": 271,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "pidfd_getfd": 438, "kcmp": 272, "io_uring_setup": 425, "io_uring_enter": 426,
        "io_uring_register": 427, "syslog": 116, "lookup_dcookie": 18, "quotactl": 60, "quotactl_fd": 443,
        "clone": 220, "clone3": 435, "unshare": 97,
    },
}  # fmt: skip

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


def build_filter() -> bytes:
    """The filter as a packed `struct sock_filter[]`, ready to write to bwrap's `--seccomp` descriptor."""
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
            if syscall in table:
                program.jump(_JEQ_K, table[syscall], "eperm")
        program.jump(_JEQ_K, table["clone"], "namespaces")
        program.jump(_JEQ_K, table["unshare"], "namespaces")
        program.jump(_JEQ_K, table["clone3"], "enosys")
        program.ret(SECCOMP_RET_ALLOW)
    program.label("namespaces")
    program.load(_ARG0_LOW)
    program.jump(_JSET_K, NAMESPACE_FLAGS, "eperm")
    program.ret(SECCOMP_RET_ALLOW)
    program.label("eperm")
    program.ret(SECCOMP_RET_ERRNO | errno.EPERM)
    program.label("enosys")
    program.ret(SECCOMP_RET_ERRNO | errno.ENOSYS)
    program.label("kill")
    program.ret(SECCOMP_RET_KILL_PROCESS)
    return program.assemble()


FILTER = build_filter()
