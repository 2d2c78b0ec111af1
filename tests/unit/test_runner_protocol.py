"""The runner protocol (llm_sandbox_mcp/runners/PROTOCOL.md), conformance without an engine: each runner runs as
a plain host process (tests/support/host_runners.py) and the server's own reader and writer (`Kernel`,
`Zygotes`) speak to it. Then a stand-in runner sends what no runner should, over a real pipe, and the reader
must refuse it by its limits with a clear result: never wait for bytes a frame only claims, never crash."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import AsyncIterator
from typing import Literal

import pytest

from llm_sandbox_mcp import stages
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.languages import get_language, runner_source
from llm_sandbox_mcp.models import ExecResult, Limits, SandboxRef, SandboxSpec
from llm_sandbox_mcp.run.budget import MemoryBudget
from llm_sandbox_mcp.run.kernel import Kernel, KernelDied, ProtocolError, encode_frame
from llm_sandbox_mcp.run.zygote.containers import ContainerKernels
from llm_sandbox_mcp.run.zygote.policy import ZygotePolicy
from llm_sandbox_mcp.run.zygote.templates import ZygoteTemplates
from tests.support.host_runners import HostRunners

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the runners run in Linux namespaces"),
]

LIMIT = 1024 * 1024  # a run's inline file budget (SANDBOX_ARTIFACT_LIMIT)
SPEC = SandboxSpec("python", Limits())


@pytest.fixture
async def host() -> AsyncIterator[HostRunners]:
    backend = HostRunners()
    try:
        yield backend
    finally:
        await backend.aclose()


def ref(name: str) -> SandboxRef:
    return SandboxRef(name, SPEC)


async def run(
    kernel: Kernel,
    code: str,
    mode: Literal["fork", "inline"] = "fork",
    timeout: float = 20,
    output_limit: int = 65536,
    workdir: str = "/tmp/work",
    **extra: object,
) -> ExecResult:
    filename = f"{workdir}/main.py" if mode == "fork" else "<cell>"
    return await kernel.run(
        code,
        mode=mode,
        echo=mode == "inline",
        filename=filename,
        timeout=timeout,
        output_limit=output_limit,
        artifact_limit=LIMIT,
        **extra,  # type: ignore[arg-type]
    )


def files(result: ExecResult) -> dict[str, bytes | None]:
    return {artifact.name: artifact.data for artifact in result.artifacts}


# The Python kernel (runners/python_kernel.py).

WRITES = "import os, sys\nopen(os.path.join(os.environ['OUTPUT_DIR'], 'a.txt'), 'w').write('made')\n"


async def test_a_one_shot_run_of_the_python_kernel(host: HostRunners) -> None:
    kernel = await Kernel.start(host, ref("py"), {}, preload=False)
    assert kernel.pid == 1  # its hello: the pid as the sandbox sees it, PID 1 of its namespace here
    result = await run(kernel, WRITES + "print('out')\nprint('err', file=sys.stderr)\nraise SystemExit(3)")
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    assert files(result) == {"a.txt": b"made"} and not result.interpreter_lost and not result.timed_out
    assert host.killed == []


async def test_the_python_kernel_keeps_a_one_shot_runs_time_and_still_sends_its_files(host: HostRunners) -> None:
    kernel = await Kernel.start(host, ref("py"), {}, preload=False)
    result = await run(kernel, WRITES + "import time\nprint('before', flush=True)\ntime.sleep(600)", timeout=1)
    assert (result.exit_code, result.timed_out, result.stdout) == (137, True, b"before\n")
    assert files(result) == {"a.txt": b"made"} and not result.interpreter_lost
    assert host.killed == []  # the kernel stopped the program itself (D with "timed_out"): nothing from outside


@pytest.mark.parametrize(
    ("code", "exit_code"),
    [
        ("import sys\nsys.exit(256)", 0),  # what a script's exit status is: the low byte
        ("import sys\nsys.exit(-1)", 255),
        ("import os\nos._exit(5)", 5),  # says nothing before its exit: its wait status tells
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", 137),
    ],
)
async def test_a_one_shot_programs_exit_status_is_a_scripts(host: HostRunners, code: str, exit_code: int) -> None:
    kernel = await Kernel.start(host, ref("py"), {}, preload=False)
    result = await run(kernel, "print('out', flush=True)\n" + code)
    assert (result.exit_code, result.stdout, result.timed_out) == (exit_code, b"out\n", False)


async def test_all_output_comes_back_before_a_program_that_says_its_status_has_exited(host: HostRunners) -> None:
    kernel = await Kernel.start(host, ref("py"), {}, preload=False)
    for _ in range(3):
        code = "import sys\nsys.stdout.write('x' * 300000)\nprint('end', file=sys.stderr)"
        result = await run(kernel, code, output_limit=1_000_000)
        assert (result.exit_code, len(result.stdout), result.stderr) == (0, 300000, b"end\n")


# The program's status pipe is the one write-only pipe it holds besides its stdout and stderr.
STATUS_PIPE = """import os
def status_pipe():
    for name in os.listdir('/proc/self/fd'):
        try:
            fd = int(name)
            if fd > 2 and os.readlink(f'/proc/self/fd/{fd}').startswith('pipe:'):
                with open(f'/proc/self/fdinfo/{fd}') as info:
                    if int(info.read().split('flags:')[1].split()[0], 8) & os.O_WRONLY:
                        return fd
        except OSError:
            pass  # the listing's own descriptor, closed by now
