"""What every request over HTTP passes through once the SDK has verified its token: the principal it runs
for, that principal's quota of calls in progress, and one audit line per tool call.

The audit line says who called which tool, in which language, for how long and with what outcome; it never
holds the arguments (the code, file contents), the result (the output) or a token.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, cast

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp_types import CallToolResult, TextContent

from llm_sandbox_mcp.server.principals import LOCAL, acting_for

audit_log = logging.getLogger("llm_sandbox_mcp.audit")

QUOTA_SETTING = "SANDBOX_HTTP_MAX_CALLS_PER_PRINCIPAL"
# What a value from the request may look like to be logged as it is; anything else is logged as "?".
_WORD = re.compile(r"[A-Za-z0-9_.+-]{1,64}")


def principal_of(request: object) -> str:
    """The principal the SDK's bearer middleware verified for `request` (the token's subject: the tokens file's
    principal, or an OAuth token's `sub`), or LOCAL where nothing is verified."""
    scope: object = getattr(request, "scope", None)
    user = cast("dict[str, object]", scope).get("user") if isinstance(scope, dict) else None
    if isinstance(user, AuthenticatedUser):
        return user.access_token.subject or user.access_token.client_id
    return LOCAL


def _word(value: object) -> str:
    return value if isinstance(value, str) and _WORD.fullmatch(value) else "?"


def _field(result: HandlerResult, model_name: str, wire_name: str) -> object:
    if isinstance(result, dict):
        return result.get(wire_name)
    return getattr(result, model_name, None)


class CallGate:
    """The SDK's ServerMiddleware for the HTTP face (`MCPServer(middleware=[...])`)."""

    def __init__(self, most_calls: int) -> None:
        self.most_calls = most_calls
        self._in_progress: dict[str, int] = {}

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        principal = principal_of(ctx.request)
        if ctx.method != "tools/call":
            with acting_for(principal):
                return await call_next(ctx)
        params = ctx.params or {}
        tool = _word(params.get("name"))
        arguments: object = params.get("arguments")
        language: object = "-"
        if isinstance(arguments, dict):
            language = cast("dict[str, object]", arguments).get("language", "-")
        started = time.monotonic()
        if self._in_progress.get(principal, 0) >= self.most_calls:
            _audit(principal, tool, language, started, "refused (too many calls)")
            return CallToolResult(
                content=[
                    TextContent(
                        type="text",
                        text=f"You have the maximum of {self.most_calls} calls in progress that this server allows "
                        f"each user ({QUOTA_SETTING}); wait for one to finish, or run long work with "
                        "background=true and poll get_job",
                    )
                ],
                is_error=True,
            )
        self._in_progress[principal] = self._in_progress.get(principal, 0) + 1
        outcome = "failed"
        try:
            with acting_for(principal):
                result = await call_next(ctx)
            structured = _field(result, "structured_content", "structuredContent")
            if isinstance(structured, dict):
                language = cast("dict[str, object]", structured).get("language", language)
            outcome = "error" if _field(result, "is_error", "isError") else "ok"
            return result
        except anyio.get_cancelled_exc_class():
            outcome = "cancelled"
            raise
        finally:
            self._in_progress[principal] -= 1
            if not self._in_progress[principal]:
                del self._in_progress[principal]
            _audit(principal, tool, language, started, outcome)


def _audit(principal: str, tool: str, language: object, started: float, outcome: str) -> None:
    audit_log.info(
        "call principal=%s tool=%s language=%s duration_ms=%d outcome=%s",
        principal or "(local)",
        tool,
        "-" if language == "-" else _word(language),
        round((time.monotonic() - started) * 1000),
        outcome,
    )
