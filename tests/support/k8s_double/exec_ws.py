"""`pods/exec` over WebSocket, as the API server + kubelet serve it, backed by `docker exec`.

Wire format (k8s.io/apimachinery `remotecommand`): binary frames whose first byte is the channel,
0 stdin, 1 stdout, 2 stderr, 3 status; `v5.channel.k8s.io` adds 255 = close a channel (`\\xff\\x00`
closes stdin). The negotiated protocol is the first one the client offers that the double speaks: v5
or v4, the two the backend supports. Older protocols and `tty=true` (terminal size on channel 4) are
valid Kubernetes the double does not serve: 400 BadRequest.

End of stdin: v5 `close(0)` half-closes the Docker exec socket, so the process reads EOF. v4 has
no such signal (an empty stdin frame is a zero-byte write, as in the kubelet), so stdin ends only
when the client disconnects. Client disconnect while the process runs: stdin gets EOF and the
streams are dropped, but the process is NOT killed; the kubelet does not kill it either.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import io
import json
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import docker
import docker.errors
from aiohttp import WSMsgType, web

from .docker_api import DockerApi
from .errors import ApiError, bad_request, status_object
from .objects import JsonObj

logger = logging.getLogger(__name__)
T = TypeVar("T")

V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
SUPPORTED_PROTOCOLS = (V5, V4)
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255
_OCI_FAILURE = b"OCI runtime exec failed"
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FALSE = {"0", "f", "F", "false", "FALSE", "False"}


def parse_bool(value: str | None, name: str) -> bool:
    """Go's `strconv.ParseBool`, which the API server uses for query flags.

    Raises:
        ApiError: 400 for anything else.
    """
    if value is None:
        return False
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise bad_request(f'{name}: strconv.ParseBool: parsing "{value}": invalid syntax')


def negotiate(header: str | None) -> str:
    """The sub-protocol to answer with.

    Raises:
        ApiError: 400 when the client offers none the double speaks.
    """
    offered = [p.strip() for p in (header or "").split(",") if p.strip()]
    for protocol in offered:
        if protocol in SUPPORTED_PROTOCOLS:
            return protocol
    raise bad_request(f"requested protocol(s) are not supported: {offered}; supports {list(SUPPORTED_PROTOCOLS)}")


@dataclass(frozen=True)
class ExecRequest:
    command: list[str]
    stdin: bool
    stdout: bool
    stderr: bool

    @classmethod
    def from_query(cls, query: Any) -> ExecRequest:
        """Raises: ApiError 400, with the API server's messages."""
        command = [str(c) for c in query.getall("command", [])]
        stdin, stdout = parse_bool(query.get("stdin"), "stdin"), parse_bool(query.get("stdout"), "stdout")
        stderr = parse_bool(query.get("stderr"), "stderr")
        if not command:
            raise bad_request("you must specify at least one command for the container")
        if not (stdin or stdout or stderr):
            raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
        if parse_bool(query.get("tty"), "tty"):
            raise bad_request("tty: not supported by the k8s test double")
        return cls(command, stdin, stdout, stderr)


def exit_status(command: list[str], exit_code: int) -> JsonObj:
    """The v4 status frame for a finished command (kubelet `remotecommand.ServeExec`)."""
    if exit_code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command [{' '.join(command)}], "
        f"exit code {exit_code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]},
    }


def internal_error_status(message: str) -> JsonObj:
    status = status_object(
        500, "InternalError", f"Internal error occurred: {message}", {"causes": [{"message": message}]}
    )
    del status["kind"], status["apiVersion"]
    return status


