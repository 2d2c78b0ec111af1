# The Python kernel: runs inside the sandbox as `python3 -c <this file>` and speaks a framed protocol with the
# server on its stdin/stdout. Frames are 1 kind byte + 4-byte big-endian length + payload.
#   server -> kernel  R {"mode": "fork"|"inline", "echo", "artifact_limit", "filename"} "\n" code (UTF-8)
#                     I (empty): interrupt the session cell that runs now (KeyboardInterrupt); dropped otherwise
#   kernel -> server  H {"pid", "python"}   O stdout bytes   E stderr bytes
#                     F {"name", "size", "inline"} "\n" data     D {"exit", "clean"?, "timed_out"?, "times"?}
# Started as `python3 -c <this file> <python_isolation.py source> <config JSON>`, it is the kernel of a Docker or
# Podman zygote template container (serve_forks): it never runs user code itself, and each one-shot call runs
# in a child that made a sandbox of its own first, whose "H" (one per call, before its request) says it is
# ready and that every process of the call before it is gone.
# "fork" runs the code in a forked child: a fresh process with the exit status, crashes and os._exit of a
# real script (which says its status on a pipe of its own before it exits, so nothing waits for the exit itself:
# it is then killed with the rest, not waited for); a one-shot run, so once the child has exited every other
# process of the sandbox user that did
# not exist when the kernel started is killed before the output files are read ("clean": false in D when that
# could not be achieved, with no files: the server then kills and collects from outside); a "timeout" in the
# request (seconds) is enforced here, the program and all it started killed at it ("timed_out" in D), so its
# files still come back. "inline" runs it in this process so variables survive between calls (sessions); what
# the code leaves running is left alone. Once a session has begun, a reader thread takes the frames, so an
# interrupt reaches a cell while it runs: the server keeps a cell's time and asks through this stream, with
# nothing started in the sandbox that the code could stop.
# The user's stdout/stderr go to pipes this kernel forwards, so nothing the code prints can break framing.
# Must run on any Python 3.8+. Prints nothing of its own.
import ast
import builtins
import contextlib
import fcntl
import gc
import io
import json
import linecache
import os
import select
import signal
import stat
import struct
import sys
import termios
import threading
import time
import traceback
import types

OUT = os.environ.get("OUTPUT_DIR", "/workspace/outputs")
SHIM_DIR = "/tmp/.llm_sandbox"
SHIM = """
from matplotlib.backends.backend_agg import FigureCanvasAgg as FigureCanvas  # noqa: F401
from matplotlib.backend_bases import FigureManagerBase as FigureManager  # noqa: F401


def show(*args, **kwargs):
    save_open_figures()


def save_open_figures():
    import os
    import matplotlib.pyplot as plt

    out = os.environ.get("OUTPUT_DIR", "/workspace/outputs")
    os.makedirs(out, exist_ok=True)
    for num in plt.get_fignums():
        index = 1
        while True:
            path = os.path.join(out, "figure_%03d.png" % index)
            try:
                os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                break
            except FileExistsError:
                index += 1
        plt.figure(num).savefig(path, format="png", dpi=100)
    plt.close("all")
"""
HEADER = struct.Struct(">cI")
PROTO = os.fdopen(os.dup(1), "wb", buffering=0)
LOCK = threading.Lock()
STDIN = os.fdopen(os.dup(0), "rb", buffering=0)


def send(kind, payload):
    with LOCK:
        PROTO.write(HEADER.pack(kind, len(payload)) + payload)


