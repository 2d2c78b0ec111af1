"""The server's side of a warm runner inside a sandbox, spoken to in frames: the Python kernel, and the
supervisor that runs every other language's program in a runtime started ahead of time.

The frame format is described in runners/python_kernel.py, the supervisor in runners/supervisor.pl. A
runner's output is hostile input (user code in a session runs inside the kernel and can write to its
protocol descriptor), so the server enforces its own limits: each kind of frame has a size cap checked
before its body is read, a run's files have a count and an inline byte budget, and every JSON header is
parsed strictly. A frame that breaks any of this ends the run (the interpreter is killed) with a clear
result, never an allocation or an exception. A compiled program's binary (B frames, then b with its size)
is kept only when it arrived whole, within the limit the run asked for, with the size that was announced.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import cast

import anyio

from llm_sandbox_mcp import stages
from llm_sandbox_mcp.artifacts import Artifact
from llm_sandbox_mcp.backends import Backend, SandboxProcess
from llm_sandbox_mcp.errors import FileTransferError, SandboxFailure
from llm_sandbox_mcp.languages import runner_source
from llm_sandbox_mcp.models import ExecResult, HeadTail, Live, SandboxRef
from llm_sandbox_mcp.run.transfer import safe_relative

logger = logging.getLogger(__name__)

_HEADER = struct.Struct(">cI")
_MAX_ARTIFACTS = 200
# The kernel forwards its capture pipes in reads of at most 64 KiB; hello and done frames are small JSON.
_MAX_STREAM_FRAME = 64 * 1024
_MAX_JSON = 4096
# A file header carries its name (the kernel sends names of at most 1,024 characters).
_MAX_FILE_HEADER = 16 * 1024
_EXIT_RANGE = range(-(2**31), 2**31)
_START_TIMEOUT = 60.0
# After an interrupt (sessions), how long the cell gets to unwind before everything is killed.
_INTERRUPT_GRACE = 2.0
# When the caller is gone (cancelled, disconnected), how long a session's cell gets to unwind from the interrupt.
_CANCEL_GRACE = 1.0
# How long past a one-shot run's timeout a kernel that keeps the time itself has to report (and send the files)
# before the server kills from outside.
_KEEP_TIME_GRACE = 2.0
# What a fork-mode run's `times` (in its D frame) say ended, for SANDBOX_TRACE_STAGES's account.
_RUNNER_STAGES = [
    "the request's way to the runner",
    "the program, from its request to its exit",
    "after its exit: the rest killed, its files found",
]


def encode_frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame of the protocol, as the server sends it."""
    return _HEADER.pack(kind, len(payload)) + payload


def drop_uncollected_files(result: ExecResult) -> None:
    """A one-shot run killed from outside in a sandbox of its own (a zygote child): its files lived in that
    sandbox's tmpfs, gone with it, so none come back and its stderr says so."""
    result.artifacts = []
    result.stderr += b"\n[the run was stopped before its output files could be read]\n"


class KernelDied(SandboxFailure):
    """The kernel process ended or broke the protocol."""


class ProtocolError(KernelDied):
    """The kernel (or code writing to its descriptor) sent something the protocol does not allow."""


class SandboxRefused(KernelDied):
    """A template container's call child could not make its sandbox here (its reason is the message)."""


