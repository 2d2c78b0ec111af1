"""What one HTTP connection may hold: uvicorn's HTTP/1.1 protocol (h11) with two bounds it lacks.

- A deadline to send a whole request. uvicorn times out an idle keep-alive connection, but not a request being
  sent: a client that sends its headers or its body a byte at a time (slowloris) would hold its connection,
  and the call waiting for its body, for as long as it likes. Here a request must be complete, headers and body,
  within SANDBOX_HTTP_REQUEST_TIMEOUT of the connection opening or of the previous response ending; past it the
  connection is closed (with 408 when the headers were not complete, so no response has begun). Once a request
  is complete the deadline is off: a long call's response may stream for as long as the call runs.
- A cap on open connections, SANDBOX_HTTP_MAX_CONNECTIONS: one more is answered 503 and closed at once, before
  anything is read from it.

It also turns Nagle's algorithm off on every connection (TCP_NODELAY), as asyncio does for the sockets it makes
itself but not for those accepted on a listening socket made without naming IPPROTO_TCP, such as
`socket.create_server`'s. With Nagle on, a response written in parts (its headers, then its event stream's
chunks) waited for the client's delayed acknowledgement: 40 ms more for every request on a kept-alive connection.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import cast

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

logger = logging.getLogger(__name__)

_TOO_SLOW = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
_TOO_MANY = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"
# The states of the client's side of h11 in which its request is still on its way.
_SENDING = (h11.IDLE, h11.SEND_BODY)
# A flood of refused connections is logged once in this many seconds, not once a connection.
_LOG_EVERY_SECONDS = 10.0


def bounded_protocol(request_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with these bounds (uvicorn.Config(http=...) takes a class)."""

    class Bounded(_Bounded):
        pass

    Bounded.request_timeout = request_timeout
    Bounded.max_connections = max_connections
    return Bounded


def no_delay(transport: asyncio.BaseTransport) -> None:
    """Small writes sent at once, without waiting for the peer to acknowledge the previous ones."""
    sock: socket.socket | None = transport.get_extra_info("socket")  # asyncio's TransportSocket, a socket's face
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Bounded(H11Protocol):
    request_timeout: float = 30.0
    max_connections: int = 256
    _refused_logged_at: float = -_LOG_EVERY_SECONDS
    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # pyright: ignore[reportIncompatibleMethodOverride]
        no_delay(transport)
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            now = time.monotonic()
            if now - _Bounded._refused_logged_at >= _LOG_EVERY_SECONDS:
                _Bounded._refused_logged_at = now
                logger.warning(
                    "Refusing connections: %d are open, the most SANDBOX_HTTP_MAX_CONNECTIONS allows",
                    self.max_connections,
                )
            transport.write(_TOO_MANY)
            transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state not in _SENDING:
            self._disarm()  # the request is complete (or the connection is over)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state in _SENDING:
            self._arm()  # the next request's time starts now

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        logger.info(
            "Closed the connection of %s: no complete request within %g seconds (SANDBOX_HTTP_REQUEST_TIMEOUT)",
            client,
            self.request_timeout,
        )
        cycle = cast("RequestResponseCycle | None", self.cycle)  # None before the first request, uvicorn's typing aside
        if self.conn.their_state is h11.IDLE and (cycle is None or cycle.response_complete):
            self.transport.write(_TOO_SLOW)
        self.transport.close()
