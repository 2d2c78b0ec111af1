"""The memory held by all sandboxes of the server stays within SANDBOX_MEMORY_BUDGET, with a clear error past it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client
from mcp_types import CallToolResult, TextContent

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import OverBudget
from llm_sandbox_mcp.run.budget import HEADROOM, MemoryBudget
from llm_sandbox_mcp.server.app import build_server
from tests.support.fakes import FakeBackend


def _text(result: CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return first.text


@pytest.mark.anyio
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


@pytest.mark.anyio
async def test_a_library_installer_counts_against_the_budget_too() -> None:
    settings = Settings(sandbox_pool_size=0, sandbox_memory_budget=1024**3)
    async with Client(build_server(settings, FakeBackend())) as client:
        result: Any = await client.call_tool("execute_code", {"code": "import six", "libraries": ["six"]})
    assert result.is_error and "library installer" in _text(result)


# How admission decides (run/budget.py), with the host's measures given: where the kernel bounds the total it counts
# use plus headroom, elsewhere whole limits, and either way it keeps the host's reserve free.
MIB = 1024**2


def _budget(used: int | None, available: int | None = 64 * 1024 * MIB) -> MemoryBudget:
    return MemoryBudget(1024 * MIB, meter=lambda: used, available=lambda: available, reserve=512 * MIB)


def test_where_use_is_measured_small_sandboxes_are_admitted_past_their_limits() -> None:
    budget = _budget(used=10 * MIB)
    charges = [budget.reserve(512 * MIB, "a session") for _ in range(20)]  # 20 x 512 MiB of limits in 1 GiB
    assert charges == [HEADROOM] * 20 and budget.committed == 20 * HEADROOM


def test_where_nothing_measures_each_sandbox_counts_its_whole_limit() -> None:
    budget = _budget(used=None)
    assert [budget.reserve(512 * MIB, "a session") for _ in range(2)] == [512 * MIB] * 2
    with pytest.raises(OverBudget, match="already hold 1024 MiB of 1024 MiB"):
        budget.reserve(512 * MIB, "a session")
    assert not budget.room_for(1, 512 * MIB)


def test_measured_use_that_fills_the_budget_refuses_with_what_holds_it() -> None:
    usage = {"now": 10 * MIB}
    budget = MemoryBudget(1024 * MIB, meter=lambda: usage["now"], available=lambda: 64 * 1024 * MIB, reserve=0)
    budget.reserve(512 * MIB, "a session")
    usage["now"] = 1000 * MIB  # the session grew after admission
    assert not budget.room_for(1, 512 * MIB)
    with pytest.raises(OverBudget) as refused:
        budget.reserve(512 * MIB, "a session")
    assert "use 1000 MiB now and 32 MiB more is kept for their growth, of 1024 MiB" in str(refused.value)
    assert "SANDBOX_MEMORY_BUDGET" in str(refused.value)


def test_a_sandbox_smaller_than_the_headroom_is_charged_its_limit() -> None:
    assert _budget(used=0).reserve(16 * MIB, "a sandbox") == 16 * MIB


@pytest.mark.parametrize("used", [None, 0])
def test_a_host_short_of_memory_refuses_whatever_the_budget_says(used: int | None) -> None:
    budget = _budget(used=used, available=540 * MIB)  # 540 MiB available, 512 MiB kept for the host
    with pytest.raises(OverBudget) as refused:
        budget.reserve(256 * MIB, "a session")
    assert "this host has only 540 MiB of memory available and keeps 512 MiB" in str(refused.value)
    assert budget.committed == 0


def test_released_charges_make_room_again() -> None:
    budget = _budget(used=None)
    charge = budget.reserve(1024 * MIB, "a session")
    budget.release(charge)
    assert budget.room_for(2, 512 * MIB)