class Kernel:
    """One interpreter process in one sandbox."""

    def __init__(self, backend: Backend, ref: SandboxRef, process: SandboxProcess) -> None:
        self.backend = backend
        self.ref = ref
        self.process = process
        self.pid = 0
        self.alive = True
        # Set by a one-shot run whose files the runner could not collect with nothing of the program left
        # running (a timeout, a runner killed or stopped by the code): the caller collects from outside.
        self.collect_outside = False
        # How a run's processes are killed from outside: the whole sandbox unless set (a zygote child: its cgroup).
        self.killer: Callable[[], Awaitable[None]] | None = None
        self._buffer = bytearray()
        # What the current run may still send inline as file contents (0 outside a run).
        self._room = 0
        # The binary the last run's build handed over whole (runners/supervisor.pl), when it asked for one.
        self.built: bytes | None = None
        # Whether this runner enforces a one-shot run's timeout itself (the Python kernel), so a timed-out run
        # still sends its files; the server's own deadline is then a little later.
        self.keeps_time = False

    @classmethod
    async def start(
        cls, backend: Backend, ref: SandboxRef, env: Mapping[str, str], preload: bool, forks: str | None = None
    ) -> Kernel:
        """Start the Python kernel and wait for its hello. Raises KernelDied when it does not come up. `forks`: the
        config (JSON) of a zygote template container's kernel, whose calls each run in a sandbox of their own
        (`next_call`)."""
        full_env = {**env, "LLM_SANDBOX_PRELOAD": "1" if preload else "0"}
        argv = ["python3", "-c", runner_source("python_kernel.py")]
        if forks is not None:
            argv += [runner_source("python_isolation.py"), forks]
        kernel = await cls.launch(backend, ref, argv, full_env, "The Python interpreter")
        kernel.keeps_time = True
        return kernel

    async def next_call(self, timeout: float) -> None:
        """Wait until a template container's kernel has its next call's sandbox ready (that child's hello, sent
        once every process of the call before it is gone). Raises SandboxRefused with the child's reason when
        it could not make its sandbox, KernelDied for anything else."""
        frame = await self._next_frame(time.monotonic() + timeout)
        if frame is None:
            raise KernelDied("the next call's sandbox was not ready in time")
        kind, body = frame
        if kind == b"X":
            reason = _json_object(body).get("error")
            raise SandboxRefused(reason if isinstance(reason, str) else "no reason given")
        if kind != b"H":
            raise ProtocolError(f"a {kind.decode('latin-1')!r} frame between calls")

    @classmethod
    async def supervise(
        cls, backend: Backend, ref: SandboxRef, runtime: Sequence[str], env: Mapping[str, str]
    ) -> Kernel:
        """Start the supervisor with `runtime` waiting for a one-shot program. Raises KernelDied."""
        argv = ["perl", "-e", runner_source("supervisor.pl"), "--", *runtime]
        return await cls.launch(backend, ref, argv, env, "The warm runner")

    @classmethod
    async def launch(
        cls, backend: Backend, ref: SandboxRef, argv: list[str], env: Mapping[str, str], what: str
    ) -> Kernel:
        return await cls.greet(backend, ref, await backend.start(ref, argv, env=env), what)

    @classmethod
    async def greet(cls, backend: Backend, ref: SandboxRef, process: SandboxProcess, what: str) -> Kernel:
        """A kernel over a started `process`, once its hello came. Raises KernelDied when it does not come; the
        process is closed whenever no kernel comes of it (a cancelled wait included)."""
        kernel = cls(backend, ref, process)
        try:
            try:
                frame = await kernel._next_frame(time.monotonic() + _START_TIMEOUT)
            except KernelDied:
                frame = None
            if frame is None or frame[0] != b"H":
                detail = process.stderr_tail().decode("utf-8", errors="replace").strip()[-2000:]
                raise KernelDied(f"{what} in the sandbox did not start: {detail or 'no output'}")
            pid = _json_object(frame[1]).get("pid")
            if type(pid) is not int or pid <= 0:
                raise ProtocolError(f"{what} in the sandbox sent an invalid hello")
        except BaseException:
            with anyio.CancelScope(shield=True):
                await process.aclose()
            raise
        kernel.pid = pid
        return kernel

    def _frame_limit(self, kind: bytes) -> int:
        if kind in (b"O", b"E", b"B"):
            return _MAX_STREAM_FRAME
        if kind == b"F":
            return _MAX_FILE_HEADER + 1 + self._room
        if kind in (b"H", b"D", b"b", b"X"):
            return _MAX_JSON
        raise ProtocolError(f"unknown frame kind {kind!r}")

    async def _next_frame(self, deadline: float) -> tuple[bytes, bytes] | None:
        """The next frame, or None at the deadline. Raises KernelDied at end of stream or on a bad frame."""
        while True:
            if len(self._buffer) >= _HEADER.size:
                kind, size = _HEADER.unpack_from(self._buffer)
                if size > self._frame_limit(kind):
                    raise ProtocolError(f"a {kind.decode('latin-1')!r} frame of {size} bytes is over its limit")
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
        live: Live | None = None,
        binary: bytes | None = None,
        build_limit: int = 0,
    ) -> ExecResult:
        """Run code; on timeout interrupt it (inline mode) or kill everything (fork mode), keeping what came back.

        The result carries the run's files and whether the interpreter was lost. Output also goes to `live` as it
        arrives. When the caller is cancelled, the run is stopped before the cancellation goes on: a cell is
        interrupted (the interpreter kept when it unwinds in time), a fork-mode run killed with everything else.
        The supervisor writes `binary` (a build from before) as ./main ahead of the program; with `build_limit`
        the build's binary may come back, up to that size, and is then `self.built`."""
        started = time.monotonic()
        out, err = HeadTail(output_limit), HeadTail(output_limit)
        artifacts: list[Artifact] = []
        request: dict[str, object] = {
            "mode": mode,
            "echo": echo,
            "filename": filename,
            "artifact_limit": artifact_limit,
        }
        if binary is not None:
            request["binary"] = len(binary)
        if build_limit:
            request["build_limit"] = build_limit
        kept = mode == "fork" and self.keeps_time
        if kept:
            request["timeout"] = timeout
        # The header is one line (JSON escapes newlines); the program follows as it is.
        payload = json.dumps(request).encode() + b"\n" + (binary or b"") + code.encode("utf-8", errors="replace")
        build = _Build(build_limit)
        self.built = None
        exit_code: int | None = None
        timed_out = False
        lost = False
        deadline = started + timeout + (_KEEP_TIME_GRACE if kept else 0.0)
        interrupted = False
        sent = False
        times: object = None
        self._room = artifact_limit
        self.collect_outside = False
        try:
            # A kernel that does not read (stopped by the code of an earlier cell) cannot hold the call past its time.
            with anyio.fail_after(deadline - started):
                await self.process.send(encode_frame(b"R", payload))
            sent = True
            stages.mark("send the program")
            while exit_code is None:
                frame = await self._next_frame(deadline)
                if frame is None:
                    timed_out = True
                    if mode == "inline" and not interrupted:
                        interrupted = True
                        deadline = time.monotonic() + _INTERRUPT_GRACE
                        if await self._interrupt(deadline):
                            continue
                    await self._kill()
                    lost = self.collect_outside = True
                    exit_code = 137
                    break
                kind, body = frame
                if kind == b"O":
                    out.feed(body)
                    if live is not None:
                        live.feed("stdout", body)
                elif kind == b"E":
                    err.feed(body)
                    if live is not None:
                        live.feed("stderr", body)
                if out.flooded or err.flooded:  # over the read budget: stopped, the interpreter with it
                    await self._kill()
                    lost, exit_code = True, 137
                    break
                elif kind == b"F":
                    if len(artifacts) >= _MAX_ARTIFACTS:
                        raise ProtocolError(f"more than {_MAX_ARTIFACTS} output files")
                    artifact = self._artifact(body)
                    if artifact is not None:
                        artifacts.append(artifact)
                elif kind == b"D":
                    info = _json_object(body)
                    status, clean = info.get("exit"), info.get("clean", True)
                    kept_time = info.get("timed_out", False)
                    if type(status) is not int or status not in _EXIT_RANGE or type(clean) is not bool:
                        raise ProtocolError("an invalid exit status")
                    if type(kept_time) is not bool:
                        raise ProtocolError("an invalid timeout flag")
                    exit_code = status
                    timed_out = timed_out or kept_time
                    times = info.get("times")
                    if not clean:
                        # Something of the program outlived every kill: its files are not to be trusted.
                        await self._kill()
                        self.collect_outside, artifacts = True, []
                elif kind == b"B":
                    build.feed(body)
                elif kind == b"b":
                    build.end(_json_object(body).get("size"))
                elif kind == b"H":
                    raise ProtocolError("a second hello")
                elif kind == b"X":
                    raise ProtocolError("a call sandbox's refusal during a run")
        except ProtocolError as exc:
            await self._kill()
            lost, exit_code, artifacts, build.whole = True, 137, [], None
            err.feed(f"\n[the run broke the sandbox's result protocol ({exc}); it was stopped]\n".encode())
        except (SandboxFailure, TimeoutError) as exc:
            # The interpreter died mid-run (e.g. killed for memory), stopped reading, or its sandbox went away.
            await self._kill()
            lost, exit_code = True, 137
            self.collect_outside = True
            timed_out = timed_out or isinstance(exc, TimeoutError)
            err.feed(f"\n[the interpreter was lost: {exc or 'it stopped reading'}]\n".encode())
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await self._abandon(inline=mode == "inline", sent=sent)
            raise
        finally:
            self._room = 0
        if not stages.reported(_RUNNER_STAGES, times):
            stages.mark("the run: program, its files, its end reported")
        else:
            stages.mark("the end's way back to the server")
        self.built = build.whole
        result = ExecResult.captured(exit_code, out, err, timed_out=timed_out, started=started)
        result.artifacts = sorted(artifacts, key=lambda artifact: artifact.name)
        result.interpreter_lost = lost
        return result

    def _artifact(self, body: bytes) -> Artifact | None:
        """One output file; None for a name that leaves the output directory (skipped, as the kernel would) or is
        not text (JSON can carry a lone surrogate, which no result can: skipped, as the supervisor does)."""
        header, newline, data = body.partition(b"\n")
        info = _json_object(header, _MAX_FILE_HEADER)
        name, size, inline = info.get("name"), info.get("size"), info.get("inline")
        if not newline or not isinstance(name, str) or type(size) is not int or type(inline) is not bool:
            raise ProtocolError("an invalid file header")
        if size < 0 or (inline and len(data) != size) or (not inline and data):
            raise ProtocolError("a file whose size does not match its header")
        if len(data) > self._room:
            raise ProtocolError("files over the inline budget (SANDBOX_ARTIFACT_LIMIT)")
        self._room -= len(data)
        try:
            name.encode()
            relative = str(safe_relative(name))
        except (UnicodeEncodeError, FileTransferError):
            return None
        return Artifact.of(relative, size, data if inline else None)

    async def _abandon(self, *, inline: bool, sent: bool) -> None:
        """Stop a run whose caller is gone. A cell is interrupted like at a timeout and keeps the interpreter if
        it unwinds within the grace; otherwise, and for fork-mode runs, every process in the sandbox is killed."""
        if not sent:
            return
        if inline and self.alive:
            try:
                deadline = time.monotonic() + _CANCEL_GRACE
                if await self._interrupt(deadline):
                    while (frame := await self._next_frame(deadline)) is not None:
                        if frame[0] == b"D":
                            return
            except SandboxFailure as exc:  # includes a broken protocol: the kill below ends it
                logger.info("Interrupting the cell in %s failed: %s", self.ref.id[:12], exc)
        await self._kill()

    async def _interrupt(self, deadline: float) -> bool:
        """Ask the cell that runs now to stop (an `I` frame: its kernel raises KeyboardInterrupt in it). Nothing is
        started in the sandbox for it, so the code cannot stop the interrupt on its way. False when it could not be
        sent by `deadline` (a kernel that stopped reading): the caller kills from outside."""
        try:
            with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                await self.process.send(encode_frame(b"I"))
        except (SandboxFailure, TimeoutError) as exc:
            logger.info("Could not interrupt the cell in %s: %s", self.ref.id[:12], exc or "it stopped reading")
            return False
        return True

    async def _kill(self) -> None:
        self.alive = False
        with anyio.CancelScope(shield=True):
            try:
                await (self.killer() if self.killer is not None else self.backend.kill_all(self.ref))
            except SandboxFailure as exc:  # the sandbox is gone: so is everything that ran in it
                logger.info("Could not kill the processes of %s: %s", self.ref.id[:12], exc)

    async def aclose(self) -> None:
        self.alive = False
        await self.process.aclose()


