"""One suite for every real backend: what code inside the sandbox can see and do, and what the server gets back."""

from __future__ import annotations

import errno
import json
import platform
import socket
import textwrap

import anyio
import pytest

from llm_sandbox_mcp.errors import InvalidRequest
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.models import Execution
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.seccomp.policy import AUDIT_ARCH_AARCH64, AUDIT_ARCH_X86_64, SYSCALLS
from tests.engines.conftest import RecordingBackend, engine_settings
from tests.support.memory import RssWindow
from tests.support.survivors import LISTING, survivors

pytestmark = pytest.mark.anyio


async def run(executor: Executor, code: str, **kwargs: object) -> Execution:
    return await executor.execute(textwrap.dedent(code), **kwargs)  # type: ignore[arg-type]


async def test_hello_world(executor: Executor) -> None:
    result = await run(executor, "print('hello from the sandbox')")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hello from the sandbox\n", "")
    assert not result.timed_out and not result.truncated
    assert result.artifacts == []


async def test_a_failing_program_is_a_result_with_the_users_line_numbers(executor: Executor) -> None:
    result = await run(executor, "x = 1\ny = 2\nraise ValueError('boom')\n")
    assert result.exit_code == 1
    assert 'File "/workspace/main.py", line 3, in <module>' in result.stderr
    assert "ValueError: boom" in result.stderr
    assert "python_runner" not in result.stderr and "<string>" not in result.stderr


async def test_exit_codes_and_syntax_errors(executor: Executor) -> None:
    assert (await run(executor, "import sys; sys.exit(7)")).exit_code == 7
    broken = await run(executor, "def f(:\n  pass")
    assert broken.exit_code == 1 and "SyntaxError" in broken.stderr and "main.py" in broken.stderr


async def test_sandbox_has_no_capabilities_no_root_and_no_new_privileges(executor: Executor) -> None:
    result = await run(
        executor,
        """
        import os
        status = dict(line.split(':\\t', 1) for line in open('/proc/self/status').read().splitlines() if ':\\t' in line)
        fields = [status[name].strip() for name in ('CapEff', 'CapPrm', 'NoNewPrivs')]
        print(os.getuid(), os.getgid(), *fields)
        """,
    )
    uid, gid, cap_eff, cap_prm, no_new_privs = result.stdout.split()
    assert uid != "0" and gid != "0"
    assert int(cap_eff, 16) == 0 and int(cap_prm, 16) == 0
    assert no_new_privs == "1"


