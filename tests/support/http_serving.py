"""`serve --http`'s app under uvicorn on a free loopback port, in the test's own event loop, with the engine the
test gives (the fake one, usually): the real HTTP stack without a process of its own."""

from __future__ import annotations

import socket
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager

import anyio
import uvicorn

from llm_sandbox_mcp.backends import Backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.http import build_app, check_authentication, parse_listen, uvicorn_config
from llm_sandbox_mcp.server.state import AppState


@asynccontextmanager
async def serving(
    settings_for: Callable[[int], Settings], backend: Backend, unauthenticated_loopback: bool = False
) -> AsyncGenerator[tuple[str, Settings]]:
    """Serve until the block ends; yield the base URL (http://127.0.0.1:PORT) and the settings served with,
    made by `settings_for(port)` (a resource URL names the port)."""
    sock = socket.create_server(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    settings = settings_for(port)
    listen = parse_listen(f"127.0.0.1:{port}")
    authentication = check_authentication(settings, listen, unauthenticated_loopback)
    app, verifier = build_app(settings, AppState(settings, over_http=True), listen, authentication, backend)
    server = uvicorn.Server(uvicorn_config(app, settings))
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(server.serve, [sock])
        while not server.started:  # noqa: ASYNC110 - uvicorn has a flag, no event
            await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}", settings
        finally:
            server.should_exit = True
    sock.close()
    if verifier is not None:
        await verifier.aclose()
