"""request_network over real stdio, from the installed console script to a Docker sandbox, with the SDK's client
supporting elicitation (the person accepts) and not supporting it (the operator's default refuses)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult, ElicitRequestParams, ElicitResult, TextContent

from tests.e2e.test_stdio import ENV, SCRIPT
from tests.engines.conftest import require
from tests.engines.test_egress import FETCH
from tests.support.egress import loopback_name
from tests.support.registries import serve

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.docker]


def _payload(result: CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, TextContent) and not result.is_error, first
    return json.loads(first.text)


# Worth its 5-8 s per case (a server start and a Docker session each): the only test of the question crossing a
# real process boundary, with and without elicitation.
@pytest.mark.parametrize("elicits", [True, False], ids=["elicitation", "no-elicitation"])
async def test_over_stdio_the_person_opens_a_host_for_one_session_and_a_client_that_cannot_ask_does_not(
    request: pytest.FixtureRequest, elicits: bool
) -> None:
    await require(request, "docker")
    name, address = loopback_name()
    asked: list[str] = []

    async def person(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"allow": True})

    with tempfile.TemporaryDirectory(prefix="llm-sandbox-asked-") as tmp, serve(Path(tmp), address, name) as url:
        (Path(tmp) / "data").write_text("ok")
        host = url.removeprefix("http://")
        code = FETCH.format(allowed=f"{url}/data", unlisted=f"{url}/data")
        params = StdioServerParameters(command=SCRIPT, env={**ENV, "SANDBOX_SESSION_ALLOW_HOSTS": host})
        with anyio.fail_after(180):
            async with Client(params, elicitation_callback=person if elicits else None) as client:
                created = _payload(await client.call_tool("create_session", {"network": []}))
                cell = {"session_id": created["session_id"], "code": code}
                before = _payload(await client.call_tool("execute_code", cell))
                answer = _payload(
                    await client.call_tool(
                        "request_network",
                        {"session_id": created["session_id"], "host": host, "reason": "to read\x07 the data"},
                    )
                )
                after = _payload(await client.call_tool("execute_code", cell))
    assert before["stdout"] == "403 403\n" and before["network_refused"][0].startswith(f"{host} refused")
    assert answer["granted"] is elicits
    assert answer["decision"] == ("granted" if elicits else "no-elicitation")
    assert after["stdout"] == ("200 200\n" if elicits else "403 403\n"), after["stderr"]
    assert len(asked) == elicits
    if elicits:
        assert created["session_id"] in asked[0] and "to read\\x07 the data" in asked[0] and "\x07" not in asked[0]
