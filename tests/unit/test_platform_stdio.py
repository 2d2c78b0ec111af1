"""A first run on any platform with no engine answering: the server, started as a client starts it (a process
speaking MCP over stdio), lists its tools, and a call says which engine is missing and what to do.

Needs no engine (the addresses it is given refuse at once), so the platforms workflow runs it on macOS and
Windows; `LLM_SANDBOX_MCP_COMMAND` points it at an installed console script, else this interpreter runs the
package. It costs one server start (about 5 s here, more on a loaded machine): one test checks the whole path.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import TextContent

pytestmark = pytest.mark.anyio

# A port nothing listens on: refused at once on every system, where a missing socket or pipe differs by platform.
NOWHERE = "tcp://127.0.0.1:9"


def _server(tmp_path: Path) -> StdioServerParameters:
    env = {
        "BACKEND": "auto",
        "DOCKER_HOST": NOWHERE,
        "PODMAN_HOST": NOWHERE,
        "SANDBOX_BWRAP_PATH": str(tmp_path / "bwrap"),
        "SANDBOX_NSJAIL_PATH": str(tmp_path / "nsjail"),
        "SANDBOX_LOG_LEVEL": "WARNING",
    }
    for name in ("SYSTEMROOT", "PATH", "TEMP", "TMP", "HOME", "USERPROFILE"):  # what Windows' Python needs to start
        if name in os.environ:
            env.setdefault(name, os.environ[name])
    command = os.environ.get("LLM_SANDBOX_MCP_COMMAND")
    if command:
        return StdioServerParameters(command=command, env=env)
    return StdioServerParameters(command=sys.executable, args=["-m", "llm_sandbox_mcp"], env=env)


async def test_with_no_engine_the_server_answers_and_a_call_names_the_missing_engine_and_the_fix(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(120):
        async with Client(_server(tmp_path)) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert {"execute_code", "get_supported_languages", "create_session"} <= tools
            result = await client.call_tool("execute_code", {"code": "print(1)"})
            listed = await client.call_tool("get_supported_languages", {})
    assert result.is_error
    first = result.content[0]
    assert isinstance(first, TextContent)
    text = first.text
    assert "BACKEND=auto found no usable engine" in text, text
    assert f"docker: The Docker engine at {NOWHERE} (DOCKER_HOST) does not answer" in text, text
    assert f"podman: The Podman service at {NOWHERE} (PODMAN_HOST) does not answer" in text, text
    assert "start Docker or Podman" in text and "llm-sandbox-mcp doctor" in text, text
    assert "Traceback" not in text
    if sys.platform != "linux":
        assert "bubblewrap" not in text and "nsjail" not in text, text  # not tried where they cannot run
    assert not listed.is_error and listed.structured_content is not None
    assert not any(language["available"] for language in listed.structured_content["languages"])
    assert json.dumps(listed.structured_content)  # plain JSON, whatever the platform
