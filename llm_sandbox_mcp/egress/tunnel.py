"""The egress path of every sandbox: the relay in the sandbox (runners/egress_forward.pl) carries its
connections over its own stdout and stdin, the exec stream (or pipes) the server already holds, and this end
hands each stream to the sandbox's proxy in this process (`EgressListener.connect`). The sandbox needs no
network at all, and nothing of the server's filesystem.

Frames, both ways: a header of type (1 byte), stream id (4) and payload length (4), big-endian, then the payload.
The relay opens streams (OPEN); either end sends DATA, EOF (its direction is done), CLOSE (the stream is gone)
and WINDOW (a 4-byte count: that many more bytes may come, as many as were delivered); the server's PING
(stream 0) is answered with PING. The relay may send WINDOW_BYTES of a stream ahead of the server's grants, the
server RELAY_WINDOW_BYTES ahead of the relay's (that much more is buffered by the relay, in the sandbox's own
memory: a larger window keeps downloads fast when a round trip through the engine is slow), so a connection
whose reader is slow (a client in the sandbox, the proxy's upstream) holds up only itself, and the reader of the
relay's output never waits for any stream.

The relay's output is hostile input: code in the sandbox runs as the relay's user and may write into its stdout.
So a payload above MAX_PAYLOAD, or an unknown frame type, ends the tunnel (the framing is lost) without reading
what the header claims; OPENs beyond MAX_STREAMS are ignored (the relay itself never has more); DATA beyond a
stream's window closes that stream, so no stream holds more than WINDOW_BYTES here; frames for ids that are
not open are ignored; nothing raised by one stream leaves it. The worst a forger gets is more connections to
the proxy, which applies the sandbox's policy to every one of them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
from anyio.abc import SocketStream, TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from llm_sandbox_mcp.backends import SandboxProcess
from llm_sandbox_mcp.background import TaskOwner
from llm_sandbox_mcp.egress.proxy import MAX_CONNECTIONS
from llm_sandbox_mcp.errors import SandboxFailure

logger = logging.getLogger(__name__)

# A new connection to the sandbox's proxy.
Connect = Callable[[], Awaitable[SocketStream]]

OPEN, DATA, EOF, CLOSE, WINDOW, PING = 1, 2, 3, 4, 5, 6
HEADER = struct.Struct(">BII")
_COUNT = struct.Struct(">I")
MAX_PAYLOAD = 64 * 1024
MAX_STREAMS = MAX_CONNECTIONS
WINDOW_BYTES = 256 * 1024
RELAY_WINDOW_BYTES = 1024 * 1024
CONNECT_SECONDS = 10.0
# A relay that does not answer a PING within this long is taken for gone.
PING_SECONDS = 5.0
# A relay that takes no frame within this long has stopped reading (its code stopped it): the frame is cut,
# and with it the relay's stream.
SEND_SECONDS = 15.0
_CHUNK = MAX_PAYLOAD
# How long one read of the relay's output waits (in a worker thread) before the reader looks again.
_RECEIVE_SECONDS = 5.0


@dataclass
class _Stream:
    id: int
    # What the relay sent, on its way to the proxy connection (the reader puts, the stream's task takes), and
    # how many bytes of it are not yet delivered: never more than the window the relay was given.
    inbox: MemoryObjectSendStream[bytes]
    queued: MemoryObjectReceiveStream[bytes]
    undelivered: int = 0
    # How many bytes the relay may still be sent, and an event set when it grants more.
    credit: int = RELAY_WINDOW_BYTES
    credited: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def close(self) -> None:
        self.scope.cancel()
        self.inbox.close()
        self.queued.close()


class Tunnel:
    """One relay's streams, each a connection made by `connect`. Ends when the relay does, at `aclose`, or at
    the first broken frame; never raises from its background task."""

    def __init__(self, process: SandboxProcess, connect: Connect, label: str, pending: bytes = b"") -> None:
        self._process = process
        self._connect = connect
        self._label = label
        self._pending = pending
        self._streams: dict[int, _Stream] = {}
        self._send_lock = anyio.Lock()
        self._scope = anyio.CancelScope()
        self.ended = anyio.Event()
        self._closed = anyio.Event()
        self._answered = anyio.Event()

    @property
    def streams(self) -> int:
        return len(self._streams)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            with self._scope:
                async with anyio.create_task_group() as tasks:
                    task_status.started()
                    try:
                        await self._read(tasks)
                    finally:
                        tasks.cancel_scope.cancel()
        except Exception:  # background work never ends the server
            logger.exception("The egress tunnel of %s failed", self._label)
        finally:
            for stream in self._streams.values():
                stream.close()  # also those whose task never started
            self._streams.clear()
            self.ended.set()
            self._answered.set()
            # Ended by itself (the relay's end, a broken frame): the relay's stream goes too, so the relay,
            # which ends at the end of its input, frees its port for the next one.
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await self._process.aclose()
            self._closed.set()

    async def alive(self) -> bool:
        """Whether the relay still answers: the end of its stream may not have reached the server yet when it
        was killed a moment ago."""
        if self.ended.is_set():
            return False
        self._answered = anyio.Event()
        # The wait for the send lock is bounded too: a frame of another stream may hold it while the relay, stopped
        # by the sandbox's code, reads nothing (that frame ends at SEND_SECONDS). A tunnel that fails this is
        # closed, and the session starts a new relay.
        with anyio.move_on_after(PING_SECONDS):
            try:
                await self._send(PING, 0)
            except SandboxFailure:
                return False
            await self._answered.wait()
        return self._answered.is_set() and not self.ended.is_set()

    async def aclose(self) -> None:
        """Stop the tunnel, every stream and the relay's stream, and wait until they are gone. Idempotent."""
        self._scope.cancel()
        with anyio.CancelScope(shield=True):
            await self._process.aclose()  # a read of it waiting in a worker thread returns now
            await self._closed.wait()

    async def _read(self, tasks: TaskGroup) -> None:
        buffer = bytearray(self._pending)
        while True:
            # Complete frames first: the buffer never holds more than one frame and one chunk.
            while len(buffer) >= HEADER.size:
                kind, stream_id, length = HEADER.unpack_from(buffer)
                if length > MAX_PAYLOAD or kind not in (OPEN, DATA, EOF, CLOSE, WINDOW, PING):
                    logger.warning(
                        "The egress relay of %s sent a broken frame (type %d, %d bytes); its tunnel is closed",
                        self._label,
                        kind,
                        length,
                    )
                    return
                if len(buffer) < HEADER.size + length:
                    break
                payload = bytes(buffer[HEADER.size : HEADER.size + length])
                del buffer[: HEADER.size + length]
                self._dispatch(tasks, kind, stream_id, payload)
            chunk = await self._process.receive(timeout=_RECEIVE_SECONDS)
            if chunk is None:
                continue
            if not chunk:
                return  # the relay ended
            buffer += chunk

    def _dispatch(self, tasks: TaskGroup, kind: int, stream_id: int, payload: bytes) -> None:
        """Act on one frame; never waits, so no stream can hold up the reading of the others' frames."""
        stream = self._streams.get(stream_id)
        if kind == PING:
            self._answered.set()
        elif kind == OPEN:
            # An id in use, or more streams than the relay ever opens at once: not the relay's doing, ignored.
            if stream is None and len(self._streams) < MAX_STREAMS:
                stream = _Stream(stream_id, *anyio.create_memory_object_stream[bytes](math.inf))
                self._streams[stream_id] = stream
                tasks.start_soon(self._serve, stream)
        elif stream is None:
            return
        elif kind == DATA:
            if stream.undelivered + len(payload) > WINDOW_BYTES:
                self._forget(stream)  # beyond its window: not the relay's doing
                return
            # Closed: DATA after the stream's EOF (forged), or a stream that ended; nothing more goes to the proxy.
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                stream.inbox.send_nowait(payload)
                stream.undelivered += len(payload)
        elif kind == WINDOW:
            if len(payload) == _COUNT.size:
                stream.credit = min(RELAY_WINDOW_BYTES, stream.credit + _COUNT.unpack(payload)[0])
                stream.credited.set()
        elif kind == EOF:
            stream.inbox.close()
        else:
            self._forget(stream)

    def _forget(self, stream: _Stream) -> None:
        stream.close()
        if self._streams.get(stream.id) is stream:
            del self._streams[stream.id]

    async def _serve(self, stream: _Stream) -> None:
        try:
            with stream.scope:
                with anyio.fail_after(CONNECT_SECONDS):
                    connection = await self._connect()
                async with connection, anyio.create_task_group() as both:
                    both.start_soon(self._upward, stream, connection)
                    await self._downward(stream, connection)
        except Exception as exc:  # hostile input must never end anything but its own stream
            logger.debug("Egress tunnel stream %d of %s ended: %r", stream.id, self._label, exc)
        finally:
            self._forget(stream)
        with contextlib.suppress(SandboxFailure):
            await self._send(CLOSE, stream.id)

    async def _downward(self, stream: _Stream, connection: SocketStream) -> None:
        while True:
            while stream.credit <= 0:
                stream.credited = anyio.Event()
                await stream.credited.wait()
            try:
                data = await connection.receive(min(_CHUNK, stream.credit))
            except anyio.EndOfStream:
                break
            stream.credit -= len(data)
            await self._send(DATA, stream.id, data)
        await self._send(EOF, stream.id)

    async def _upward(self, stream: _Stream, connection: SocketStream) -> None:
        async for data in stream.queued:
            await connection.send(data)
            stream.undelivered -= len(data)
            await self._send(WINDOW, stream.id, _COUNT.pack(len(data)))
        await connection.send_eof()

    async def _send(self, kind: int, stream_id: int, payload: bytes = b"") -> None:
        """One frame to the relay; frames of different streams never interleave. Raises SandboxFailure.

        A frame, once begun, is written whole whoever is cancelled meanwhile: a stream closed by the relay while
        its frame is on its way (a client that drops a download) must not cut the frame, since a cut frame loses
        the relay's stream and every connection on it. Only SEND_SECONDS, or the tunnel's close, ends it."""
        async with self._send_lock:
            with anyio.CancelScope(shield=True), anyio.move_on_after(SEND_SECONDS) as bound:
                await self._process.send(HEADER.pack(kind, stream_id, len(payload)) + payload)
            if bound.cancelled_caught:
                raise SandboxFailure(f"the egress relay of {self._label} stopped taking frames")


class Tunnels(TaskOwner):
    """The background work of this server's egress tunnels. Use as an async context manager: leaving it ends
    every tunnel still open."""

    async def open(self, process: SandboxProcess, connect: Connect, label: str, pending: bytes = b"") -> Tunnel:
        """A tunnel for the relay `process` (whose output so far after its ready line is `pending`), running.
        Raises SandboxFailure when these tunnels are not running (outside `async with`)."""
        if self._tasks is None:
            raise SandboxFailure("The egress tunnels are not running (the server is shutting down)")
        tunnel = Tunnel(process, connect, label, pending)
        await self._tasks.start(tunnel.run)
        return tunnel
