"""What every connection `serve --http` accepts is set to, checked on the server's own end of a real one."""

from __future__ import annotations

import socket

import anyio
import httpx2
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.http import uvicorn_config

pytestmark = pytest.mark.anyio


async def _ok(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def test_an_accepted_connection_sends_small_writes_without_waiting_for_acknowledgements() -> None:
    """TCP_NODELAY on the server's end: without it a response written in parts waited for the client's delayed
    acknowledgement, 40 ms more per request on a kept-alive connection (benchmarks/http_vs_stdio.py)."""
    sock = socket.create_server(("127.0.0.1", 0))  # made as serve_http makes it, without naming IPPROTO_TCP
    port: int = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(Starlette(routes=[Route("/", _ok)]), Settings(sandbox_pool_size=0)))
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(server.serve, [sock])
            while not server.started:  # noqa: ASYNC110 - uvicorn has a flag, no event
                await anyio.sleep(0.01)
            try:
                http = httpx2.AsyncClient()
                async with http:
                    assert (await http.get(f"http://127.0.0.1:{port}/")).text == "ok"
                    accepted = list(server.server_state.connections)
                    assert len(accepted) == 1
                    end = accepted[0].transport.get_extra_info("socket")
                    assert end.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            finally:
                server.should_exit = True
    sock.close()
