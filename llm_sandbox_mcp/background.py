"""Objects that own background work: one task group, entered and left with the object."""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

import anyio
from anyio.abc import TaskGroup

Owner = TypeVar("Owner", bound="TaskOwner")


class TaskOwner:
    """Owns a task group for work that outlives the call that starts it. Use as an async context manager:
    leaving it cancels what still runs and waits for it. `_tasks` is None outside, and from the moment
    leaving begins, so no new work starts then."""

    _tasks: TaskGroup | None = None

    async def __aenter__(self: Owner) -> Owner:
        tasks = anyio.create_task_group()
        await tasks.__aenter__()
        self._tasks = tasks
        self._started(tasks)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tasks, self._tasks = self._tasks, None
        assert tasks is not None
        tasks.cancel_scope.cancel()
        # The work absorbs its own errors, so what the body raised goes on as it is, not in an exception group.
        await tasks.__aexit__(None, None, None)
        await self._after_tasks()

    def _started(self, tasks: TaskGroup) -> None:
        """Start work that runs for as long as the object is entered (for subclasses)."""

    async def _after_tasks(self) -> None:
        """What is left to do once the background work has ended (for subclasses)."""
