"""The memory held by all sandboxes of the server stays within SANDBOX_MEMORY_BUDGET, with a clear error past it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client
from mcp_types import CallToolResult, TextContent

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.app import build_server
from tests.support.fakes import FakeBackend

pytestmark = pytest.mark.anyio


def _text(result: CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return first.text


async def test_sessions_past_the_budget_are_refused_until_one_is_closed() -> None:
    backend = FakeBackend()
    settings = Settings(sandbox_pool_size=0, sandbox_memory_budget=1024**3, sandbox_mem_limit=512 * 1024**2)
    async with Client(build_server(settings, backend)) as client:
        ids: list[str] = []
        for _ in range(2):
            created = await client.call_tool("create_session", {"language": "python"})
            assert not created.is_error
            ids.append(json.loads(_text(created))["session_id"])
        refused = await client.call_tool("create_session", {"language": "python"})
        one_shot = await client.call_tool("execute_code", {"code": "print(1)"})
        await client.call_tool("close_session", {"session_id": ids[0]})
        again = await client.call_tool("execute_code", {"code": "print(1)"})
    for result in (refused, one_shot):
        assert result.is_error
        assert "SANDBOX_MEMORY_BUDGET" in _text(result) and "1024 MiB of 1024 MiB" in _text(result)
    assert not again.is_error
    assert len(backend.created) == 3  # nothing was started past the budget


async def test_a_library_installer_counts_against_the_budget_too() -> None:
    settings = Settings(sandbox_pool_size=0, sandbox_memory_budget=1024**3)
    async with Client(build_server(settings, FakeBackend())) as client:
        result: Any = await client.call_tool("execute_code", {"code": "import six", "libraries": ["six"]})
    assert result.is_error and "library installer" in _text(result)
