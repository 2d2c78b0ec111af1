"""The warm pool hands out only items young enough to trust: an engine may have ended an old one meanwhile."""

from __future__ import annotations

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from llm_sandbox_mcp.run.pool import Pool

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


class Maker:
    """Items are numbers, made at once; records what was made and disposed of."""

    def __init__(self) -> None:
        self.made: list[int] = []
        self.disposed: list[int] = []

    async def make(self, key: str, ahead: bool) -> int:
        self.made.append(len(self.made))
        return self.made[-1]

    async def dispose(self, item: int) -> None:
        self.disposed.append(item)


async def test_a_pool_found_empty_grows_to_its_cap_and_shrinks_back_when_idle() -> None:
    maker = Maker()
    async with Pool(maker.make, maker.dispose, size=1, max_size=4, idle=0.2) as pool:
        for _ in range(3):  # back to back: each call takes the pool's only ready item, or finds none
            await pool.acquire("python")
        await wait_all_tasks_blocked()
        ready, making, target = pool.sizes()["python"]
        assert (ready, making, target) == (4, 0, 4)
        await anyio.sleep(0.5)  # idle: back to its base size, the extra items disposed of
        await wait_all_tasks_blocked()
        assert pool.sizes()["python"] == (1, 0, 1)
        assert len(maker.disposed) == 3


async def test_a_pool_grows_only_while_the_memory_budget_allows() -> None:
    maker = Maker()
    async with Pool(maker.make, maker.dispose, size=1, max_size=8, can_grow=lambda key: False) as pool:
        for _ in range(3):
            await pool.acquire("python")
        await wait_all_tasks_blocked()
        assert pool.sizes()["python"][0] == 1


async def test_a_lent_item_is_not_replaced_and_comes_back_only_when_ready_again() -> None:
    maker = Maker()
    async with Pool(maker.make, maker.dispose, size=1) as pool:
        pool.warm("python")
        await wait_all_tasks_blocked()
        first = await pool.acquire("python", lend=True)
        await wait_all_tasks_blocked()
        assert maker.made == [0] and pool.sizes()["python"] == (0, 0, 1)  # no replacement while it is out
        back = anyio.Event()

        async def ready(item: int) -> bool:
            await back.wait()
            return True

        await pool.recycle("python", first, ready)
        async with anyio.create_task_group() as tasks:

            async def waiter() -> None:
                # A call that finds the pool empty waits for the item on its way back rather than making one.
                assert await pool.acquire("python", lend=True) == first
                await pool.recycle("python", first, refused)

            async def refused(item: int) -> bool:
                return False

            tasks.start_soon(waiter)
            await wait_all_tasks_blocked()
            assert maker.made == [0]
            back.set()
        await wait_all_tasks_blocked()
        # Not ready again: disposed of, and a fresh one made in its place.
        assert maker.disposed == [first] and maker.made == [0, 1] and pool.sizes()["python"] == (1, 0, 1)


async def test_dropped_keys_lose_their_ready_items_and_a_lent_one_is_not_kept_or_replaced() -> None:
    """What the executor does once a project image is built: the base image's sandboxes go for good."""
    maker = Maker()
    async with Pool(maker.make, maker.dispose, size=1) as pool:
        pool.warm("base")
        pool.warm("other")
        await wait_all_tasks_blocked()
        lent = await pool.acquire("base", lend=True)
        await wait_all_tasks_blocked()
        pool.drop(lambda key: key == "base")
        await wait_all_tasks_blocked()

        async def ready(item: int) -> bool:
            return True

        await pool.recycle("base", lent, ready)
        await wait_all_tasks_blocked()
        assert "base" not in pool.sizes() and pool.sizes()["other"] == (1, 0, 1)
        assert lent in maker.disposed and len(maker.made) == 2  # nothing made again for the dropped key


class GatedMaker(Maker):
    """As Maker, but each item made ahead waits for `gate` (a template container takes seconds to start)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()

    async def make(self, key: str, ahead: bool) -> int:
        if len(self.made) > 0:
            await self.gate.wait()
        return await super().make(key, ahead)


async def test_a_call_that_finds_none_ready_while_items_are_lent_takes_the_first_back_or_made() -> None:
    async def ready(item: int) -> bool:
        return True

    maker = GatedMaker()
    async with Pool(maker.make, maker.dispose, size=1, max_size=4) as pool:
        pool.warm("python")
        await wait_all_tasks_blocked()
        lent = await pool.acquire("python", lend=True)
        got: list[int] = []
        async with anyio.create_task_group() as tasks:

            async def call() -> None:
                got.append(await pool.acquire("python", lend=True))

            tasks.start_soon(call)
            await wait_all_tasks_blocked()
            # It waits, and more are being made in the background (not on its own path: made stays [0]).
            assert got == [] and maker.made == [0] and pool.sizes()["python"][1] >= 1
            await pool.recycle("python", lent, ready)  # the lent one comes back first: the call takes it
        assert got == [lent]
        maker.gate.set()
        await wait_all_tasks_blocked()
        assert pool.sizes()["python"][0] >= 1  # what was made meanwhile is ready for the next call

    # A lent item that never comes back (its call ended badly: disposed of) leaves the call the made one.
    maker = GatedMaker()
    async with Pool(maker.make, maker.dispose, size=1, max_size=4) as pool:
        pool.warm("python")
        await wait_all_tasks_blocked()
        lent = await pool.acquire("python", lend=True)
        got = []
        async with anyio.create_task_group() as tasks:

            async def other_call() -> None:
                got.append(await pool.acquire("python", lend=True))

            tasks.start_soon(other_call)
            await wait_all_tasks_blocked()
            await pool.release(lent, "python")
            maker.gate.set()
        assert len(got) == 1 and got[0] != lent and lent in maker.disposed


async def test_the_least_recently_used_key_goes_past_max_keys_but_never_a_pinned_one() -> None:
    maker = Maker()
    async with Pool(maker.make, maker.dispose, size=1, max_keys=2, pinned=lambda key: key == "template") as pool:
        for key in ("template", "ruby", "go", "java"):
            pool.warm(key)
            await wait_all_tasks_blocked()
        # Two keys kept besides the pinned one: ruby, used least recently, went with its item.
        assert set(pool.sizes()) == {"template", "go", "java"}
        assert maker.disposed == [1]  # ruby's item (items are numbered as made: template 0, ruby 1, ...)
        assert await pool.acquire("template") == 0
