"""The most common first run: no engine answers. Every tool must say so, with the fix, not fail obscurely."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp_types import TextContent, TextResourceContents

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.app import build_server

pytestmark = pytest.mark.anyio

# A valid call of every tool; each needs the engine except get_supported_languages.
CALLS: dict[str, dict[str, Any]] = {
    "execute_code": {"code": "print(1)"},
    "get_language_details": {"language": "python"},
    "create_session": {},
    "close_session": {"session_id": "s-0000000000000000"},
    "list_sessions": {},
    "request_network": {"session_id": "s-0000000000000000", "host": "api.example.org", "reason": "x"},
    "upload_file": {"session_id": "s-0000000000000000", "path": "a.txt", "content": "x"},
    "download_file": {"session_id": "s-0000000000000000", "path": "a.txt"},
    "list_files": {"session_id": "s-0000000000000000"},
    "get_job": {"job_id": "j-000000000000"},
    "cancel_job": {"job_id": "j-000000000000"},
}


@pytest.fixture
def no_engine(tmp_path: Path) -> Settings:
    """BACKEND=auto where the Docker and Podman sockets do not exist and neither bwrap nor nsjail is installed."""
    return Settings(
        backend="auto",
        docker_host=f"unix://{tmp_path}/docker.sock",
        podman_host=f"unix://{tmp_path}/podman.sock",
        sandbox_bwrap_path=tmp_path / "bwrap",
        sandbox_nsjail_path=tmp_path / "nsjail",
    )


def _text(content: list[Any]) -> str:
    first = content[0]
    assert isinstance(first, TextContent)
    return first.text


async def test_every_tool_that_needs_an_engine_answers_with_why_and_what_to_do(no_engine: Settings) -> None:
    async with Client(build_server(no_engine)) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert set(CALLS) | {"get_supported_languages"} == listed
        for name, arguments in CALLS.items():
            result = await client.call_tool(name, arguments)
            text = _text(result.content)
            assert result.is_error, name
            assert "BACKEND=auto found no usable engine" in text, (name, text)
            assert "docker.sock" in text and "podman.sock" in text, (name, text)
            assert ("bwrap" in text) == (sys.platform == "linux"), (name, text)  # elsewhere it is not tried
            assert "start Docker or Podman" in text and "restart the MCP server" in text, (name, text)


async def test_the_language_list_says_nothing_can_run_and_why(no_engine: Settings) -> None:
    async with Client(build_server(no_engine)) as client:
        result = await client.call_tool("get_supported_languages", {})
        resource = await client.read_resource("sandbox://languages")
    assert not result.is_error
    assert result.structured_content is not None
    languages = result.structured_content["languages"]
    assert len(languages) == 7
    for language in languages:
        assert language["available"] is False, language
        assert "BACKEND=auto found no usable engine" in language["unavailable_reason"]
    contents = resource.contents[0]
    assert isinstance(contents, TextResourceContents)
    listed = json.loads(contents.text)
    assert [lang["available"] for lang in listed["languages"]] == [False] * 7
