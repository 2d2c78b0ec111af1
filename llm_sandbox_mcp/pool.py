"""Warm pool: sandboxes made ready ahead of time, so a call costs a message rather than a container start.

Items are used once: `acquire` takes a ready one (or makes one), a replacement is made in the background,
and `release` disposes of the used one in the background.
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

from llm_sandbox_mcp.errors import SandboxError

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class Pool(Generic[K, T]):
    """At most `size` ready items per key, for the `max_keys` most recently used keys.

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
    ) -> None:
        self._make = make
        self._dispose = dispose
        self._size = size
        self._max_keys = max_keys
        # An item older than this is not handed out: an engine may have ended it meanwhile (a pod's deadline).
        self._max_age = max_age
        self._ready: OrderedDict[K, list[tuple[float, T]]] = OrderedDict()
        self._making: dict[K, int] = {}
        self._tasks: TaskGroup | None = None
        self._closed = False

    async def __aenter__(self) -> Pool[K, T]:
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closed = True
        assert self._tasks is not None
        self._tasks.cancel_scope.cancel()
        await self._tasks.__aexit__(exc_type, exc, tb)
        with anyio.CancelScope(shield=True):
            for items in self._ready.values():
                for _, item in items:
                    await self._dispose(item)
            self._ready.clear()

    def warm(self, key: K) -> None:
        """Start making items for `key` in the background, up to the pool size."""
        if self._size == 0 or self._closed or self._tasks is None:
            return
        self._ready.setdefault(key, [])
        self._ready.move_to_end(key)
        self._evict()
        missing = self._size - len(self._ready[key]) - self._making.get(key, 0)
        for _ in range(max(0, missing)):
            self._making[key] = self._making.get(key, 0) + 1
            self._tasks.start_soon(self._fill, key)

    async def _fill(self, key: K) -> None:
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
        self._ready[key].append((time.monotonic(), item))

    def _evict(self) -> None:
        while len(self._ready) > self._max_keys:
            _, items = self._ready.popitem(last=False)
            for _, item in items:
                if self._tasks is not None:
                    self._tasks.start_soon(self._shielded_dispose, item)

    async def acquire(self, key: K) -> T:
        """A fresh item for `key`; the pool refills behind it."""
        items = self._ready.get(key) or []
        item: T | None = None
        while items and item is None:
            made, candidate = items.pop(0)
            if time.monotonic() - made <= self._max_age:
                item = candidate
            elif self._tasks is not None:
                self._tasks.start_soon(self._shielded_dispose, candidate)
        self.warm(key)
        if item is None:
            item = await self._make(key, False)
        return item

    async def release(self, item: T) -> None:
        """Dispose of a used item, in the background unless the pool is closing."""
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
