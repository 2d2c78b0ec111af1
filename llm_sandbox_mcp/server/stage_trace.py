"""SANDBOX_TRACE_STAGES: each request's account (`llm_sandbox_mcp.stages`) logged on stderr once its answer is
ready, one JSON line per request, for benchmarks/stages.py. Installed only with the setting on."""

from __future__ import annotations

import json
import logging
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext

from llm_sandbox_mcp.stages import recording

logger = logging.getLogger("llm_sandbox_mcp.stages")
# What a line starts with, for the benchmark that reads them back.
PREFIX = "stages "


class StageTrace:
    """Middleware: from the request reaching it (the SDK has read and parsed its JSON-RPC message) to the answer
    being ready for the wire (validated and shaped by the SDK), what each stage took."""

    def __init__(self) -> None:
        # The lines are the setting's whole point: shown whatever SANDBOX_LOG_LEVEL says.
        logger.setLevel(logging.INFO)

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.request_id is None:  # a notification: nothing waits for an answer
            return await call_next(ctx)
        name = ctx.params.get("name") if ctx.params else None
        tool = name[:64] if isinstance(name, str) else None
        with recording() as stages:
            try:
                return await call_next(ctx)
            finally:
                stages.mark("the SDK shapes the answer")
                line: dict[str, object] = {
                    "id": ctx.request_id,
                    "method": ctx.method,
                    "tool": tool,
                    **stages.account(),
                }
                logger.info("%s%s", PREFIX, json.dumps(line))
