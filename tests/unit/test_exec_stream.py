"""The Kubernetes exec stream against a peer that stops mid-frame: the read ends, its thread is not held."""

from __future__ import annotations

import socket
import threading

import pytest
from websocket import WebSocket

from llm_sandbox_mcp.backends._kubernetes import exec as exec_stream
from llm_sandbox_mcp.backends._kubernetes.exec import END, STDOUT, ExecStream


def connected(sock: socket.socket) -> WebSocket:
    ws = WebSocket(skip_utf8_validation=True)
    ws.sock = sock
    ws.connected = True
    return ws


def binary_frame(payload: bytes) -> bytes:
    assert len(payload) < 126
    return bytes([0x82, len(payload)]) + payload  # FIN + binary, unmasked (a server's frame)


def test_a_frame_that_stops_half_way_ends_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exec_stream, "FRAME_SECONDS", 0.3)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        stream = ExecStream(connected(ours), None)
        theirs.sendall(binary_frame(bytes([STDOUT]) + b"whole"))
        assert stream.read(5) == (STDOUT, b"whole")
        theirs.sendall(b"\x82")  # a header begun, never finished
        assert stream.read(5) == (END, b"")


def test_two_readers_never_read_one_stream_at_once() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        stream = ExecStream(connected(ours), None)
        got: list[object] = []
        readers = [threading.Thread(target=lambda: got.append(stream.read(5))) for _ in range(2)]
        for reader in readers:
            reader.start()
        theirs.sendall(binary_frame(bytes([STDOUT]) + b"one"))
        theirs.sendall(binary_frame(bytes([STDOUT]) + b"two"))
        for reader in readers:
            reader.join(10)
        assert not any(reader.is_alive() for reader in readers)
        assert sorted(got, key=repr) == [(STDOUT, b"one"), (STDOUT, b"two")]
