"""Run a command where user namespaces are refused, as Ubuntu 24.04's AppArmor refuses them to an unconfined
binary (`kernel.apparmor_restrict_unprivileged_userns=1`): `unshare` and `clone` asked for CLONE_NEWUSER fail
with EPERM, `clone3` with ENOSYS (its flags are out of a filter's reach; libc then falls back to `clone`).

    python tests/support/userns_refused.py COMMAND [ARG...]

A seccomp filter, inherited by everything the command starts, with every sysctl left as it is: nothing on
the host says user namespaces are off, as on Ubuntu, where only the AppArmor sysctl does. Put in front of
bwrap or nsjail alone (a wrapper script as SANDBOX_BWRAP_PATH), it refuses them to that binary only, as
AppArmor does; put in front of the server, it confines the server as a client's sandbox does. It changes
nothing outside the command's own process tree.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
import sys

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# (clone, unshare, clone3) per architecture.
NUMBERS = {"x86_64": (56, 272, 435), "aarch64": (220, 97, 435)}
CLONE_NEWUSER = 0x10000000
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
# Classic BPF: ld [k]; jeq k, jt, jf; jset k, jt, jf; ret k.
LD, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06


def program(machine: str) -> bytes:
    clone, unshare, clone3 = NUMBERS[machine]
    insns = [
        (LD, 0, 0, 4),  # arch
        (JEQ, 1, 0, AUDIT_ARCH[machine]),
        (RET, 0, 0, RET_ALLOW),  # another ABI: left alone (this is a simulation, not a policy)
        (LD, 0, 0, 0),  # syscall number
        (JEQ, 0, 1, clone3),
        (RET, 0, 0, RET_ERRNO | errno.ENOSYS),
        (JEQ, 1, 0, clone),
        (JEQ, 0, 3, unshare),
        (LD, 0, 0, 16),  # low word of the first argument: the flags of both
        (JSET, 0, 1, CLONE_NEWUSER),
        (RET, 0, 0, RET_ERRNO | errno.EPERM),
        (RET, 0, 0, RET_ALLOW),
    ]
    return b"".join(struct.pack("<HBBI", *insn) for insn in insns)


def refuse_user_namespaces() -> None:
    code = program(platform.machine())
    buffer = ctypes.create_string_buffer(code)
    # struct sock_fprog { unsigned short len; struct sock_filter *filter; }
    fprog = struct.pack("HxxxxxxP", len(code) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    # Without CAP_SYS_ADMIN a filter needs no_new_privs (root keeps it off, as AppArmor leaves it).
    if os.geteuid() != 0 and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


if __name__ == "__main__":
    refuse_user_namespaces()
    os.execvp(sys.argv[1], sys.argv[1:])