class _Build:
    """A binary coming back in B frames: kept while within the limit, whole once b announces its real size."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.data: bytearray | None = bytearray()
        self.ended = False
        self.whole: bytes | None = None

    def feed(self, chunk: bytes) -> None:
        if not self.limit or self.ended:
            raise ProtocolError("a build's binary that was not asked for")
        if self.data is not None and len(self.data) + len(chunk) <= self.limit:
            self.data += chunk
        else:
            self.data = None  # too large to keep: the rest is read and dropped

    def end(self, size: object) -> None:
        if not self.limit or self.ended or type(size) is not int or size < 0:
            raise ProtocolError("an invalid end of a build's binary")
        self.ended = True
        if self.data is None or size > self.limit:
            return
        if size != len(self.data):
            raise ProtocolError("a build's binary whose size does not match")
        self.whole = bytes(self.data) if size else None
        self.data = None


def _json_object(data: bytes, limit: int = _MAX_JSON) -> dict[str, object]:
    """A small JSON object, or ProtocolError: whatever the bytes are (deep nesting, huge numbers, not UTF-8)."""
    if len(data) > limit:
        raise ProtocolError("an oversized header")
    try:
        value: object = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError("a header that is not JSON") from exc
    if not isinstance(value, dict):
        raise ProtocolError("a header that is not a JSON object")
    return cast(dict[str, object], value)