# One syscall policy on every engine: the same answer to each call, whatever runs the sandbox. Each probe is
# chosen so that, without the policy, it would succeed or fail with another errno (the comments say how), so
# EPERM here is the policy's answer, not a missing capability's. 0 means the call succeeded.
SYSCALL_ANSWERS: dict[str, int] = {
    "unshare(CLONE_NEWUSER)": errno.EPERM,  # succeeds unconfined: a new user namespace
    "unshare(CLONE_NEWNS)": errno.EPERM,
    "unshare(CLONE_NEWNET)": errno.EPERM,
    "clone(CLONE_NEWUSER|CLONE_NEWNET)": errno.EPERM,  # succeeds unconfined: a child in new namespaces
    "setns(uts)": errno.EPERM,
    "mount(tmpfs)": errno.EPERM,
    "umount2(/tmp)": errno.EPERM,
    "ptrace(PTRACE_ATTACH, own child)": errno.EPERM,  # succeeds unconfined: same uid, a descendant
    "bpf(BPF_MAP_CREATE)": errno.EPERM,  # EINVAL unconfined where unprivileged BPF is on
    "perf_event_open(NULL)": errno.EPERM,  # EFAULT unconfined
    "userfaultfd(UFFD_USER_MODE_ONLY)": errno.EPERM,  # succeeds unconfined
    "keyctl(GET_KEYRING_ID, session)": errno.EPERM,  # succeeds unconfined
    "io_uring_setup(1)": errno.EPERM,  # succeeds unconfined
    "personality(ADDR_NO_RANDOMIZE)": errno.EPERM,  # succeeds unconfined
    "clone3(NULL, 0)": errno.ENOSYS,  # EINVAL unconfined; ENOSYS makes libc fall back to clone
    # What must keep working.
    "personality(0xffffffff)": 0,
    "fork": 0,
    "thread": 0,
}
SYSCALL_PROBE = """
import ctypes, json, os, signal, threading, time
NR = json.loads(%r)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def call(name, *args):
    ctypes.set_errno(0)
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]  # pointers: ctypes objects, kept alive
    result = libc.syscall(ctypes.c_long(NR[name]), *args)
    if result == 0 and name == "clone":
        os._exit(0)  # the child of a clone that was allowed
    if result > 0 and name == "clone":
        os.waitpid(result, 0)
    return 0 if result >= 0 else ctypes.get_errno()

def raised(action):
    try:
        action()
        return 0
    except OSError as exc:
        return exc.errno

def attach():
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    try:
        return call("ptrace", 16, child, 0, 0)  # PTRACE_ATTACH
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)

def fork():
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)

def isolated(probe):
    # One child per probe: a call that got through cannot change the next one's answer.
    child = os.fork()
    if child == 0:
        os._exit(probe())
    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])

probes = {
    "unshare(CLONE_NEWUSER)": lambda: call("unshare", 0x10000000),
    "unshare(CLONE_NEWNS)": lambda: call("unshare", 0x00020000),
    # os.unshare is Python 3.12+ (bubblewrap runs the host's Python).
    "unshare(CLONE_NEWNET)": lambda: raised(lambda: os.unshare(os.CLONE_NEWNET)) if hasattr(os, "unshare")
                             else call("unshare", 0x40000000),
    "clone(CLONE_NEWUSER|CLONE_NEWNET)": lambda: call("clone", 0x10000000 | 0x40000000 | signal.SIGCHLD, 0, 0, 0, 0),
    "setns(uts)": lambda: call("setns", os.open("/proc/self/ns/uts", os.O_RDONLY), 0),
    "mount(tmpfs)": lambda: call("mount", ctypes.c_char_p(b"none"), ctypes.c_char_p(b"/tmp"),
                                 ctypes.c_char_p(b"tmpfs"), 0, 0),
    "umount2(/tmp)": lambda: call("umount2", ctypes.c_char_p(b"/tmp"), 0),
    "ptrace(PTRACE_ATTACH, own child)": lambda: attach(),
    "bpf(BPF_MAP_CREATE)": lambda: call("bpf", 0, 0, 0),
    "perf_event_open(NULL)": lambda: call("perf_event_open", 0, 0, -1, -1, 0),
    "userfaultfd(UFFD_USER_MODE_ONLY)": lambda: call("userfaultfd", 1),
    "keyctl(GET_KEYRING_ID, session)": lambda: call("keyctl", 0, -3, 1),
    "io_uring_setup(1)": lambda: call("io_uring_setup", 1, ctypes.create_string_buffer(120)),
    "personality(ADDR_NO_RANDOMIZE)": lambda: call("personality", 0x0040000),
    "clone3(NULL, 0)": lambda: call("clone3", 0, 0),
    "personality(0xffffffff)": lambda: call("personality", 0xFFFFFFFF),
    "fork": lambda: raised(fork),
    "thread": lambda: raised(lambda: (lambda t: (t.start(), t.join()))(threading.Thread(target=int))),
}
answers = {name: isolated(probe) for name, probe in probes.items()}
print(json.dumps(answers))
"""


@pytest.mark.skipif(platform.machine() not in ("x86_64", "aarch64"), reason="the policy covers x86_64 and aarch64")
async def test_seccomp_every_engine_answers_the_same_to_each_denied_syscall(executor: Executor) -> None:
    table = SYSCALLS[AUDIT_ARCH_X86_64 if platform.machine() == "x86_64" else AUDIT_ARCH_AARCH64]
    result = await run(executor, SYSCALL_PROBE % json.dumps(table), timeout=60)
    assert result.exit_code == 0, result.stderr
    answers = json.loads(result.stdout)
    wrong = {name: errno.errorcode.get(got, got) for name, got in answers.items() if got != SYSCALL_ANSWERS[name]}
    assert not wrong, f"answers differing from the policy: {wrong}"
    assert set(answers) == set(SYSCALL_ANSWERS)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the i386 ABI exists on x86_64 kernels only")