def read_exactly(size):
    data = b""
    while len(data) < size:
        chunk = STDIN.read(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def receive():
    kind, size = HEADER.unpack(read_exactly(HEADER.size))
    return kind, read_exactly(size)


def write_files():
    """The output directory and the matplotlib shim (again in each zygote child, whose /tmp is new)."""
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(SHIM_DIR, exist_ok=True)
    with open(os.path.join(SHIM_DIR, "llm_sandbox_mpl.py"), "w") as shim:
        shim.write(SHIM)


def prepare():
    write_files()
    sys.path.insert(0, SHIM_DIR)
    # Child processes of the user's code capture their figures too.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SHIM_DIR, os.environ.get("PYTHONPATH")) if p)
    os.environ["MPLBACKEND"] = "module://llm_sandbox_mpl"
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(os.devnull)
    if os.environ.pop("LLM_SANDBOX_PRELOAD", "") == "1":
        for name in ("numpy", "matplotlib.pyplot"):
            with contextlib.suppress(Exception):
                __import__(name)


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


MAX_FILES = 200
MAX_NAME = 1024


def snapshot():
    """Regular files in the output directory (links, FIFOs and devices are never opened)."""
    state = {}
    for root, _dirs, files in os.walk(OUT):
        for name in files:
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            relative = os.path.relpath(path, OUT)
            if stat.S_ISREG(info.st_mode) and len(relative) <= MAX_NAME:
                state[relative] = (info.st_mtime_ns, info.st_size)
    return state


def read_regular(path, size):
    """At most `size` bytes of a regular file, or None: a file swapped for a link or FIFO is not followed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return handle.read(size)


def send_artifacts(before, limit):
    after = snapshot()
    budget = limit
    changed = [name for name in sorted(after) if before.get(name) != after[name]][:MAX_FILES]
    for name in changed:
        size = after[name][1]
        inline = size <= budget
        data = b""
        if inline:
            data = read_regular(os.path.join(OUT, name), size)
            if data is None:
                continue
            size = len(data)
            budget -= size
        header = json.dumps({"name": name, "size": size, "inline": inline}).encode()
        send(b"F", header + b"\n" + data)


def save_figures():
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None and pyplot.get_fignums():
        try:
            import llm_sandbox_mpl

            llm_sandbox_mpl.save_open_figures()
        except Exception:
            traceback.print_exc()


def user_traceback(exc):
    # Drop this kernel's own frames so the traceback starts in the user's code.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb)


def run_code(request, namespace):
    """Run one request's code in `namespace`; return the exit status a script would have."""
    source = request["code"]
    filename = request["filename"]
    if filename.startswith("/"):
        with open(filename, "w", encoding="utf-8", errors="surrogateescape") as handle:
            handle.write(source)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    status = 0
    try:
        tree = ast.parse(source, filename, "exec")
        tail = None
        if request.get("echo") and tree.body and isinstance(tree.body[-1], ast.Expr):
            tail = ast.Expression(tree.body.pop().value)
        exec(compile(tree, filename, "exec", dont_inherit=True), namespace)
        if tail is not None:
            value = eval(compile(tail, filename, "eval", dont_inherit=True), namespace)
            if value is not None:
                namespace["_"] = value
                print(repr(value))
    except SystemExit as exc:
        if exc.code is None:
            status = 0
        elif isinstance(exc.code, int):
            status = exc.code
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except SyntaxError as exc:
        traceback.print_exception(type(exc), exc, None)
        status = 1
    except BaseException as exc:
        user_traceback(exc)
        status = 1
    finally:
        save_figures()
        sys.stdout.flush()
        sys.stderr.flush()
    return status


PUMP_LOCK = threading.Lock()


def pump(fds):
    """Forward what arrives on the session's capture pipes, for as long as the kernel lives."""
    kinds = {fds[0]: b"O", fds[1]: b"E"}
    while True:
        ready, _, _ = select.select(fds, [], [], 0.5)
        with PUMP_LOCK:
            for fd in ready:
                data = os.read(fd, 65536)
                if data:
                    send(kinds[fd], data)


def wait_forwarded(fds):
    """Return once everything written to the capture pipes so far has been forwarded by `pump`."""
    while True:
        with PUMP_LOCK:
            if all(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0] == 0 for fd in fds):
                return
        time.sleep(0.001)


