"""Python calls forked inside zygote template containers (SANDBOX_ZYGOTE on Docker and Podman), probed from
inside the calls and from the container: consecutive calls served by the SAME container (the server's own
record of which container ran each call says so) share nothing, user code is as confined as in a pooled
container, abnormal calls retire their container, and where the children cannot make their sandboxes calls
take the pool.

A call served by a template container's child shows it: its runner is PID 1 of a PID namespace of its own, so
the program's parent is PID 1 (in a pooled container PID 1 is the holder's shell and the kernel is the parent).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

import pytest

from llm_sandbox_mcp.backends import load_backend
from llm_sandbox_mcp.models import Execution, Live, SandboxRef
from llm_sandbox_mcp.proc_masks import MASKED, READ_ONLY
from llm_sandbox_mcp.run.executor import Executor, Program
from llm_sandbox_mcp.run.leases import Lease
from llm_sandbox_mcp.run.modes import RunMode
from llm_sandbox_mcp.seccomp import oci
from tests.engines.conftest import engine_settings, require

pytestmark = [pytest.mark.anyio]

ENGINES = [pytest.param("docker", marks=pytest.mark.docker), pytest.param("podman", marks=pytest.mark.podman)]
MARKER = "27.1828"  # `sleep 27.1828`: a process of call 1 that the container's own /proc would show

PROBE = """
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(result):
    return ctypes.get_errno() if result != 0 else 0
"""


class Recorded:
    """An executor whose one-shot runs are recorded with the container that ran them."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self.containers: list[SandboxRef] = []
        run = executor.run

        async def recording(lease: Lease, program: Program, mode: RunMode, live: Live | None = None) -> Execution:
            self.containers.append(lease.ref)
            return await run(lease, program, mode, live)

        executor.run = recording

    async def forked(self, code: str, timeout: float = 30) -> Execution:
        """Run `code` and check a template container's child ran it."""
        result = await self.executor.execute(
            "import os\nassert os.getppid() == 1, 'not a forked call'\n" + code, timeout=timeout
        )
        assert "not a forked call" not in result.stderr, result.stderr
        assert self.executor.zygote.policy.unavailable == {}
        return result


@asynccontextmanager
async def container_executor(request: pytest.FixtureRequest, engine: str, **settings: int) -> AsyncGenerator[Executor]:
    """An executor whose Python one-shot calls run in template containers' children (SANDBOX_ZYGOTE)."""
    await require(request, engine)
    configured = engine_settings(engine, sandbox_zygote=True, **{f"sandbox_{k}": v for k, v in settings.items()})
    backend = load_backend(configured.backend, configured)
    try:
        async with Executor(configured, backend) as executor:
            yield executor
    finally:
        await backend.aclose()


@asynccontextmanager
async def recorded(request: pytest.FixtureRequest, engine: str) -> AsyncGenerator[Recorded]:
    # One container, one call at a time: a call that follows another takes the same container when it was reused.
    async with container_executor(request, engine, pool_size=1, max_concurrency=1) as executor:
        yield Recorded(executor)


def probed(result: Execution) -> dict[str, object]:
    assert result.exit_code == 0, result.stderr
    value: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return value


LEFT = ("/workspace/left", "/tmp/left", "/dev/shm/left", "/dev/mqueue/left", "/workspace/outputs/left.txt")


@pytest.mark.parametrize("engine", ENGINES)
async def test_consecutive_calls_in_the_same_container_share_nothing(
    request: pytest.FixtureRequest, engine: str
) -> None:
    calls = 0
    async with recorded(request, engine) as run:
        leave = textwrap.dedent(f"""
            import ctypes, socket, subprocess, sys
            for path in {LEFT!r}:
                open(path, "w").write("secret")
            ctypes.CDLL(None).shmget(0x5A5B, 4096, 0o1666)  # IPC_CREAT | 0666
            os.environ["LEFT"] = "secret"
            SECRET = "in memory"
            subprocess.Popen(["sleep", "{MARKER}"], start_new_session=True)
            # A daemon: double-forked, its own session, listening on an abstract socket.
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    server = socket.socket(socket.AF_UNIX)
                    server.bind("\\0llm-sandbox-zygote-container")
                    server.listen(1)
                    os.execvp("sleep", ["sleep", "{MARKER}"])
                os._exit(0)
            os.wait()
            print("left", flush=True)
        """)
        first = await run.forked(leave)
        assert first.exit_code == 0 and first.stdout == "left\n", first.stderr
        # The call's output files come back as from a pooled container.
        assert [artifact.name for artifact in first.artifacts] == ["left.txt"]
        look = PROBE + textwrap.dedent(f"""
            client = socket.socket(socket.AF_UNIX)
            try:
                client.connect("\\0llm-sandbox-zygote-container")
                abstract = "connected"
            except OSError as exc:
                abstract = exc.__class__.__name__
            print(json.dumps({{
                "files": [p for p in {LEFT!r} if os.path.exists(p)],
                "shm": libc.shmget(0x5A5B, 0, 0),
                "env": "LEFT" in os.environ,
                "memory": "SECRET" in globals(),
                "abstract": abstract,
                "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                "me": os.getpid(),
                "workspace": sorted(os.listdir("/workspace")),
                "queues": os.listdir("/dev/mqueue"),
            }}))
        """)
        second = probed(await run.forked(look))
        calls = run.executor.zygote.policy.served
        assert run.containers[0].id == run.containers[1].id, "the second call did not reuse the container"
        assert second["files"] == [] and second["queues"] == [] and second["shm"] == -1
        assert second["env"] is False and second["memory"] is False
        assert second["abstract"] == "ConnectionRefusedError"
        assert second["pids"] == [1, second["me"]]
        assert second["workspace"] == ["main.py", "outputs"]
        # Seen from the container itself (its /proc shows every nested process): nothing of call 1 is left.
        listing = await run.executor.backend.exec(
            run.containers[1], ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"], timeout=30, output_limit=65536
        )
        assert MARKER.encode() not in listing.stdout and b"python3" in listing.stdout
    assert calls == 2


