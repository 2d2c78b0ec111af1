"""`/healthz` and `/readyz` for an orchestrator's probes: served without authentication, so they say nothing
but yes or no (no version, no engine, no path, no reason; the server's log has the reason).

- `/healthz` (liveness): the process answers HTTP. Nothing else is checked, so a slow engine never gets the
  server restarted.
- `/readyz` (readiness): the engine started and answers now (`Backend.describe`, its cheapest round trip),
  within READY_TIMEOUT_SECONDS. Checks are not stacked: one runs at a time and its answer is reused for
  READY_CACHE_SECONDS, so a flood of probes costs the engine one call a second at most.
"""

from __future__ import annotations

import logging
import time

import anyio
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from llm_sandbox_mcp.server.state import AppState

logger = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 5.0
READY_CACHE_SECONDS = 1.0
_HEADERS = {"Cache-Control": "no-store"}


def _answer(ok: bool) -> PlainTextResponse:
    return PlainTextResponse("ok\n" if ok else "not ready\n", status_code=200 if ok else 503, headers=_HEADERS)


class Readiness:
    def __init__(self, state: AppState) -> None:
        self.state = state
        self._lock = anyio.Lock()
        self._checked_at = -READY_CACHE_SECONDS
        self._ready = False
        self._said: str | None = None

    async def ready(self) -> bool:
        async with self._lock:
            if time.monotonic() - self._checked_at >= READY_CACHE_SECONDS:
                self._ready = await self._check()
                self._checked_at = time.monotonic()
            return self._ready

    async def _check(self) -> bool:
        state = self.state
        if state.running is None:
            self._note("the engine has not started" if state.failure is None else f"no engine: {state.failure}")
            return False
        try:
            with anyio.fail_after(READY_TIMEOUT_SECONDS):
                await state.running.backend.describe()
        except TimeoutError:
            self._note(f"the engine did not answer within {READY_TIMEOUT_SECONDS:g} seconds")
            return False
        except Exception as exc:  # whatever an engine's client raises, the probe says "not ready" and the log why
            self._note(f"the engine does not answer: {exc}")
            return False
        self._note(None)
        return True

    def _note(self, why: str | None) -> None:
        """Log a change of readiness once, not once a probe."""
        if why != self._said:
            if why is None:
                logger.info("Ready: the engine answers")
            else:
                logger.warning("Not ready: %s", why)
        self._said = why


def health_routes(state: AppState) -> list[Route]:
    readiness = Readiness(state)

    async def healthz(_request: Request) -> PlainTextResponse:
        return _answer(True)

    async def readyz(_request: Request) -> PlainTextResponse:
        return _answer(await readiness.ready())

    return [Route("/healthz", healthz, methods=["GET", "HEAD"]), Route("/readyz", readyz, methods=["GET", "HEAD"])]
