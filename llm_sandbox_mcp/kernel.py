"""The server's side of the Python kernel: a warm interpreter inside a sandbox, spoken to in frames.

The frame format and the kernel itself are described in runners/python_kernel.py. The kernel's output is
untrusted (user code can write to the protocol descriptor), so every frame is size-checked and parsed
defensively; a malformed stream kills the kernel and is reported, never trusted.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Mapping

import anyio

from llm_sandbox_mcp.artifacts import Artifact
from llm_sandbox_mcp.backends import Backend, SandboxProcess
from llm_sandbox_mcp.errors import FileTransferError, SandboxFailure
from llm_sandbox_mcp.languages import runner_source
from llm_sandbox_mcp.models import ExecResult, HeadTail, SandboxRef
from llm_sandbox_mcp.transfer import safe_relative

_HEADER = struct.Struct(">cI")
_MAX_ARTIFACTS = 200
_START_TIMEOUT = 60.0
# After an interrupt (sessions), how long the cell gets to unwind before everything is killed.
_INTERRUPT_GRACE = 2.0


class KernelDied(SandboxFailure):
    """The kernel process ended or broke the protocol."""


class Kernel:
    """One interpreter process in one sandbox."""

    def __init__(self, backend: Backend, ref: SandboxRef, process: SandboxProcess) -> None:
        self.backend = backend
        self.ref = ref
        self.process = process
        self.pid = 0
        self.alive = True
        self._buffer = bytearray()
        self._max_frame = 64 * 1024**2

    @classmethod
    async def start(cls, backend: Backend, ref: SandboxRef, env: Mapping[str, str], preload: bool) -> Kernel:
        """Start the kernel and wait for its hello. Raises KernelDied when it does not come up."""
        full_env = {**env, "LLM_SANDBOX_PRELOAD": "1" if preload else "0"}
        process = await backend.start(ref, ["python3", "-c", runner_source("python_kernel.py")], env=full_env)
        kernel = cls(backend, ref, process)
        frame = await kernel._next_frame(time.monotonic() + _START_TIMEOUT)
        if frame is None or frame[0] != b"H":
            detail = process.stderr_tail().decode("utf-8", errors="replace").strip()[-2000:]
            await process.aclose()
            raise KernelDied(f"The Python interpreter in the sandbox did not start: {detail or 'no output'}")
        kernel.pid = int(json.loads(frame[1])["pid"])
        return kernel

    async def _next_frame(self, deadline: float) -> tuple[bytes, bytes] | None:
        """The next frame, or None at the deadline. Raises KernelDied at end of stream or on a bad frame."""
        while True:
            if len(self._buffer) >= _HEADER.size:
                kind, size = _HEADER.unpack_from(self._buffer)
                if size > self._max_frame or kind not in b"HOEFD":
                    self.alive = False
                    raise KernelDied("The interpreter sent a malformed frame")
                if len(self._buffer) >= _HEADER.size + size:
                    payload = bytes(self._buffer[_HEADER.size : _HEADER.size + size])
                    del self._buffer[: _HEADER.size + size]
                    return kind, payload
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            chunk = await self.process.receive(min(remaining, 1.0))
            if chunk == b"":
                self.alive = False
                raise KernelDied("The interpreter process ended")
            if chunk:
                self._buffer += chunk

    async def run(
        self,
        code: str,
        *,
        mode: str,
        echo: bool,
        filename: str,
        timeout: float,
        output_limit: int,
        artifact_limit: int,
    ) -> ExecResult:
        """Run code; on timeout interrupt it (inline mode) or kill everything (fork mode), keeping what came back.

        The result carries the run's files and whether the interpreter was lost."""
        started = time.monotonic()
        out, err = HeadTail(output_limit), HeadTail(output_limit)
        artifacts: list[Artifact] = []
        request = {"code": code, "mode": mode, "echo": echo, "filename": filename, "artifact_limit": artifact_limit}
        payload = json.dumps(request).encode()
        await self.process.send(_HEADER.pack(b"R", len(payload)) + payload)
        exit_code: int | None = None
        timed_out = False
        lost = False
        deadline = started + timeout
        interrupted = False
        try:
            while exit_code is None:
                frame = await self._next_frame(deadline)
                if frame is None:
                    timed_out = True
                    if mode == "inline" and not interrupted:
                        interrupted = True
                        await self.backend.exec(self.ref, ["kill", "-INT", str(self.pid)], timeout=10)
                        deadline = time.monotonic() + _INTERRUPT_GRACE
                        continue
                    await self._kill()
                    lost = True
                    exit_code = 137
                    break
                kind, body = frame
                if kind == b"O":
                    out.feed(body)
                elif kind == b"E":
                    err.feed(body)
                elif kind == b"F" and len(artifacts) < _MAX_ARTIFACTS:
                    artifact = _artifact(body)
                    if artifact is not None:
                        artifacts.append(artifact)
                elif kind == b"D":
                    exit_code = int(json.loads(body).get("exit", 1))
        except (KernelDied, ValueError, TypeError) as exc:
            # The interpreter died mid-run (e.g. killed for memory) or broke the protocol: the run ends here.
            if not isinstance(exc, KernelDied):
                await self._kill()
            lost = True
            exit_code = 137
            err.feed(f"\n[the interpreter was lost: {exc}]\n".encode())
        result = ExecResult.captured(exit_code, out, err, timed_out=timed_out, started=started)
        result.artifacts = sorted(artifacts, key=lambda artifact: artifact.name)
        result.interpreter_lost = lost
        return result

    async def _kill(self) -> None:
        self.alive = False
        with anyio.CancelScope(shield=True):
            await self.backend.kill_all(self.ref)

    async def aclose(self) -> None:
        self.alive = False
        await self.process.aclose()


def _artifact(body: bytes) -> Artifact | None:
    header, _, data = body.partition(b"\n")
    info = json.loads(header)
    try:
        name = str(safe_relative(str(info["name"])))
    except FileTransferError:
        return None
    size = int(info["size"])
    inline = bool(info.get("inline")) and len(data) == size
    return Artifact.of(name, size, data if inline else None)