class ExecSession:
    """One exec: Docker exec socket <-> WebSocket channels, until the process's output ends."""

    def __init__(
        self,
        ws: web.WebSocketResponse,
        protocol: str,
        request: ExecRequest,
        exec_id: str,
        api: DockerApi,
        executor: ThreadPoolExecutor,
    ) -> None:
        self._ws = ws
        self._protocol = protocol
        self._request = request
        self._exec_id = exec_id
        self._api = api
        self._executor = executor
        self._abandoned = threading.Event()
        self._queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue(maxsize=64)
        self._held_back: bytes | None = None
        self._socket: socket.socket | None = None

    async def _run_sync(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, partial(fn, *args, **kwargs))

    async def run(self) -> None:
        hijacked: Any = await self._run_sync(self._api.exec_start, self._exec_id, socket=True)
        reader = _buffered_reader(hijacked)
        self._socket = getattr(hijacked, "_sock", None)
        loop = asyncio.get_running_loop()
        pump = loop.run_in_executor(self._executor, self._pump_output, reader, loop)
        try:
            # Like the kubelet: an empty frame on the lowest writable channel says "connected".
            first = STDOUT if self._request.stdout else STDERR if self._request.stderr else STATUS
            await self._ws.send_bytes(bytes([first]))
            sender = asyncio.create_task(self._send_output())
            receiver = asyncio.create_task(self._receive_input())
            done, _ = await asyncio.wait({sender, receiver}, return_when=asyncio.FIRST_COMPLETED)
            if sender in done and not self._abandoned.is_set():
                receiver.cancel()
                await self._finish()
            else:
                sender.cancel()
                receiver.cancel()
        finally:
            self._abandoned.set()
            self._close_socket()
            await asyncio.gather(pump, return_exceptions=True)
            response = getattr(hijacked, "_response", None)
            if response is not None:
                response.close()

    def _close_socket(self) -> None:
        if self._socket is None:
            return
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()

    def _pump_output(self, reader: io.BufferedIOBase, loop: asyncio.AbstractEventLoop) -> None:
        """Worker thread: demultiplex Docker's stream (8-byte frame headers) into the queue."""
        try:
            while len(header := _read_exact(reader, 8)) == 8:
                payload = _read_exact(reader, int.from_bytes(header[4:8], "big"))
                if not self._put(loop, (STDERR if header[0] == 2 else STDOUT, payload)):
                    return
        except (OSError, ValueError):
            pass  # socket shut down because the client went away
        self._put(loop, None)

    def _put(self, loop: asyncio.AbstractEventLoop, item: tuple[int, bytes] | None) -> bool:
        while not self._abandoned.is_set():
            try:
                future = asyncio.run_coroutine_threadsafe(self._queue.put(item), loop)
            except RuntimeError:  # loop closed
                return False
            try:
                future.result(timeout=0.5)
                return True
            except concurrent.futures.TimeoutError:
                future.cancel()
        return False

    async def _send_output(self) -> None:
        first = True
        while (item := await self._queue.get()) is not None:
            channel, data = item
            if first and data.startswith(_OCI_FAILURE):
                self._held_back = data  # maybe Docker's "could not start the process" report
                first = False
                continue
            first = False
            if channel == STDERR and not self._request.stderr or channel == STDOUT and not self._request.stdout:
                continue
            try:
                await self._ws.send_bytes(bytes([channel]) + data)
            except ConnectionError:
                self._abandoned.set()
                return

    async def _receive_input(self) -> None:
        async for message in self._ws:
            if message.type == WSMsgType.BINARY:
                data: bytes = message.data
            elif message.type == WSMsgType.TEXT:
                data = str(message.data).encode()
            else:
                break
            if not data:
                continue
            channel, payload = data[0], data[1:]
            if channel == CLOSE and self._protocol == V5:
                if payload[:1] == bytes([STDIN]):
                    await self._run_sync(self._close_stdin)
            elif channel == STDIN and self._request.stdin and payload and self._socket is not None:
                # OSError: the process closed its stdin or exited; its status frame still follows.
                with contextlib.suppress(OSError):
                    await self._run_sync(self._socket.sendall, payload)

    def _close_stdin(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.shutdown(socket.SHUT_WR)

    async def _exit_code(self) -> int:
        for _ in range(500):
            try:
                info = await self._run_sync(self._api.exec_inspect, self._exec_id)
            except docker.errors.NotFound:
                return 137  # the container went away with the pod
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            await asyncio.sleep(0.01)
        return 137

    async def _finish(self) -> None:
        exit_code = await self._exit_code()
        held = self._held_back
        if held is not None and exit_code in (126, 127):
            cause = (
                f"error executing command in container: failed to exec in container: failed to start exec "
                f'"{self._exec_id}": {held.decode(errors="replace").strip()}'
            )
            status = internal_error_status(cause)
        else:
            if held is not None and self._request.stdout:
                await self._ws.send_bytes(bytes([STDOUT]) + held)
            status = exit_status(self._request.command, exit_code)
        await self._ws.send_bytes(bytes([STATUS]) + json.dumps(status, separators=(",", ":")).encode())
        await self._ws.close()


def _read_exact(reader: io.BufferedIOBase, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining > 0:
        chunk = reader.read1(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _buffered_reader(hijacked: Any) -> io.BufferedIOBase:
    """The HTTP response's own buffered reader, which may already hold the first output bytes.

    docker-py hands out the raw socket (`response.raw._fp.fp.raw`); reading the raw socket would lose
    whatever `http.client` buffered while parsing the upgrade headers.
    """
    response = getattr(hijacked, "_response", None)
    try:
        reader = response.raw._fp.fp  # pyright: ignore[reportOptionalMemberAccess]
    except AttributeError:
        return io.BufferedReader(hijacked)
    return reader if isinstance(reader, io.BufferedIOBase) else io.BufferedReader(hijacked)


async def create_exec(api: DockerApi, executor: ThreadPoolExecutor, container_id: str, request: ExecRequest) -> str:
    """Create the Docker exec before the upgrade, so failures are still plain HTTP errors.

    Raises:
        ApiError: 400 when the container stopped meanwhile.
    """
    create = partial(api.exec_create, container_id, request.command, stdin=request.stdin, stdout=True, stderr=True)
    try:
        created = await asyncio.get_running_loop().run_in_executor(executor, create)
    except docker.errors.APIError as exc:
        raise bad_request(f"unable to upgrade connection: {exc.explanation or exc}") from exc
    return str(created["Id"])


async def serve_exec(
    request: web.Request, container_id: str, api: DockerApi, executor: ThreadPoolExecutor
) -> web.StreamResponse:
    """Validate, upgrade and run one exec; errors before the upgrade are `Status` responses.

    Raises:
        ApiError: 400 for bad flags, a missing upgrade, or unsupported sub-protocols.
    """
    exec_request = ExecRequest.from_query(request.query)
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise ApiError(status_object(400, "BadRequest", "Upgrade request required"))
    protocol = negotiate(request.headers.get("Sec-WebSocket-Protocol"))
    exec_id = await create_exec(api, executor, container_id, exec_request)
    ws = web.WebSocketResponse(protocols=(protocol,), compress=False, max_msg_size=0, timeout=5)
    await ws.prepare(request)
    session = ExecSession(ws, protocol, exec_request, exec_id, api, executor)
    try:
        await session.run()
    except ConnectionError:
        logger.debug("k8s double: exec client went away")
    return ws
