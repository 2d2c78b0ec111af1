"""Leases: sandboxes ready for runs, where a run's comes from, and what becomes of it afterwards.

A `Lease` is a sandbox with its warm interpreter or runner when the language has one. `Leases` makes one (in
the memory budget) and disposes of it. A `SandboxSource` lends a lease to one call as a `Loan`, whose `release`
gives it back to where it came from: the warm pool (destroyed after its one run), a zygote template container
(lent again once ready, or retired), a zygote child (ended with its cgroup). `Sources` is the one place that
chooses among them; a session's lease is its own, opened and closed with the session.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio

from llm_sandbox_mcp import stages
from llm_sandbox_mcp.backends import Backend
from llm_sandbox_mcp.languages import Language, get_language
from llm_sandbox_mcp.models import Execution, SandboxRef, SandboxSpec
from llm_sandbox_mcp.run.budget import MemoryBudget
from llm_sandbox_mcp.run.build_cache import BUILD_PIPE_ENV, RUN_SCRIPTS
from llm_sandbox_mcp.run.environment import run_env
from llm_sandbox_mcp.run.kernel import Kernel, KernelDied
from llm_sandbox_mcp.run.pool import Pool

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmKey:
    """What makes two sandboxes interchangeable in the pool."""

    language: str
    spec: SandboxSpec


@dataclass(eq=False)
class Lease:
    """A sandbox ready for runs, with its warm interpreter or runner when the language has one."""

    ref: SandboxRef
    language: Language
    kernel: Kernel | None = None
    # What this sandbox holds of the server's memory budget.
    charged: int = 0
    # Lent to one-shot calls (not a session's): from the pool, used by one run and destroyed afterwards; a zygote
    # template container (`spec.forks`) serves more runs, each in a sandbox of its own.
    one_shot: bool = True
    calls: int = 0
    # A zygote child of a template in `ref`: a sandbox of its own for one run.
    child: bool = False

    @property
    def forked(self) -> bool:
        """Whether each run is in a sandbox forked for it (a zygote child): its files go with that sandbox."""
        return self.child or self.ref.spec.forks


@dataclass(eq=False)
class Loan:
    """A lease lent to one call; `release` gives it back to its source."""

    lease: Lease
    give_back: Callable[[Execution | None], Awaitable[None]]

    async def release(self, execution: Execution | None) -> None:
        """Back to where it came from; `execution`: how the call's run ended (None when it did not end)."""
        with anyio.CancelScope(shield=True):
            await self.give_back(execution)


class SandboxSource(Protocol):
    """Somewhere a one-shot call's sandbox can come from."""

    def warm(self, language: Language, spec: SandboxSpec) -> None:
        """Have sandboxes of this kind ready before calls come (in the background)."""
        ...

    async def lend(self, language: Language, spec: SandboxSpec, code: bytes = b"") -> Loan | None:
        """A sandbox for one call, or None when this source cannot serve it here (the pool then does). `code`:
        the call's source, which a source may read to choose among the sandboxes it has (`zygote.preloads`)."""
        ...


class ForkingSources(Protocol):
    """The zygote's answer to which source, if any, forks a one-shot call (`run.zygote.Zygote`)."""

    def source(self, language: Language, spec: SandboxSpec) -> SandboxSource | None: ...


class Sources:
    """Where a one-shot call's sandbox comes from: a zygote child where the zygote's policy forks the call and it
    can, else the warm pool (which always can)."""

    def __init__(self, zygote: ForkingSources, pool: Pool[WarmKey, Lease]) -> None:
        self._zygote = zygote
        self._pool = pool

    def warm(self, language: Language, spec: SandboxSpec) -> None:
        forking = self._zygote.source(language, spec)
        if forking is not None:
            forking.warm(language, spec)
        else:
            self._pool.warm(WarmKey(language.name, spec))

    async def lend(self, language: Language, spec: SandboxSpec, code: bytes = b"") -> Loan:
        forking = self._zygote.source(language, spec)
        if forking is not None:
            loan = await forking.lend(language, spec, code)
            if loan is not None:
                return loan
        return await pooled(self._pool, language, spec)


