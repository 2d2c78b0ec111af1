"""An in-memory backend for the unit tier, after httpx's MockTransport: the test passes the exec handler."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from llm_sandbox_mcp.models import WORKDIR, ExecResult, SandboxRef, SandboxSpec


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


def ok(stdout: bytes = b"", stderr: bytes = b"", exit_code: int = 0) -> ExecResult:
    return ExecResult(exit_code=exit_code, stdout=stdout, stderr=stderr)


@dataclass
class FakeBackend:
    """Runs nothing: `handler` decides what each exec returns. `outputs` is what the tar of outputs holds."""

    handler: ExecHandler = field(default=lambda call: ok())
    outputs: dict[str, bytes] = field(default_factory=lambda: {})
    create_error: Exception | None = None
    name: str = "fake"
    created: list[SandboxSpec] = field(default_factory=lambda: [])
    destroyed: list[str] = field(default_factory=lambda: [])
    calls: list[Call] = field(default_factory=lambda: [])
    closed: bool = False

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
    ) -> ExecResult:
        call = Call(list(argv), stdin, dict(env or {}), timeout)
        self.calls.append(call)
        if argv[:2] == ["tar", "-c"]:
            return ok(tar_of(self.outputs))
        return self.handler(call)

    async def destroy(self, ref: SandboxRef) -> None:
        self.destroyed.append(ref.id)

    async def drop_cache(self, key: str) -> None:
        return None

    async def sweep(self) -> int:
        return 0

    async def describe(self) -> str:
        return "fake backend"

    async def aclose(self) -> None:
        self.closed = True