async def test_seccomp_another_abi_cannot_dodge_the_policy(executor: Executor) -> None:
    """A 64-bit process making an i386 syscall (`int 0x80`) is killed: the policy knows only the native ABI."""
    code = """
        import ctypes, mmap
        buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        buf.write(bytes([0xB8, 0x14, 0, 0, 0, 0xCD, 0x80, 0xC3]))  # mov eax, 20 (i386 getpid); int 0x80; ret
        print("i386 getpid:", ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))())
    """
    result = await run(executor, code)
    assert result.stdout == "" and result.exit_code == 128 + 31, (result.exit_code, result.stdout)  # SIGSYS


async def test_open_files_and_core_dumps_are_limited(executor: Executor) -> None:
    result = await run(
        executor,
        "import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_CORE))",
    )
    nofile = executor.limits.nofile
    assert result.stdout == f"({nofile}, {nofile}) (0, 0)\n"


# What a sandbox's network looks like from inside: only loopback, except on Kubernetes, where a cluster keeps the
# pod's interface under the deny-all NetworkPolicy and drops what leaves it (so does the API double's node).
INTERFACES = {"kubernetes": "['eth0', 'lo']"}
LIST_INTERFACES = "print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]))"


async def test_sandbox_has_only_a_loopback_interface_or_a_pods_filtered_one(executor: Executor) -> None:
    result = await run(executor, LIST_INTERFACES)
    assert result.stdout.strip() == INTERFACES.get(executor.engine, "['lo']")


# Each way out, as code would try it: a service on the host's own address, a public address, and a name lookup.
NO_WAY_OUT = """
import json, socket
host, port = {host!r}, {port}
def connect(address, port):
    try:
        socket.create_connection((address, port), timeout=2).close()
        return "connected"
    except OSError as e:
        return type(e).__name__
def lookup(name):
    try:
        return str(socket.getaddrinfo(name, 443))
    except OSError as e:
        return type(e).__name__
print(json.dumps({"host": connect(host, port), "public": connect("1.1.1.1", 443), "dns": lookup("example.com")}))
"""