def drain(fds, wait=0.02):
    """Forward everything already written to the pipes, without waiting for writers that stay alive."""
    while fds:  # select on no descriptors would just sleep its timeout
        ready, _, _ = select.select(fds, [], [], wait)
        if not ready:
            return
        progressed = False
        for fd in ready:
            data = os.read(fd, 65536)
            if data:
                send(b"O" if fd == fds[0] else b"E", data)
                progressed = True
        if not progressed:
            return


def status_of(wait_status):
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def fork_program():
    """Fork the process that runs a one-shot request, waiting for the request on a pipe of its own (a zygote
    child forks it before its call comes). Returns its pid, its stdout and stderr, the request pipe and the
    pipe on which it says its exit status before it exits."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    request_r, request_w = os.pipe()
    status_r, status_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (out_r, out_w, err_r, err_w, request_w, status_r):
            os.close(fd)
        PROTO.close()
        STDIN.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with os.fdopen(request_r, "rb") as pipe:
            request = json.loads(pipe.read().decode("utf-8"))
        namespace = fresh_main(request["filename"])
        status = run_code(request, namespace) & 0xFF
        # Said before the exit: tearing down an address space forked from the preloaded interpreter takes a
        # millisecond or more, which the call need not wait for (its output is flushed by now).
        with contextlib.suppress(OSError):
            os.write(status_w, b"%d\n" % status)
        os._exit(status)
    for fd in (out_w, err_w, request_r, status_w):
        os.close(fd)
    return pid, out_r, err_r, request_w, status_r


def reap_orphans(program):
    """Reap exited children other than the program: as PID 1 (a zygote child's runner) the program's orphans
    are this process's, and unreaped they would hold their pids. Elsewhere there are none."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == program:
            return  # the program's own status is read by the caller
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)


def run_forked(request, program=None):
    received = time.monotonic()
    before = snapshot()
    pid, out_r, err_r, request_w, status_r = program or fork_program()
    try:
        with os.fdopen(request_w, "wb") as pipe:
            pipe.write(json.dumps(request).encode("utf-8"))
    except BrokenPipeError:
        pass  # it died first (its status says how)
    # The run's own timeout, kept here so that a timed-out program's files still come back (the server kills
    # from outside only if this kernel does not report in time).
    limit = request.get("timeout")
    deadline = time.monotonic() + limit if isinstance(limit, (int, float)) else None
    fds = [out_r, err_r]
    kinds = {out_r: b"O", err_r: b"E"}
    open_fds = list(fds)
    # Readable once the program has exited (Linux 5.3, Python 3.9): its end is seen at once, also when it
    # closed its output long before (or the pipes closed a moment before it was a zombie).
    exited = []
    with contextlib.suppress(AttributeError, OSError):
        exited.append(os.pidfd_open(pid))
    said = [status_r]
    reported = None  # the exit status the program said before its exit, once it did
    wait_status = None
    timed_out = False
    while wait_status is None and reported is None:
        if open_fds or exited or said:
            ready, _, _ = select.select(open_fds + exited + said, [], [], 0.05)
        else:
            ready = []
            time.sleep(0.005)
        for fd in ready:
            if fd in exited:
                continue
            if fd in said:
                reported = said_status(fd)
                said.clear()
                continue
            data = os.read(fd, 65536)
            if data:
                send(kinds[fd], data)
            else:
                open_fds.remove(fd)
        if reported is not None:
            break
        reap_orphans(pid)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            wait_status = status
        elif deadline is not None and time.monotonic() >= deadline:
            timed_out = True
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
            wait_status = os.waitpid(pid, 0)[1]
    ended = time.monotonic()
    for fd in exited:
        os.close(fd)
    os.close(status_r)
    # Background processes may keep the pipes open: take what is there and stop. A program that said its
    # status flushed its output before; the pipes stay open only until its exit, which nothing waits for.
    wait = 0 if reported is not None else 0.02
    drain(open_fds, wait)
    clean = kill_the_rest(exiting=pid if reported is not None else None)
    if clean:
        drain([fd for fd in open_fds if fd in fds], wait)
    for fd in fds:
        os.close(fd)
    if clean:
        send_artifacts(before, request["artifact_limit"])
    times = [received, ended, time.monotonic()]  # for the server's stage account (SANDBOX_TRACE_STAGES)
    code = reported if reported is not None else status_of(wait_status)
    done = {"exit": code, "clean": clean, "timed_out": timed_out, "times": times}
    send(b"D", json.dumps(done).encode())
    if reported is not None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # after the answer: a kernel that serves on has no zombie left of it