@pytest.mark.parametrize("engine", ENGINES)
async def test_user_code_is_confined_as_in_a_pooled_container(request: pytest.FixtureRequest, engine: str) -> None:
    async with recorded(request, engine) as run:
        probe = PROBE + textwrap.dedent(f"""
            status = dict(l.split(":\\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\\t" in l)
            def masked(path):
                if os.path.isdir(path):
                    return os.listdir(path) == []
                return open(path, "rb").read(64) == b""
            mounts = {{}}
            for line in open("/proc/self/mountinfo"):
                fields = line.split()
                mounts[fields[4]] = fields[5].split(",")  # the last mount on a path is the one in force
            def read_only(path):
                return "ro" in mounts.get(path, ())
            fd = os.open("/proc/self/ns/net", os.O_RDONLY)
            sock = socket.socket()
            sock.settimeout(2)
            try:
                sock.connect(("1.1.1.1", 53))
                net = "connected"
            except OSError as exc:
                net = exc.__class__.__name__
            print(json.dumps({{
                "unshare": errno_of(libc.unshare(0x10000000)),
                "mount": errno_of(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 0, None)),
                "setns": errno_of(libc.setns(fd, 0)),
                "filters": int(status["Seccomp_filters"]),
                "caps": status["CapEff"].strip(),
                "no_new_privs": status["NoNewPrivs"].strip(),
                "masked": [p for p in {MASKED!r} if os.path.exists(p) and not masked(p)],
                "read_only": [p for p in {READ_ONLY!r} if os.path.exists(p) and not read_only(p)],
                "present": [p for p in ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sys")
                            if os.path.exists(p)],
                "interfaces": [name for _, name in socket.if_nameindex()],
                "net": net,
                "hostname": socket.gethostname(),
            }}))
        """)
        seen = probed(await run.forked(probe))
    assert seen["unshare"] == 1 and seen["mount"] == 1 and seen["setns"] == 1  # EPERM
    # The template container's profile, then the strict filter the child stacked on it.
    assert seen["filters"] == 2, seen
    assert seen["caps"] == "0000000000000000" and seen["no_new_privs"] == "1"
    assert seen["masked"] == [] and seen["read_only"] == [], seen
    present = seen["present"]
    assert isinstance(present, list) and "/proc/sys" in present  # (what this kernel has of them was checked above)
    assert seen["interfaces"] == ["lo"] and seen["net"] in ("OSError", "TimeoutError"), seen
    assert seen["hostname"] == "sandbox"


ABNORMAL = {
    "timeout": ("import time\ntime.sleep(30)\n", 2),
    "flood": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", 20),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n", 3),
    "memory bomb": ("chunks = []\nwhile True:\n    chunks.append(bytearray(32 * 2**20))\n", 30),
}


@pytest.mark.parametrize("engine", ENGINES)
async def test_abnormal_calls_end_and_retire_their_container(request: pytest.FixtureRequest, engine: str) -> None:
    async with recorded(request, engine) as run:
        assert (await run.forked("print('warm')")).stdout == "warm\n"
        for name, (code, timeout) in ABNORMAL.items():
            ended = await run.executor.execute(code, timeout=timeout)
            assert ended.exit_code != 0, name
            if name == "timeout":
                assert ended.timed_out
            if name == "flood":
                assert ended.truncated
            if name == "memory bomb":
                # The OOM killer took the call's program, not the template's kernel, which still said how it ended.
                assert ended.exit_code == 137 or "MemoryError" in ended.stderr, ended
                assert "[the interpreter was lost" not in ended.stderr and "[the run " not in ended.stderr, ended
            after = await run.forked("print('next')")
            assert after.exit_code == 0 and after.stdout == "next\n", (name, after.stderr)
            # The call after an abnormal one ran in another container: the abnormal call's was not reused.
            assert run.containers[-1].id != run.containers[-2].id, name
        assert run.executor.zygote.policy.served == 2 * len(ABNORMAL) + 1


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_template_whose_children_cannot_unshare_falls_back_to_the_pool(
    request: pytest.FixtureRequest, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The template container gets the strict profile (as under AppArmor's docker-default, which denies mount, or
    # a host without unprivileged user namespaces): its first child cannot make its sandbox.
    monkeypatch.setattr(oci, "TEMPLATE_PROFILE_JSON", oci.PROFILE_JSON)
    async with recorded(request, engine) as run:
        for _ in range(2):
            result = await run.executor.execute("import os\nprint(os.getppid() != 1)")
            assert result.exit_code == 0 and result.stdout == "True\n", result.stderr
        reasons = list(run.executor.zygote.policy.unavailable.values())
        assert len(reasons) == 1 and "unshare" in reasons[0] and "Operation not permitted" in reasons[0]
        assert run.executor.zygote.policy.served == 0
        python = run.executor.program("", "python", [], None).language
        assert (await run.executor.check_zygote(python)).startswith("not used, calls take the pool: ")