def _host_address() -> str:
    """The address this host reaches the outside from (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("1.1.1.1", 53))
        return str(probe.getsockname()[0])


async def test_no_connection_leaves_the_sandbox(executor: Executor) -> None:
    """Proven from inside on every engine. On Kubernetes the pod has an interface and a route, so this is what
    holds the network shut there: the policy drops each attempt (each waits out its 2 s), where the other engines
    have no route at all. Worth its seconds on Kubernetes: the double keeps the interface a cluster keeps."""
    address = _host_address()
    with socket.socket() as listener:
        listener.bind((address, 0))
        listener.listen(4)
        listener.setblocking(False)
        code = NO_WAY_OUT.replace("{host!r}", repr(address)).replace("{port}", str(listener.getsockname()[1]))
        result = await run(executor, code, timeout=60)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing arrived
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    dropped_or_unroutable = "TimeoutError" if executor.engine == "kubernetes" else "OSError"  # OSError: ENETUNREACH
    assert seen == {"host": dropped_or_unroutable, "public": dropped_or_unroutable, "dns": "gaierror"}, seen


async def test_root_filesystem_is_read_only_and_workspace_and_tmp_are_writable(executor: Executor) -> None:
    result = await run(
        executor,
        """
        import os
        for path in ('/etc/probe', '/usr/probe', '/probe', '/workspace/probe', '/tmp/probe'):
            try:
                open(path, 'w').write('x')
                print(path, 'writable')
            except OSError as exc:
                print(path, 'denied', exc.errno)
        """,
    )
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["/etc/probe"].startswith("denied")
    assert lines["/usr/probe"].startswith("denied")
    assert lines["/probe"].startswith("denied")
    assert lines["/workspace/probe"] == "writable"
    assert lines["/tmp/probe"] == "writable"


async def test_the_servers_environment_is_not_visible_inside(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_SANDBOX_CANARY_SECRET", "do-not-leak")
    result = await run(executor, "import os; print(sorted(os.environ))")
    assert "LLM_SANDBOX_CANARY_SECRET" not in result.stdout
    assert "do-not-leak" not in result.stdout


async def test_a_fork_bomb_is_contained_by_the_pids_limit(executor: Executor) -> None:
    result = await run(
        executor,
        """
        import os, time
        children = 0
        try:
            while True:
                pid = os.fork()
                if pid == 0:
                    time.sleep(30)
                    os._exit(0)
                children += 1
        except OSError as exc:
            print('stopped after', children, exc.errno)
        """,
        timeout=20,
    )
    assert result.stdout.startswith("stopped after"), result.stderr
    children = int(result.stdout.split()[2])
    assert 0 < children < executor.limits.pids


async def test_a_memory_bomb_is_killed(executor: Executor) -> None:
    result = await run(
        executor, "blocks = []\nwhile True:\n    blocks.append(bytearray(64 * 1024 * 1024))\n", timeout=30
    )
    assert result.exit_code != 0
    assert result.exit_code == 137 or "MemoryError" in result.stderr


async def test_a_timeout_kills_every_process_and_keeps_partial_output(
    executor: Executor, backend: RecordingBackend
) -> None:
    spec = executor.spec_for(get_language("python"))
    ref = await backend.create(spec)
    try:
        result = await backend.exec(
            ref,
            ["sh", "-c", "echo started; sleep 1000 & (sleep 1000 &) ; python3 -c 'while True: pass'"],
            timeout=2,
        )
        assert result.timed_out
        assert result.stdout == b"started\n"
        listing = await backend.exec(ref, ["sh", "-c", LISTING], timeout=10)
        alive = survivors(listing.stdout)
        assert alive == [], alive
    finally:
        await backend.destroy(ref)


async def test_an_infinite_loop_times_out_as_a_result(executor: Executor) -> None:
    result = await run(executor, "print('before', flush=True)\nwhile True: pass\n", timeout=2)
    assert result.timed_out
    assert result.stdout == "before\n"
    assert "timed out after 2 s" in result.stderr


async def test_a_timed_out_program_still_returns_its_files(executor: Executor) -> None:
    code = """
    import os, subprocess, time
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/partial.txt", "w") as handle:
        handle.write("written before the timeout")
    subprocess.Popen(["sleep", "1000"], start_new_session=True)
    print("waiting", flush=True)
    time.sleep(1000)
    """
    result = await run(executor, code, timeout=2)
    assert result.timed_out and result.exit_code == 137, result
    assert result.stdout == "waiting\n"
    [artifact] = result.artifacts
    assert artifact.name == "partial.txt" and artifact.data == b"written before the timeout"


async def test_an_output_flood_is_capped_head_and_tail_without_growing_the_server(executor: Executor) -> None:
    window = RssWindow()
    result = await run(
        executor,
        """
        import sys
        sys.stdout.write('FIRST\\n')
        chunk = 'x' * (1 << 20)
        for _ in range(40):  # under the read budget (READ_BUDGET_FACTOR): kept head and tail, not stopped
            sys.stdout.write(chunk)
        sys.stdout.write('\\nLAST\\n')
        """,
        timeout=120,
    )
    grown = window.growth()  # the peak during this call, whatever earlier tests reached
    assert result.exit_code == 0 and result.truncated
    assert result.stdout.startswith("FIRST\n") and result.stdout.endswith("LAST\n")
    assert len(result.stdout) < executor.settings.sandbox_output_limit + 200
    assert grown < 100 * 1024**2


async def test_invalid_utf8_output_is_replaced(executor: Executor) -> None:
    result = await run(
        executor, "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe\\n')\nsys.stderr.buffer.write(b'\\xc3')"
    )
    assert result.stdout == "ok \ufffd\ufffd\n"
    assert result.stderr == "\ufffd"


async def test_unicode_in_and_out(executor: Executor) -> None:
    result = await run(executor, "print('héllo wörld ✓ 日本')")
    assert result.stdout == "héllo wörld ✓ 日本\n"


async def test_huge_code_runs_and_oversized_code_is_refused(executor: Executor) -> None:
    big = "x = 0\n" + "x += 1\n" * 100_000 + "print(x)\n"
    assert (await run(executor, big)).stdout == "100000\n"
    with pytest.raises(InvalidRequest, match="limit is 1048576 bytes"):
        await run(executor, "#" * (1024 * 1024 + 1))


async def test_every_matplotlib_figure_comes_back_with_no_setup_text(executor: Executor) -> None:
    result = await run(
        executor,
        """
        import os
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3]); plt.show()
        plt.figure(); plt.bar(['a', 'b'], [3, 1]); plt.show()
        fig = plt.figure(); plt.scatter([1, 2], [2, 1])
        fig.savefig(os.path.join(os.environ['OUTPUT_DIR'], 'scatter.svg'))
        plt.figure(); plt.plot([3, 2, 1])
        print('done')
        """,
        timeout=60,
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "done\n"
    names = [(a.name, a.mime_type) for a in result.artifacts]
    pngs = [name for name, mime in names if mime == "image/png"]
    assert len(pngs) == 4, names  # two shown, two left open (the scatter one was also saved as SVG)
    assert ("scatter.svg", "image/svg+xml") in names
    for artifact in result.artifacts:
        assert artifact.data is not None
        if artifact.mime_type == "image/png":
            assert artifact.data.startswith(b"\x89PNG\r\n\x1a\n")


async def test_libraries_install_with_network_then_run_without_and_are_cached(
    executor: Executor, backend: RecordingBackend, engine: str
) -> None:
    code = "import six, socket\nprint(six.__name__, socket.gethostbyname_ex.__name__)\n"
    # On Docker not the store an earlier run left: this call installs. Every engine's own fresh install (its way
    # to the registry, its store) is proven by tests/engines/test_egress.py with this session's packages; here
    # the other engines may start from an earlier run's store, which is what the caching below is about.
    fresh = engine == "docker"
    if fresh:
        backend.fresh_stores()
    first = await run(executor, code, libraries=["six"], timeout=60)
    assert first.exit_code == 0, first.stderr
    assert first.stdout.startswith("six ")
    assert not fresh or get_language("python").install_argv(["six"]) in backend.argvs, "nothing was installed"
    no_network = await run(executor, LIST_INTERFACES, libraries=["six"])
    assert no_network.stdout.strip() == INTERFACES.get(executor.engine, "['lo']")  # no more network with libraries
    read_only = await run(executor, "open('/opt/llm-sandbox/libs/python/evil.py', 'w')", libraries=["six"])
    assert read_only.exit_code == 1 and "Read-only file system" in read_only.stderr

    # A new server process (fresh executor) on the same engine reuses the cache and installs nothing.
    backend.argvs.clear()
    async with Executor(engine_settings(engine), backend) as fresh:
        again = await fresh.execute(code, libraries=["six"])
    assert again.stdout == first.stdout
    assert not any("pip" in argv for argv in backend.argvs)


async def test_an_unknown_library_is_an_install_error_with_pips_message(executor: Executor) -> None:
    from llm_sandbox_mcp.errors import InstallFailed

    with pytest.raises(InstallFailed, match="No matching distribution|not find a version"):
        await run(executor, "pass", libraries=["no-such-package-llm-sandbox-zz9"], timeout=60)


async def test_calls_run_concurrently(executor: Executor) -> None:
    results: list[Execution] = []

    async def one(n: int) -> None:
        results.append(await run(executor, f"print({n} * 2)"))

    async with anyio.create_task_group() as tasks:
        for n in range(4):
            tasks.start_soon(one, n)
    assert sorted(r.stdout for r in results) == ["0\n", "2\n", "4\n", "6\n"]


async def test_a_process_whose_sandbox_vanishes_under_it_ends_with_status_137(
    executor: Executor, backend: RecordingBackend
) -> None:
    ref = await backend.create(executor.spec_for(get_language("python")))
    results: list[int] = []

    async def long_running() -> None:
        results.append((await backend.exec(ref, ["sh", "-c", "touch /tmp/started; sleep 300"], timeout=120)).exit_code)

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(long_running)
            started = await backend.exec(
                ref, ["sh", "-c", "until [ -f /tmp/started ]; do sleep 0.05; done"], timeout=60
            )
            assert not started.timed_out
            await backend.destroy(ref)
    finally:
        await backend.destroy(ref)
    assert results == [137]
