"""The egress proxy served for real, on connections handed to it in this process (as the tunnel does), with
origin servers on 127.0.0.1 only.

Every socket connect of this process is recorded: a refused host is refused before any connection is tried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import anyio
import pytest

from llm_sandbox_mcp.egress import proxy as proxy_module
from llm_sandbox_mcp.egress.policy import EgressPolicy
from llm_sandbox_mcp.egress.proxy import EgressListener, open_listener
from llm_sandbox_mcp.host_rules import HostRule
from tests.support.connects import recorded
from tests.support.tls import client_hello

pytestmark = pytest.mark.anyio


async def _origin(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An HTTP server that answers with the request head it got; after a CONNECT, an echo of the tunnel."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        if head.startswith(b"PING"):
            writer.write(b"PONG " + head)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + head)
        await writer.drain()
    finally:
        writer.close()


@pytest.fixture
async def origin() -> AsyncIterator[int]:
    server = await asyncio.start_server(_origin, "127.0.0.1", 0)
    port: int = server.sockets[0].getsockname()[1]
    async with server:
        yield port


async def _listener(*entries: str) -> EgressListener:
    """Entries written `implied:host` are not explicit (as a toolchain's default registry)."""
    rules = [HostRule.parse(e.removeprefix("implied:"), explicit=not e.startswith("implied:")) for e in entries]
    return open_listener(EgressPolicy.of(rules, "SANDBOX_TEST_HOSTS"), "a test sandbox")


async def _ask(listener: EgressListener, data: bytes) -> bytes:
    answer = b""
    async with await listener.connect() as stream:
        await stream.send(data)
        with anyio.fail_after(10):
            while True:
                try:
                    answer += await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError):
                    return answer


async def _ask_once(entry: str, data: bytes) -> bytes:
    """`data` sent to a new listener allowing `entry`, and the answer."""
    listener = await _listener(entry)
    try:
        return await _ask(listener, data)
    finally:
        await listener.aclose()


async def test_plain_http_to_an_explicit_host_is_forwarded_in_origin_form(origin: int) -> None:
    answer = await _ask_once(
        f"127.0.0.1:{origin}", f"GET http://127.0.0.1:{origin}/simple/ HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    )
    assert answer.startswith(b"HTTP/1.1 200 OK")
    assert f"GET /simple/ HTTP/1.1\r\nHost: 127.0.0.1:{origin}\r\nConnection: close".encode() in answer


async def test_connect_opens_a_tunnel(origin: int) -> None:
    answer = await _ask_once(f"127.0.0.1:{origin}", f"CONNECT 127.0.0.1:{origin} HTTP/1.1\r\n\r\nPING\r\n\r\n".encode())
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\nPONG PING\r\n\r\n"


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("169.254.169.254:80", "IP address not on this sandbox's allowlist"),
        ("10.0.0.1:443", "IP address not on this sandbox's allowlist"),
        ("other.example:443", "host not on this sandbox's allowlist"),
        ("localhost:{port}", "host not on this sandbox's allowlist"),
        ("127.0.0.1:22", "port 22 is not allowed"),
    ],
)
async def test_refused_before_any_connection(
    origin: int, target: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    listener = await _listener(f"127.0.0.1:{origin}", "127.0.0.1:8080")
    target = target.format(port=origin)
    with recorded() as connects, caplog.at_level(logging.WARNING):
        try:
            answer = await _ask(listener, f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
            plain = await _ask(listener, f"GET http://{target}/latest/meta-data HTTP/1.1\r\n\r\n".encode())
        finally:
            await listener.aclose()
    assert answer.startswith(b"HTTP/1.1 403 Forbidden") and plain.startswith(b"HTTP/1.1 403 Forbidden")
    assert reason.encode() in answer and b"SANDBOX_TEST_HOSTS can allow it" in answer
    assert connects == []  # nothing from the proxy (and ours to it is a socket pair, no connect)
    refusals = [r for r in caplog.records if r.name == "llm_sandbox_mcp.egress.proxy"]
    assert len(refusals) == 2 and target.rsplit(":", 1)[0] in refusals[0].getMessage()
    assert listener.refused and listener.refused[0].port == int(target.rsplit(":", 1)[1])


async def test_implied_names_resolving_to_loopback_are_refused(origin: int, caplog: pytest.LogCaptureFixture) -> None:
    listener = await _listener(f"implied:localhost:{origin}")
    with recorded() as connects:
        try:
            answer = await _ask(listener, f"CONNECT localhost:{origin} HTTP/1.1\r\n\r\n".encode())
        finally:
            await listener.aclose()
    assert answer.startswith(b"HTTP/1.1 403") and b"non-public address" in answer
    assert b"127.0.0.1" not in answer  # what the name resolves to is the operator's to see, in the log
    assert "127.0.0.1" in " ".join(r.getMessage() for r in caplog.records if r.name == "llm_sandbox_mcp.egress.proxy")
    assert connects == []


async def test_explicit_names_resolve_on_the_host_side(origin: int) -> None:
    answer = await _ask_once(f"localhost:{origin}", f"CONNECT localhost:{origin} HTTP/1.1\r\n\r\nPING\r\n\r\n".encode())
    assert answer.endswith(b"PONG PING\r\n\r\n")


@pytest.mark.parametrize(
    "data",
    [
        b"garbage\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x00\xff" * 10 + b"\r\n\r\n",
        b"A" * 20000,
        b"CONNECT :1 HTTP/1.1\r\n\r\n",
    ],
)
async def test_malformed_requests_get_400_and_a_close(data: bytes) -> None:
    listener = await _listener("example.org")
    try:
        answer = await _ask(listener, data)
        again = await _ask(listener, b"junk\r\n\r\n")  # the listener still serves
    finally:
        await listener.aclose()
    assert answer.startswith(b"HTTP/1.1 400 Bad Request") and again.startswith(b"HTTP/1.1 400")


async def test_a_client_that_goes_silent_or_away_ends_only_its_connection(origin: int) -> None:
    listener = await _listener(f"127.0.0.1:{origin}")
    try:
        silent = await listener.connect()
        await silent.send(b"CONNECT 127.0.0.1")  # never finished
        gone = await listener.connect()
        await gone.aclose()
        answer = await _ask(listener, f"CONNECT 127.0.0.1:{origin} HTTP/1.1\r\n\r\nPING\r\n\r\n".encode())
    finally:
        await listener.aclose()
    assert answer.endswith(b"PONG PING\r\n\r\n")
    # Closing the proxy ended the silent connection too, and it takes no new one.
    with anyio.fail_after(5), pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError)):
        await silent.receive()
    await silent.aclose()
    with pytest.raises(ConnectionRefusedError, match="closed"):
        await listener.connect()


