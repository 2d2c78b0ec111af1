"""The proxy: one per sandbox, serving that sandbox's policy on connections handed to it in this process.

No socket is listened on: each stream the sandbox's tunnel opens becomes one end of a socket pair whose other
end the proxy serves (`EgressListener.connect`), so nothing on the host, no file and no port, can be connected
to by anyone else, and nothing here needs a UNIX-socket server (which Windows lacks).

A tunnel to port 80 or 443 of a named host must begin with a TLS ClientHello that names that host
(`tls.py`): a CDN serves many sites behind one address, and the CONNECT name alone would let a tunnel opened
for an allowed registry reach any of them. Plain HTTP goes as absolute-form requests, whose Host the proxy
sets. Tunnels to an IP address or to another port (only ever allowed by an explicit host:port) are passed
as they are: a protocol there may wait for the server to speak first. A CONNECT to a host:port a session's
secret is bound to is the exception: TLS ends here (`bound.py`), and plain HTTP to a bound host is refused.

Bounded everywhere: connections per sandbox, the request head's size, the time to send it, to resolve and to
connect, and idle tunnels. No exception escapes a connection's handler: anything unexpected closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass, field

from anyio.abc import SocketStream

from llm_sandbox_mcp.egress.bound import SecretRoutes, StreamPair, serve_bound, upstream_tls
from llm_sandbox_mcp.egress.policy import EgressPolicy, Refusal
from llm_sandbox_mcp.egress.request import MAX_HEAD, BadRequest, Request, parse_head
from llm_sandbox_mcp.egress.tls import NotAClientHello, read_client_hello, server_name
from llm_sandbox_mcp.egress.upstream import Upstream, upstream_for
from llm_sandbox_mcp.host_rules import WEB_PORTS, HostRule, ip_literal

logger = logging.getLogger(__name__)

MAX_CONNECTIONS = 64
HEAD_SECONDS = 30.0
RESOLVE_SECONDS = 15.0
CONNECT_SECONDS = 20.0
IDLE_SECONDS = 300.0
_CHUNK = 64 * 1024
_MAX_REFUSALS = 20
# A sandbox that floods the proxy must not flood the server's log.
MAX_LOGGED_REFUSALS = 200
# Distinct refusals one call reports; past them only a count is kept.
MAX_CALL_REFUSALS = 10


@dataclass
class RefusalWindow:
    """The refusals of one call: the first distinct ones (at most `cap`) and how many more there were. Its
    size is bounded whatever the sandbox does."""

    cap: int = MAX_CALL_REFUSALS
    shown: list[Refusal] = field(default_factory=lambda: [])
    left_out: int = 0

    def add(self, refusal: Refusal) -> None:
        if refusal in self.shown:
            return
        if len(self.shown) < self.cap:
            self.shown.append(refusal)
        else:
            self.left_out += 1


@dataclass
class EgressListener:
    """A sandbox's proxy: the connections handed to it (`connect`) and what it refused."""

    policy: EgressPolicy
    label: str
    # The session's secrets: TLS to their hosts ends here, every other tunnel stays end to end.
    secrets: SecretRoutes | None = None
    refused: list[Refusal] = field(default_factory=lambda: [])
    # The refusals of the call running now (`watch`), for that call's result.
    window: RefusalWindow | None = None
    # Allowed hosts the proxy could not reach (answered 502), for the install error.
    unreachable: list[str] = field(default_factory=lambda: [])
    connections: int = 0
    refusals: int = 0
    closed: bool = False
    _tasks: set[asyncio.Task[None]] = field(default_factory=lambda: set())

    async def connect(self) -> SocketStream:
        """A new connection to this proxy: one end of a socket pair, the other served here. Raises OSError
        once the proxy is closed."""
        if self.closed:
            raise ConnectionRefusedError(f"the egress proxy of {self.label} is closed")
        ours, theirs = socket.socketpair()
        task = asyncio.ensure_future(self._serve_socket(ours))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: ours.close())  # also when cancelled before it ran
        try:
            return await SocketStream.from_socket(theirs)
        except BaseException:  # cancelled meanwhile: the proxy's end then sees the connection's end
            theirs.close()
            raise

    async def aclose(self) -> None:
        """Refuse new connections and end every connection. Idempotent."""
        self.closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def allow(self, rule: HostRule) -> None:
        """Widen the allowlist, live: every connection from now on is matched against the new one."""
        self.policy = EgressPolicy.of((*self.policy.rules, rule), self.policy.setting)

    def watch(self) -> RefusalWindow:
        """Start recording the refusals of a call (one at a time: a later `watch` replaces the window)."""
        self.window = RefusalWindow()
        return self.window

    def _refuse(self, refusal: Refusal) -> None:
        self.refusals += 1
        if self.window is not None:
            self.window.add(refusal)
        if self.refusals <= MAX_LOGGED_REFUSALS:
            logger.warning("Egress refused for %s: %s", self.label, refusal.logged(self.policy.setting))
        if self.refusals == MAX_LOGGED_REFUSALS:
            logger.warning("Egress: further refusals for %s are not logged", self.label)
        if len(self.refused) < _MAX_REFUSALS and refusal not in self.refused:
            self.refused.append(refusal)

    async def _unreachable(self, writer: asyncio.StreamWriter, request: Request, why: str) -> None:
        logger.warning("Egress for %s: %s:%d %s", self.label, request.host, request.port, why)
        target = f"{request.host}:{request.port} ({why})"
        if len(self.unreachable) < _MAX_REFUSALS and target not in self.unreachable:
            self.unreachable.append(target)
        await _answer(writer, 502, f"{request.host}:{request.port}: {why}")

    async def _serve_socket(self, sock: socket.socket) -> None:
        reader, writer = await asyncio.open_connection(sock=sock, limit=MAX_HEAD)
        await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            if self.connections > MAX_CONNECTIONS:
                await _answer(writer, 503, "too many connections through this sandbox's proxy")
                return
            await self._handle(reader, writer)
        except asyncio.CancelledError:
            pass  # only `aclose` cancels; a cancelled callback task would be reported by asyncio as an error
        except Exception as exc:  # hostile input must never end anything but its own connection
            logger.debug("Egress connection for %s ended: %r", self.label, exc)
        finally:
            self.connections -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_SECONDS)
            request = parse_head(head)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError):
            return
        except (asyncio.LimitOverrunError, BadRequest) as exc:
            await _answer(writer, 400, str(exc) if isinstance(exc, BadRequest) else "request head too large")
            return
        rule = self.policy.match(request.host, request.port)
        if isinstance(rule, Refusal):
            self._refuse(rule)
            await _answer(writer, 403, rule.message(self.policy.setting))
            return
        bound = self.secrets is not None and self.secrets.names_host(request.host)
        if bound and not request.tunnel:
            why = "a secret is bound to this host: only HTTPS reaches it"
            refusal = Refusal(request.host, request.port, why, settable=False)
            self._refuse(refusal)
            await _answer(writer, 403, refusal.reason)
            return
        upstream = upstream_for(request)
        if upstream is not None:
            streams = await self._through_upstream(upstream, request, writer)
        else:
            streams = await self._direct(rule, request, writer)
        if streams is None:
            return
        far_reader, far_writer = streams
        try:
            if self.secrets is not None and self.secrets.for_host(request.host, request.port):
                await self._intercept(self.secrets, request, (reader, writer), (far_reader, far_writer))
                return
            if request.tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if _names_its_tls(request):
                    hello = await self._client_hello(reader, request)
                    if hello is None:
                        return
                    far_writer.write(hello)
            elif upstream is None:
                far_writer.write(request.head)
            await _splice(reader, writer, far_reader, far_writer)
        finally:
            far_writer.close()
            with contextlib.suppress(Exception):
                await far_writer.wait_closed()

    async def _intercept(
        self,
        secrets: SecretRoutes,
        request: Request,
        near: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        far: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    ) -> None:
        """A CONNECT to a host:port a secret is bound to: TLS to the real host first (verified), then to the
        sandbox with this server's leaf, and one request between them (`bound.py`)."""
        try:
            upward = await upstream_tls(secrets, StreamPair(*far), request.host)
        except Exception as exc:  # a verification failure, a reset, a timeout: the host is not reached
            reason = getattr(exc, "verify_message", None) or getattr(exc, "reason", None) or type(exc).__name__
            await self._unreachable(near[1], request, f"TLS to it failed ({reason})")
            return
        near[1].write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        why = await serve_bound(secrets, StreamPair(*near), upward, request.host, request.port, self.label)
        if why is not None:
            self._refuse(Refusal(request.host, request.port, why, settable=False))

    async def _client_hello(self, reader: asyncio.StreamReader, request: Request) -> bytes | None:
        """The tunnel's first records when they are a ClientHello naming the host asked for, else None
        (refused and remembered, or the client went away)."""
        try:
            records, hello = await asyncio.wait_for(read_client_hello(reader), HEAD_SECONDS)
            name = server_name(hello)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError):
            return None
        except NotAClientHello as exc:
            self._refuse(Refusal(request.host, request.port, f"the tunnel did not begin with a TLS ClientHello: {exc}"))
            return None
        if name != request.host:
            named = "no server name" if name is None else f"the server name {name!r}"
            self._refuse(Refusal(request.host, request.port, f"its TLS ClientHello gave {named}, not this host"))
            return None
        return records

    async def _direct(
        self, rule: HostRule, request: Request, writer: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Resolve here (the sandbox has no DNS), keep the addresses the policy allows, connect to one."""
        literal = ip_literal(request.host)
        if literal is not None:
            found = [literal]
        else:
            try:
                resolving = asyncio.get_running_loop().getaddrinfo(request.host, request.port, type=socket.SOCK_STREAM)
                infos = await asyncio.wait_for(resolving, RESOLVE_SECONDS)
            except (OSError, asyncio.TimeoutError):
                infos = []
            found = [address for address in (ip_literal(str(info[4][0])) for info in infos) if address is not None]
        addresses = self.policy.addresses(rule, request.host, request.port, found)
        if isinstance(addresses, Refusal):
            self._refuse(addresses)
            await _answer(writer, 403, addresses.message(self.policy.setting))
            return None
        for address in addresses:
            try:
                connecting = asyncio.open_connection(str(address), request.port, limit=_CHUNK)
                return await asyncio.wait_for(connecting, CONNECT_SECONDS)
            except (OSError, asyncio.TimeoutError):
                continue
        await self._unreachable(writer, request, "could not be connected to")
        return None

    async def _through_upstream(
        self, upstream: Upstream, request: Request, writer: asyncio.StreamWriter
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The server's own proxy (HTTPS_PROXY/HTTP_PROXY) resolves and connects; the name check was ours."""
        try:
            connecting = asyncio.open_connection(upstream.host, upstream.port, limit=MAX_HEAD)
            far_reader, far_writer = await asyncio.wait_for(connecting, CONNECT_SECONDS)
        except (OSError, asyncio.TimeoutError):
            await self._unreachable(writer, request, "the upstream proxy could not be reached")
            return None
        if not request.tunnel:
            far_writer.write(upstream.with_credentials(request.absolute_head))
            return far_reader, far_writer
        far_writer.write(upstream.connect_head(request.host, request.port))
        try:
            answer = await asyncio.wait_for(far_reader.readuntil(b"\r\n\r\n"), CONNECT_SECONDS)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            answer = b""
        if answer.split(b" ", 2)[1:2] != [b"200"]:
            far_writer.close()
            await self._unreachable(writer, request, "the upstream proxy did not open it")
            return None
        return far_reader, far_writer


def _names_its_tls(request: Request) -> bool:
    return request.port in WEB_PORTS and ip_literal(request.host) is None


async def _answer(writer: asyncio.StreamWriter, status: int, text: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Service Unavailable"}
    body = f"llm-sandbox-mcp egress proxy: {text}\n".encode()
    writer.write(
        f"HTTP/1.1 {status} {reasons[status]}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.drain(), 5)


async def _splice(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    far_reader: asyncio.StreamReader,
    far_writer: asyncio.StreamWriter,
) -> None:
    """Copy both ways until both sides are done, or nothing moved for IDLE_SECONDS."""
    loop = asyncio.get_running_loop()
    last = [loop.time()]

    async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(_CHUNK):
            last[0] = loop.time()
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            with contextlib.suppress(OSError):
                sink.write_eof()

    pipes = [asyncio.ensure_future(pipe(reader, far_writer)), asyncio.ensure_future(pipe(far_reader, writer))]
    try:
        while not all(task.done() for task in pipes):
            await asyncio.wait(pipes, timeout=min(IDLE_SECONDS, 10.0), return_when=asyncio.FIRST_EXCEPTION)
            if any(task.done() and task.exception() for task in pipes) or loop.time() - last[0] > IDLE_SECONDS:
                break
    finally:
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


def open_listener(policy: EgressPolicy, label: str, secrets: SecretRoutes | None = None) -> EgressListener:
    """The proxy of one sandbox; its tunnel connects to it, and the caller closes it."""
    return EgressListener(policy, label, secrets)
