"""Warm pool: sandboxes made ready ahead of time, so a call costs a message rather than a container start.

Items are used once: `acquire` takes a ready one (or makes one), a replacement is made in the background,
and `release` disposes of the used one in the background. An item that can serve again (a zygote template
container, whose calls each run in a sandbox of their own) is lent instead (`acquire(key, lend=True)`): no
replacement is made for it while it is out, and `recycle` puts it back once it says it is ready again.
The pool adapts: a key whose calls find it empty
(back-to-back or parallel calls) gets a larger target, up to `max_size` and while `can_grow` allows it (the
memory budget), refilled in parallel; a key left idle shrinks back to `size`.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from types import TracebackType
from typing import Generic, TypeVar

import anyio
from anyio.abc import TaskGroup

from llm_sandbox_mcp import stages
from llm_sandbox_mcp.errors import SandboxError

logger = logging.getLogger(__name__)

# How long a key that grew under load stays larger once its calls stop.
IDLE_SECONDS = 30.0

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class Pool(Generic[K, T]):
    """At most `size` ready items per key, for the `max_keys` most recently used keys and every `pinned` one.

    `make(key, ahead)` builds an item; `ahead` is True when it is made for the pool rather than for a waiting
    caller, so it may spend longer getting ready (e.g. pre-importing libraries).
    """

    def __init__(
        self,
        make: Callable[[K, bool], Awaitable[T]],
        dispose: Callable[[T], Awaitable[None]],
        size: int,
        max_keys: int = 4,
        max_age: float = 3600.0,
        max_size: int | None = None,
        can_grow: Callable[[K], bool] = lambda key: True,
        idle: float = IDLE_SECONDS,
        pinned: Callable[[K], bool] = lambda key: False,
    ) -> None:
        self._make = make
        self._dispose = dispose
        self._size = size
        self._max_size = max(size, max_size if max_size is not None else size)
        self._can_grow = can_grow
        # After this long without a call, a key's target falls back to `size` and the extra items go.
        self._idle = idle
        self._target: dict[K, int] = {}
        self._used: dict[K, float] = {}
        self._max_keys = max_keys
        # Keys never evicted for others, nor counted against `max_keys` (slow to make, and used most).
        self._pinned = pinned
        # An item older than this is not handed out: an engine may have ended it meanwhile (a pod's deadline).
        self._max_age = max_age
        self._ready: OrderedDict[K, list[tuple[float, T]]] = OrderedDict()
        self._making: dict[K, int] = {}
        # Items lent out per key, and when each lent item was made (ids: items need not be hashable).
        self._lent: dict[K, int] = {}
        self._made: dict[int, float] = {}
        # Items being taken back per key, and what a caller waiting for one of them waits on.
        self._returning: dict[K, int] = {}
        self._back: dict[K, anyio.Event] = {}
        self._tasks: TaskGroup | None = None
        self._closed = False

    async def __aenter__(self) -> Pool[K, T]:
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        if self._max_size > self._size:
            self._tasks.start_soon(self._shrink_idle)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed = True
        assert self._tasks is not None
        self._tasks.cancel_scope.cancel()
        await self._tasks.__aexit__(exc_type, exc, tb)
        with anyio.CancelScope(shield=True):
            # In parallel: each disposal is an engine round trip, and shutdown waits for all of them.
            async with anyio.create_task_group() as disposals:
                for items in self._ready.values():
                    for _, item in items:
                        disposals.start_soon(self._shielded_dispose, item)
            self._ready.clear()

    def sizes(self) -> dict[K, tuple[int, int, int]]:
        """Per key: items ready, being made, and the current target."""
        return {
            key: (len(items), self._making.get(key, 0), self._target.get(key, self._size))
            for key, items in self._ready.items()
        }

    def warm(self, key: K) -> None:
        """Start making items for `key` in the background, up to the pool size."""
        if self._size == 0 or self._closed or self._tasks is None:
            return
        self._ready.setdefault(key, [])
        self._ready.move_to_end(key)
        self._evict()
        target = self._target.get(key, self._size)
        out = self._lent.get(key, 0) + self._returning.get(key, 0)
        have = len(self._ready[key]) + self._making.get(key, 0) + out
        for count in range(have, target):
            if count >= self._size and not self._can_grow(key):
                break
            self._making[key] = self._making.get(key, 0) + 1
            self._tasks.start_soon(self._fill, key)

    def drop(self, stale: Callable[[K], bool]) -> None:
        """Forget the keys `stale` picks (sandboxes of an image no longer used): their ready items go now, and
        items being made or lent for them are disposed of when they come back."""
        for key in [key for key in self._ready if stale(key)]:
            items = self._ready.pop(key)
            self._target.pop(key, None)
            self._used.pop(key, None)
            for _, item in items:
                if self._tasks is not None:
                    self._tasks.start_soon(self._shielded_dispose, item)

    def _grow(self, key: K) -> None:
        """A call found `key` empty: keep more ready, up to the cap."""
        target = self._target.get(key, self._size)
        if target < self._max_size:
            self._target[key] = min(self._max_size, max(1, target * 2))
            logger.debug("Warm pool for %s grows to %d under load", key, self._target[key])

    async def _shrink_idle(self) -> None:
        while True:
            await anyio.sleep(self._idle / 4)
            now = time.monotonic()
            for key, target in list(self._target.items()):
                if target <= self._size or now - self._used.get(key, now) < self._idle:
                    continue
                self._target[key] = self._size
                if key not in self._ready:
                    continue
                logger.debug("Warm pool for %s shrinks to %d when idle", key, self._size)
                items = self._ready[key]
                extra, self._ready[key] = items[self._size :], items[: self._size]
                for _, item in extra:
                    assert self._tasks is not None
                    self._tasks.start_soon(self._shielded_dispose, item)

    async def _fill(self, key: K) -> None:
        try:
            await self._fill_one(key)
        finally:
            self._arrived(key)  # made or not, a call waiting for it looks again

    async def _fill_one(self, key: K) -> None:
        try:
            item = await self._make(key, True)
        except SandboxError as exc:
            logger.warning("Could not prepare a sandbox ahead of time: %s", exc)
            return
        except Exception:  # background work never ends the server: an engine's own error type included
            logger.exception("Could not prepare a sandbox ahead of time")
            return
        finally:
            self._making[key] -= 1
        if self._closed or key not in self._ready:
            with anyio.CancelScope(shield=True):
                await self._dispose(item)
            return
        if len(self._ready[key]) >= self._target.get(key, self._size):
            await self._shielded_dispose(item)  # the key shrank while this was made
            return
        self._ready[key].append((time.monotonic(), item))

    def _evict(self) -> None:
        while True:
            unpinned = [key for key in self._ready if not self._pinned(key)]
            if len(unpinned) <= self._max_keys:
                return
            key = unpinned[0]  # the least recently used
            items = self._ready.pop(key)
            self._target.pop(key, None)
            self._used.pop(key, None)
            for _, item in items:
                if self._tasks is not None:
                    self._tasks.start_soon(self._shielded_dispose, item)

    async def acquire(self, key: K, lend: bool = False) -> T:
        """A fresh item for `key`; the pool refills behind it, unless it is lent (`recycle` or `release` it with
        its key)."""
        item, made = self._take(key)
        waited = False
        if item is None and self._lent.get(key):
            # Items of this key are out and come back when their calls end (a template container serves a
            # call in milliseconds, and takes seconds to make): more are made in the background, and the call
            # takes the first ready, made or back, rather than waiting for one made on its own path.
            self._grow(key)
            self.warm(key)
        while item is None and (self._returning.get(key) or (self._lent.get(key) and self._making.get(key))):
            # An item on its way back is ready sooner than a new one; more of them would have spared the wait.
            waited = True
            await self._arrival(key).wait()
            item, made = self._take(key)
        items = self._ready.get(key) or []
        self._used[key] = time.monotonic()
        if item is None or waited or (not items and self._making.get(key, 0)):
            self._grow(key)
        if lend:
            self._lent[key] = self._lent.get(key, 0) + 1
        self.warm(key)
        stages.note(
            "sandbox", "made for the call" if item is None else "waited for one coming back" if waited else "ready"
        )
        if item is None:
            try:
                item = await self._make(key, False)
            except BaseException:
                if lend:
                    self._returned(key)
                raise
            made = time.monotonic()
        if lend:
            self._made[id(item)] = made
        return item

    def _arrival(self, key: K) -> anyio.Event:
        """Set when an item of `key` may have become ready (taken back, made, or given up on)."""
        return self._back.setdefault(key, anyio.Event())

    def _arrived(self, key: K) -> None:
        self._back.pop(key, anyio.Event()).set()

    def _take(self, key: K) -> tuple[T | None, float]:
        items = self._ready.get(key) or []
        while items:
            made, candidate = items.pop(0)
            if time.monotonic() - made <= self._max_age:
                return candidate, made
            if self._tasks is not None:
                self._tasks.start_soon(self._shielded_dispose, candidate)
        return None, 0.0

    def _returned(self, key: K) -> None:
        self._lent[key] -= 1
        if not self._lent[key]:
            del self._lent[key]

    async def recycle(self, key: K, item: T, ready: Callable[[T], Awaitable[bool]]) -> None:
        """Take back a lent item whose use ended cleanly: ready again for `key` once `ready(item)` says so (in
        the background), disposed of when it does not, when it is too old, or when the key has enough."""
        made = self._made.pop(id(item), 0.0)
        self._returned(key)
        if self._tasks is None or self._closed:
            await self._shielded_dispose(item)
            return
        self._returning[key] = self._returning.get(key, 0) + 1
        self._tasks.start_soon(self._take_back, key, item, made, ready)

    async def _take_back(self, key: K, item: T, made: float, ready: Callable[[T], Awaitable[bool]]) -> None:
        try:
            usable = await ready(item)
        except Exception:  # in the background: logged, never fatal
            logger.exception("A used sandbox could not be made ready again")
            usable = False
        except BaseException:  # the pool is closing: the item is not lost with this task
            await self._shielded_dispose(item)
            raise
        finally:
            self._returning[key] -= 1
            if not self._returning[key]:
                del self._returning[key]
            self._arrived(key)
        items = self._ready.get(key)
        fresh = time.monotonic() - made <= self._max_age
        if (
            usable
            and fresh
            and not self._closed
            and items is not None
            and len(items) < self._target.get(key, self._size)
        ):
            items.insert(0, (made, item))
            return
        await self._shielded_dispose(item)
        if items is not None:  # else the key was evicted or dropped meanwhile
            self.warm(key)

    async def release(self, item: T, key: K | None = None) -> None:
        """Dispose of a used item, in the background unless the pool is closing; `key`: it was lent for it."""
        if key is not None:
            self._made.pop(id(item), None)
            self._returned(key)
            if key in self._ready:  # else the key was evicted or dropped meanwhile
                self.warm(key)
        if self._tasks is None or self._closed:
            await self._shielded_dispose(item)
            return
        self._tasks.start_soon(self._shielded_dispose, item)

    async def _shielded_dispose(self, item: T) -> None:
        with anyio.CancelScope(shield=True):
            try:
                await self._dispose(item)
            except Exception:  # in the background: logged, never fatal
                logger.exception("Could not remove a used sandbox")
