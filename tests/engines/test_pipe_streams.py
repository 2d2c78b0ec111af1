"""The exec stream path for streams `select` cannot wait on (Docker Desktop's named pipe on Windows), on real engines.

There is no named pipe here, so each engine's real exec socket is handed to the backend inside `PipeStandIn`, which
offers only what the docker SDK's `NpipeSocket` offers: no `fileno` (so `select` is impossible), reads and writes,
timeouts, and no half-close. What then comes back must be what the socket path gives.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, cast

import docker.api.client
import pytest

from llm_sandbox_mcp.backends._docker import DockerEngine
from llm_sandbox_mcp.backends._podman import PodmanEngine
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.models import SandboxRef, Stream
from llm_sandbox_mcp.run.executor import Executor
from tests.engines.conftest import RecordingBackend, engine_settings
from tests.support.pipes import PipeStandIn

pytestmark = pytest.mark.anyio


@pytest.fixture(
    params=[pytest.param("docker", marks=pytest.mark.docker), pytest.param("podman", marks=pytest.mark.podman)]
)
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch, engine: str) -> Iterator[list[str]]:
    """Exec streams reach the backend as `PipeStandIn`s; yields the list where output and kills are noted in order."""
    events: list[str] = []
    if engine == "docker":
        raw = cast(Callable[..., Any], vars(docker.api.client.APIClient)["_get_raw_response_socket"])

        def piped(self: docker.api.client.APIClient, response: Any) -> PipeStandIn:
            found = raw(self, response)  # on a Unix socket, the SDK's file object over the socket
            return PipeStandIn(cast(socket.socket, found._sock), found)

        monkeypatch.setattr(docker.api.client.APIClient, "_get_raw_response_socket", piped)
        engine_class: Any = DockerEngine
    else:
        opened: Callable[..., tuple[str, socket.socket]] = PodmanEngine._open_exec  # pyright: ignore[reportPrivateUsage]

        def piped_podman(self: PodmanEngine, *args: Any) -> tuple[str, PipeStandIn]:
            exec_id, sock = opened(self, *args)
            return exec_id, PipeStandIn(sock)

        monkeypatch.setattr(PodmanEngine, "_open_exec", piped_podman)
        engine_class = PodmanEngine
    kill: Callable[[Any, str], None] = engine_class._kill_all

    def noted(self: Any, container_id: str) -> None:
        events.append("kill")
        kill(self, container_id)

    monkeypatch.setattr(engine_class, "_kill_all", noted)
    PipeStandIn.made = 0
    yield events
    assert PipeStandIn.made > 0, "no exec stream went through the stand-in: the test did not take the pipe path"


@pytest.fixture
async def sandbox(backend: RecordingBackend, engine: str, kills: list[str]) -> AsyncIterator[SandboxRef]:
    ref = await backend.create(Executor(engine_settings(engine), backend).spec_for(get_language("python")))
    try:
        yield ref
    finally:
        await backend.destroy(ref)


async def test_output_streams_stdin_and_exit_codes(backend: RecordingBackend, sandbox: SandboxRef) -> None:
    # `cat` ends only at end of input: it proves the input was ended without a half-close.
    script = "cat; echo to-stderr >&2; exit 3"
    result = await backend.exec(sandbox, ["sh", "-c", script], timeout=30, stdin=b"line one\nline two\n")
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (
        3,
        b"line one\nline two\n",
        b"to-stderr\n",
        False,
    )
    big = bytes(range(256)) * 8192  # 2 MiB: more than any buffer between here and the process holds
    counted = await backend.exec(sandbox, ["sh", "-c", "wc -c"], timeout=30, stdin=big)
    assert (counted.exit_code, counted.stdout.strip()) == (0, str(len(big)).encode())
    nothing = await backend.exec(sandbox, ["sh", "-c", "cat; exit 0"], timeout=30)
    assert (nothing.exit_code, nothing.stdout, nothing.timed_out) == (0, b"", False)


async def test_a_timeout_kills_and_keeps_output_streamed_before_it(
    backend: RecordingBackend, sandbox: SandboxRef, kills: list[str]
) -> None:
    heard: list[bytes] = []

    def listen(stream: Stream, data: bytes) -> None:
        heard.append(data)
        kills.append("output")

    result = await backend.exec(
        sandbox, ["sh", "-c", "echo started; echo half >&2; exec sleep 600"], timeout=3, on_output=listen
    )
    assert result.timed_out
    assert (result.stdout, result.stderr) == (b"started\n", b"half\n")
    # The output was passed on while the process still ran, not collected after it was killed.
    assert kills[0] == "output" and "kill" in kills, kills
    assert b"".join(heard) in (b"started\nhalf\n", b"half\nstarted\n")


async def test_a_process_that_never_reads_its_input_is_stopped_at_its_deadline(
    backend: RecordingBackend, sandbox: SandboxRef, kills: list[str]
) -> None:
    result = await backend.exec(
        sandbox, ["sh", "-c", "echo waiting; exec sleep 600"], timeout=3, stdin=b"x" * (8 << 20)
    )
    assert (result.timed_out, result.stdout) == (True, b"waiting\n")
    assert kills == ["kill"]
    quick = await backend.exec(sandbox, ["sh", "-c", "echo done"], timeout=30, stdin=b"x" * (8 << 20))
    assert (quick.exit_code, quick.stdout, quick.timed_out) == (0, b"done\n", False)


async def test_an_output_flood_is_capped_head_and_tail_and_stopped_past_its_budget(
    backend: RecordingBackend, sandbox: SandboxRef
) -> None:
    script = "echo HEAD; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo TAIL"
    capped = await backend.exec(sandbox, ["sh", "-c", script], timeout=60, output_limit=1000)
    assert capped.exit_code == 0 and capped.truncated and not capped.timed_out
    assert capped.stdout.startswith(b"HEAD\nxxx") and capped.stdout.endswith(b"xxx\nTAIL\n")
    assert b" bytes truncated ...]" in capped.stdout
    flood = await backend.exec(sandbox, ["sh", "-c", "echo HEAD; exec yes"], timeout=120, output_limit=1000)
    assert flood.truncated and not flood.timed_out
    assert flood.stdout.startswith(b"HEAD\ny\n") and b"it was stopped]" in flood.stdout


async def test_a_started_process_streams_both_ways_and_ends(backend: RecordingBackend, sandbox: SandboxRef) -> None:
    process = await backend.start(sandbox, ["sh", "-c", "echo ready; echo note >&2; read line; echo got $line"])
    try:
        seen = b""
        while b"ready\n" not in seen:  # before any input: output arrives while the process waits
            chunk = await process.receive(30)
            assert chunk, f"no 'ready' before {chunk!r}"
            seen += chunk
        assert await process.receive(0.5) is None  # nothing more until it reads
        await process.send(b"ping\n")
        rest = b""
        while (chunk := await process.receive(30)) != b"":
            assert chunk is not None, "the process's answer did not come"
            rest += chunk
        assert (seen + rest, await process.receive(1)) == (b"ready\ngot ping\n", b"")
        assert process.stderr_tail() == b"note\n"
    finally:
        await process.aclose()
