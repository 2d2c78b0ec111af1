"""Python calls forked from a zygote template (SANDBOX_ZYGOTE) on bubblewrap and NsJail, probed from inside the
child and from the host: each call starts clean, is as contained as a pooled sandbox, and its limits and kills hold.

A call served by a child shows it: its runner is PID 1 of a PID namespace of its own, so the program's parent
is PID 1 (in a pooled sandbox PID 1 is the holder's shell and the kernel is the parent).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import cast

import anyio
import pytest

from llm_sandbox_mcp.backends import _bubblewrap, load_backend
from llm_sandbox_mcp.backends._bubblewrap import BubblewrapBackend
from llm_sandbox_mcp.backends._daemonless.host import state_root
from llm_sandbox_mcp.backends._nsjail import NsjailBackend
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.models import Execution, Limits, Live, SandboxSpec
from llm_sandbox_mcp.run.executor import Executor, Program
from llm_sandbox_mcp.run.leases import Lease
from llm_sandbox_mcp.run.modes import RunMode
from llm_sandbox_mcp.run.zygote import templates as zygote_templates
from llm_sandbox_mcp.seccomp.bpf import FILTER
from tests.engines import test_contract as contract
from tests.engines.conftest import engine_settings, require
from tests.engines.test_bubblewrap import dead_owner, host_processes, own_marker, until

pytestmark = [pytest.mark.anyio]

# The engines whose templates are a process in a sandbox of theirs (a `TemplateHost`).
TEMPLATE_HOSTS = ("bubblewrap", "nsjail")

PROBE = """
import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(result):
    return ctypes.get_errno() if result != 0 else 0
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
"""


@pytest.fixture(params=[pytest.param(name, marks=getattr(pytest.mark, name)) for name in TEMPLATE_HOSTS])
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@asynccontextmanager
async def zygote_executor(request: pytest.FixtureRequest, ahead: int, engine: str) -> AsyncGenerator[Executor]:
    """An executor on `engine` whose Python calls run in zygote children, `ahead` of them forked before their call."""
    await require(request, engine)
    settings = engine_settings(engine, sandbox_zygote=True, sandbox_max_concurrency=4, sandbox_pool_size=ahead)
    backend = load_backend(engine, settings)
    try:
        async with Executor(settings, backend) as executor:
            yield executor
            # pytest 9.1 leaves FixtureRequest.node untyped.
            node = cast("pytest.Item", request.node)  # pyright: ignore[reportUnknownMemberType]
            if "uses_the_pool" not in node.name:
                # Every call of the test ran in a child: none fell back to the pool.
                assert executor.zygote.policy.served > 0 and not executor.zygote.policy.unavailable
    finally:
        await backend.aclose()


# Children forked when a call comes, and forked ahead (SANDBOX_POOL_SIZE) and waiting for their call. Which of
# the two is the server's own code, the same on every engine: NsJail, whose children differ only in the jail
# around their template, runs forked ahead only (what a call meets by default), which halves its minutes.
EXECUTORS = [
    pytest.param("bubblewrap", 0, marks=pytest.mark.bubblewrap, id="on-demand-bubblewrap"),
    pytest.param("bubblewrap", 2, marks=pytest.mark.bubblewrap, id="forked-ahead-bubblewrap"),
    pytest.param("nsjail", 2, marks=pytest.mark.nsjail, id="forked-ahead-nsjail"),
]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ahead" in metafunc.fixturenames:
        metafunc.parametrize(("engine", "ahead"), EXECUTORS)


@pytest.fixture
async def executor(request: pytest.FixtureRequest, engine: str, ahead: int) -> AsyncIterator[Executor]:
    async with zygote_executor(request, ahead, engine) as executor:
        yield executor


async def forked(executor: Executor, code: str, timeout: float = 30, live: Live | None = None) -> Execution:
    """Run `code` and check a zygote child ran it."""
    result = await executor.execute_program(
        executor.program("import os\nassert os.getppid() == 1, 'not a zygote child'\n" + code, "python", [], timeout),
        live,
    )
    assert "not a zygote child" not in result.stderr, result.stderr
    assert not executor.zygote.policy.unavailable
    return result


def probed(result: Execution) -> dict[str, object]:
    assert result.exit_code == 0, result.stderr
    value: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return value


async def test_a_forked_call_runs_through_the_executors_one_run(executor: Executor) -> None:
    # The one seam: a call forked from a template is run by Executor.run, as a pooled call or a session's cell is,
    # in a lease on the template's sandbox that is a child of its own.
    leases: list[Lease] = []
    run = executor.run

    async def recording(lease: Lease, program: Program, mode: RunMode, live: Live | None = None) -> Execution:
        leases.append(lease)
        return await run(lease, program, mode, live)

    executor.run = recording
    assert (await forked(executor, "print(6 * 7)")).stdout == "42\n"
    [lease] = leases
    assert lease.child and lease.forked
    templates = executor.zygote.templates._templates  # pyright: ignore[reportPrivateUsage]
    assert lease.ref in [template.ref for template in templates.values()]


async def test_code_that_names_numpy_or_matplotlib_forks_from_the_preloaded_template_any_other_from_the_lean(
    executor: Executor,
) -> None:
    # Module names spelt in pieces, so that this code names neither: the lean template's child has not loaded them.
    loaded = "import sys\nprint(sorted({m.split('.')[0] for m in sys.modules} & {'num' + 'py', 'mat' + 'plotlib'}))\n"
    assert (await forked(executor, loaded)).stdout == "[]\n"
    # Naming one sends the call to the preloaded template: pyplot is there before the code imports anything.
    assert (await forked(executor, "import numpy as np\n" + loaded)).stdout == "['matplotlib', 'numpy']\n"
    # Either runs any code: a plot whose import the choice misses still comes back, imported by the code itself.
    plot = "p = __import__('mat' + 'plotlib.pyplot', fromlist=['plot'])\np.plot([1, 3, 2])\np.show()\n"
    result = await forked(executor, plot)
    assert result.exit_code == 0, result.stderr
    assert [(artifact.data or b"")[:8] for artifact in result.artifacts] == [b"\x89PNG\r\n\x1a\n"]
    kinds = executor.zygote.templates._templates  # pyright: ignore[reportPrivateUsage]
    assert sorted(preloaded for _, preloaded in kinds) == [False, True]


async def test_each_call_starts_clean(executor: Executor) -> None:
    marker = own_marker()  # other tests, other workers and other runs on this host use MARKER
    leave = textwrap.dedent(f"""
        import ctypes, subprocess
        for path in ("/workspace/left", "/tmp/left", "/dev/shm/left", "/workspace/outputs/left.txt"):
            open(path, "w").write("secret")
        ctypes.CDLL(None).shmget(0x5A59, 4096, 0o1666)  # IPC_CREAT | 0666
        os.environ["LEFT"] = "secret"
        subprocess.Popen(["sleep", "{marker}"], start_new_session=True)
        SECRET = "in memory"
        print("left")
    """)
    first = await forked(executor, leave)
    assert first.exit_code == 0 and first.stdout == "left\n", first.stderr
    assert [artifact.name for artifact in first.artifacts] == ["left.txt"]
    # Everything the call started is gone with it, killed from outside.
    await until(lambda: not host_processes(marker))
    look = PROBE + textwrap.dedent("""
        print(json.dumps({
            "files": [p for p in ("/workspace/left", "/tmp/left", "/dev/shm/left", "/workspace/outputs/left.txt")
                      if os.path.exists(p)],
            "shm": libc.shmget(0x5A59, 0, 0),
            "env": "LEFT" in os.environ,
            "memory": "SECRET" in globals(),
            "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "me": os.getpid(),
            "workspace": sorted(os.listdir("/workspace")),
        }))
    """)
    second = probed(await forked(executor, look))
    assert second["files"] == [] and second["shm"] == -1
    assert second["env"] is False and second["memory"] is False
    # Only this call's runner (PID 1) and the program itself.
    assert second["pids"] == [1, second["me"]]
    assert second["workspace"] == ["main.py", "outputs"]


async def test_concurrent_calls_cannot_see_each_other(executor: Executor) -> None:
    marker = own_marker()  # other tests, other workers and other runs on this host use MARKER
    hold = textwrap.dedent(f"""
        import ctypes, socket, subprocess, sys, time
        open("/tmp/secret", "w").write("secret")
        ctypes.CDLL(None).shmget(0x5A5A, 4096, 0o1666)
        server = socket.socket(socket.AF_UNIX)
        server.bind("\\0llm-sandbox-zygote-test")
        server.listen(1)
        subprocess.Popen(["sleep", "{marker}"])
        terminal = os.openpty()
        print("ready", flush=True)
        time.sleep(60)
    """)
    peek = PROBE + textwrap.dedent(f"""
        client = socket.socket(socket.AF_UNIX)
        try:
            client.connect("\\0llm-sandbox-zygote-test")
            abstract = "connected"
        except OSError as exc:
            abstract = exc.__class__.__name__
        commands = [open(f"/proc/{{p}}/cmdline").read() for p in os.listdir("/proc") if p.isdigit()]
        print(json.dumps({{
            "abstract": abstract,
            "shm": libc.shmget(0x5A5A, 0, 0),
            "tmp": os.path.exists("/tmp/secret"),
            "sleep": any("{marker}" in command for command in commands),
            "terminals": sorted(os.listdir("/dev/pts")),
        }}))
    """)
    live = Live()
    seen: dict[str, object] = {}
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(forked, executor, hold, 60, live)
        with anyio.fail_after(30):
            await live.wait_for_output()
        assert host_processes(marker), "the first call's process runs meanwhile"
        seen = probed(await forked(executor, peek))
        tasks.cancel_scope.cancel()
    assert seen == {
        "abstract": "ConnectionRefusedError",
        "shm": -1,
        "tmp": False,
        "sleep": False,
        "terminals": ["ptmx"],
    }
    await until(lambda: not host_processes(marker))


async def test_user_code_is_locked_down(executor: Executor) -> None:
    check = PROBE + textwrap.dedent("""
        caps = {key: status[key].strip() for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
        outside = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            outside.connect(("192.0.2.1", 53))
            outside.send(b"x")
            network = "reached"
        except OSError as exc:
            network = exc.errno
        loop = socket.socket()
        loop.bind(("127.0.0.1", 0))
        loop.listen(1)
        socket.create_connection(loop.getsockname()).close()
        print(json.dumps({
            "caps": sorted(set(caps.values())),
            "no_new_privs": status["NoNewPrivs"].strip(),
            "seccomp": status["Seccomp"].strip(),
            "userns": errno_of(libc.unshare(0x10000000)),
            "netns": errno_of(libc.unshare(0x40000000)),
            "mount": errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
            "hostname": errno_of(libc.sethostname(b"x", 1)),
            "name": socket.gethostname(),
            "network": network,
            "interfaces": [name for _, name in socket.if_nameindex()],
            "uid_map": open("/proc/self/uid_map").read().split(),
            "uid": os.getuid(),
            "cgroupfs": os.path.exists("/sys/fs/cgroup"),
        }))
    """)
    seen = probed(await forked(executor, check))
    uid = str(executor.limits.uid)
    assert seen == {
        "caps": ["0000000000000000"],
        "no_new_privs": "1",
        "seccomp": "2",
        "userns": 1,  # EPERM
        "netns": 1,
        "mount": 1,
        "hostname": 1,
        "name": "sandbox",
        "network": 101,  # ENETUNREACH: only loopback exists
        "interfaces": ["lo"],
        "uid_map": [uid, uid, "1"],
        "uid": executor.limits.uid,
        "cgroupfs": False,
    }
    # Signalling everything it can reach reaches nothing outside its own call: the template still serves.
    templates = dict(executor.zygote.templates._templates)  # pyright: ignore[reportPrivateUsage]
    await forked(executor, "import signal\nos.kill(-1, signal.SIGKILL)\n")
    after = await forked(executor, "print('still here')")
    assert after.stdout == "still here\n"
    assert executor.zygote.templates._templates == templates  # pyright: ignore[reportPrivateUsage]
    python = get_language("python")
    assert (await executor.check_zygote(python)).startswith("works")


def pids_cgroup(pid: int) -> tuple[str, str]:
    """The name of the pids cgroup a host process is in, and that cgroup's pids.max."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            name = Path(path).name
            [limit] = Path("/sys/fs/cgroup").glob(f"**/{name}/pids.max")
            return name, limit.read_text().strip()
    raise AssertionError(f"process {pid} has no pids cgroup")


async def test_limits_and_kills_hold_per_call(executor: Executor) -> None:
    marker = own_marker()  # other tests, other workers and other runs on this host use MARKER
    live = Live()
    async with anyio.create_task_group() as tasks:
        waiting = f"import subprocess, time\nsubprocess.Popen(['sleep', '{marker}'])\nprint('up', flush=True)\n"
        waiting += "time.sleep(60)\n"

        async def timed_out() -> None:
            result = await forked(executor, waiting, timeout=3, live=live)
            assert result.timed_out and result.stdout == "up\n"

        tasks.start_soon(timed_out)
        with anyio.fail_after(30):
            await live.wait_for_output()
        [(pid, uid)] = host_processes(marker)
        assert uid == executor.limits.uid
        # On the host: a cgroup of the call's own, not the template's, with the sandbox's limits.
        name, limit = pids_cgroup(pid)
        assert name.startswith("call-") and limit == str(executor.limits.pids)
    await until(lambda: not host_processes(marker))

    flood = await forked(executor, "while True:\n    print('x' * 4096)\n")
    assert flood.truncated and flood.exit_code != 0
    memory = await forked(executor, f"block = bytearray({executor.limits.memory_bytes * 2})\nprint('allocated')\n")
    assert memory.exit_code != 0 and "allocated" not in memory.stdout
    bomb = textwrap.dedent("""
        import time
        children = 0
        for _ in range(10000):
            try:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                children += 1
            except OSError:
                break
        print(children)
    """)
    forks = await forked(executor, bomb, timeout=20)
    assert forks.exit_code == 0 and int(forks.stdout) < executor.limits.pids, forks.stderr
    assert (await forked(executor, "print(6 * 7)")).stdout == "42\n"


async def test_a_host_where_children_cannot_be_made_uses_the_pool(
    executor: Executor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A template whose children cannot make namespaces, as on a host without nested user namespaces: its
    # policy is the one every exec gets.
    backend = executor.backend
    if isinstance(backend, NsjailBackend):
        monkeypatch.setattr(backend, "_template_policy", backend._policy)  # pyright: ignore[reportPrivateUsage]
    else:
        monkeypatch.setattr(_bubblewrap, "TEMPLATE_FILTER", FILTER)
    result = await executor.execute("import os\nprint(os.getppid() == 1)")
    assert result.exit_code == 0 and result.stdout == "False\n", result.stderr
    [reason] = executor.zygote.policy.unavailable.values()
    assert "unshare" in reason
    assert (await executor.execute("print(1)")).stdout == "1\n"
    python = get_language("python")
    assert (await executor.check_zygote(python)).startswith("not used")


async def test_children_kept_ready_under_load_go_back_to_the_pool_size_when_idle(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    monkeypatch.setattr(zygote_templates, "IDLE_SECONDS", 1.0)
    async with zygote_executor(request, 1, engine) as executor:
        async with anyio.create_task_group() as calls:
            for _ in range(4):  # one finds the child forked ahead, the others none: more are kept ready
                calls.start_soon(forked, executor, "import time\ntime.sleep(1)\n")
        templates = executor.zygote.templates._templates.values()  # pyright: ignore[reportPrivateUsage]
        [template] = [template for template in templates if not template.preloaded]
        assert template.ahead > 1
        with anyio.fail_after(30):
            while template.ahead > 1 or len(template.ready) > 1:  # noqa: ASYNC110
                await anyio.sleep(0.1)
        assert (await forked(executor, "print(1)")).stdout == "1\n"


async def test_sweep_removes_the_cgroups_of_a_dead_servers_children(
    request: pytest.FixtureRequest, engine: str
) -> None:
    await require(request, engine)
    kind = NsjailBackend if engine == "nsjail" else BubblewrapBackend
    server, after_restart = kind(None), kind(None)
    try:
        ref = await server.create(SandboxSpec("host", Limits()))
        children = [await server.child_cgroup(ref) for _ in range(2)]
        # The server is killed: its record now names an owner that is gone.
        record = state_root() / "sandboxes" / f"{ref.id}.json"
        record.write_text(json.dumps({**json.loads(record.read_text()), "labels": dead_owner()}))
        assert all(directory.is_dir() for cgroup in children for directory in cgroup.dirs)
        assert await after_restart.sweep() >= 1
        assert not record.exists()
        assert not any(directory.exists() for cgroup in children for directory in cgroup.dirs)
        await server.destroy(ref)
    finally:
        await server.aclose()
        await after_restart.aclose()


# The contract every engine keeps, for Python calls served by zygote children (this module's `executor`).
test_a_failing_program_is_a_result_with_the_users_line_numbers = (
    contract.test_a_failing_program_is_a_result_with_the_users_line_numbers
)
test_a_fork_bomb_is_contained_by_the_pids_limit = contract.test_a_fork_bomb_is_contained_by_the_pids_limit
test_a_memory_bomb_is_killed = contract.test_a_memory_bomb_is_killed
test_an_infinite_loop_times_out_as_a_result = contract.test_an_infinite_loop_times_out_as_a_result
test_a_timed_out_program_still_returns_its_files = contract.test_a_timed_out_program_still_returns_its_files
test_an_output_flood_is_capped_head_and_tail_without_growing_the_server = (
    contract.test_an_output_flood_is_capped_head_and_tail_without_growing_the_server
)
test_calls_run_concurrently = contract.test_calls_run_concurrently
test_every_matplotlib_figure_comes_back_with_no_setup_text = (
    contract.test_every_matplotlib_figure_comes_back_with_no_setup_text
)
test_exit_codes_and_syntax_errors = contract.test_exit_codes_and_syntax_errors
test_hello_world = contract.test_hello_world
test_huge_code_runs_and_oversized_code_is_refused = contract.test_huge_code_runs_and_oversized_code_is_refused
test_invalid_utf8_output_is_replaced = contract.test_invalid_utf8_output_is_replaced
test_open_files_and_core_dumps_are_limited = contract.test_open_files_and_core_dumps_are_limited
test_root_filesystem_is_read_only_and_workspace_and_tmp_are_writable = (
    contract.test_root_filesystem_is_read_only_and_workspace_and_tmp_are_writable
)
test_sandbox_has_no_capabilities_no_root_and_no_new_privileges = (
    contract.test_sandbox_has_no_capabilities_no_root_and_no_new_privileges
)
test_sandbox_has_only_a_loopback_interface_or_a_pods_filtered_one = (
    contract.test_sandbox_has_only_a_loopback_interface_or_a_pods_filtered_one
)
test_seccomp_another_abi_cannot_dodge_the_policy = contract.test_seccomp_another_abi_cannot_dodge_the_policy
test_seccomp_every_engine_answers_the_same_to_each_denied_syscall = (
    contract.test_seccomp_every_engine_answers_the_same_to_each_denied_syscall
)
test_unicode_in_and_out = contract.test_unicode_in_and_out