"""


async def test_a_status_the_code_makes_up_only_ends_its_own_run_and_kills_it(host: HostRunners) -> None:
    kernel = await Kernel.start(host, ref("py"), {}, preload=False)
    lied = await run(
        kernel,
        STATUS_PIPE + "print('before', flush=True)\nos.write(status_pipe(), b'7\\n')\nimport time\ntime.sleep(600)",
    )
    assert (lied.exit_code, lied.stdout, lied.timed_out) == (7, b"before\n", False)
    # What it wrote that is no status is ignored: the status is its exit's.
    garbage = await run(kernel, STATUS_PIPE + "os.write(status_pipe(), b'no status\\n')\nraise SystemExit(3)")
    assert garbage.exit_code == 3
    # The liar was killed: nothing of it is left in the sandbox for the next run to see.
    left = await run(kernel, "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert left.stdout.decode().count(",") <= 1, left.stdout  # the kernel (PID 1) and this program
    assert host.killed == []


async def test_a_session_keeps_its_state_across_an_interrupted_cell(host: HostRunners) -> None:
    kernel = await Kernel.start(host, ref("py"), {}, preload=False)
    assert (await run(kernel, "x = 41", "inline")).exit_code == 0
    assert (await run(kernel, "x + 1", "inline")).stdout == b"42\n"
    result = await run(kernel, "import time\nwhile True: time.sleep(0.05)", "inline", timeout=1)
    assert result.timed_out and result.exit_code == 1 and b"KeyboardInterrupt" in result.stderr
    assert not result.interpreter_lost and host.killed == []
    assert host.calls == []  # the interrupt is a frame: nothing runs in the sandbox that the code could stop
    assert (await run(kernel, "x", "inline")).stdout == b"41\n"


async def test_an_interrupt_that_comes_between_cells_is_dropped(host: HostRunners) -> None:
    kernel = await Kernel.start(host, ref("py"), {}, preload=False)
    assert (await run(kernel, "x = 41", "inline")).exit_code == 0  # from here on a thread reads the frames
    await kernel.process.send(encode_frame(b"I"))
    result = await run(kernel, "import time\ntime.sleep(0.5)\nx + 1", "inline")
    assert (result.exit_code, result.stdout, result.stderr) == (0, b"42\n", b""), result


async def test_a_file_name_that_is_not_text_is_skipped(host: HostRunners) -> None:
    # The kernel sends such a name as JSON's escape of a lone surrogate; the supervisor never sends it.
    kernel = await Kernel.start(host, ref("py"), {}, preload=False)
    code = "import os\nout = os.environb[b'OUTPUT_DIR']\nfor name in (b'\\xff.txt', b'ok.txt'):\n"
    code += "    open(os.path.join(out, name), 'w').write('x')\n"
    result = await run(kernel, code)
    assert result.exit_code == 0 and files(result) == {"ok.txt": b"x"}


# The supervisor (runners/supervisor.pl), with sh as the runtime it starts ahead.


async def test_a_run_of_the_supervisor(host: HostRunners) -> None:
    kernel = await Kernel.supervise(host, ref("sv"), ["sh"], {})
    assert kernel.pid == 1
    result = await run(kernel, 'echo out; echo err >&2; printf made > "$OUTPUT_DIR/a.txt"; exit 5')
    assert (result.exit_code, result.stdout, result.stderr) == (5, b"out\n", b"err\n")
    assert files(result) == {"a.txt": b"made"} and not result.interpreter_lost and host.killed == []


async def test_the_supervisor_hands_a_build_back_and_writes_one_before_the_program(host: HostRunners) -> None:
    env = {"LLM_SANDBOX_BUILD_PIPE": "3"}
    kernel = await Kernel.supervise(host, ref("build"), ["sh"], env)
    result = await run(kernel, "printf BINARY >&3; exec 3>&-; echo ran", build_limit=100)
    assert (result.exit_code, result.stdout, kernel.built) == (0, b"ran\n", b"BINARY")
    kernel = await Kernel.supervise(host, ref("built"), ["sh"], env)
    result = await run(kernel, "./main", binary=b"#!/bin/sh\necho from main\n")
    assert (result.exit_code, result.stdout) == (0, b"from main\n")


async def test_the_supervisor_does_not_keep_time_so_the_server_kills(host: HostRunners) -> None:
    kernel = await Kernel.supervise(host, ref("sv"), ["sh"], {})
    result = await run(kernel, "echo before; sleep 600", timeout=1)
    assert (result.exit_code, result.timed_out, result.stdout) == (137, True, b"before\n")
    assert result.interpreter_lost and host.killed == ["sv"]


# The zygote child: bubblewrap's (runners/python_zygote.py) and the template container's (python_kernel.py with a
# config), each call in a child that made namespaces of its own (runners/python_isolation.py, mounts aside).


async def test_bubblewrap_zygote_children_run_one_call_each(host: HostRunners) -> None:
    settings = Settings(sandbox_pool_size=0)
    policy = ZygotePolicy(settings, host)
    python = get_language("python")
    async with ZygoteTemplates(settings, host, MemoryBudget(2**40), policy) as templates:

        async def call(code: str, timeout: float = 20) -> ExecResult:
            loan = await templates.lend(python, SPEC)  # a child of the template, lent for this one run
            assert loan is not None and loan.lease.kernel is not None, policy.unavailable
            try:
                return await run(loan.lease.kernel, code, timeout=timeout, workdir="/workspace")
            finally:
                await loan.release(None)

        first = await call(WRITES + "import os\nprint(os.getpid(), os.getcwd())")
        assert (first.exit_code, first.stdout, files(first)) == (0, b"2 /workspace\n", {"a.txt": b"made"})
        second = await call("import os\nprint(sorted(os.listdir(os.environ['OUTPUT_DIR'])))")
        assert second.stdout == b"[]\n"  # a fresh child: nothing of the first call
        timed = await call(WRITES + "import time\ntime.sleep(600)", timeout=1)
        assert (timed.exit_code, timed.timed_out, files(timed)) == (137, True, {"a.txt": b"made"})
        assert policy.served == 3 and not any(cgroup.killed for cgroup in host.cgroups)


async def test_a_call_that_finds_no_child_ready_takes_the_first_fork_under_way(host: HostRunners) -> None:
    # One child forked ahead, still on its way when the call comes: the call forks one more and takes whichever
    # is ready first, not necessarily its own.
    settings = Settings(sandbox_pool_size=1)
    policy = ZygotePolicy(settings, host)
    async with ZygoteTemplates(settings, host, MemoryBudget(2**40), policy) as templates:
        with stages.recording() as account:
            loan = await templates.lend(get_language("python"), SPEC)
        assert loan is not None and loan.lease.kernel is not None, policy.unavailable
        try:
            result = await run(loan.lease.kernel, "print(1)", workdir="/workspace")
        finally:
            await loan.release(None)
    assert result.stdout == b"1\n"
    assert account.notes == {"source": "a zygote template's child", "sandbox": "the first of the forks under way"}


async def test_a_template_containers_kernel_serves_calls_one_child_at_a_time(host: HostRunners) -> None:
    config = ContainerKernels(Settings(), ZygotePolicy(Settings(), host)).config(SPEC.limits)
    kernel = await Kernel.start(host, ref("template"), {}, preload=False, forks=config)
    await kernel.next_call(10)  # the first call's child: its own hello
    result = await run(kernel, WRITES + "import os\nprint(os.getpid())", workdir="/workspace")
    assert (result.exit_code, result.stdout, files(result)) == (0, b"2\n", {"a.txt": b"made"})
    await kernel.next_call(10)  # every process of that call gone: the next child's hello
    result = await run(kernel, "import os\nprint(os.listdir(os.environ['OUTPUT_DIR']))", workdir="/workspace")
    assert (result.exit_code, result.stdout) == (0, b"[]\n")


# A stand-in runner: says hello (and is "gone" at once), reads one request, answers with the bytes the test chose,
# then ends, hangs (so that only the reader's limits, not the end of the stream, can end the run) or floods
# (more than the read budget, then a D the server must not have waited for).
STAND_IN = """
import os, struct, sys, time
hello, answer, then = bytes.fromhex(sys.argv[1]), bytes.fromhex(sys.argv[2]), sys.argv[3]
os.write(1, hello)
if then == "gone":
    sys.exit()
