"""A call about a session or a job that another replica holds is sent there, and its answer comes back as that
replica gave it: the SDK middleware every HTTP request passes when the server is one of several replicas.

The ids say which replica holds them (`replica_ids.py`). The call goes to that replica's /mcp as the client sent
it (its JSON-RPC request and its `Mcp-*` headers, so the owner answers in the client's protocol generation), with
a peer token for the caller's principal instead of the client's own token (`server/peers.py`). The owner applies
its own checks: another principal's id is "not found" there as here. Progress notifications on the owner's
answer are relayed to the client as they come. A call that arrived from a replica is served where it arrived,
never sent on: an id that replica does not hold is unknown there. Calls without an id (one-shot execute_code,
create_session, list_sessions, the languages) are served where they arrive.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any, cast

import anyio
import httpx2
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, ErrorData, TextContent

from llm_sandbox_mcp.replica_ids import replica_of
from llm_sandbox_mcp.server.call_gate import audit_log, principal_of
from llm_sandbox_mcp.server.peers import SETTING, Peers, forwarded_by_peer

logger = logging.getLogger(__name__)

# The arguments that name what a replica holds, and what each names.
HELD = {"session_id": "session", "job_id": "job"}
# The client's headers that go along: what the transport reads (the protocol generation, the method and name a
# 2026-07-28 request mirrors, what the client accepts); never its token, cookies or origin.
RELAYED = ("accept", "content-type", "last-event-id")
# The largest answer a replica sends back (a downloaded file in base64, plots): well above any that a tool makes.
ANSWER_CAP = 256 * 1024**2
# A tool's name as it may go into the audit line (anything else is logged as "?").
_WORD = re.compile(r"[A-Za-z0-9_.+-]{1,64}")
STOPPED = "stopped answering: if it was stopped or replaced, its sessions and jobs are lost with it; else try again"


class OwnerUnavailable(Exception):
    """The replica that holds the id did not answer the call: why (what the caller reads after the replica's
    name), and whether it is gone (it could not be reached at all)."""

    def __init__(self, why: str, gone: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.gone = gone


class Forwarder:
    """The SDK's ServerMiddleware, outermost: a call for another replica's session or job never reaches this
    replica's tools, quotas or audit line of calls (the owner's has it); its own audit line says where it went."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        held = self._held_elsewhere(ctx.params)
        if held is None or forwarded_by_peer(ctx.request):
            return await call_next(ctx)
        what, identifier, owner = held
        principal = principal_of(ctx.request)
        tool = (ctx.params or {}).get("name")
        started = time.monotonic()
        outcome = "failed"
        try:
            result = await self._forward(ctx, owner)
            outcome = "ok"
            return result
        except OwnerUnavailable as exc:
            outcome = "unavailable"
            return CallToolResult(
                content=[TextContent(type="text", text=_unavailable(exc, what, identifier))], is_error=True
            )
        except MCPError:
            outcome = "error"
            raise
        except anyio.get_cancelled_exc_class():
            outcome = "cancelled"
            raise
        finally:
            audit_log.info(
                "forward principal=%s tool=%s to=%s duration_ms=%d outcome=%s",
                principal or "(local)",
                tool if isinstance(tool, str) and _WORD.fullmatch(tool) else "?",
                owner,
                round((time.monotonic() - started) * 1000),
                outcome,
            )

    def _held_elsewhere(self, params: Mapping[str, Any] | None) -> tuple[str, str, str] | None:
        """(what, id, replica) when the call's arguments name a session or a job another replica holds."""
        arguments: object = (params or {}).get("arguments")
        if not isinstance(arguments, dict):
            return None
        for name, what in HELD.items():
            identifier = cast("dict[str, object]", arguments).get(name)
            if isinstance(identifier, str):
                owner = replica_of(identifier)
                if owner is not None and owner != self.peers.replica:
                    return what, identifier, owner
        return None

    async def _forward(self, ctx: ServerRequestContext[Any, Any], owner: str) -> HandlerResult:
        request: object = ctx.request
        incoming = cast("Mapping[str, str]", getattr(request, "headers", {}))
        headers = {name: value for name, value in incoming.items() if name in RELAYED or name.startswith("mcp-")}
        headers["authorization"] = f"Bearer {self.peers.token_for(principal_of(request), owner)}"
        headers["content-type"] = "application/json"
        request_body = {"jsonrpc": "2.0", "id": ctx.request_id, "method": ctx.method, "params": ctx.params}
        # As compact as the client sent it, at most: the owner applies the same SANDBOX_HTTP_MAX_BODY.
        body = json.dumps(request_body, ensure_ascii=False, separators=(",", ":"))
        try:
            with anyio.fail_after(self.peers.deadline):
                async with self.peers.http.stream(
                    "POST", self.peers.url_of(owner), content=body.encode(), headers=headers
                ) as response:
                    return await self._answer(ctx, owner, response)
        except TimeoutError:
            raise OwnerUnavailable(
                f"did not answer within {self.peers.deadline:g} s; try again, and run long work with background=true"
            ) from None
        except httpx2.SSEError:
            raise OwnerUnavailable("sent an answer this replica could not read (too large, or malformed)") from None
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
            logger.warning("Could not reach replica %s for a forwarded call: %s", owner, exc)
            raise OwnerUnavailable("cannot be reached", gone=True) from None
        except httpx2.HTTPError as exc:
            logger.warning("Replica %s stopped answering a forwarded call: %s", owner, exc)
            raise OwnerUnavailable(STOPPED) from None

    async def _answer(
        self, ctx: ServerRequestContext[Any, Any], owner: str, response: httpx2.Response
    ) -> HandlerResult:
        """The owner's result (relaying its progress meanwhile), its JSON-RPC error raised, or OwnerUnavailable."""
        if response.status_code in (401, 403):
            logger.error(
                "Replica %s refused this replica's peer token (HTTP %d): every replica needs the same %s, and "
                "clocks within a minute of each other",
                owner,
                response.status_code,
                SETTING,
            )
            raise OwnerUnavailable(
                "refused this replica's forwarded call (a configuration fault the operator must fix)"
            )
        if response.status_code == 503:
            raise OwnerUnavailable("is too busy to answer now (HTTP 503); try again in a moment")
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind == "text/event-stream":
            async for event in httpx2.EventSource(response, max_event_size=ANSWER_CAP):
                if not event.data:
                    continue
                final = await self._message(ctx, _decoded(event.data))
                if final is not None:
                    return final
            raise OwnerUnavailable(STOPPED)
        if kind == "application/json":
            data = bytearray()
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > ANSWER_CAP:
                    raise OwnerUnavailable("sent an answer this replica could not read (too large, or malformed)")
            final = await self._message(ctx, _decoded(bytes(data)))
            if final is not None:
                return final
        logger.warning("Replica %s answered a forwarded call with HTTP %d (%s)", owner, response.status_code, kind)
        raise OwnerUnavailable(f"answered HTTP {response.status_code}")

    async def _message(self, ctx: ServerRequestContext[Any, Any], message: object) -> HandlerResult:
        """The call's result from one JSON-RPC message of the owner's, or None (a progress notification, relayed,
        or anything else, dropped)."""
        if not isinstance(message, dict):
            return None
        fields = cast("dict[str, object]", message)
        if fields.get("method") == "notifications/progress":
            params = fields.get("params")
            if isinstance(params, dict):
                progress = cast("dict[str, object]", params)
                done, total, text = progress.get("progress"), progress.get("total"), progress.get("message")
                if isinstance(done, int | float):
                    await ctx.session.report_progress(
                        done,
                        total if isinstance(total, int | float) else None,
                        text if isinstance(text, str) else None,
                    )
            return None
        if fields.get("id") != ctx.request_id:
            return None
        result, error = fields.get("result"), fields.get("error")
        if isinstance(result, dict):
            return cast("dict[str, Any]", result)
        if isinstance(error, dict):
            raise MCPError.from_error_data(ErrorData.model_validate(error))
        return None


def _decoded(data: str | bytes) -> object:
    try:
        return json.loads(data)
    except ValueError:
        raise OwnerUnavailable("sent an answer this replica could not read (too large, or malformed)") from None


def _unavailable(failure: OwnerUnavailable, what: str, identifier: str) -> str:
    """The tool error for a call whose owner did not answer: what happened, and what to do."""
    owner = replica_of(identifier)
    if failure.gone:
        again = "create a new session" if what == "session" else "run the code again"
        return (
            f"The server replica that held {what} {identifier} ({owner}) cannot be reached: it is gone (or being "
            f"replaced), and its sessions and jobs are lost with it; {again}"
        )
    return f"The server replica that holds {what} {identifier} ({owner}) {failure.why}"
