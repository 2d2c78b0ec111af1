"""Processes in a pod over the `pods/exec` WebSocket: channel frames, stdin, end of stdin, exit status.

Wire format (`v5.channel.k8s.io`, `v4.channel.k8s.io`): binary frames whose first byte is the channel,
0 stdin, 1 stdout, 2 stderr, 3 status (a JSON `Status` once the process has ended); v5 adds 255 = close a
channel, so `\\xff\\x00` is end of stdin. v4 has no end of stdin, so a command that must see EOF reads its input
through `head -c N` (see `wrap`). Every call here blocks; the backend runs it in a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import select
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any, cast

import anyio.to_thread
from websocket import ABNF, WebSocket, WebSocketException

from llm_sandbox_mcp.backends._stopping import HELD, POLL_SECONDS, StopClock
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.models import HeadTail

V5 = "v5.channel.k8s.io"
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
END = -1  # pseudo channel: the stream is over
Frame = tuple[int, bytes]

_CHUNK = 256 * 1024
_STDERR_TAIL = 64 * 1024
# How long one blocking read or write of the stream may wait once begun (a frame half sent, a peer that does not
# read): past it the stream is taken as broken. Without it a reader stuck mid-frame holds its worker thread,
# and whatever waits for that thread, for good.
FRAME_SECONDS = 30.0
# Run as `sh -c WRAPPER sh NOFILE WORKDIR [COUNT] NAME=VALUE... ARGV...`: every value is a positional
# parameter, never spliced into the script, so nothing of the caller's is interpreted by the shell.
_PRELUDE = 'ulimit -n "$1" 2>/dev/null; ulimit -c 0 2>/dev/null; cd -- "$2" || exit 126; '
WRAPPER = _PRELUDE + 'shift 2; exec env "$@"'
COUNTED_WRAPPER = _PRELUDE + 'n=$3; shift 3; head -c "$n" | env "$@"'


def wrap(
    argv: Sequence[str],
    env: Mapping[str, str],
    workdir: PurePosixPath,
    nofile: int,
    stdin_size: int | None = None,
) -> list[str]:
    """argv that runs `argv` in `workdir` with `env` added and rlimits lowered, as the pod's user.

    The pods/exec API has no working directory, environment or rlimits of its own. `stdin_size` (for protocols
    without end of stdin) makes the command read exactly that many bytes, then end of file.
    """
    for name in env:
        if not name or "=" in name or "\x00" in name:
            raise ValueError(f"invalid environment variable name {name!r}")
    assignments = [f"{name}={value}" for name, value in env.items()]
    if stdin_size is None:
        return ["sh", "-c", WRAPPER, "sh", str(nofile), str(workdir), *assignments, *argv]
    return ["sh", "-c", COUNTED_WRAPPER, "sh", str(nofile), str(workdir), str(stdin_size), *assignments, *argv]


class ExecRefused(Exception):
    """The cluster could not run the command at all (its status is not an exit code)."""


def exit_code(status: bytes) -> int | None:
    """The exit code in a v4/v5 status frame; None when there was none. Raises ExecRefused."""
    if not status.strip():
        return None
    try:
        parsed: Any = json.loads(status)
    except ValueError as exc:
        raise ExecRefused(status.decode("utf-8", errors="replace")) from exc
    if not isinstance(parsed, dict):
        raise ExecRefused(status.decode("utf-8", errors="replace"))
    obj = cast(dict[str, Any], parsed)
    if obj.get("status") == "Success":
        return 0
    details: Any = obj.get("details")
    causes: Any = cast(dict[str, Any], details).get("causes") if isinstance(details, dict) else None
    for cause in cast(list[Any], causes) if isinstance(causes, list) else []:
        if isinstance(cause, dict) and cast(dict[str, Any], cause).get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(cast(dict[str, Any], cause)["message"])
    raise ExecRefused(str(obj.get("message") or status.decode("utf-8", errors="replace")))


class ExecStream:
    """One exec WebSocket. `read` and `write` may run in different threads (the client locks each side)."""

    def __init__(self, ws: WebSocket, protocol: str | None) -> None:
        self._ws = ws
        self.protocol = protocol
        self._ended = False
        # One reader at a time: two that both saw the socket readable would leave one blocked mid-frame.
        self._reading = threading.Lock()
        ws.settimeout(FRAME_SECONDS)

    @property
    def closes_stdin(self) -> bool:
        """Whether the protocol can signal end of stdin (v5)."""
        return self.protocol == V5

    def write(self, data: bytes) -> None:
        """Send stdin. Raises WebSocketException or OSError when the stream is gone."""
        for offset in range(0, len(data), _CHUNK):
            self._ws.send_binary(bytes([STDIN]) + data[offset : offset + _CHUNK])

    def close_stdin(self) -> None:
        if self.closes_stdin:
            self._ws.send_binary(bytes([CLOSE, STDIN]))

    def read(self, timeout: float) -> Frame | None:
        """The next data frame as (channel, payload), (END, b"") once the stream is over, None at the timeout."""
        deadline = time.monotonic() + timeout
        if not self._reading.acquire(timeout=max(0.0, timeout)):
            return None
        try:
            return self._read(deadline)
        finally:
            self._reading.release()

    def _read(self, deadline: float) -> Frame | None:
        while not self._ended:
            if not self._readable(max(0.0, deadline - time.monotonic())):
                return None
            try:
                opcode, frame = cast(tuple[int, Any], self._ws.recv_data_frame(True))  # pyright: ignore[reportUnknownMemberType]
            except (WebSocketException, OSError, ValueError):
                self._ended = True
                break
            if opcode == ABNF.OPCODE_CLOSE:
                self._ended = True
                break
            data: Any = frame.data
            payload = bytes(data) if isinstance(data, (bytes, bytearray)) else str(data).encode()
            if opcode in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) and payload and payload[0] != CLOSE:
                return payload[0], payload[1:]
        return END, b""

    def _readable(self, timeout: float) -> bool:
        sock = self._ws.sock
        if sock is None:
            return True  # recv reports the closed stream
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return True  # already decrypted: invisible to poll
        if sys.platform == "win32":  # no poll; select has no descriptor limit there
            readable, _, _ = select.select([sock], [], [], timeout)
            return bool(readable)
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(timeout * 1000))

    def abort(self) -> None:
        """Unblock a writer stuck on a peer that does not read."""
        self._ws.abort()

    def close(self) -> None:
        try:
            self._ws.close(timeout=1)
        except (WebSocketException, OSError):
            pass
        finally:
            self._ws.shutdown()


def _write_all(stream: ExecStream, data: bytes) -> None:
    # The process may exit without reading its input; its output still tells why.
    with contextlib.suppress(WebSocketException, OSError):
        stream.write(data)
        stream.close_stdin()


def pump(
    stream: ExecStream,
    stdin: bytes | None,
    out: HeadTail,
    err: HeadTail,
    deadline: float,
    on_timeout: Callable[[], None],
) -> tuple[bytes, bool]:
    """Feed stdin (from a helper thread, so a process that writes before it reads cannot deadlock us), read
    stdout/stderr into `out`/`err` until the stream ends, call `on_timeout` once at the deadline, in a thread of its
    own while reading on (see `_stopping`); it has returned by the time this does.

    Returns the status frame and whether the deadline passed.
    """
    writer: threading.Thread | None = None
    if stdin is not None:
        writer = threading.Thread(target=_write_all, args=(stream, stdin), name="k8s-exec-stdin", daemon=True)
        writer.start()
    sinks = {STDOUT: out, STDERR: err}
    status = bytearray()
    clock = StopClock(deadline, on_timeout)  # read on meanwhile: see _stopping
    try:
        while (wait := clock.wait()) is not None:
            frame = stream.read(wait)
            if frame is None:
                continue
            channel, payload = frame
            if channel == END:
                break
            if channel == STATUS:
                status += payload
            elif channel in sinks and not sinks[channel].flooded:  # past its read budget, read only to be dropped
                sinks[channel].feed(payload)
                if sinks[channel].flooded:
                    clock.stop_now()  # stopped like at its deadline
    finally:
        clock.finish()
        if writer is not None and writer.is_alive():
            stream.abort()
            writer.join()
    return bytes(status), clock.stopped


class WebSocketProcess:
    """A long-lived process behind an exec WebSocket, as a SandboxProcess.

    Reads run in worker threads and land in a buffer first, so a receive whose caller is cancelled loses nothing:
    the next receive returns it.
    """

    def __init__(self, stream: ExecStream) -> None:
        self._stream = stream
        self._stdout = bytearray()
        self._stderr_tail = bytearray()
        self._ended = False

    async def send(self, data: bytes) -> None:
        """Write `data`; a caller's deadline ends the write too, by aborting the connection (which ends the write
        blocked in its worker thread), and the process is lost with it."""
        try:
            await anyio.to_thread.run_sync(self._stream.write, data, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            with contextlib.suppress(Exception):
                self._stream.abort()
            raise
        except (WebSocketException, OSError) as exc:
            raise SandboxFailure(f"The sandbox process is gone ({exc})") from exc

    async def receive(self, timeout: float) -> bytes | None:
        if not self._stdout and not self._ended:
            await anyio.to_thread.run_sync(self._fill, timeout)
        if self._stdout:
            chunk = bytes(self._stdout)
            self._stdout.clear()
            return chunk
        return b"" if self._ended else None

    def _fill(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self._stdout and not self._ended:
            frame = self._stream.read(max(0.0, deadline - time.monotonic()))
            if frame is None:
                return
            self._keep(frame, None)

    def drain(self, until: threading.Event) -> None:
        """Read on (keeping what fits in HELD for `receive`) until `until` is set or the stream ends."""
        while not until.is_set() and not self._ended:
            frame = self._stream.read(POLL_SECONDS)
            if frame is not None:
                self._keep(frame, HELD)

    def _keep(self, frame: Frame, limit: int | None) -> None:
        channel, payload = frame
        if channel == END:
            self._ended = True
        elif channel == STDOUT:
            self._stdout += payload if limit is None else payload[: max(0, limit - len(self._stdout))]
        elif channel == STDERR:
            self._stderr_tail += payload
            del self._stderr_tail[:-_STDERR_TAIL]

    def stderr_tail(self) -> bytes:
        return bytes(self._stderr_tail)

    async def aclose(self) -> None:
        self._ended = True
        await anyio.to_thread.run_sync(self._stream.close)
