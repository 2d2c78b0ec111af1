"""A tunnel to a host a secret is bound to: TLS ended here with a leaf of this server's CA, one request read,
its secrets put in their places, sent over TLS verified against the real host, the answer carried back with
any value in it masked. One request per tunnel: the request asks the host to close after its answer, and the
tunnel closes then, so no later request on it goes out without being read here.

Every other tunnel is never opened here: its TLS runs end to end between the sandbox and the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import anyio
from anyio.abc import ByteStream
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.tls import TLSStream

from llm_sandbox_mcp.egress.authority import Authority
from llm_sandbox_mcp.egress.request import MAX_HEAD
from llm_sandbox_mcp.egress.substitution import (
    BadInnerRequest,
    Binding,
    Scrubber,
    host_matches,
    outgoing_head,
    parse_inner,
    substitute_json,
    wants_json,
)

logger = logging.getLogger(__name__)

HANDSHAKE_SECONDS = 30.0
IDLE_SECONDS = 300.0
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class SecretRoutes:
    """A session's secrets as its proxy sees them: the bindings and the CA that ends TLS for their hosts."""

    bindings: tuple[Binding, ...]
    authority: Authority

    def for_host(self, host: str, port: int) -> list[Binding]:
        return [binding for binding in self.bindings if binding.binds(host, port)]

    def names_host(self, host: str) -> bool:
        return any(rule.covers(host) for binding in self.bindings for rule in binding.spec.hosts)

    def values(self) -> list[str]:
        return [binding.value for binding in self.bindings]


class StreamPair(ByteStream):
    """An asyncio reader and writer as an anyio byte stream (for anyio's TLS over the proxy's connections)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def receive(self, max_bytes: int = _CHUNK) -> bytes:
        data = await self._reader.read(max_bytes)
        if not data:
            raise anyio.EndOfStream
        return data

    async def send(self, item: bytes) -> None:
        self._writer.write(item)
        await self._writer.drain()

    async def send_eof(self) -> None:
        if self._writer.can_write_eof():
            with contextlib.suppress(OSError):
                self._writer.write_eof()

    async def aclose(self) -> None:
        self._writer.close()


async def upstream_tls(routes: SecretRoutes, far: ByteStream, host: str) -> TLSStream:
    """TLS to the real host over `far`, its certificate verified. Raises on failure (ssl.SSLError, OSError...)."""
    with anyio.fail_after(HANDSHAKE_SECONDS):
        return await TLSStream.wrap(
            far, hostname=host, ssl_context=routes.authority.upstream, standard_compatible=False
        )


async def serve_bound(
    routes: SecretRoutes, client: ByteStream, far: TLSStream, host: str, port: int, label: str
) -> str | None:
    """Serve one request from `client` (the sandbox, after 200 to its CONNECT) to `far`. Returns why it was
    refused (the caller records it), or None."""
    with anyio.fail_after(HANDSHAKE_SECONDS):
        inner = await TLSStream.wrap(
            client, server_side=True, ssl_context=routes.authority.server_context(host), standard_compatible=False
        )
    buffered = BufferedByteReceiveStream(inner)
    bindings = routes.for_host(host, port)
    try:
        with anyio.fail_after(HANDSHAKE_SECONDS):
            head = await buffered.receive_until(b"\r\n\r\n", MAX_HEAD) + b"\r\n\r\n"
        request = parse_inner(head)
    except (anyio.EndOfStream, anyio.IncompleteRead, TimeoutError):
        return None
    except (anyio.DelimiterNotFound, BadInnerRequest) as exc:
        await _answer(inner, 400, str(exc) if isinstance(exc, BadInnerRequest) else "request head too large")
        return None
    if not host_matches(request, host, port):
        why = "its Host header names another host than the tunnel's (a secret goes only to its own host)"
        await _answer(inner, 403, why)
        return why
    body: bytes | None = None
    if wants_json(request, bindings):
        length = request.content_length or 0
        with anyio.fail_after(HANDSHAKE_SECONDS):
            body = substitute_json(await buffered.receive_exactly(length), bindings)
    await far.send(outgoing_head(request, bindings, None if body is None else len(body)) + (body or b""))
    logger.info("Egress for %s: a request to %s:%d, where secrets %s are bound", label, host, port, _names(bindings))
    await _relay(buffered, inner, far, Scrubber(routes.values()))
    return None


async def _relay(buffered: BufferedByteReceiveStream, inner: TLSStream, far: TLSStream, scrubber: Scrubber) -> None:
    """The rest of the request's body upward as it is; the answer downward, masked, until the host closes."""

    async def upward() -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            if buffered.buffer:
                await far.send(bytes(buffered.buffer))
            while True:
                await far.send(await inner.receive())

    async with anyio.create_task_group() as both:
        both.start_soon(upward)
        # Until the host closes (it was asked to, after its answer), or nothing came for IDLE_SECONDS.
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError, TimeoutError):
            while True:
                with anyio.fail_after(IDLE_SECONDS):
                    data = await far.receive()
                masked = scrubber.feed(data)
                if masked:
                    await inner.send(masked)
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            rest = scrubber.end()
            if rest:
                await inner.send(rest)
        both.cancel_scope.cancel()


def _names(bindings: Sequence[Binding]) -> str:
    return ", ".join(binding.spec.name for binding in bindings) or "none"


async def _answer(stream: ByteStream, status: int, text: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}
    body = f"llm-sandbox-mcp egress proxy: {text}\n".encode()
    head = (
        f"HTTP/1.1 {status} {reasons[status]}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    with contextlib.suppress(Exception):
        await stream.send(head.encode() + body)
