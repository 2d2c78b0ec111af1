"""Warm pool: hardened sandboxes created ahead of time, so a call costs an exec rather than a start.

A sandbox is used once: `acquire` takes a ready one (or creates one), a replacement is started in the
background, and `release` destroys the used one in the background.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from types import TracebackType

import anyio
from anyio.abc import TaskGroup

from llm_sandbox_mcp.backends import Backend
from llm_sandbox_mcp.errors import SandboxError
from llm_sandbox_mcp.models import SandboxRef, SandboxSpec

logger = logging.getLogger(__name__)


class Pool:
    """Ready sandboxes per spec, at most `size` each, for the `max_specs` most recently used specs."""

    def __init__(self, backend: Backend, size: int, max_specs: int = 4) -> None:
        self._backend = backend
        self._size = size
        self._max_specs = max_specs
        self._ready: OrderedDict[SandboxSpec, list[SandboxRef]] = OrderedDict()
        self._starting: dict[SandboxSpec, int] = {}
        self._tasks: TaskGroup | None = None
        self._closed = False

    async def __aenter__(self) -> Pool:
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
            for refs in self._ready.values():
                for ref in refs:
                    await self._backend.destroy(ref)
            self._ready.clear()

    def warm(self, spec: SandboxSpec) -> None:
        """Start filling the pool for `spec` in the background."""
        if self._size == 0 or self._closed or self._tasks is None:
            return
        self._ready.setdefault(spec, [])
        self._ready.move_to_end(spec)
        self._evict()
        missing = self._size - len(self._ready[spec]) - self._starting.get(spec, 0)
        for _ in range(max(0, missing)):
            self._starting[spec] = self._starting.get(spec, 0) + 1
            self._tasks.start_soon(self._fill, spec)

    async def _fill(self, spec: SandboxSpec) -> None:
        try:
            ref = await self._backend.create(spec)
        except SandboxError as exc:
            logger.warning("Could not pre-start a sandbox for %s: %s", spec.image, exc)
            return
        finally:
            self._starting[spec] -= 1
        if self._closed or spec not in self._ready:
            with anyio.CancelScope(shield=True):
                await self._backend.destroy(ref)
            return
        self._ready[spec].append(ref)

    def _evict(self) -> None:
        while len(self._ready) > self._max_specs:
            _, refs = self._ready.popitem(last=False)
            for ref in refs:
                self.release(ref)

    async def acquire(self, spec: SandboxSpec) -> SandboxRef:
        """A fresh sandbox for `spec`; the pool refills behind it."""
        refs = self._ready.get(spec)
        ref = refs.pop(0) if refs else None
        self.warm(spec)
        if ref is None:
            ref = await self._backend.create(spec)
        return ref

    def release(self, ref: SandboxRef) -> None:
        """Destroy a used sandbox without making the caller wait."""
        if self._tasks is None or self._closed:
            return
        self._tasks.start_soon(self._destroy, ref)

    async def _destroy(self, ref: SandboxRef) -> None:
        with anyio.CancelScope(shield=True):
            await self._backend.destroy(ref)
