"""Pumping a Docker-style multiplexed exec stream (8-byte frame headers) with a deadline.

Used by the Docker and Podman backends, whose exec sockets speak the same framing.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import sys
import time
from collections.abc import Callable

import anyio.to_thread

from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.models import HeadTail

_HEADER = struct.Struct(">BxxxL")
_CHUNK = 65536
# After a kill, wait this long for the stream to close before giving up on it.
_DRAIN_SECONDS = 3.0
_STDERR_TAIL = 64 * 1024


def send_stdin(sock: socket.socket, data: bytes) -> None:
    """Write stdin and half-close, so the process sees end of file."""
    if data:
        sock.sendall(data)
    _half_close(sock)


def _half_close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)


def _write_some(sock: socket.socket, pending: memoryview) -> memoryview | None:
    """What is left of `pending` after one non-blocking send; None when the process no longer takes input."""
    try:
        return pending[sock.send(pending[:_CHUNK]) :]
    except BlockingIOError:
        return pending
    except OSError:
        return None


NAMED_PIPE_HINT = (
    "on Windows this server streams a process's output through sockets only, and the engine was reached through a "
    "named pipe: run the server in WSL2, or reach Docker over TCP (Docker Desktop: Settings > General > Expose "
    "daemon on tcp://localhost:2375 without TLS, then DOCKER_HOST=tcp://localhost:2375)"
)


def _require_socket(sock: object, closer: Callable[[], object] | None = None) -> None:
    """Refuse, with the way out, a stream that `select` cannot wait on: Windows' select takes sockets only."""
    if sys.platform != "win32":
        return
    if not isinstance(sock, socket.socket):
        if closer is not None:
            closer()
        raise SandboxFailure(f"Cannot read the sandbox process's output: {NAMED_PIPE_HINT}")


class FrameReader:
    """Incremental parser of the multiplexed stream: feed raw bytes, get (stream, payload) pairs."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buffer += data
        frames: list[tuple[int, bytes]] = []
        while len(self._buffer) >= _HEADER.size:
            stream, size = _HEADER.unpack_from(self._buffer)
            if len(self._buffer) < _HEADER.size + size:
                break
            frames.append((stream, bytes(self._buffer[_HEADER.size : _HEADER.size + size])))
            del self._buffer[: _HEADER.size + size]
        return frames


def pump(
    sock: socket.socket,
    out: HeadTail,
    err: HeadTail,
    deadline: float,
    on_timeout: Callable[[], None],
    stdin: bytes | None = None,
) -> bool:
    """Read frames into `out`/`err` until the stream ends; call `on_timeout` once at the deadline.

    With `stdin`, also write it as the process takes it, then half-close: a process that writes before it has
    read all its input cannot then block against us (Podman, unlike Docker, does not buffer its output).
    Returns True when the deadline passed (or the output went over its read budget, which ends it the same way).
    """
    _require_socket(sock)
    reader = FrameReader()
    sinks = {1: out, 2: err}
    pending = memoryview(stdin) if stdin is not None else None
    timed_out = False
    hard_stop = float("inf")
    sock.setblocking(False)
    while True:
        if pending is not None and not pending:
            _half_close(sock)
            pending = None
        now = time.monotonic()
        if not timed_out and now >= deadline:
            timed_out, pending = True, None
            on_timeout()
            hard_stop = time.monotonic() + _DRAIN_SECONDS
        if now >= hard_stop:
            break
        wait = (deadline if not timed_out else hard_stop) - now
        writers = [sock] if pending is not None else []
        ready, writable, _ = select.select([sock], writers, [], max(0.0, min(wait, 1.0)))
        if writable and pending is not None:
            pending = _write_some(sock, pending)
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
        for stream, payload in reader.feed(chunk):
            sink = sinks.get(stream)
            if sink is not None:
                sink.feed(payload)
                if sink.flooded:
                    deadline = min(deadline, now)  # stopped like at its deadline, without reading more
    return timed_out


class SocketProcess:
    """A process behind a multiplexed exec socket, as a SandboxProcess. Blocking IO runs in worker threads."""

    def __init__(self, sock: socket.socket, closer: Callable[[], object]) -> None:
        _require_socket(sock, closer)
        self._sock = sock
        self._closer = closer
        self._reader = FrameReader()
        self._stderr_tail = bytearray()
        self._closed = False

    async def send(self, data: bytes) -> None:
        try:
            await anyio.to_thread.run_sync(self._sock.sendall, data)
        except OSError as exc:
            raise SandboxFailure(f"The sandbox process is gone ({exc})") from exc

    async def receive(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while True:
            chunk = await anyio.to_thread.run_sync(self._recv, max(0.0, deadline - time.monotonic()))
            if chunk is None:
                return None
            if not chunk:
                return b""
            out = bytearray()
            for stream, payload in self._reader.feed(chunk):
                if stream == 1:
                    out += payload
                elif stream == 2:
                    self._stderr_tail += payload
                    del self._stderr_tail[:-_STDERR_TAIL]
            if out:
                return bytes(out)

    def _recv(self, timeout: float) -> bytes | None:
        if self._closed:
            return b""
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return None
        try:
            return self._sock.recv(_CHUNK)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def stderr_tail(self) -> bytes:
        return bytes(self._stderr_tail)

    async def aclose(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            # Wakes a read waiting in a worker thread now (closing the socket alone would leave its select()
            # waiting out its timeout).
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()
        self._closer()
