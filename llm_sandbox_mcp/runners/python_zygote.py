# The Python zygote: the template process of llm_sandbox_mcp/zygote.py, run inside a bubblewrap sandbox as
# `python3 -c <this file> <python_kernel.py source> <config JSON>`. It pays the interpreter start and the
# kernel's imports once, then forks one child per call. It never runs user code and never reads anything a
# child writes: the server sends it, on the control socket (a SOCK_SEQPACKET descriptor), one message per
# call carrying the child's end of a fresh socket pair, and the child speaks the kernel's frame protocol
# (python_kernel.py) on that socket straight to the server.
#
# Each child, before any user code, makes a sandbox of its own inside the template's:
#   1. closes every descriptor but its socket; new user, mount, PID, network, IPC and UTS namespaces (the
#      user namespace maps only its own uid and gid), then forks once more: the grandchild is PID 1 of the
#      new PID namespace and the intermediate exits;
#   2. fresh size-limited tmpfs on /workspace, /tmp and /dev/shm, a /proc of its own PID namespace, a devpts
#      instance of its own, the loopback interface up, the host name "sandbox";
#   3. sets the sandbox's rlimits, drops every capability (bounding, ambient, effective, permitted,
#      inheritable), sets no_new_privs and the same seccomp filter every bubblewrap exec gets (which forbids
#      new namespaces and mounts);
#   4. sends the kernel's hello and waits: the server sends "G" (an empty frame) only once it has moved this
#      process (known by the SCM_CREDENTIALS the kernel attaches to the hello) into a cgroup of its own; then
#      forks the program's process (python_kernel.fork_program), which waits for the request, and runs the
#      request when it comes as the kernel's fork mode does.
# Must run on any Python 3.9+ (socket.recv_fds). Prints nothing of its own.
import ctypes
import fcntl
import gc
import io
import json
import os
import resource
import signal
import socket
import struct
import sys
import types

CONFIG = json.loads(sys.argv[2])
kernel = types.ModuleType("llm_sandbox_kernel")
exec(compile(sys.argv[1], "<string>", "exec"), kernel.__dict__)

LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAP_AMBIENT = 4, 24, 38, 22, 47
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER = 4, 2
LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
IFREQ = struct.Struct("16sh22x")  # struct ifreq: the name, then ifr_flags in the union
SOCKET_FD = 3
INHERITED = []


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


FILTER = ctypes.create_string_buffer(bytes.fromhex(CONFIG["seccomp"]))


def check(result, what):
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{what}: {os.strerror(error)}")


def mount(source, target, fstype, flags, options):
    data = options.encode() if options else None
    check(LIBC.mount(source.encode(), target.encode(), fstype.encode(), ctypes.c_ulong(flags), data), target)


def write(path, text):
    with open(path, "w") as handle:
        handle.write(text)


def only_socket(fd):
    os.dup2(fd, SOCKET_FD)
    os.closerange(SOCKET_FD + 1, max(os.sysconf("SC_OPEN_MAX"), 1024))
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(devnull, target)
    if devnull > SOCKET_FD:
        os.close(devnull)