async def pooled(pool: Pool[WarmKey, Lease], language: Language, spec: SandboxSpec) -> Loan:
    """A fresh sandbox from the warm pool, destroyed after its one call."""
    stages.note("source", "the warm pool")
    lease = await pool.acquire(WarmKey(language.name, spec))

    async def give_back(execution: Execution | None) -> None:
        await pool.release(lease)

    return Loan(lease, give_back)


class TemplateKernels(Protocol):
    """How a zygote template container's kernel starts (`run.zygote.containers.ContainerKernels`)."""

    async def start(self, backend: Backend, ref: SandboxRef, env: dict[str, str]) -> Kernel: ...


class Leases:
    """Makes sandboxes ready for runs (started, with their warm runner) within the memory budget, and disposes of
    them."""

    def __init__(self, backend: Backend, budget: MemoryBudget, containers: TemplateKernels) -> None:
        self._backend = backend
        self._budget = budget
        self._containers = containers
        # Sandbox kinds whose image could not start the warm runner (no perl, say): they run one exec per call.
        self._cold: set[WarmKey] = set()

    def room_to_grow(self, key: WarmKey) -> bool:
        """A larger pool leaves room in the memory budget for one more sandbox (a session, a call)."""
        return self._budget.room_for(2, key.spec.limits.memory_bytes)

    async def make(self, key: WarmKey, ahead: bool, one_shot: bool = True) -> Lease:
        """A started sandbox of `key`; `ahead`: made for the pool rather than a waiting call."""
        charge = self._budget.reserve(key.spec.limits.memory_bytes, "a warm sandbox" if ahead else "a sandbox")
        try:
            ref = await self._backend.create(key.spec)
        except BaseException:
            self._budget.release(charge)
            raise
        lease = Lease(ref, get_language(key.language), charged=charge, one_shot=one_shot)
        try:
            await self._start_kernel(lease, preload=ahead)
            if one_shot and lease.kernel is None:
                await self._start_runner(key, lease)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.dispose(lease)
            raise
        return lease

    async def dispose(self, lease: Lease) -> None:
        try:
            if lease.kernel is not None:
                await lease.kernel.aclose()
            await self._backend.destroy(lease.ref)
        finally:
            self._budget.release(lease.charged)
            lease.charged = 0

    async def revive(self, lease: Lease) -> bool:
        """Start a new interpreter where the last one was lost; True when that happened."""
        if lease.kernel is None or lease.kernel.alive:
            return False
        await lease.kernel.aclose()
        lease.kernel = None
        await self._start_kernel(lease, preload=False)
        return True

    async def _start_kernel(self, lease: Lease, preload: bool) -> None:
        if not lease.language.kernel:
            return
        env = run_env(lease.language, lease.ref.spec)
        if lease.ref.spec.forks:
            lease.kernel = await self._containers.start(self._backend, lease.ref, env)
        else:
            lease.kernel = await Kernel.start(self._backend, lease.ref, env, preload=preload)

    async def _start_runner(self, key: WarmKey, lease: Lease) -> None:
        """The language's runtime started ahead, waiting for the program; a sandbox that cannot runs cold."""
        warm_argv = lease.language.warm_argv
        if warm_argv is None or key in self._cold:
            return
        env = run_env(lease.language, lease.ref.spec)
        if lease.language.name in RUN_SCRIPTS:
            env.update(BUILD_PIPE_ENV)
        try:
            lease.kernel = await Kernel.supervise(self._backend, lease.ref, warm_argv(), env)
        except KernelDied as exc:
            logger.warning("%s sandboxes run without a warm runner: %s", lease.language.title, exc)
            self._cold.add(key)
            await self._backend.kill_all(lease.ref)
