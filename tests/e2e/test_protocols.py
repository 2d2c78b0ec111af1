"""The installed console script over real stdio, in every protocol generation the official client speaks."""

from __future__ import annotations

import anyio
import pytest
from mcp import Client
from mcp.client import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from tests.e2e.test_stdio import ENV, SCRIPT
from tests.engines.conftest import require_now
from tests.support.protocol import check_printed_1, check_tools, initialize_at

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.docker]

# No warm sandboxes: each test makes one call, and the pool would only add containers to start and remove.
PARAMS = StdioServerParameters(command=SCRIPT, env={**ENV, "SANDBOX_POOL_SIZE": "0"})


@pytest.fixture
def docker_required(request: pytest.FixtureRequest) -> None:
    require_now(request, "docker")


@pytest.mark.parametrize("version", HANDSHAKE_PROTOCOL_VERSIONS)
async def test_each_handshake_version_runs_code_over_stdio(docker_required: None, version: str) -> None:
    with anyio.fail_after(120):
        async with stdio_client(PARAMS) as (read, write), ClientSession(read, write) as session:
            result = await initialize_at(session, version)
            assert result.protocol_version == version and session.protocol_version == version
            check_tools((await session.list_tools()).tools, version)
            check_printed_1(await session.call_tool("execute_code", {"code": "print(1)"}), version)


@pytest.mark.parametrize("version", MODERN_PROTOCOL_VERSIONS)
async def test_discovery_without_initialize_runs_code_over_stdio(docker_required: None, version: str) -> None:
    with anyio.fail_after(120):
        async with Client(PARAMS) as client:
            assert client.protocol_version == version
            assert client.session.initialize_result is None and client.session.discover_result is not None
            assert version in client.session.discover_result.supported_versions
            assert client.server_info is not None and client.server_info.name == "llm-sandbox"
            check_tools((await client.list_tools()).tools, version)
            check_printed_1(await client.call_tool("execute_code", {"code": "print(1)"}), version)


@pytest.mark.parametrize("version", MODERN_PROTOCOL_VERSIONS)
async def test_a_client_pinned_to_a_modern_version_runs_code_over_stdio_at_once(
    docker_required: None, version: str
) -> None:
    with anyio.fail_after(120):
        async with Client(PARAMS, mode=version) as client:
            assert client.protocol_version == version and client.session.initialize_result is None
            check_tools((await client.list_tools()).tools, version)
            check_printed_1(await client.call_tool("execute_code", {"code": "print(1)"}), version)
