"""Docker Desktop on Windows is reached through a named pipe, whose exec streams `select` cannot wait on there: a
call then fails with the cause and the ways out rather than an obscure WinError. (The refusal is checked here by
taking Windows' branch; the pipe itself is the platforms workflow's to meet.)"""

from __future__ import annotations

import socket
import sys

import pytest

from llm_sandbox_mcp.backends._stream import SocketProcess, pump
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.models import HeadTail


class NamedPipe:
    """Stands for the docker SDK's NpipeSocket: socket-like, not a socket."""


def test_on_windows_a_named_pipe_stream_is_refused_with_the_ways_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    closed: list[bool] = []
    with pytest.raises(SandboxFailure, match=r"named pipe: run the server in WSL2, or reach Docker over TCP"):
        pump(NamedPipe(), HeadTail(1024), HeadTail(1024), 0.0, lambda: None)  # pyright: ignore[reportArgumentType]
    with pytest.raises(SandboxFailure, match="DOCKER_HOST=tcp://localhost:2375"):
        SocketProcess(NamedPipe(), lambda: closed.append(True))  # pyright: ignore[reportArgumentType]
    assert closed == [True]
    ours, theirs = socket.socketpair()
    with ours, theirs:
        SocketProcess(ours, lambda: None)  # a socket is streamed as anywhere else