def new_namespaces():
    uid, gid = os.getuid(), os.getgid()
    flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    # A non-dumpable process cannot write its own id maps; nothing of another call can see this one meanwhile
    # (their code runs in PID namespaces of their own), and the child is made non-dumpable again below.
    check(LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    check(LIBC.unshare(flags), "unshare")
    write("/proc/self/setgroups", "deny")
    write("/proc/self/uid_map", f"{uid} {uid} 1")
    write("/proc/self/gid_map", f"{gid} {gid} 1")


def fresh_mounts():
    mount("none", "/", "", MS_REC | MS_PRIVATE, None)
    mount("tmpfs", "/workspace", "tmpfs", MS_NOSUID | MS_NODEV, f"size={CONFIG['workspace']},mode=0700")
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={CONFIG['tmp']},mode=1777")
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={CONFIG['tmp']},mode=1777")
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    # bwrap's /dev/ptmx points into /dev/pts: a terminal of this call's own instance.
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620")
    name = b"sandbox"
    check(LIBC.sethostname(name, len(name)), "sethostname")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = IFREQ.pack(b"lo", 0)
        flags = IFREQ.unpack(fcntl.ioctl(probe.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe.fileno(), SIOCSIFFLAGS, IFREQ.pack(b"lo", flags | IFF_UP))


def set_rlimits():
    """The sandbox's rlimits, lowered only (CPU: SIGXCPU at the soft limit, SIGKILL a little later)."""
    wanted = {name: (value, value) for name, value in CONFIG["rlimits"].items()}
    wanted["CPU"] = (CONFIG["cpu"], CONFIG["cpu"] + 5)
    for name, (soft, hard) in wanted.items():
        kind = getattr(resource, "RLIMIT_" + name)
        _, ceiling = resource.getrlimit(kind)
        if ceiling != resource.RLIM_INFINITY:
            soft, hard = min(soft, ceiling), min(hard, ceiling)
        resource.setrlimit(kind, (soft, hard))


def lock_down():
    for cap in range(64):
        if LIBC.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the last capability this kernel knows
    check(LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0)
    data = bytes(24)  # two struct __user_cap_data_struct, all zero
    check(LIBC.capset(header, data), "capset")
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    program = SockFprog(len(FILTER.raw) // 8, ctypes.addressof(FILTER))
    check(LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0), "seccomp")


def child(fd):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    only_socket(fd)
    try:
        set_rlimits()
        new_namespaces()
        if os.fork() != 0:
            os._exit(0)
        fresh_mounts()
        os.chdir("/workspace")
        kernel.not_dumpable()
        # The template's own protocol files stay referenced (in INHERITED): collected, they would close
        # descriptors that now hold other things.
        kernel.PROTO = os.fdopen(SOCKET_FD, "wb", buffering=0)
        kernel.STDIN = os.fdopen(os.dup(SOCKET_FD), "rb", buffering=0)
        kernel.note_existing()
        kernel.write_files()
        # Locked down before it waits: a child forked ahead waits for its call with no privilege left.
        lock_down()
    except Exception as exc:
        # Before the hello, the server takes whatever arrives for the reason this host cannot make children.
        os.write(SOCKET_FD, f"zygote child setup failed: {exc}".encode()[:1000])
        os._exit(1)
    kernel.send(b"H", json.dumps({"pid": os.getpid(), "python": sys.version.split()[0]}).encode())
    try:
        placed, _ = kernel.receive()
        # In its cgroup now: the program's process is forked ahead, in there, and waits for the request.
        program = kernel.fork_program() if placed == b"G" else os._exit(1)
        kind, payload = kernel.receive()
    except EOFError:
        os._exit(0)
    if kind != b"R":
        os._exit(1)
    header, _, code = payload.partition(b"\n")
    request = json.loads(header.decode("utf-8"))
    request["code"] = code.decode("utf-8", errors="replace")
    kernel.run_forked(request, program)
    os._exit(0)


def warm_matplotlib():
    """Draw and render one figure, so fonts and the Agg renderer are loaded before any child is forked."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        figure = pyplot.figure()
        figure.gca().plot([0, 1])
        figure.savefig(io.BytesIO(), format="png")
    except Exception:
        pass
    pyplot.close("all")


def main():
    control = socket.socket(fileno=CONFIG["control"])
    INHERITED.extend((kernel.PROTO, kernel.STDIN, control))
    kernel.not_dumpable()
    kernel.prepare()
    warm_matplotlib()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel; none reports back
    # What is loaded now is never collected: a child's collector then does not walk (and copy) every page of it.
    gc.collect()
    gc.freeze()
    kernel.send(b"H", json.dumps({"pid": os.getpid(), "python": sys.version.split()[0]}).encode())
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 16, 4)
        except InterruptedError:
            continue
        if not message and not fds:
            return  # the server closed the control socket
        for extra in fds[1:]:
            os.close(extra)
        if not fds:
            continue
        if os.fork() == 0:
            try:
                child(fds[0])
            finally:
                os._exit(1)
        os.close(fds[0])


main()
