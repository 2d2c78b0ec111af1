"""Docker Desktop on Windows is reached through a named pipe, which `select` cannot wait on there: such a stream is
read by a thread with blocking reads instead. The engine tier runs that path against real engines
(tests/engines/test_pipe_streams.py); this runs it in the unit tier, which the platforms workflow runs on Windows and
macOS, with a peer that frames its output the way the engines do."""

from __future__ import annotations

import socket
import struct
import threading
import time

from llm_sandbox_mcp.backends._stream import pump
from llm_sandbox_mcp.models import HeadTail
from tests.support.pipes import PipeStandIn


def _frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxL", stream, len(data)) + data


def _echoing_peer(sock: socket.socket) -> None:
    """Reads its input to the end, then answers with it on stdout and its size on stderr, and hangs up."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    sock.sendall(_frame(1, received) + _frame(2, str(len(received)).encode()))
    sock.close()


def test_a_stream_select_cannot_wait_on_carries_input_to_its_end_and_output_back() -> None:
    ours, theirs = socket.socketpair()
    peer = threading.Thread(target=_echoing_peer, args=(theirs,))
    peer.start()
    out, err = HeadTail(None), HeadTail(None)
    stream = PipeStandIn(ours)
    try:
        timed_out = pump(stream, out, err, time.monotonic() + 60, lambda: None, stdin=b"x" * 300_000)
    finally:
        stream.close()
    peer.join()
    assert (timed_out, len(out.getvalue()), err.getvalue()) == (False, 300_000, b"300000")


def test_at_its_deadline_a_silent_stream_is_killed_and_what_came_before_is_kept() -> None:
    ours, theirs = socket.socketpair()
    theirs.sendall(_frame(1, b"started\n"))
    killed: list[bool] = []

    def kill() -> None:
        killed.append(True)
        theirs.close()  # as an engine ends the stream once the process is killed

    out, err = HeadTail(None), HeadTail(None)
    stream = PipeStandIn(ours)
    try:
        timed_out = pump(stream, out, err, time.monotonic() + 0.5, kill, stdin=b"never read")
    finally:
        stream.close()
    assert (timed_out, killed, out.getvalue()) == (True, [True], b"started\n")
