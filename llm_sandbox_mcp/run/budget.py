"""The memory that all sandboxes of this server may hold at once: pool, sessions and installers together.

How admission decides (docs/security.md, "Memory: admission and the one limit over all sandboxes"):

- Where the engine holds every sandbox of this server under one parent cgroup whose memory limit is the budget
  (`backends.SharedMemoryLimit`: Docker and Podman through a cgroup parent, bubblewrap and NsJail through their
  own cgroups), the kernel enforces the total, whatever the sandboxes do after admission. Admission then counts
  what they measurably use (the parent's usage less reclaimable file cache) plus a fixed headroom per live
  sandbox (`HEADROOM`, or its own limit when smaller) for the next one to start and the others to grow.
- Elsewhere (Kubernetes, an engine on another kernel, a host without cgroups) nothing bounds the total but
  bookkeeping, so admission counts each sandbox's whole memory limit, as before.
- Either way a sandbox is refused while the host itself has less memory available (MemAvailable) than the new
  sandbox's charge plus a reserve kept for everything else (`host_reserve`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager

from llm_sandbox_mcp.errors import OverBudget
from llm_sandbox_mcp.host_memory import available_memory, physical_memory

MIB = 1024**2
# What a live sandbox is charged on top of its measured use where the kernel bounds the total: room for a
# Python session to start (about 10-15 MiB measured) and grow a little before the next admission sees it.
HEADROOM = 32 * MIB


def _mib(size: int) -> str:
    return f"{size // MIB} MiB"


def host_reserve(physical: int) -> int:
    """What admission leaves free on the host for everything that is not a sandbox: a sixteenth of it."""
    return physical // 16


Meter = Callable[[], int | None]
"""What this server's sandboxes use together now, in bytes; None where no limit over all of them holds."""


class MemoryBudget:
    """Admits sandboxes against SANDBOX_MEMORY_BUDGET and the host's available memory (see the module's
    docstring). Not thread-safe: event loop only."""

    def __init__(
        self,
        total: int,
        meter: Meter | None = None,
        available: Callable[[], int | None] = available_memory,
        reserve: int | None = None,
    ) -> None:
        self.total = total
        # The charges of live sandboxes: limits where nothing measures, headroom where the kernel bounds the total.
        self.committed = 0
        self.meter = meter
        self._available = available
        self._reserve = host_reserve(physical_memory()) if reserve is None else reserve

    def _measured(self) -> int | None:
        return None if self.meter is None else self.meter()

    def charge(self, limit: int) -> int:
        """What a sandbox whose memory limit is `limit` is charged: its headroom where use is measured (and the
        kernel bounds the total), else its whole limit."""
        return limit if self._measured() is None else min(limit, HEADROOM)

    def reserve(self, limit: int, what: str) -> int:
        """Admit one more sandbox whose memory limit is `limit`; returns its charge, to `release` when it ends.
        Raises OverBudget, saying what holds the memory and what to do, when it does not fit."""
        used = self._measured()
        charge = limit if used is None else min(limit, HEADROOM)
        if used is None and self.committed + charge > self.total:
            raise OverBudget(
                f"Starting {what} ({_mib(limit)}) would pass this server's memory budget: its sandboxes already "
                f"hold {_mib(self.committed)} of {_mib(self.total)} (SANDBOX_MEMORY_BUDGET). Close sessions you no "
                "longer need (list_sessions shows them), wait for running calls, or ask for less memory."
            )
        if used is not None and used + self.committed + charge > self.total:
            raise OverBudget(
                f"Starting {what} would pass this server's memory budget: its sandboxes use {_mib(used)} now and "
                f"{_mib(self.committed)} more is kept for their growth, of {_mib(self.total)} "
                "(SANDBOX_MEMORY_BUDGET). Close sessions you no longer need (list_sessions shows them), free memory "
                "in the ones you keep, or wait for running calls."
            )
        available = self._available()
        if available is not None and available - charge < self._reserve:
            raise OverBudget(
                f"Starting {what} was refused: this host has only {_mib(available)} of memory available and keeps "
                f"{_mib(self._reserve)} for everything that is not a sandbox. Close sessions you no longer need "
                "(list_sessions shows them) or free memory on the host, then try again."
            )
        self.committed += charge
        return charge

    def room_for(self, count: int, limit: int) -> bool:
        """Whether `count` more sandboxes of `limit` would be admitted now (no refusal raised)."""
        used = self._measured()
        if used is None:
            return self.committed + count * limit <= self.total
        return used + self.committed + count * min(limit, HEADROOM) <= self.total

    def release(self, charge: int) -> None:
        self.committed = max(0, self.committed - charge)

    @contextmanager
    def held(self, limit: int, what: str) -> Generator[None]:
        charge = self.reserve(limit, what)
        try:
            yield
        finally:
            self.release(charge)
