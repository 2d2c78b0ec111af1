"""The vocabulary shared by the executor and the backends, including the one outcome of a run."""

from __future__ import annotations

import re
import time
import unicodedata
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Literal

import anyio
from pydantic import BaseModel, Field

from llm_sandbox_mcp.artifacts import Artifact
from llm_sandbox_mcp.defaults import SANDBOX_USER

WORKDIR = PurePosixPath("/workspace")
OUTPUT_DIR = WORKDIR / "outputs"
LIBS_DIR = PurePosixPath("/opt/llm-sandbox/libs")
# The installer network of engines whose sandboxes reach the egress proxy: no route at all, the tunnel over the
# relay's own stream the only way out.
EGRESS_NETWORK = "egress"
# Floors of what a sandbox may be given: below them engines drop the limit (a CPU quota of 0 means none).
MIN_CPUS = 0.01
MIN_MEMORY = 32 * 1024**2
# The kernel kills sandboxes before the server when memory runs out (every engine sets it).
OOM_SCORE_ADJ = 1000
# The largest program a call may send.
MAX_CODE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Resource limits and hardening for one sandbox. Defaults are the secure ones."""

    memory_bytes: int = 512 * 1024**2
    cpus: float = 1.0
    pids: int = 128
    nofile: int = 1024
    workspace_bytes: int = 256 * 1024**2
    tmp_bytes: int = 64 * 1024**2
    network_mode: str = "none"
    read_only: bool = True
    cap_drop: tuple[str, ...] = ("ALL",)
    security_opt: tuple[str, ...] = ("no-new-privileges:true",)
    privileged: bool = False
    uid: int = int(SANDBOX_USER.split(":")[0])
    gid: int = int(SANDBOX_USER.split(":")[1])


@dataclass(frozen=True)
class CacheMount:
    """A library cache: a named store on the engine, mounted at `target` in the sandbox."""

    key: str
    target: PurePosixPath = LIBS_DIR
    writable: bool = False


@dataclass(frozen=True)
class SandboxSpec:
    """Everything needed to create a sandbox. Hashable: equal specs share a warm pool."""

    image: str
    limits: Limits
    cache: CacheMount | None = None
    # Whether the sandbox may reach its egress proxy (through the relay's own stream: nothing is mounted).
    egress: bool = False
    # A zygote template container (SANDBOX_ZYGOTE on Docker/Podman): its kernel makes each one-shot call a
    # sandbox of its own in nested namespaces, so the engine lets it unshare and mount (see `run.zygote`).
    forks: bool = False
    # Variables of this sandbox alone (a session's secrets: their placeholders and the proxy CA's files).
    env: tuple[tuple[str, str], ...] = ()


@dataclass
class SandboxRef:
    """A live sandbox as the backend knows it."""

    id: str
    spec: SandboxSpec


@dataclass
class ExecResult:
    """What one process in a sandbox did, as raw bytes. A non-zero exit is a result, not an error.

    A warm interpreter also reports the files the run left (`artifacts`) and whether it was lost on the way.
    """

    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False
    duration_ms: float = 0.0
    artifacts: list[Artifact] = field(default_factory=lambda: [])
    interpreter_lost: bool = False

    @classmethod
    def captured(cls, exit_code: int, out: HeadTail, err: HeadTail, *, timed_out: bool, started: float) -> ExecResult:
        """The result of a process whose streams went into `out` and `err`, started at monotonic `started`."""
        return cls(
            exit_code=exit_code,
            stdout=out.getvalue(),
            stderr=err.getvalue(),
            timed_out=timed_out and not (out.flooded or err.flooded),  # stopped for its output, not its time
            truncated=out.truncated or err.truncated or out.flooded or err.flooded,
            duration_ms=(time.monotonic() - started) * 1000,
        )


# However much a run writes, the server reads at most this multiple of what it keeps of a stream (and at least
# MIN_READ_BUDGET): past it the run is stopped, so a flood costs the server neither memory nor unbounded time.
READ_BUDGET_FACTOR = 1024
MIN_READ_BUDGET = 16 * 1024**2


class HeadTail:
    """Keeps the first and last `limit // 2` bytes of a stream and counts what was dropped between them.

    Memory stays bounded however much the process writes.
    """

    def __init__(self, limit: int | None, listener: Callable[[bytes], None] | None = None) -> None:
        self.limit = limit
        self._listener = listener
        self._head = bytearray()
        self._tail = bytearray()
        self.dropped = 0
        self.read = 0
        self.budget = None if limit is None else max(limit * READ_BUDGET_FACTOR, MIN_READ_BUDGET)

    def feed(self, data: bytes) -> None:
        self.read += len(data)
        if self._listener is not None and data:
            self._listener(data)
        if self.limit is None:
            self._head += data
            return
        half = self.limit // 2
        room = half - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if not data:
            return
        keep = self.limit - half
        self._tail += data
        if len(self._tail) > keep:
            excess = len(self._tail) - keep
            self.dropped += excess
            del self._tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    @property
    def flooded(self) -> bool:
        """More was written than a run may make the server read: whoever pumps this stops the run."""
        return self.budget is not None and self.read > self.budget

    def getvalue(self) -> bytes:
        flood = b""
        if self.flooded:
            flood = f"\n[the run wrote more than {self.budget} bytes here; it was stopped]\n".encode()
        if not self.dropped:
            return bytes(self._head + self._tail) + flood
        marker = f"\n[... {self.dropped} bytes truncated ...]\n".encode()
        return bytes(self._head) + marker + bytes(self._tail) + flood


Stream = Literal["stdout", "stderr"]
OutputListener = Callable[[Stream, bytes], None]
"""Told every chunk of a process's output as it arrives (in the event loop's thread)."""


def captures(limit: int | None, listener: OutputListener | None) -> tuple[HeadTail, HeadTail]:
    """The stdout and stderr captures of one process, each telling `listener` what it is fed."""
    if listener is None:
        return HeadTail(limit), HeadTail(limit)
    heard = listener
    return HeadTail(limit, lambda data: heard("stdout", data)), HeadTail(limit, lambda data: heard("stderr", data))


# Escape sequences (colours, cursor moves) that would garble a one-line progress message.
_ESCAPES = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|.)")
_LINE_CHARS = 200


def one_line(text: str, limit: int = _LINE_CHARS) -> str:
    """Text fit for a one-line status: escapes removed, control and format characters as spaces, capped."""
    text = _ESCAPES.sub("", text)
    text = "".join(" " if unicodedata.category(char) in ("Cc", "Cf", "Cs", "Co") else char for char in text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Live:
    """What a run has shown so far: its phase and its output as it arrives, for progress and background jobs.

    The output of both streams is kept interleaved, as it came, at absolute byte offsets; only the last `keep`
    bytes stay in memory however much the run writes.
    """

    def __init__(self, keep: int = 256 * 1024) -> None:
        self.phase = "queued"
        # Said after the phase for the whole run: e.g. that it runs on the base image while the project image
        # is built (a function: what it says changes as the build goes).
        self.note: Callable[[], str] = str
        self.started = time.monotonic()
        self.ended: float | None = None
        self.total = 0
        self._keep = keep
        self._chunks: deque[tuple[int, Stream, bytes]] = deque()
        self._kept = 0
        self._tail = b""
        self._waiters: list[anyio.Event] = []
        # Values of a session's secrets: masked (same length, offsets kept) in whatever is read of the output.
        self.secrets: tuple[bytes, ...] = ()

    def feed(self, stream: Stream, data: bytes) -> None:
        if not data:
            return
        self._chunks.append((self.total, stream, data))
        self.total += len(data)
        self._kept += len(data)
        while self._kept - len(self._chunks[0][2]) >= self._keep:
            self._kept -= len(self._chunks.popleft()[2])
        self._tail = (self._tail + data)[-4096:]
        waiters, self._waiters = self._waiters, []
        for event in waiters:
            event.set()

    async def wait_for_output(self, count: int = 1) -> None:
        """Return once at least `count` bytes of output have arrived."""
        while self.total < count:
            event = anyio.Event()
            self._waiters.append(event)
            await event.wait()

    def since(self, offset: int) -> tuple[bytes, bytes, int]:
        """Output from `offset` on, split by stream, and how many bytes before it are no longer kept."""
        out, err = bytearray(), bytearray()
        first = self._chunks[0][0] if self._chunks else self.total
        for start, stream, data in self._chunks:
            if start + len(data) <= offset:
                continue
            part = data[max(0, offset - start) :]
            (out if stream == "stdout" else err).extend(part)
        return self._masked(bytes(out)), self._masked(bytes(err)), max(0, first - max(offset, 0))

    def _masked(self, data: bytes) -> bytes:
        for value in self.secrets:
            data = data.replace(value, b"*" * len(value))
        return data

    def last_line(self) -> str:
        tail = self._masked(self._tail).decode("utf-8", errors="replace")
        lines = [line for line in tail.splitlines() if line.strip()]
        return one_line(lines[-1]) if lines else ""

    def summary(self) -> str:
        """One line a person can read: phase, time so far, output so far and its last line."""
        elapsed = (self.ended or time.monotonic()) - self.started
        text = f"{self.phase}{self.note()}, {elapsed:.0f} s"
        if self.total:
            text += f", {_size(self.total)} of output"
        line = self.last_line()
        return f"{text}; last line: {line}" if line else text


def _size(count: int) -> str:
    if count < 1024:
        return f"{count} bytes"
    if count < 1024**2:
        return f"{count / 1024:.1f} KiB"
    return f"{count / 1024**2:.1f} MiB"


class Execution(BaseModel):
    """The outcome of one run, exactly as `execute_code` returns it. User code failing is an outcome, not an error."""

    exit_code: int | None = Field(
        description="Exit status of the program; non-zero means it failed; null while it goes on as a job"
    )
    stdout: str
    stderr: str
    timed_out: bool = Field(description="The timeout expired and every process was killed")
    truncated: bool = Field(description="Output was longer than the cap; its middle was cut")
    duration_ms: int
    language: str
    backend: str
    phase: Literal["compile", "run"] = Field(description="Where it failed or ended: compile errors say 'compile'")
    session_id: str | None = Field(description="The session the code ran in, if any")
    interpreter_lost: bool = Field(description="The session's interpreter was stopped; the next call starts anew")
    artifacts: list[Artifact] = Field(description="Files written to $OUTPUT_DIR (plots included)")
    status: Literal["finished", "running"] = Field(
        default="finished", description="'running': the run goes on as a background job (see job_id)"
    )
    job_id: str | None = Field(default=None, description="The background job this run goes on as: poll get_job")
    message: str | None = Field(default=None, description="What to do next, when the run goes on as a job")
    network_refused: list[str] = Field(
        default_factory=lambda: [],
        description="Connections the session's proxy refused during this call: host:port and why",
    )
