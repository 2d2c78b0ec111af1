"""The run core's collaborators, built in one place and handed to the executor (`assemble`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from llm_sandbox_mcp.backends import Backend, SharedMemoryLimit
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.egress.tunnel import Tunnels
from llm_sandbox_mcp.images.background import ProjectImages
from llm_sandbox_mcp.models import Limits
from llm_sandbox_mcp.run.budget import MemoryBudget
from llm_sandbox_mcp.run.build_cache import BuildCache
from llm_sandbox_mcp.run.leases import Lease, Leases, Sources, WarmKey
from llm_sandbox_mcp.run.libraries import LibraryCache
from llm_sandbox_mcp.run.pool import Pool
from llm_sandbox_mcp.run.zygote import Zygote
from llm_sandbox_mcp.run.zygote.containers import ContainerKernels, ContainerTemplates
from llm_sandbox_mcp.run.zygote.policy import ZygotePolicy
from llm_sandbox_mcp.run.zygote.templates import ZygoteTemplates


@dataclass(frozen=True)
class RunParts:
    """What the executor orchestrates."""

    limits: Limits
    budget: MemoryBudget
    # Where the egress tunnels of installers and sessions run.
    tunnels: Tunnels
    libraries: LibraryCache
    images: ProjectImages
    builds: BuildCache
    leases: Leases
    pool: Pool[WarmKey, Lease]
    zygote: Zygote
    # Where a one-shot call's sandbox comes from.
    sources: Sources
    # At most SANDBOX_MAX_CONCURRENCY runs at once.
    limiter: anyio.CapacityLimiter


def assemble(settings: Settings, backend: Backend, switched: Callable[[str, str], Awaitable[None]]) -> RunParts:
    """The collaborators of an executor on `backend`; `switched(language, base)`: a project image is built."""
    limits = settings.limits()
    budget = MemoryBudget(settings.memory_budget())
    if isinstance(backend, SharedMemoryLimit):
        backend.limit_sandboxes_together(budget.total)
        budget.meter = backend.sandboxes_memory
    tunnels = Tunnels()
    libraries = LibraryCache(settings, backend, limits, budget, tunnels)
    images = ProjectImages(settings, backend, switched)
    libraries.image_of = images.image
    policy = ZygotePolicy(settings, backend)
    kernels = ContainerKernels(settings, policy)
    leases = Leases(backend, budget, kernels)
    pool: Pool[WarmKey, Lease] = Pool(
        leases.make,
        leases.dispose,
        settings.sandbox_pool_size,
        # Under load a key keeps up to one ready sandbox per call that may run at once.
        max_size=settings.sandbox_max_concurrency,
        can_grow=leases.room_to_grow,
        # Python's template containers (SANDBOX_ZYGOTE on Docker and Podman) take seconds to start and serve the
        # calls made most: other languages' sandboxes never push them out. Those of a library set may go.
        pinned=lambda key: key.spec.forks and key.spec.cache is None,
    )
    zygote = Zygote(
        policy, ZygoteTemplates(settings, backend, budget, policy), ContainerTemplates(pool, kernels, policy)
    )
    return RunParts(
        limits=limits,
        budget=budget,
        tunnels=tunnels,
        libraries=libraries,
        images=images,
        builds=BuildCache(backend, settings.sandbox_build_cache_size),
        leases=leases,
        pool=pool,
        zygote=zygote,
        sources=Sources(zygote, pool),
        limiter=anyio.CapacityLimiter(settings.sandbox_max_concurrency),
    )
