"""Pumping a Docker-style multiplexed exec stream (8-byte frame headers) with a deadline.

Used by the Docker and Podman backends, whose exec streams speak the same framing. A stream is a socket, waited
on with `select`, or on Windows the docker SDK's named pipe (`NpipeSocket`), which `select` cannot wait on: that
one is read by a thread of its own with blocking reads (see `PipeReader`).
"""

from __future__ import annotations

import contextlib
import queue
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Protocol

import anyio.to_thread

from llm_sandbox_mcp.backends._stopping import HELD, POLL_SECONDS, StopClock
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.models import HeadTail

_HEADER = struct.Struct(">BxxxL")
_CHUNK = 65536
_STDERR_TAIL = 64 * 1024
# Chunks a pipe's reader thread may hold before it waits for them to be taken (what a socket's buffer does).
_PIPE_BACKLOG = 16


class ExecStream(Protocol):
    """What both kinds of stream offer: the part of the socket API the docker SDK's `NpipeSocket` implements."""

    def recv_into(self, buffer: memoryview, nbytes: int = 0, /) -> int: ...

    def send(self, data: bytes | memoryview, /) -> int: ...

    def settimeout(self, value: float | None, /) -> None: ...

    def close(self) -> None: ...


def end_input(stream: ExecStream) -> None:
    """Tell the process its stdin is at end of file.

    A socket is half-closed. A named pipe cannot be (the SDK's `shutdown` closes it); Docker's pipe is a message
    pipe, where a zero-byte write is the end-of-input signal, the way the docker CLI half-closes on Windows.
    """
    if isinstance(stream, socket.socket):
        with contextlib.suppress(OSError):
            stream.shutdown(socket.SHUT_WR)
        return
    with contextlib.suppress(Exception):  # pywin32's errors are not OSErrors
        stream.send(b"")


