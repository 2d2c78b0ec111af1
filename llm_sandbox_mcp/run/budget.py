"""The memory that all sandboxes of this server may hold at once: pool, sessions and installers together."""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager

from llm_sandbox_mcp.errors import OverBudget


def _mib(size: int) -> str:
    return f"{size // 1024**2} MiB"


class MemoryBudget:
    """Counts the memory limits of live sandboxes against SANDBOX_MEMORY_BUDGET. Not thread-safe: event loop only."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.committed = 0

    def reserve(self, amount: int, what: str) -> None:
        """Raises OverBudget, saying what holds the memory, when `amount` more would pass the budget."""
        if self.committed + amount > self.total:
            raise OverBudget(
                f"Starting {what} ({_mib(amount)}) would pass this server's memory budget: its sandboxes already "
                f"hold {_mib(self.committed)} of {_mib(self.total)} (SANDBOX_MEMORY_BUDGET). Close sessions you no "
                "longer need (list_sessions shows them), wait for running calls, or ask for less memory."
            )
        self.committed += amount

    def release(self, amount: int) -> None:
        self.committed = max(0, self.committed - amount)

    @contextmanager
    def held(self, amount: int, what: str) -> Generator[None]:
        self.reserve(amount, what)
        try:
            yield
        finally:
            self.release(amount)
