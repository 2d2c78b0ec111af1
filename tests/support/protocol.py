"""The official client at a chosen protocol version, and what every generation must show of our server."""

from __future__ import annotations

import json
from typing import Any

from mcp.client import ClientSession
from mcp_types import (
    SERVER_INFO_META_KEY,
    CallToolResult,
    ClientCapabilities,
    Implementation,
    InitializedNotification,
    InitializeRequest,
    InitializeRequestParams,
    InitializeResult,
    TextContent,
    Tool,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS, is_version_at_least

TOOLS = {
    "execute_code",
    "get_supported_languages",
    "get_language_details",
    "create_session",
    "close_session",
    "list_sessions",
    "request_network",
    "upload_file",
    "download_file",
    "list_files",
    "get_job",
    "cancel_job",
}


async def initialize_at(session: ClientSession, version: str) -> InitializeResult:
    """The handshake as a client of `version` sends it.

    `ClientSession.initialize()` always offers the newest handshake version; an older client offers its own.
    The rest is what `initialize()` does, through the session's public API.
    """
    request = InitializeRequest(
        params=InitializeRequestParams(
            protocol_version=version,
            capabilities=ClientCapabilities(),
            client_info=Implementation(name="llm-sandbox-mcp-tests", version="0"),
        )
    )
    result = await session.send_request(request, InitializeResult)
    session.adopt(result)
    await session.send_notification(InitializedNotification())
    return result


def check_tools(tools: list[Tool], version: str) -> None:
    """Every tool, with its strict input schema; output schemas from 2025-06-18, the version that defines them."""
    assert {tool.name for tool in tools} == TOOLS
    for tool in tools:
        assert tool.input_schema.get("additionalProperties") is False, tool.name
        if is_version_at_least(version, "2025-06-18"):
            assert tool.output_schema is not None and tool.output_schema["type"] == "object", tool.name
    execute = next(tool for tool in tools if tool.name == "execute_code")
    assert execute.input_schema["required"] == ["code"]


def check_printed_1(result: CallToolResult, version: str) -> None:
    """The result of `print(1)`: the JSON text every client reads, and the same object as structured content.

    The server stamps its identity on results of the 2026-07-28 generation only: evidence, from the server's
    side, of the generation that served the call.
    """
    assert not result.is_error
    assert (SERVER_INFO_META_KEY in (result.meta or {})) == (version in MODERN_PROTOCOL_VERSIONS)
    first = result.content[0]
    assert isinstance(first, TextContent)
    payload = json.loads(first.text)
    assert payload["stdout"] == "1\n" and payload["exit_code"] == 0
    if is_version_at_least(version, "2025-06-18"):
        assert result.structured_content == payload


def text_of(result: CallToolResult) -> str:
    """A tool result's first content, which must be text."""
    first = result.content[0]
    assert isinstance(first, TextContent)
    return first.text


def structured_of(result: CallToolResult) -> dict[str, Any]:
    """A successful tool result's structured content."""
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content
