"""Pumping a Docker-style multiplexed exec stream (8-byte frame headers) with a deadline.

Used by the Docker and Podman backends, whose exec sockets speak the same framing.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections.abc import Callable

from llm_sandbox_mcp.models import HeadTail

_HEADER = struct.Struct(">BxxxL")
_CHUNK = 65536
# After a kill, wait this long for the stream to close before giving up on it.
_DRAIN_SECONDS = 3.0


def send_stdin(sock: socket.socket, data: bytes) -> None:
    """Write stdin and half-close, so the process sees end of file."""
    if data:
        sock.sendall(data)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


def pump(
    sock: socket.socket,
    out: HeadTail,
    err: HeadTail,
    deadline: float,
    on_timeout: Callable[[], None],
) -> bool:
    """Read frames into `out`/`err` until the stream ends; call `on_timeout` once at the deadline.

    Returns True when the deadline passed.
    """
    buffer = bytearray()
    sinks = {1: out, 2: err}
    timed_out = False
    hard_stop = float("inf")
    sock.setblocking(False)
    while True:
        now = time.monotonic()
        if not timed_out and now >= deadline:
            timed_out = True
            on_timeout()
            hard_stop = time.monotonic() + _DRAIN_SECONDS
        if now >= hard_stop:
            break
        wait = (deadline if not timed_out else hard_stop) - now
        ready, _, _ = select.select([sock], [], [], max(0.0, min(wait, 1.0)))
        if not ready:
            continue
        try:
            chunk = sock.recv(_CHUNK)
        except BlockingIOError:
            continue
        except OSError:
            break
        if not chunk:
            break
        buffer += chunk
        while len(buffer) >= _HEADER.size:
            stream, size = _HEADER.unpack_from(buffer)
            if len(buffer) < _HEADER.size + size:
                break
            payload = bytes(buffer[_HEADER.size : _HEADER.size + size])
            del buffer[: _HEADER.size + size]
            sink = sinks.get(stream)
            if sink is not None:
                sink.feed(payload)
    return timed_out
