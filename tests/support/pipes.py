"""A stand-in for the docker SDK's named pipe (`NpipeSocket`, Docker Desktop on Windows), over a real socket."""

from __future__ import annotations

import contextlib
import socket
from typing import Any


class PipeStandIn:
    """A socket showing only the docker SDK's `NpipeSocket` API.

    As on Docker's message-mode pipe, a zero-byte write ends the process's input (the daemon reads it as the
    client's half-close); `shutdown` closes, as the SDK's does; closing ends a read that is waiting, as closing a
    pipe's handle does.
    """

    made = 0

    def __init__(self, sock: socket.socket, holder: Any = None) -> None:
        self._socket = sock
        self._holder = holder  # the SDK's file object over the socket, closed with it
        PipeStandIn.made += 1

    def recv(self, size: int) -> bytes:
        return self._socket.recv(size)

    def recv_into(self, buffer: memoryview, nbytes: int = 0) -> int:
        return self._socket.recv_into(buffer, nbytes)

    def send(self, data: bytes | memoryview) -> int:
        if not len(data):
            self._socket.shutdown(socket.SHUT_WR)
            return 0
        return self._socket.send(data)

    def sendall(self, data: bytes) -> int:
        return self.send(data)  # what the SDK's does: one write

    def settimeout(self, value: float | None) -> None:
        self._socket.settimeout(value)

    def gettimeout(self) -> float | None:
        return self._socket.gettimeout()

    def shutdown(self, how: int) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        if self._holder is not None:
            self._holder.close()
        self._socket.close()
