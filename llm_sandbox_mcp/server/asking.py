"""Asking the person through the client (MCP elicitation) before request_network decides.

The SDK's resolver (`Resolve`) runs before the tool body. On protocol 2026-07-28 and later it returns the
question to the client inside the call's result (`InputRequiredResult`) and the client calls again with the
answer, so the server holds nothing while the person thinks. On older protocols, where the server sends the
question as a request of its own mid-call, this module asks itself: one question per session at a time, with a
time limit. A client that did not declare form elicitation, or a connection that cannot carry a request from
the server (stateless HTTP on an older protocol), is not asked at all: the operator's setting decides.
"""
# No `from __future__ import annotations`: the SDK evaluates the resolver's signature.

from typing import Any, Literal

from mcp.server.elicitation import CancelledElicitation, DeclinedElicitation, ElicitationResult
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.resolve import Elicit
from mcp_types.version import is_version_at_least
from pydantic import BaseModel, Field

from llm_sandbox_mcp.server.state import AppState

# The first protocol whose tool calls carry elicitation in their result rather than as a server request.
_IN_RESULT = "2026-07-28"


class Approval(BaseModel):
    allow: bool = Field(default=True, title="Allow this host for this session")


class Replied(Approval):
    """Not shown to anyone: what asking on an older protocol came to, or that nothing was asked (`reply`
    None when the client cannot be asked, "unasked" when there was nothing to ask)."""

    reply: Literal["accept", "decline", "cancel", "unanswered", "busy", "unasked"] | None = None


def _can_elicit(ctx: Context[Any, Any]) -> bool:
    capabilities = ctx.request_context.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    # A bare `elicitation: {}` (from before the modes) means form; url-only does not.
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def _in_result(ctx: Context[Any, Any]) -> bool:
    version = ctx.request_context.session.protocol_version
    return is_version_at_least(version, _IN_RESULT)


def person_resolver(state: AppState) -> Any:
    """The resolver of request_network's `person` parameter, over `state`."""

    async def ask_person(
        session_id: str, host: str, reason: str, ctx: Context[Any, Any]
    ) -> Elicit[Approval] | Approval:
        if not _can_elicit(ctx) or not (_in_result(ctx) or ctx.request_context.session.can_send_request):
            return Replied(reply=None)
        question = state.network_question(session_id, host, reason)
        if question is None:
            return Replied(reply="unasked")
        if _in_result(ctx):
            return Elicit(question, Approval)

        async def ask(message: str) -> Literal["accept", "decline", "cancel"]:
            answer = await ctx.elicit(message, Approval)
            return "decline" if answer.action == "accept" and not answer.data.allow else answer.action

        return Replied(reply=await state.ask_person(session_id, question, ask))

    return ask_person


def reply_of(
    outcome: ElicitationResult[Approval],
) -> Literal["accept", "decline", "cancel", "unanswered", "busy"] | None:
    """The person's reply to hand to request_network; None when the client cannot be asked."""
    if isinstance(outcome, DeclinedElicitation):
        return "decline"
    if isinstance(outcome, CancelledElicitation):
        return "cancel"
    data = outcome.data
    if isinstance(data, Replied):
        return "unanswered" if data.reply == "unasked" else data.reply
    return "accept" if data.allow else "decline"