async def test_connections_beyond_the_limit_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy_module, "MAX_CONNECTIONS", 1)
    listener = await _listener("example.org")
    try:
        holding = await listener.connect()
        await asyncio.sleep(0.1)
        answer = await _ask(listener, b"CONNECT example.org:443 HTTP/1.1\r\n\r\n")
        await holding.aclose()
    finally:
        await listener.aclose()
    assert answer.startswith(b"HTTP/1.1 503")


async def _chained(monkeypatch: pytest.MonkeyPatch, *tunnels: bytes) -> tuple[list[bytes], list[bytes], EgressListener]:
    """Each of `tunnels` sent to a listener allowing registry.example, through the server's own proxy (an
    upstream that opens every CONNECT and echoes what the tunnel carries): the heads it was asked, the
    answers, and the listener."""
    asked: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        asked.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
        writer.write(b"ECHO " + await reader.read(65536))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("HTTPS_PROXY", f"http://user:pw@127.0.0.1:{port}")
    monkeypatch.setenv("NO_PROXY", "")
    listener = await _listener("registry.example")
    async with server:
        try:
            answers = [await _ask(listener, tunnel) for tunnel in tunnels]
        finally:
            await listener.aclose()
    return asked, answers, listener


async def test_chains_to_the_servers_own_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTPS_PROXY of the server's environment: the tunnel is asked of that proxy, the name check stays ours."""
    hello = client_hello("registry.example")
    asked, (answer, refused), _ = await _chained(
        monkeypatch,
        b"CONNECT registry.example:443 HTTP/1.1\r\n\r\n" + hello,
        b"CONNECT other.example:443 HTTP/1.1\r\n\r\n",
    )
    assert answer == b"HTTP/1.1 200 Connection established\r\n\r\nECHO " + hello
    assert asked[0].startswith(b"CONNECT registry.example:443 HTTP/1.1\r\n")
    assert b"Proxy-Authorization: Basic dXNlcjpwdw==" in asked[0]
    assert refused.startswith(b"HTTP/1.1 403") and len(asked) == 1


async def test_a_tunnel_carries_tls_only_for_the_host_it_was_opened_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind one CDN address, the TLS server name picks the site: a tunnel to an allowed name that asks
    for another one, for none, or that does not speak TLS is closed, and nothing of it goes on."""
    connect = b"CONNECT registry.example:443 HTTP/1.1\r\n\r\n"
    _, answers, listener = await _chained(
        monkeypatch,
        connect + client_hello("other-site.example"),
        connect + client_hello(None),
        connect + b"GET / HTTP/1.1\r\nHost: other-site.example\r\n\r\n",
    )
    assert answers == [b"HTTP/1.1 200 Connection established\r\n\r\n"] * 3  # then closed: no ECHO
    reasons = [refusal.reason for refusal in listener.refused]
    assert "the server name 'other-site.example', not this host" in reasons[0]
    assert "no server name" in reasons[1]
    assert "did not begin with a TLS ClientHello" in reasons[2]


async def test_an_allowed_host_that_cannot_be_reached_is_a_502_remembered_for_the_install_error() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port: int = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()  # nothing listens there any more
    listener = await _listener(f"127.0.0.1:{port}")
    try:
        answer = await _ask(listener, f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
    finally:
        await listener.aclose()
    assert answer.startswith(b"HTTP/1.1 502 Bad Gateway") and b"could not be connected to" in answer
    assert listener.unreachable == [f"127.0.0.1:{port} (could not be connected to)"] and listener.refused == []
