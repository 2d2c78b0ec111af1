"""A kill is made while the output of what it kills is still read.

The peer here writes frames without end, each write blocking while nobody reads, and it is gone (its kill proven)
only once its last write has been taken: what Podman's conmon does with an exec's output, and what kept a killed
process there (and on Kubernetes) until the kill gave up after its whole bound and removed the sandbox. The
engines' own proof is tests/hostile/test_bombs_and_escapes.py's endless output flood, on every engine.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import pytest
from websocket import WebSocket

from llm_sandbox_mcp.backends._kubernetes import exec as k8s_exec
from llm_sandbox_mcp.backends._stopping import HELD, draining
from llm_sandbox_mcp.backends._stream import SocketProcess, pump
from llm_sandbox_mcp.models import HeadTail
from tests.support.pipes import PipeStandIn

pytestmark = pytest.mark.anyio

# How long a kill waits for the peer to be gone: only ever reached when nobody reads (the failure shown).
_KILL_BOUND = 5.0
_PAYLOAD = b"y" * 65000


def _docker_frame(payload: bytes) -> bytes:
    return struct.pack(">BxxxL", 1, len(payload)) + payload


def _websocket_frame(payload: bytes) -> bytes:
    """A server's binary frame (unmasked) on the exec stream's stdout channel, with a 16-bit length."""
    data = bytes([k8s_exec.STDOUT]) + payload
    return bytes([0x82, 126]) + struct.pack(">H", len(data)) + data


class Flood:
    """A peer writing `frame` until killed; `kill` is proven when its writer is gone within _KILL_BOUND."""

    def __init__(self, sock: socket.socket, frame: bytes, first: bytes = b"") -> None:
        self._sock = sock
        self._frame = frame
        self._first = first
        self._stopped = threading.Event()
        self.proven: list[bool] = []
        self._writer = threading.Thread(target=self._write, daemon=True)
        self._writer.start()

    def _write(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.sendall(self._first)
            while not self._stopped.is_set():
                self._sock.sendall(self._frame)
            self._sock.shutdown(socket.SHUT_WR)  # as an engine ends the stream of a process that died

    def kill(self) -> None:
        self._stopped.set()
        self._writer.join(_KILL_BOUND)
        self.proven.append(not self._writer.is_alive())

    def close(self) -> None:
        self._stopped.set()
        self._sock.close()
        self._writer.join()


@pytest.mark.parametrize("kind", ["socket", "pipe"])
def test_a_run_over_its_read_budget_is_read_on_while_it_is_killed(kind: str) -> None:
    ours, theirs = socket.socketpair()
    flood = Flood(theirs, _docker_frame(_PAYLOAD))
    out, err = HeadTail(1000), HeadTail(1000)
    stream = ours if kind == "socket" else PipeStandIn(ours)
    try:
        stopped = pump(stream, out, err, time.monotonic() + 120, flood.kill)
    finally:
        flood.close()
        stream.close()
    assert (stopped, out.flooded, flood.proven) == (True, True, [True])
    assert out.budget is not None and out.read <= out.budget + len(_PAYLOAD), "past its budget, read not kept"


def test_a_kubernetes_run_over_its_read_budget_is_read_on_while_it_is_killed() -> None:
    ours, theirs = socket.socketpair()
    ws = WebSocket(skip_utf8_validation=True)
    ws.sock, ws.connected = ours, True
    flood = Flood(theirs, _websocket_frame(_PAYLOAD))
    out, err = HeadTail(1000), HeadTail(1000)
    stream = k8s_exec.ExecStream(ws, None)
    try:
        _, stopped = k8s_exec.pump(stream, None, out, err, time.monotonic() + 120, flood.kill)
    finally:
        flood.close()
        ours.close()
    assert (stopped, out.flooded, flood.proven) == (True, True, [True])


async def test_a_started_process_is_read_on_while_its_sandbox_is_killed_and_keeps_what_came_first() -> None:
    ours, theirs = socket.socketpair()
    flood = Flood(theirs, _docker_frame(_PAYLOAD), first=_docker_frame(b"HEAD\n"))
    process = SocketProcess(ours, lambda: None)
    try:
        with draining([process]):
            flood.kill()
        kept = await process.receive(1)
    finally:
        flood.close()
        await process.aclose()
    assert flood.proven == [True]
    assert kept is not None and kept.startswith(b"HEAD\n") and len(kept) <= HELD


async def test_a_started_kubernetes_process_is_read_on_while_its_pod_is_killed() -> None:
    ours, theirs = socket.socketpair()
    ws = WebSocket(skip_utf8_validation=True)
    ws.sock, ws.connected = ours, True
    flood = Flood(theirs, _websocket_frame(_PAYLOAD), first=_websocket_frame(b"HEAD\n"))
    process = k8s_exec.WebSocketProcess(k8s_exec.ExecStream(ws, None))
    try:
        with draining([process]):
            flood.kill()
        kept = await process.receive(1)
    finally:
        flood.close()
        ours.close()
    assert flood.proven == [True]
    assert kept is not None and kept.startswith(b"HEAD\n") and len(kept) <= HELD
