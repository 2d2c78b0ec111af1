# The Python zygote: the template process of run/zygote/templates.py, run inside a bubblewrap or NsJail sandbox as
# `python3 -c <this file> <python_kernel.py source> <python_isolation.py source> <config JSON>`. It pays the
# interpreter start and the kernel's imports once, then forks one child per call. It never runs user code and
# never reads anything a child writes: the server sends it, on the control socket (a SOCK_SEQPACKET
# descriptor), one message per call carrying the child's end of a fresh socket pair, and the child speaks the
# kernel's frame protocol (python_kernel.py) on that socket straight to the server.
#
# Each child, before any user code, makes a sandbox of its own inside the template's (python_isolation.py):
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
import gc
import json
import os
import signal
import socket
import sys
import types


def load(name, source):
    module = types.ModuleType(name)
    exec(compile(source, "<string>", "exec"), module.__dict__)
    return module


kernel = load("llm_sandbox_kernel", sys.argv[1])
isolation = load("llm_sandbox_isolation", sys.argv[2])
CONFIG = json.loads(sys.argv[3])
SOCKET_FD = 3
INHERITED = []


def only_socket(fd):
    os.dup2(fd, SOCKET_FD)
    isolation.keep_only([SOCKET_FD])


def child(fd):
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    only_socket(fd)
    try:
        isolation.set_rlimits(CONFIG)
        isolation.new_namespaces()
        if os.fork() != 0:
            os._exit(0)
        isolation.fresh_mounts(CONFIG)
        os.chdir("/workspace")
        kernel.not_dumpable()
        # The template's own protocol files stay referenced (in INHERITED): collected, they would close
        # descriptors that now hold other things.
        kernel.PROTO = os.fdopen(SOCKET_FD, "wb", buffering=0)
        kernel.STDIN = os.fdopen(os.dup(SOCKET_FD), "rb", buffering=0)
        kernel.note_existing()
        kernel.write_files()
        # Locked down before it waits: a child forked ahead waits for its call with no privilege left.
        isolation.lock_down(CONFIG)
    except Exception as exc:
        # Before the hello, the server takes whatever arrives for the reason this host cannot make children.
        os.write(SOCKET_FD, f"zygote child setup failed: {exc}".encode()[:1000])
        os._exit(1)
    kernel.hello()
    try:
        placed, _ = kernel.receive()
        # In its cgroup now: the program's process is forked ahead, in there, and waits for the request.
        program = kernel.fork_program() if placed == b"G" else os._exit(1)
        kind, payload = kernel.receive()
    except EOFError:
        os._exit(0)
    if kind != b"R":
        os._exit(1)
    kernel.run_forked(kernel.parse_request(payload), program)
    os._exit(0)


def main():
    control = socket.socket(fileno=CONFIG["control"])
    INHERITED.extend((kernel.PROTO, kernel.STDIN, control))
    kernel.not_dumpable()
    kernel.prepare()
    kernel.warm_matplotlib()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel; none reports back
    # What is loaded now is never collected: a child's collector then does not walk (and copy) every page of it.
    gc.collect()
    gc.freeze()
    kernel.hello()
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