def _send_all(stream: ExecStream, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[stream.send(view[:_CHUNK]) :]


def _write_some(sock: socket.socket, pending: memoryview) -> memoryview | None:
    """What is left of `pending` after one non-blocking send; None when the process no longer takes input."""
    try:
        return pending[sock.send(pending[:_CHUNK]) :]
    except BlockingIOError:
        return pending
    except OSError:
        return None


class PipeReader:
    """Reads a stream in a thread of its own with blocking reads, handing over each chunk in order.

    Blocking reads are what a named pipe offers safely: the SDK's read with a timeout cancels the read when the
    timeout passes, and bytes that arrived meanwhile are lost. The thread ends when the stream ends or is closed.
    """

    def __init__(self, stream: ExecStream) -> None:
        self._chunks: queue.Queue[bytes] = queue.Queue(_PIPE_BACKLOG)
        self._ended = False
        self._stopped = threading.Event()
        stream.settimeout(None)
        threading.Thread(target=self._read, args=(stream,), name="exec-pipe-reader", daemon=True).start()

    def _read(self, stream: ExecStream) -> None:
        buffer = memoryview(bytearray(_CHUNK))
        while True:
            try:
                size = stream.recv_into(buffer)
            except Exception:  # closed, or the engine ended the pipe (pywin32 raises its own error type)
                size = 0
            chunk = bytes(buffer[:size])
            while not self._stopped.is_set():
                try:
                    self._chunks.put(chunk, timeout=0.5)
                    break
                except queue.Full:
                    continue
            if not chunk or self._stopped.is_set():
                return

    def get(self, timeout: float) -> bytes | None:
        """The next chunk; b"" once the stream has ended; None when nothing came within `timeout`."""
        if self._ended:
            return b""
        try:
            chunk = self._chunks.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        self._ended = not chunk
        return chunk

    def stop(self) -> None:
        """Let the thread go once its read returns (closing the stream ends a read that is waiting)."""
        self._stopped.set()


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


class _SelectedSocket:
    """Waiting on a socket with `select`, writing stdin as the process takes it, then half-closing."""

    def __init__(self, sock: socket.socket, stdin: bytes | None) -> None:
        self._sock = sock
        self._pending = memoryview(stdin) if stdin is not None else None
        sock.setblocking(False)

    def next_chunk(self, wait: float) -> bytes | None:
        if self._pending is not None and not self._pending:
            end_input(self._sock)
            self._pending = None
        writers = [self._sock] if self._pending is not None else []
        ready, writable, _ = select.select([self._sock], writers, [], wait)
        if writable and self._pending is not None:
            self._pending = _write_some(self._sock, self._pending)
        if not ready:
            return None
        try:
            return self._sock.recv(_CHUNK)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def stop_input(self) -> None:
        self._pending = None

    def done(self) -> None:
        """Nothing runs in the background."""


class _ReadPipe:
    """A stream `select` cannot wait on: a reader thread, and a writer thread for stdin (then end of input)."""

    def __init__(self, stream: ExecStream, stdin: bytes | None) -> None:
        self._reader = PipeReader(stream)
        if stdin is not None:
            threading.Thread(target=self._feed, args=(stream, stdin), name="exec-pipe-writer", daemon=True).start()

    @staticmethod
    def _feed(stream: ExecStream, stdin: bytes) -> None:
        # Ends with an error once the process is gone or the stream is closed, input unread: nothing to do then.
        with contextlib.suppress(Exception):
            _send_all(stream, stdin)
            end_input(stream)

    def next_chunk(self, wait: float) -> bytes | None:
        return self._reader.get(wait)

    def stop_input(self) -> None:
        """The writer blocks until the process reads or the stream is closed; either ends it."""

    def done(self) -> None:
        self._reader.stop()


def pump(
    stream: ExecStream,
    out: HeadTail,
    err: HeadTail,
    deadline: float,
    on_timeout: Callable[[], None],
    stdin: bytes | None = None,
) -> bool:
    """Read frames into `out`/`err` until the stream ends; call `on_timeout` once at the deadline, in a thread of
    its own while reading on (see `_stopping`); it has returned by the time this does.

    With `stdin`, also write it as the process takes it, then end its input: a process that writes before it has
    read all its input cannot then block against us (Podman, unlike Docker, does not buffer its output).
    Returns True when the deadline passed (or the output went over its read budget, which ends it the same way).
    The caller closes `stream` afterwards.
    """
    source = _SelectedSocket(stream, stdin) if isinstance(stream, socket.socket) else _ReadPipe(stream, stdin)
    reader = FrameReader()
    sinks = {1: out, 2: err}
    clock = StopClock(deadline, on_timeout, before_stop=source.stop_input)  # read on meanwhile: see _stopping
    try:
        while (wait := clock.wait()) is not None:
            chunk = source.next_chunk(wait)
            if chunk is None:
                continue
            if not chunk:
                break
            for kind, payload in reader.feed(chunk):
                sink = sinks.get(kind)
                if sink is None or sink.flooded:  # past its read budget, read only to be dropped
                    continue
                sink.feed(payload)
                if sink.flooded:
                    clock.stop_now()  # stopped like at its deadline
    finally:
        source.done()
        clock.finish()
    return clock.stopped


class SocketProcess:
    """A process behind a multiplexed exec stream, as a SandboxProcess. Blocking IO runs in worker threads.

    While its sandbox is being killed, its output is read on (`draining`) even though nobody asks for it: where the
    engine does not buffer output (Podman) a killed process is only gone once its output has been taken.
    """

    def __init__(self, stream: ExecStream, closer: Callable[[], object]) -> None:
        self._stream = stream
        self._closer = closer
        self._pipe = None if isinstance(stream, socket.socket) else PipeReader(stream)
        self._reader = FrameReader()
        self._stderr_tail = bytearray()
        # Output read while the sandbox was being killed, for the next `receive` (what passes HELD is dropped).
        self._held = bytearray()
        self._reading = threading.Lock()  # one reader at a time: `receive` or a drain
        self._closed = False

    async def send(self, data: bytes) -> None:
        """Write `data`; a caller's deadline ends the write too: the stream is shut, which ends the send blocked
        in its worker thread (a process that stopped reading would hold that thread forever), and the process
        is lost with it (a frame cut short cannot be resumed)."""
        try:
            await anyio.to_thread.run_sync(_send_all, self._stream, data, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            self._shut()
            raise
        except Exception as exc:  # an OSError, or pywin32's error on a named pipe
            raise SandboxFailure(f"The sandbox process is gone ({exc})") from exc

    def _shut(self) -> None:
        self._closed = True
        if isinstance(self._stream, socket.socket):
            with contextlib.suppress(OSError):
                # Wakes a read or a write waiting in a worker thread now (closing the socket alone would not).
                self._stream.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self._stream.close()

    async def receive(self, timeout: float) -> bytes | None:
        return await anyio.to_thread.run_sync(self._next, timeout)

    def _next(self, timeout: float) -> bytes | None:
        """The next stdout bytes; b"" at the end; None when none came within `timeout`."""
        deadline = time.monotonic() + timeout
        if not self._reading.acquire(timeout=max(0.0, timeout)):
            return None
        try:
            if self._held:
                held = bytes(self._held)
                self._held.clear()
                return held
            while True:
                chunk = self._recv(max(0.0, deadline - time.monotonic()))
                if chunk is None:
                    return None
                if not chunk:
                    return b""
                out = self._take(chunk)
                if out:
                    return out
        finally:
            self._reading.release()

    def drain(self, until: threading.Event) -> None:
        """Read on (keeping what fits in HELD for `receive`) until `until` is set or the stream ends."""
        while not until.is_set():
            with self._reading:
                chunk = self._recv(POLL_SECONDS)
                if chunk is None:
                    continue
                if not chunk:
                    return
                out = self._take(chunk)
                self._held += out[: max(0, HELD - len(self._held))]

    def _take(self, chunk: bytes) -> bytes:
        """The stdout in `chunk`'s frames; its stderr goes to the tail."""
        out = bytearray()
        for stream, payload in self._reader.feed(chunk):
            if stream == 1:
                out += payload
            elif stream == 2:
                self._stderr_tail += payload
                del self._stderr_tail[:-_STDERR_TAIL]
        return bytes(out)

    def _recv(self, timeout: float) -> bytes | None:
        if self._closed:
            return b""
        if self._pipe is not None:
            return self._pipe.get(timeout)
        sock = self._stream
        assert isinstance(sock, socket.socket)
        try:
            ready, _, _ = select.select([sock], [], [], timeout)
        except (OSError, ValueError):  # closed meanwhile by another thread (a send cut at its deadline)
            return b""
        if not ready:
            return None
        try:
            return sock.recv(_CHUNK)
        except BlockingIOError:
            return None
        except OSError:
            return b""

    def stderr_tail(self) -> bytes:
        return bytes(self._stderr_tail)

    async def aclose(self) -> None:
        self._closed = True
        if self._pipe is not None:
            self._pipe.stop()
        self._shut()
        self._closer()
