"""The warm pool hands out only items young enough to trust: an engine may have ended an old one meanwhile."""

from __future__ import annotations

import pytest
from anyio import wait_all_tasks_blocked

from llm_sandbox_mcp.pool import Pool

pytestmark = pytest.mark.anyio


async def test_an_item_past_its_age_is_disposed_of_and_a_fresh_one_made() -> None:
    made: list[int] = []
    disposed: list[int] = []

    async def make(key: str, ahead: bool) -> int:
        made.append(len(made))
        return made[-1]

    async def dispose(item: int) -> None:
        disposed.append(item)

    async with Pool(make, dispose, size=1, max_age=0.0) as pool:
        pool.warm("python")
        await wait_all_tasks_blocked()  # the background refill has made item 0
        assert made == [0]
        first = await pool.acquire("python")
        await wait_all_tasks_blocked()
    assert first != 0 and 0 in disposed
