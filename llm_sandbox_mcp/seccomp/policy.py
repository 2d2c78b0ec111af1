"""The one syscall policy of every sandbox, whatever the engine: what is denied, as data its renderings read.

Rendered per engine by the modules beside this one: `oci` (the Docker/OCI JSON profile), `bpf` (the classic-BPF
filter bubblewrap loads and zygote children install); NsJail's Kafel text is its own (`backends/_nsjail/policy.py`).

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
