# How a zygote's child makes a sandbox of its own inside its template, before any user code: shared by the
# bubblewrap zygote (python_zygote.py) and the Docker/Podman template container's kernel (python_kernel.py
# with a config), which load this source as a module. Every function takes the template's config (JSON):
#   workspace, tmp      sizes of the child's fresh /workspace, /tmp and /dev/shm tmpfs
#   seccomp             the strict filter (hex of a packed struct sock_filter[]) stacked before user code
#   rlimits, cpu        rlimits set (lowered only) in the child; cpu: RLIMIT_CPU, the longest timeout allowed
#   mask, read_only     (containers) paths the engine would have masked or made read-only, which the child
#                       masks again under its own /proc and /sys; paths this kernel does not have are skipped
# Must run on any Python 3.8+. Prints nothing of its own.
import ctypes
import fcntl
import os
import resource
import socket
import struct

LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 0x1, 0x2, 0x4, 0x8, 0x20, 0x1000
MS_REC, MS_PRIVATE = 0x4000, 0x40000
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAP_AMBIENT = 4, 24, 38, 22, 47
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER = 4, 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = struct.Struct("16sh22x")  # struct ifreq: the name, then ifr_flags in the union


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def check(result, what):
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def mount(source, target, fstype, flags, options=None):
    data = options.encode() if options else None
    check(LIBC.mount(source.encode(), target.encode(), fstype.encode(), ctypes.c_ulong(flags), data), target)


def write(path, text):
    with open(path, "w") as handle:
        handle.write(text)


def keep_only(keep):
    """Close every descriptor but those in `keep` (all above 2); 0, 1 and 2 become /dev/null."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(devnull, target)
    os.close(devnull)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, max(os.sysconf("SC_OPEN_MAX"), 1024))


def raise_oom_score():
    """The call's processes go first when memory runs out, before the template (raising needs no privilege).
    A process that is not dumpable has its /proc/self files owned by root, so this one is made dumpable first,
    as new_namespaces, which comes next, makes it anyway; the child is made non-dumpable again after."""
    check(LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    write("/proc/self/oom_score_adj", "1000")


def new_namespaces():
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    # A non-dumpable process cannot write its own id maps; nothing of another call can see this one meanwhile
    # (their code runs in PID namespaces of their own), and the child is made non-dumpable again after.
    check(LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    check(LIBC.unshare(flags), "unshare")
    write("/proc/self/setgroups", "deny")
    write("/proc/self/uid_map", f"{uid} {uid} 1")
    write("/proc/self/gid_map", f"{gid} {gid} 1")


def mask(config):
    """Mask again what the engine masks in a container: files behind /dev/null, directories behind an empty
    read-only tmpfs; the read-only paths bound read-only onto themselves."""
    for path in config.get("mask", ()):
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=0555")
        elif os.path.exists(path):
            mount("/dev/null", path, "", MS_BIND)
    for path in config.get("read_only", ()):
        if os.path.exists(path):
            mount(path, path, "", MS_BIND | MS_REC)
            mount(path, path, "", MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def fresh_mounts(config):
    mount("none", "/", "", MS_REC | MS_PRIVATE)
    mount("tmpfs", "/workspace", "tmpfs", MS_NOSUID | MS_NODEV, f"size={config['workspace']},mode=0700")
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={config['tmp']},mode=1777")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={config['tmp']},mode=1777")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # The engines' and bwrap's /dev/ptmx point into /dev/pts: a terminal of this call's own instance.
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    if os.path.isdir("/dev/mqueue"):
        # The container's queue file system shows its own IPC namespace's queues, not this call's.
        mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    mask(config)
    name = b"sandbox"
    check(LIBC.sethostname(name, len(name)), "sethostname")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = IFREQ.pack(b"lo", 0)
        flags = IFREQ.unpack(fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS, IFREQ.pack(b"lo", flags | IFF_UP))


def set_rlimits(config):
    """The sandbox's rlimits, lowered only (CPU: SIGXCPU at the soft limit, SIGKILL a little later)."""
    wanted = {name: (value, value) for name, value in config["rlimits"].items()}
    wanted["CPU"] = (config["cpu"], config["cpu"] + 5)
    for name, (soft, hard) in wanted.items():
        kind = getattr(resource, "RLIMIT_" + name)
        _, ceiling = resource.getrlimit(kind)
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        resource.setrlimit(kind, (soft, hard))


def lock_down(config):
    for cap in range(64):
        if LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    check(LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0)
    data = bytes(24)  # two struct __user_cap_data_struct, all zero
    check(LIBC.capset(header, data), "capset")
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    program_filter = ctypes.create_string_buffer(bytes.fromhex(config["seccomp"]))
    program = SockFprog(len(program_filter.raw) // 8, ctypes.addressof(program_filter))
    check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0), "seccomp")