def said_status(fd):
    """The exit status a program wrote before its exit, or None: it died first (end of file), or the code
    wrote something else there (it holds the pipe too; a status it makes up only ends its own run sooner)."""
    try:
        text = os.read(fd, 16)
    except OSError:
        return None
    if not text.endswith(b"\n") or not text[:-1].isdigit() or int(text[:-1]) > 255:
        return None
    return int(text[:-1])


def process_info(pid):
    """(real uid, start time, state, session) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            uid = next(int(line.split()[1]) for line in handle if line.startswith("Uid:"))
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rpartition(")")[2].split()
        return uid, fields[19], fields[0], fields[3]
    except (OSError, StopIteration, IndexError, ValueError):
        return None


def processes():
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


# What ran before this kernel (PID 1, the engine's helpers, its ancestors) is not the user's code, nor is
# what PID 1 starts later in its own session (its sleep): the code runs in a session of its own (setsid in
# run_forked), and no process can join another session.
BEFORE = set()
INIT_SESSION = []


def note_existing():
    for pid in processes():
        info = process_info(pid)
        if info is not None:
            BEFORE.add((pid, info[1]))
    init = process_info(1)
    INIT_SESSION.append(init[3] if init is not None else None)


def kill_the_rest(seconds=3.0, exiting=None):
    """True once no process of this user is left besides this kernel and what predates it. `exiting`: the
    program that said its status, now in its exit: killed too (it may have lied), but not waited for."""
    deadline = time.monotonic() + seconds
    me, uid = os.getpid(), os.getuid()
    while True:
        left = 0
        for pid in processes():
            if pid in (me, 1):
                continue
            if pid == exiting:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                continue
            info = process_info(pid)
            if info is None or info[0] != uid or (pid, info[1]) in BEFORE or info[2] in ("Z", "X"):
                continue
            if info[3] == INIT_SESSION[0]:
                continue
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            left += 1
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        if not left:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)


def fresh_main(filename):
    module = types.ModuleType("__main__")
    module.__dict__.update({"__file__": filename, "__builtins__": builtins})
    sys.modules["__main__"] = module
    sys.argv = [filename]
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return module.__dict__


SESSION = {}
# Set by the main thread while a session's cell runs: an interrupt that comes outside a cell is dropped.
IN_CELL = [False]


def on_interrupt(signum, frame):
    if IN_CELL[0]:
        raise KeyboardInterrupt


def read_frames(requests):
    """A session kernel's reader: requests queue for the main thread, an interrupt goes to the cell now running."""
    main = threading.main_thread().ident
    while True:
        try:
            kind, payload = receive()
        except EOFError:
            requests.put(None)
            return
        if kind == b"I":
            signal.pthread_kill(main, signal.SIGINT)
        elif kind == b"R":
            requests.put(payload)


def run_inline(request, capture):
    before = snapshot()
    namespace = SESSION.get("namespace")
    if namespace is None:
        namespace = SESSION["namespace"] = fresh_main(request["filename"])
    try:
        try:
            IN_CELL[0] = True
            status = run_code(request, namespace)
        finally:
            IN_CELL[0] = False
    except KeyboardInterrupt:
        status = 130
    wait_forwarded(capture)
    send_artifacts(before, request["artifact_limit"])
    send(b"D", json.dumps({"exit": status}).encode())


def not_dumpable():
    # Other processes of the sandbox user (the code this kernel runs, its children) cannot then open this
    # kernel's descriptors through /proc/<pid>/fd, ptrace it, or read its memory.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except Exception:
        pass


