"""Asking the person through the client: MCP elicitation, where the client declared it and can take a request
from the server now (a stateless HTTP request cannot)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver import Context
from mcp_types import ClientCapabilities, ElicitationCapability
from pydantic import BaseModel

if TYPE_CHECKING:  # the run core is loaded after tools/list
    from llm_sandbox_mcp.run.network_requests import Answer, Ask


class Approval(BaseModel):
    """No field to fill in: accepting, declining or dismissing the question is the whole answer."""


def asker_of(ctx: Context[Any, Any] | None) -> Ask | None:
    """How to ask the person of this request's client, or None when it cannot be asked."""
    if ctx is None:
        return None
    session = ctx.request_context.session
    if not session.can_send_request or not session.check_client_capability(
        ClientCapabilities(elicitation=ElicitationCapability())
    ):
        return None

    async def ask(message: str) -> Answer:
        return (await ctx.elicit(message, Approval)).action

    return ask
