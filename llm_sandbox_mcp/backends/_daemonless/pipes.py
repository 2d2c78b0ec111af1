"""Pipes of a process in a bubblewrap sandbox: feeding stdin, pumping output, and a SandboxProcess over them."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import anyio
from anyio.abc import ByteReceiveStream, Process

from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.models import HeadTail

_STDERR_TAIL = 64 * 1024


class PipeProcess:
    """A process started with `Backend.start`, as a SandboxProcess over its pipes."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        self._process = process
        self._stdin = process.stdin
        self._stdout = process.stdout
        self._stderr = process.stderr
        self._tail = bytearray()

    async def send(self, data: bytes) -> None:
        try:
            await self._stdin.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise SandboxFailure(f"The sandbox process is gone (exit code {self._process.returncode})") from exc

    async def receive(self, timeout: float) -> bytes | None:
        # stderr is drained while we wait, so a chatty process cannot block on a full stderr pipe. Cancelling
        # a pending read of an anyio process stream loses nothing.
        chunk: bytes | None = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._drain_stderr)
            with anyio.move_on_after(timeout):
                try:
                    chunk = await self._stdout.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    chunk = b""
            tasks.cancel_scope.cancel()
        return chunk

    async def _drain_stderr(self) -> None:
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for data in self._stderr:
                self._tail += data
                del self._tail[:-_STDERR_TAIL]

    def stderr_tail(self) -> bytes:
        return bytes(self._tail)

    async def aclose(self) -> None:
        for stream in (self._stdin, self._stdout, self._stderr):
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await stream.aclose()


async def feed(process: Process, data: bytes) -> None:
    assert process.stdin is not None
    # The process may exit without reading its input; its output still tells why.
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        if data:
            await process.stdin.send(data)
        await process.stdin.aclose()


async def pump(stream: ByteReceiveStream, sink: HeadTail, on_flood: Callable[[], object]) -> None:
    """Read `stream` into `sink` to its end; past the sink's read budget, call `on_flood` and read no more."""
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        async for chunk in stream:
            sink.feed(chunk)
            if sink.flooded:
                on_flood()
                return