kind, size = struct.unpack(">cI", os.read(0, 5))
while size:
    size -= len(os.read(0, size))
os.write(1, answer)
if then == "flood":  # 20 MiB of output, then a clean end
    for _ in range(320):
        os.write(1, struct.pack(">cI", b"O", 65536) + b"y" * 65536)
    os.write(1, struct.pack(">cI", b"D", 11) + b'{"exit": 0}')
if then in ("hang", "flood"):
    time.sleep(600)
"""

HELLO = encode_frame(b"H", b'{"pid": 1}')


def done(status: int = 0) -> bytes:
    return encode_frame(b"D", json.dumps({"exit": status}).encode())


def header(kind: bytes, size: int) -> bytes:
    return struct.pack(">cI", kind, size)


async def stand_in(host: HostRunners, answer: bytes, then: str = "hang", hello: bytes = HELLO) -> Kernel:
    argv = ["python3", "-c", STAND_IN, hello.hex(), answer.hex(), then]
    return await Kernel.launch(host, ref("hostile"), argv, {}, "The stand-in")


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        pytest.param(header(b"O", 2**32 - 1), "over its limit", id="oversized-output"),
        pytest.param(header(b"D", 10**6), "over its limit", id="oversized-done"),
        pytest.param(header(b"F", 2 * LIMIT), "over its limit", id="file-over-the-budget"),
        pytest.param(encode_frame(b"Q", b"?"), "unknown frame kind", id="unknown-kind"),
        pytest.param(encode_frame(b"D", b'{"exit": 0, "note": "\xff"}'), "not JSON", id="done-not-utf8"),
        pytest.param(
            encode_frame(b"F", b'{"name": "\xff", "size": 0, "inline": true}\n'), "not JSON", id="file-not-utf8"
        ),
        pytest.param(encode_frame(b"H", b'{"pid": 1}'), "a second hello", id="second-hello"),
        pytest.param(encode_frame(b"b", b'{"size": 0}'), "invalid end of a build", id="build-end-not-asked-for"),
    ],
)
async def test_a_frame_over_its_limit_or_unknown_ends_the_run_at_once(
    host: HostRunners, answer: bytes, why: str
) -> None:
    kernel = await stand_in(host, encode_frame(b"O", b"so far\n") + answer)
    result = await run(kernel, "ignored", timeout=60)
    assert (result.exit_code, result.interpreter_lost, result.stdout) == (137, True, b"so far\n")
    assert not result.timed_out  # refused at its header: the server never waited for what the frame claimed
    assert b"broke the sandbox's result protocol" in result.stderr and why.encode() in result.stderr
    assert host.killed == ["hostile"]


async def test_output_that_is_not_utf8_is_kept_as_bytes(host: HostRunners) -> None:
    kernel = await stand_in(host, encode_frame(b"O", b"\xff\xfe\n") + encode_frame(b"E", b"\xc3(") + done(0))
    result = await run(kernel, "ignored")
    assert (result.exit_code, result.stdout, result.stderr, result.interpreter_lost) == (
        0,
        b"\xff\xfe\n",
        b"\xc3(",
        False,
    )


async def test_a_truncated_frame_from_a_runner_that_stays_is_a_timeout(host: HostRunners) -> None:
    kernel = await stand_in(host, encode_frame(b"O", b"so far\n") + header(b"O", 100) + b"0123456789")
    result = await run(kernel, "ignored", timeout=1)
    assert (result.exit_code, result.timed_out, result.interpreter_lost, result.stdout) == (
        137,
        True,
        True,
        b"so far\n",
    )
    assert host.killed == ["hostile"]


async def test_a_runner_that_exits_mid_frame_is_lost(host: HostRunners) -> None:
    kernel = await stand_in(host, encode_frame(b"O", b"so far\n") + header(b"O", 100) + b"0123456789", then="exit")
    result = await run(kernel, "ignored", timeout=60)
    assert (result.exit_code, result.timed_out, result.interpreter_lost, result.stdout) == (
        137,
        False,
        True,
        b"so far\n",
    )
    assert b"the interpreter was lost: The interpreter process ended" in result.stderr
    assert kernel.collect_outside  # its files are read from outside (or dropped with a zygote child)


async def test_a_flood_is_stopped_at_the_read_budget(host: HostRunners) -> None:
    kernel = await stand_in(host, b"", then="flood")
    result = await run(kernel, "ignored", timeout=60, output_limit=1024)  # a read budget of 16 MiB
    assert (result.exit_code, result.truncated, result.interpreter_lost, result.timed_out) == (137, True, True, False)
    assert len(result.stdout) < 2048 and host.killed == ["hostile"]


async def test_frames_after_the_end_wait_for_the_next_run(host: HostRunners) -> None:
    kernel = await stand_in(host, encode_frame(b"O", b"run\n") + done(0) + encode_frame(b"O", b"late\n") + done(9))
    result = await run(kernel, "ignored")
    assert (result.exit_code, result.stdout) == (0, b"run\n")  # the first D ends the run: nothing after it is read
    # A template container's kernel owes the next call's hello: anything else between calls is refused.
    with pytest.raises(ProtocolError, match="between calls"):
        await kernel.next_call(5)


async def test_frames_after_the_end_answer_a_sessions_next_cell(host: HostRunners) -> None:
    # The server reads nothing between runs: what a runner sent after its D is the next run's (PROTOCOL.md).
    kernel = await stand_in(host, done(0) + encode_frame(b"O", b"late\n") + done(9))
    assert (await run(kernel, "first", "inline")).exit_code == 0
    result = await run(kernel, "second", "inline")
    assert (result.exit_code, result.stdout) == (9, b"late\n")


@pytest.mark.parametrize(
    ("hello", "error"),
    [
        pytest.param(encode_frame(b"O", b"hi"), "did not start", id="output-before-hello"),
        pytest.param(header(b"H", 2**20), "did not start", id="oversized-hello"),
        pytest.param(encode_frame(b"H", b'{"pid": "1"}'), "invalid hello", id="pid-not-a-number"),
        pytest.param(encode_frame(b"H", b'{"pid": 0}'), "invalid hello", id="pid-zero"),
        pytest.param(b"H\0\0", "did not start", id="truncated-hello"),
    ],
)
async def test_a_runner_without_a_valid_hello_does_not_start(host: HostRunners, hello: bytes, error: str) -> None:
    with pytest.raises(KernelDied, match=error):
        await stand_in(host, b"", then="gone", hello=hello)


def test_the_stand_in_speaks_the_kernels_frames() -> None:
    # The stand-in and the runners share the frame header: kind byte, then a big-endian 32-bit length.
    assert struct.pack(">cI", b"O", 3) + b"abc" == encode_frame(b"O", b"abc")
    assert 'HEADER = struct.Struct(">cI")' in runner_source("python_kernel.py")
    assert 'pack("aN"' in runner_source("supervisor.pl")
