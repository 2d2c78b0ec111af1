"""Long runs over the protocol: cancellation stops the run, progress reaches the client, background jobs."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult, TextContent

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.models import ExecResult
from llm_sandbox_mcp.server import build_server
from tests.support.fakes import Call, FakeBackend, ok

pytestmark = pytest.mark.anyio


def _payload(result: CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return json.loads(first.text)


def _hung(call: Call) -> ExecResult:
    """A kernel cell that never finishes by itself."""
    return ExecResult(137, b"working\n", b"", timed_out=True)


async def _cancel_while_running(client: Client, backend: FakeBackend, arguments: dict[str, Any]) -> None:
    """Call execute_code, and cancel the call (notifications/cancelled) once its run has started."""
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(client.call_tool, "execute_code", arguments)
            await backend.running.wait()
            tasks.cancel_scope.cancel()
        await backend.kill_seen.wait()


@pytest.mark.parametrize("language", ["javascript", "python"])
async def test_a_cancelled_call_kills_every_process_and_its_sandbox_is_destroyed(language: str) -> None:
    backend = FakeBackend(hang=True, handler=_hung)
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        await _cancel_while_running(client, backend, {"code": "while True: pass", "language": language})
        with anyio.fail_after(10):
            await backend.destroy_seen.wait()
        assert set(backend.killed) == {"fake-1"} and backend.destroyed == ["fake-1"]
        backend.hang, backend.handler = False, lambda call: ok(stdout=b"next\n")
        after = await client.call_tool("execute_code", {"code": "print('next')", "language": language})
    assert _payload(after)["stdout"] == "next\n"


async def test_a_cancelled_cell_is_interrupted_and_the_session_keeps_its_state() -> None:
    backend = FakeBackend(handler=_hung, interruptible=True)
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        session_id = _payload(await client.call_tool("create_session", {}))["session_id"]
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(client.call_tool, "execute_code", {"code": "slow()", "session_id": session_id})
                await backend.running.wait()
                tasks.cancel_scope.cancel()
        backend.handler = lambda call: ok(stdout=b"42\n")
        with anyio.fail_after(10):
            after = await client.call_tool("execute_code", {"code": "x", "session_id": session_id})
    payload = _payload(after)
    assert payload["stdout"] == "42\n" and "restarted" not in payload["stderr"]
    assert backend.killed == [] and backend.destroyed[:1] == ["fake-1"]
    assert any(call.argv[:2] == ["kill", "-INT"] for call in backend.calls)


async def test_a_cancelled_cell_that_ignores_the_interrupt_is_killed_and_the_next_cell_answers() -> None:
    backend = FakeBackend(handler=_hung)
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        session_id = _payload(await client.call_tool("create_session", {}))["session_id"]
        await _cancel_while_running(client, backend, {"code": "stubborn()", "session_id": session_id})
        backend.handler = lambda call: ok(stdout=b"fresh\n")
        with anyio.fail_after(10):
            after = await client.call_tool("execute_code", {"code": "1", "session_id": session_id})
    payload = _payload(after)
    assert payload["stdout"] == "fresh\n" and "restarted" in payload["stderr"]
    assert set(backend.killed) == {"fake-1"}


async def test_a_cancelled_install_drops_its_half_written_cache() -> None:
    backend = FakeBackend(hang=True, handler=lambda call: ok(exit_code=1))
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        await _cancel_while_running(client, backend, {"code": "import six", "libraries": ["six"]})
        with anyio.fail_after(10):
            await backend.destroy_seen.wait()
    assert len(backend.dropped) == 1
    assert backend.destroyed[0] == "fake-1"  # the installer, and no sandbox ran the code
    assert len(backend.created) == 1
