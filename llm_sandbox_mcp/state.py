"""State the lifespan builds and the tools share, and the one place our errors become tool errors."""

from collections.abc import Awaitable
from typing import TypeVar

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable, SandboxError
from llm_sandbox_mcp.executor import Executor
from llm_sandbox_mcp.sessions import SessionRegistry

T = TypeVar("T")


class AppState:
    """What the lifespan builds and the tools use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.running: Executor | None = None
        self.registry: SessionRegistry | None = None
        self.versions: dict[str, str] = {}
        self.failure: str | None = None

    def _unavailable(self) -> SandboxError:
        if self.failure is not None:
            return BackendUnavailable(f"{self.failure} (restart the MCP server after fixing this)")
        return SandboxError("The server is still starting; try again in a moment")

    async def close_now(self) -> None:
        """Remove every sandbox this server made, from outside the lifespan (on a signal)."""
        with anyio.CancelScope(shield=True):
            if self.registry is not None:
                await self.registry.aclose()
            if self.running is not None:
                await self.running.backend.aclose()

    @property
    def executor(self) -> Executor:
        if self.running is None:
            raise self._unavailable()
        return self.running

    @property
    def sessions(self) -> SessionRegistry:
        if self.registry is None:
            raise self._unavailable()
        return self.registry


async def guard(call: Awaitable[T]) -> T:
    """Turn our errors into tool errors the model reads; anything else is the SDK's generic crash path."""
    try:
        return await call
    except SandboxError as exc:
        raise ToolError(str(exc)) from exc
