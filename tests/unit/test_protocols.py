"""Every protocol generation the installed SDK speaks, driven by its official client over in-memory transports.

The server records each request it receives with the version it served it at, so a test cannot pass on
the wrong generation, nor with a handshake where there must be none.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client import ClientSession

# The SDK's in-memory transport: the server behind real JSON-RPC streams, as `Client(server, mode="legacy")`
# runs it. Public `Client` reaches it only after its own handshake, which always offers the newest version.
from mcp.client._memory import InMemoryTransport
from mcp.server import MCPServer
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION, MODERN_PROTOCOL_VERSIONS

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.app import build_server
from llm_sandbox_mcp.server.state import AppState
from tests.support.fakes import FakeBackend, ok
from tests.support.protocol import check_printed_1, check_tools, initialize_at

pytestmark = pytest.mark.anyio


def _server() -> tuple[MCPServer[AppState], FakeBackend, list[tuple[str, str]]]:
    backend = FakeBackend(handler=lambda call: ok(stdout=b"1\n"))
    server = build_server(Settings(sandbox_pool_size=0), backend)
    seen: list[tuple[str, str]] = []

    async def record(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        seen.append((ctx.method, ctx.protocol_version))
        return await call_next(ctx)

    server.middleware.append(record)
    return server, backend, seen


def test_the_sdk_speaks_the_generations_the_readme_lists() -> None:
    # When the SDK adds or drops one, these tests cover it on their own; the README must say so.
    assert HANDSHAKE_PROTOCOL_VERSIONS == ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
    assert MODERN_PROTOCOL_VERSIONS == ("2026-07-28",)


@pytest.mark.parametrize("version", HANDSHAKE_PROTOCOL_VERSIONS)
async def test_each_handshake_version_is_negotiated_and_serves_tools_and_calls(version: str) -> None:
    server, backend, seen = _server()
    with anyio.fail_after(5):
        async with InMemoryTransport(server) as (read, write), ClientSession(read, write) as session:
            result = await initialize_at(session, version)
            assert result.protocol_version == version and session.protocol_version == version
            check_tools((await session.list_tools()).tools, version)
            check_printed_1(await session.call_tool("execute_code", {"code": "print(1)"}), version)
    assert backend.calls[0].stdin == b"print(1)"
    # `initialize` itself is seen before anything is negotiated; everything after it at the agreed version.
    assert [method for method, _ in seen] == ["initialize", "notifications/initialized", "tools/list", "tools/call"]
    assert {served for _, served in seen[1:]} == {version}


async def test_the_clients_own_handshake_gets_the_newest_handshake_version() -> None:
    server, _, seen = _server()
    with anyio.fail_after(5):
        async with Client(server, mode="legacy") as client:
            assert client.protocol_version == LATEST_HANDSHAKE_VERSION
            check_tools((await client.list_tools()).tools, client.protocol_version)
            check_printed_1(await client.call_tool("execute_code", {"code": "print(1)"}), client.protocol_version)
    assert seen[0][0] == "initialize"


@pytest.mark.parametrize("version", MODERN_PROTOCOL_VERSIONS)
@pytest.mark.parametrize("framing", ["direct", "json-rpc"])
async def test_discovery_without_initialize_serves_tools_and_calls(version: str, framing: str) -> None:
    """`server/discover`, then requests that each carry their version: the 2026-07-28 generation.

    `direct` is the SDK's in-process dispatch (no framing); `json-rpc` the server's stream loop, as over stdio.
    """
    server, backend, seen = _server()
    with anyio.fail_after(5):
        async with Client(server if framing == "direct" else InMemoryTransport(server)) as client:
            assert client.protocol_version == version
            assert client.session.initialize_result is None
            assert client.server_info is not None and client.server_info.name == "llm-sandbox"
            check_tools((await client.list_tools()).tools, version)
            check_printed_1(await client.call_tool("execute_code", {"code": "print(1)"}), version)
    assert backend.calls[0].stdin == b"print(1)"
    assert seen == [("server/discover", version), ("tools/list", version), ("tools/call", version)]


@pytest.mark.parametrize("version", MODERN_PROTOCOL_VERSIONS)
@pytest.mark.parametrize("framing", ["direct", "json-rpc"])
async def test_a_client_pinned_to_a_modern_version_needs_neither_discovery_nor_initialize(
    version: str, framing: str
) -> None:
    server, _, seen = _server()
    with anyio.fail_after(5):
        async with Client(server if framing == "direct" else InMemoryTransport(server), mode=version) as client:
            assert client.protocol_version == version
            check_tools((await client.list_tools()).tools, version)
            check_printed_1(await client.call_tool("execute_code", {"code": "print(1)"}), version)
    assert seen == [("tools/list", version), ("tools/call", version)]
