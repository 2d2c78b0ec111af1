"""An in-memory backend for the unit tier, after httpx's MockTransport: the test passes the exec handler."""

from __future__ import annotations

import io
import json
import struct
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import anyio

from llm_sandbox_mcp.models import WORKDIR, ExecResult, OutputListener, SandboxRef, SandboxSpec


@dataclass
class Call:
    argv: list[str]
    stdin: bytes
    env: dict[str, str]
    timeout: float


ExecHandler = Callable[[Call], ExecResult]


def tar_of(files: Mapping[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


_FRAME = struct.Struct(">cI")


def frame(kind: bytes, payload: bytes) -> bytes:
    return _FRAME.pack(kind, len(payload)) + payload


class FakeKernel:
    """Speaks the kernel protocol: each run request becomes a Call to the test's handler."""

    def __init__(self, backend: FakeBackend, env: dict[str, str]) -> None:
        self.backend = backend
        self.env = env
        self.pending = bytearray(frame(b"H", json.dumps({"pid": 42, "python": "3.12.0"}).encode()))
        self.inbox = bytearray()
        self.busy = False

    async def send(self, data: bytes) -> None:
        self.inbox += data
        while len(self.inbox) >= _FRAME.size:
            kind, size = _FRAME.unpack_from(self.inbox)
            if len(self.inbox) < _FRAME.size + size:
                return
            header, _, code = bytes(self.inbox[_FRAME.size : _FRAME.size + size]).partition(b"\n")
            del self.inbox[: _FRAME.size + size]
            if kind == b"I":
                self.backend.interrupts += 1
                if self.backend.interruptible:
                    self.interrupt()
                continue
            self._run({**json.loads(header), "code": code.decode()})

    def _run(self, request: dict[str, object]) -> None:
        call = Call(["python3", "-c", "<kernel>"], str(request["code"]).encode(), self.env, 0.0)
        self.backend.calls.append(call)
        self.backend.kernel = self
        self.backend.running.set()
        result = self.backend.handler(call)
        self.pending += frame(b"O", result.stdout) + frame(b"E", result.stderr)
        for name, data in self.backend.outputs.items():
            header = json.dumps({"name": name, "size": len(data), "inline": True}).encode()
            self.pending += frame(b"F", header + b"\n" + data)
        if result.timed_out:
            self.busy = True
            return  # never answers: the server's deadline must fire
        self.pending += frame(b"D", json.dumps({"exit": result.exit_code}).encode())

    def interrupt(self) -> None:
        """An interrupt: a busy cell that honours it ends with KeyboardInterrupt, as the real kernel does."""
        if self.busy:
            self.busy = False
            self.pending += frame(b"E", b"KeyboardInterrupt\n") + frame(b"D", json.dumps({"exit": 1}).encode())

    async def receive(self, timeout: float) -> bytes | None:
        gate = self.backend.gate
        if gate is not None and not gate.is_set() and self.backend.kernel is self:
            with anyio.move_on_after(timeout):
                await gate.wait()
            if not gate.is_set():
                return None
        if self.pending:
            data = bytes(self.pending)
            self.pending.clear()
            return data
        await anyio.sleep(timeout)
        return None

    def stderr_tail(self) -> bytes:
        return b""

    async def aclose(self) -> None:
        return None


def ok(stdout: bytes = b"", stderr: bytes = b"", exit_code: int = 0) -> ExecResult:
    return ExecResult(exit_code=exit_code, stdout=stdout, stderr=stderr)


@dataclass
class FakeBackend:
    """Runs nothing: `handler` decides what each exec returns. `outputs` is what the tar of outputs holds."""

    handler: ExecHandler = field(default=lambda call: ok())
    outputs: dict[str, bytes] = field(default_factory=lambda: {})
    create_error: Exception | None = None
    name: str = "fake"
    install_network: str = "bridge"
    created: list[SandboxSpec] = field(default_factory=lambda: [])
    destroyed: list[str] = field(default_factory=lambda: [])
    calls: list[Call] = field(default_factory=lambda: [])
    killed: list[str] = field(default_factory=lambda: [])
    dropped: list[str] = field(default_factory=lambda: [])
    closed: bool = False
    # `hang`: a run (an exec the handler answers) blocks, uncancellable like an engine call in a worker thread,
    # until kill_all or destroy ends it. `interruptible`: a hung kernel cell honours SIGINT.
    hang: bool = False
    interruptible: bool = False
    # How many interrupts (I frames) the kernel was sent.
    interrupts: int = 0
    running: anyio.Event = field(default_factory=anyio.Event)
    kill_seen: anyio.Event = field(default_factory=anyio.Event)
    destroy_seen: anyio.Event = field(default_factory=anyio.Event)
    kernel: FakeKernel | None = None
    # While not set, runs (kernel or exec) do not end: the test decides when they finish.
    gate: anyio.Event | None = None
    _ended: anyio.Event = field(default_factory=anyio.Event)

    async def create(self, spec: SandboxSpec) -> SandboxRef:
        if self.create_error is not None:
            raise self.create_error
        self.created.append(spec)
        return SandboxRef(id=f"fake-{len(self.created)}", spec=spec)

    async def exec(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes = b"",
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
        output_limit: int | None = None,
        on_output: OutputListener | None = None,
    ) -> ExecResult:
        call = Call(list(argv), stdin, dict(env or {}), timeout)
        self.calls.append(call)
        if argv[:2] == ["tar", "-c"]:
            return ok(tar_of(self.outputs))
        if self.gate is not None and argv[0] not in ("test", "find", "touch"):
            await self.gate.wait()
        if self.hang and argv[0] not in ("test", "find", "touch"):
            self.running.set()
            with anyio.CancelScope(shield=True):
                await self._ended.wait()
            return ExecResult(137, b"", b"", timed_out=False)
        result = self.handler(call)
        if argv[0] == "du" and not result.stdout.strip():  # a handler that says nothing of it: an empty store
            result = ok(f"0\t{argv[-1]}\n".encode())
        if on_output is not None:  # as a real engine streams it
            on_output("stdout", result.stdout)
            on_output("stderr", result.stderr)
        return result

    async def start(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
    ) -> FakeKernel:
        return FakeKernel(self, dict(env or {}))

    async def kill_all(self, ref: SandboxRef) -> None:
        self.killed.append(ref.id)
        self._ended.set()
        self.kill_seen.set()

    async def destroy(self, ref: SandboxRef) -> None:
        self.destroyed.append(ref.id)
        self._ended.set()
        self.destroy_seen.set()

    async def drop_cache(self, key: str) -> None:
        self.dropped.append(key)

    async def sweep(self) -> int:
        return 0

    async def describe(self) -> str:
        return "fake backend"

    async def aclose(self) -> None:
        self.closed = True
