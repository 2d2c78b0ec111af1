"""Slow and many clients against `serve --http`'s HTTP face, on loopback with raw sockets: a client that sends its
headers or its body a byte at a time is cut off once SANDBOX_HTTP_REQUEST_TIMEOUT has passed, and connections
past SANDBOX_HTTP_MAX_CONNECTIONS are refused at once, so no client holds the server's connections for long.

The attack is on the HTTP face, not on a sandbox: the fake engine stands behind it, so the tier's host check
(which counts sandbox processes) has nothing to check here and is replaced by a check that the server still
serves afterwards. The bounds are set low (1 second, 6 connections) to keep the test short.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketStream

from llm_sandbox_mcp.config import Settings
from tests.support.fakes import FakeBackend
from tests.support.http_serving import serving

pytestmark = pytest.mark.anyio

TOKEN = "slow-token-" + "4d" * 16
MAX_CONNECTIONS = 6
# Far longer than the 1 second allowed: the server must cut the client off while it is still sending.
TRICKLE_BYTES = 400
TRICKLE_PAUSE = 0.05


@pytest.fixture(autouse=True)
def host_unharmed() -> None:
    """No sandbox is made (the fake engine): the tier's check of sandbox processes does not apply."""


@asynccontextmanager
async def _server(tmp_path: Path) -> AsyncGenerator[tuple[str, int]]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"mallory {TOKEN}\n")
    tokens.chmod(0o600)
    settings = Settings(
        sandbox_pool_size=0,
        sandbox_http_tokens_file=tokens,
        sandbox_http_request_timeout=1.0,
        sandbox_http_max_connections=MAX_CONNECTIONS,
    )
    async with serving(lambda _port: settings, FakeBackend()) as (base, _settings):
        yield base, int(base.rsplit(":", 1)[1])


async def _answer(stream: SocketStream) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    try:
        while True:
            received += await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
        return received


async def _trickle(stream: SocketStream, data: bytes) -> tuple[int, bytes]:
    """Send `data` a byte at a time, listening between bytes; return how many bytes went before the server
    answered or closed the connection, and what it answered."""
    for sent in range(len(data)):
        try:
            await stream.send(data[sent : sent + 1])
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionResetError, BrokenPipeError):
            return sent, b""
        with anyio.move_on_after(TRICKLE_PAUSE):
            try:
                first = await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                return sent + 1, b""
            return sent + 1, first + await _answer(stream)
    return len(data), await _answer(stream)


async def _still_serves(port: int) -> None:
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        await stream.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert (await _answer(stream)).startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("part", ["headers", "body"])
async def test_a_client_sending_a_byte_at_a_time_is_cut_off(
    tmp_path: Path, part: str, caplog: pytest.LogCaptureFixture
) -> None:
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"padding": "' + b"x" * TRICKLE_BYTES
    head = (
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body) + 3}\r\n".encode()
    )
    caplog.set_level(logging.INFO, logger="llm_sandbox_mcp.server.connections")
    with anyio.fail_after(120):
        async with _server(tmp_path) as (_base, port):
            stream = await anyio.connect_tcp("127.0.0.1", port)
            async with stream:
                if part == "headers":
                    request = head + b"X-Slow: " + b"s" * TRICKLE_BYTES + b"\r\n\r\n"
                else:
                    await stream.send(head + b"\r\n")
                    request = body + b'"}}'
                sent, answer = await _trickle(stream, request)
                total = len(request)
            assert sent < total, "the server let the client send its whole request a byte at a time"
            if part == "headers":
                assert answer.startswith(b"HTTP/1.1 408 "), answer
            else:
                assert b"HTTP/1.1 200" not in answer and b"execute_code" not in answer, answer
            assert "no complete request within 1 seconds (SANDBOX_HTTP_REQUEST_TIMEOUT)" in caplog.text
            await _still_serves(port)


async def test_connections_past_the_cap_are_refused_and_idle_ones_are_closed(tmp_path: Path) -> None:
    with anyio.fail_after(120):
        async with _server(tmp_path) as (_base, port):
            held = [await anyio.connect_tcp("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
            try:
                extra = await anyio.connect_tcp("127.0.0.1", port)
                async with extra:
                    assert (await _answer(extra)).startswith(b"HTTP/1.1 503 ")
                # The held connections sent nothing: each is closed at the deadline, none stays.
                for stream in held:
                    assert (await _answer(stream)).startswith(b"HTTP/1.1 408 ")
            finally:
                for stream in held:
                    await stream.aclose()
            await _still_serves(port)
