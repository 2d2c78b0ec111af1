"""The memory budget on real engines, through the real server over stdio: sessions are admitted by what they use,
all of them together are held by one memory limit the kernel enforces (an OOM kill lands inside it, never on the
server or the host), and a server whose sandboxes really fill the budget refuses the next one clearly.

About 20-40 s per engine on the shared 2-core machine (eight sessions each made to hold 200 MiB); worth it: it is
the only proof that the budget cannot be talked into an OOM of the host.
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
from mcp_types import CallToolResult, TextContent

from tests.engines.conftest import require

pytestmark = pytest.mark.anyio

SCRIPT = os.environ.get("LLM_SANDBOX_MCP_COMMAND") or str(Path(sys.executable).parent / "llm-sandbox-mcp")
SESSIONS = 8
# 8 x 256 MiB of limits in a 1 GiB budget: counting limits admits 4 sessions.
ENV = {
    "SANDBOX_MEMORY_BUDGET": "1g",
    "SANDBOX_MEM_LIMIT": "256m",
    "SANDBOX_MAX_SESSIONS": str(SESSIONS + 4),
    "SANDBOX_POOL_SIZE": "0",
    "SANDBOX_LOG_LEVEL": "WARNING",
}
# Under its own 256 MiB limit, and touched page by page so that it is really used.
HOLD = "held = bytearray(200 * 2**20)\nfor i in range(0, len(held), 4096): held[i] = 1\nprint('holding')"


def _text(result: CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return first.text


@pytest.mark.parametrize(
    "engine",
    [pytest.param(name, marks=getattr(pytest.mark, name)) for name in ("docker", "podman", "bubblewrap")],
)
async def test_sessions_are_admitted_by_use_and_held_by_one_limit_that_the_host_survives(
    request: pytest.FixtureRequest, engine: str
) -> None:
    await require(request, engine)
    params = StdioServerParameters(command=SCRIPT, env={**ENV, "BACKEND": engine})
    with anyio.fail_after(300):
        async with Client(params) as client:
            ids: list[str] = []
            for _ in range(SESSIONS):
                created = await client.call_tool("create_session", {"language": "python"})
                assert not created.is_error, _text(created)
                ids.append(json.loads(_text(created))["session_id"])

            async def hold(session_id: str) -> None:
                await client.call_tool("execute_code", {"code": HOLD, "session_id": session_id})

            async with anyio.create_task_group() as group:
                for session_id in ids:
                    group.start_soon(hold, session_id)
            # A session's interpreter may be killed after its cell answered, when another grows: ask each now.
            holding: list[str] = []
            for session_id in ids:
                result = await client.call_tool("execute_code", {"code": "print(len(held))", "session_id": session_id})
                if json.loads(_text(result)).get("stdout") == f"{200 * 2**20}\n":
                    holding.append(session_id)
            # 8 x 200 MiB cannot fit in 1 GiB together: the kernel killed some inside the limit over all of them.
            assert 1 <= len(holding) <= 5, holding

            refused = await client.call_tool("create_session", {"language": "python"})
            assert refused.is_error
            assert "SANDBOX_MEMORY_BUDGET" in _text(refused) and "MiB now" in _text(refused), _text(refused)

            for session_id in ids:
                await client.call_tool("close_session", {"session_id": session_id})
            # The server lived through it and answers.
            after = await client.call_tool("execute_code", {"code": "print(6 * 7)"})
            assert not after.is_error and json.loads(_text(after))["stdout"] == "42\n"
