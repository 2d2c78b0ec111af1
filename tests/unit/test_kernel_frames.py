"""What comes back from a warm interpreter is hostile: every kind of malformed or oversized frame ends the run
with a clean result, is never allocated, and never escapes as an exception."""

from __future__ import annotations

import json
import struct

import pytest

from llm_sandbox_mcp.models import ExecResult, Limits, SandboxRef, SandboxSpec
from llm_sandbox_mcp.run.kernel import Kernel
from tests.support.fakes import FakeBackend

pytestmark = pytest.mark.anyio

LIMIT = 1024 * 1024  # the run's inline file budget (SANDBOX_ARTIFACT_LIMIT)


def frame(kind: bytes, payload: bytes, size: int | None = None) -> bytes:
    return struct.pack(">cI", kind, len(payload) if size is None else size) + payload


def file_frame(name: object, data: bytes, size: object = None, inline: object = True) -> bytes:
    header = json.dumps({"name": name, "size": len(data) if size is None else size, "inline": inline}).encode()
    return frame(b"F", header + b"\n" + data)


def done(status: object = 0) -> bytes:
    return frame(b"D", json.dumps({"exit": status}).encode())


class Scripted:
    """A kernel process that answers a run with fixed bytes, then nothing; records what the server read."""

    def __init__(self, answer: bytes) -> None:
        self.pending = answer
        self.delivered = 0

    async def send(self, data: bytes) -> None:
        return None

    async def receive(self, timeout: float) -> bytes | None:
        if not self.pending:
            return b""  # the stream ends: a kernel that said all it would
        chunk, self.pending = self.pending[:65536], self.pending[65536:]
        self.delivered += len(chunk)
        return chunk

    def stderr_tail(self) -> bytes:
        return b""

    async def aclose(self) -> None:
        return None


async def run(answer: bytes) -> tuple[ExecResult, FakeBackend, Scripted]:
    backend = FakeBackend()
    process = Scripted(answer)
    kernel = Kernel(backend, SandboxRef("fake-1", SandboxSpec("python", Limits())), process)
    kernel.pid = 42
    result = await kernel.run(
        "print(1)", mode="inline", echo=True, filename="<cell 1>", timeout=5, output_limit=65536, artifact_limit=LIMIT
    )
    return result, backend, process


async def test_an_honest_run_comes_back_whole() -> None:
    png = b"\x89PNG" + b"\0" * 100
    result, backend, _ = await run(frame(b"O", b"1\n") + file_frame("figure_001.png", png) + done(0))
    assert (result.exit_code, result.stdout, result.interpreter_lost) == (0, b"1\n", False)
    assert [(a.name, a.size, a.inline, a.data) for a in result.artifacts] == [("figure_001.png", 104, True, png)]
    assert backend.killed == []


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        pytest.param(frame(b"O", b"", size=2**31), "over its limit", id="huge-output-frame"),
        pytest.param(frame(b"F", b"", size=2 * LIMIT), "over its limit", id="file-frame-over-the-budget"),
        pytest.param(frame(b"D", b"", size=10**6), "over its limit", id="huge-done-frame"),
        pytest.param(frame(b"Q", b"boo"), "unknown frame kind", id="unknown-kind"),
        pytest.param(frame(b"X", b"{}"), "refusal during a run", id="refusal-mid-run"),
        pytest.param(frame(b"H", b'{"pid": 7}'), "a second hello", id="second-hello"),
        pytest.param(frame(b"D", b"not json"), "not JSON", id="done-not-json"),
        pytest.param(frame(b"D", b"[" * 3000 + b"]" * 3000), "over its limit", id="deep-nesting-too-long"),
        pytest.param(frame(b"D", b"[" * 2000 + b"]" * 2000), "not JSON", id="deep-nesting"),
        pytest.param(frame(b"D", b"[1, 2]"), "not a JSON object", id="done-not-an-object"),
        pytest.param(done("0"), "invalid exit status", id="exit-status-a-string"),
        pytest.param(done(10**40), "invalid exit status", id="exit-status-huge"),
        pytest.param(done(True), "invalid exit status", id="exit-status-a-boolean"),
        pytest.param(
            frame(b"D", b'{"exit": 137, "timed_out": "yes"}'), "invalid timeout flag", id="timeout-flag-a-string"
        ),
        pytest.param(file_frame(["a"], b"x"), "invalid file header", id="file-name-not-a-string"),
        pytest.param(file_frame("a.txt", b"x", size=1e300), "invalid file header", id="file-size-a-float"),
        pytest.param(file_frame("a.txt", b"x", size=-1), "does not match", id="file-size-negative"),
        pytest.param(file_frame("a.txt", b"xyz", size=2), "does not match", id="file-size-a-lie"),
        pytest.param(file_frame("a.txt", b"x", inline=False), "does not match", id="listed-file-with-data"),
        pytest.param(frame(b"F", b'{"name": "a", "size": 1, "inline": true}'), "invalid file header", id="no-data"),
        pytest.param(
            file_frame("a.png", b"\0" * (LIMIT // 2 + 1)) + file_frame("b.png", b"\0" * (LIMIT // 2 + 1)),
            "over the inline budget",
            id="files-together-over-the-budget",
        ),
        pytest.param(b"".join(file_frame(f"f{i}.txt", b"x") for i in range(201)), "more than 200", id="201-files"),
    ],
)
async def test_a_frame_that_breaks_the_protocol_ends_the_run_cleanly(answer: bytes, why: str) -> None:
    result, backend, process = await run(frame(b"O", b"partial\n") + answer + done(0))
    assert result.exit_code == 137 and result.interpreter_lost
    assert result.artifacts == []
    assert b"broke the sandbox's result protocol" in result.stderr and why.encode() in result.stderr
    assert result.stdout == b"partial\n"
    assert backend.killed == ["fake-1"]  # everything in the sandbox was killed
    # An oversized frame is refused at its header: what the server read stayed small.
    assert process.delivered <= len(answer) + 65536


async def test_a_file_name_that_leaves_the_output_directory_is_skipped_not_fatal() -> None:
    result, _, _ = await run(file_frame("../../etc/passwd", b"x") + file_frame("ok.txt", b"y") + done(0))
    assert result.exit_code == 0 and [a.name for a in result.artifacts] == ["ok.txt"]


async def test_an_interpreter_that_ends_mid_run_is_a_result() -> None:
    result, backend, _ = await run(frame(b"O", b"so far\n"))
    assert result.exit_code == 137 and result.interpreter_lost and result.stdout == b"so far\n"
    assert b"the interpreter was lost" in result.stderr
    assert backend.killed == ["fake-1"]


async def test_a_file_name_that_is_not_text_is_skipped_not_fatal() -> None:
    # JSON escapes a lone surrogate (the Python kernel's name for a file whose name is not UTF-8); no result
    # could carry it to the client.
    result, _, _ = await run(file_frame("\udcff.txt", b"x") + file_frame("ok.txt", b"y") + done(0))
    assert result.exit_code == 0 and [a.name for a in result.artifacts] == ["ok.txt"]