# How a template container's call child ends: the server closed the stream, or the sandbox could not be made
# (or the child got something else than one fork-mode request); either way the template stops with it.
CLOSED, REFUSED = 3, 4
PR_SET_CHILD_SUBREAPER = 36


def parse_request(payload):
    """An R frame's request: its JSON header line, and the code after it."""
    header, _, code = payload.partition(b"\n")
    request = json.loads(header.decode("utf-8"))
    request["code"] = code.decode("utf-8", errors="replace")
    return request


def hello():
    send(b"H", json.dumps({"pid": os.getpid(), "python": sys.version.split()[0]}).encode())


def refuse(what, exc):
    """Before its hello, a call child that cannot make its sandbox says why (an X frame) and ends."""
    with contextlib.suppress(Exception):
        send(b"X", json.dumps({"error": f"{what}: {exc}"[:1000]}).encode())
    os._exit(REFUSED)


def call_sandbox(isolation, config):
    """A call's child: a sandbox of its own (new namespaces, mounts, masks, no privilege, the strict filter),
    whose PID 1 runs one fork-mode request as run_forked does. Never returns."""
    isolation.keep_only([PROTO.fileno(), STDIN.fileno()])
    try:
        isolation.set_rlimits(config)
        isolation.raise_oom_score()
        isolation.new_namespaces()
    except Exception as exc:
        refuse("the call's namespaces", exc)
    init = os.fork()
    if init != 0:
        _, status = os.waitpid(init, 0)
        os._exit(status_of(status))
    try:
        isolation.fresh_mounts(config)
        os.chdir("/workspace")
        not_dumpable()
        # What predates the call is what this PID namespace has now (itself), not the template's processes.
        BEFORE.clear()
        del INIT_SESSION[:]
        note_existing()
        write_files()
        isolation.lock_down(config)
    except Exception as exc:
        refuse("the call's sandbox", exc)
    hello()
    program = fork_program()
    try:
        kind, payload = receive()
    except EOFError:
        os._exit(CLOSED)
    request = parse_request(payload) if kind == b"R" else {}
    if request.get("mode") != "fork":
        os._exit(REFUSED)
    run_forked(request, program)
    os._exit(0)


def serve_forks(isolation, config):
    """The template container's loop: one call child at a time, the next one forked only once every process
    of the last is gone (this kernel is their subreaper: an orphan comes back here and is waited for too)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    warm_matplotlib()
    # What is loaded now is never collected: a child's collector then does not walk (and copy) every page of it.
    gc.collect()
    gc.freeze()
    while True:
        child = os.fork()
        if child == 0:
            try:
                call_sandbox(isolation, config)
            finally:
                os._exit(REFUSED)
        status = None
        while True:
            try:
                pid, wait_status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == child:
                status = wait_status
        if status is None or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            return


def main():
    not_dumpable()
    note_existing()
    prepare()
    hello()
    if len(sys.argv) > 2:
        isolation = types.ModuleType("llm_sandbox_isolation")
        exec(compile(sys.argv[1], "<string>", "exec"), isolation.__dict__)
        serve_forks(isolation, json.loads(sys.argv[2]))
        return
    capture = None
    requests = None
    while True:
        if requests is None:
            try:
                kind, payload = receive()
            except EOFError:
                return
            if kind != b"R":
                continue
        else:
            payload = requests.get()
            if payload is None:
                return
        request = parse_request(payload)
        if request.get("mode") == "fork":
            run_forked(request)
            continue
        if requests is None:
            # A session from now on (a one-shot kernel forks its program with no thread of its own running).
            import queue

            requests = queue.Queue()
            signal.signal(signal.SIGINT, on_interrupt)
            threading.Thread(target=read_frames, args=(requests,), daemon=True).start()
        if capture is None:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.close(out_w)
            os.close(err_w)
            capture = [out_r, err_r]
            threading.Thread(target=pump, args=(capture,), daemon=True).start()
        run_inline(request, capture)


# Loaded as a module by the zygote (runners/python_zygote.py), which runs its own loop.
if __name__ == "__main__":
    main()
