"""The authorization server's answers that a token is active, kept a short while so that a client's requests in a
row cost one introspection, not one each (SANDBOX_HTTP_OAUTH_INTROSPECTION_CACHE seconds; 0 keeps none).

An answer is kept by the SHA-256 digest of its token, never the token itself, for the setting's time or until
the token expires (`exp`), whichever comes first; an answer that a token is not active is never kept, so a
token becomes valid as soon as the authorization server says so. The price is the time a revocation takes to
be seen: up to the setting's seconds. At most MAX_ENTRIES answers are kept, the oldest going first. Requests
with the same token at the same time share one question (a client opening with several requests at once).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import anyio

from llm_sandbox_mcp.server.token_claims import number

MAX_ENTRIES = 4096


def _key(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", errors="surrogateescape")).digest()


class IntrospectionCache:
    def __init__(
        self,
        seconds: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self.seconds = seconds
        self.max_entries = max_entries
        self._clock = clock
        self._wall_clock = wall_clock
        # digest -> (until when, by `clock`; the answer)
        self._entries: OrderedDict[bytes, tuple[float, dict[str, object]]] = OrderedDict()
        self._asking: dict[bytes, anyio.Event] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token: str) -> dict[str, object] | None:
        """The answer kept for `token`, if it is still young enough."""
        key = _key(token)
        entry = self._entries.get(key)
        if entry is None:
            return None
        until, claims = entry
        if self._clock() >= until:
            del self._entries[key]
            return None
        return claims

    def put(self, token: str, claims: dict[str, object]) -> None:
        """Keep an answer that `token` is active, for the setting's time or until it expires."""
        if self.seconds <= 0 or claims.get("active") is not True:
            return
        life = self.seconds
        expires = number(claims.get("exp"))
        if expires is not None:
            life = min(life, expires - self._wall_clock())
        if life <= 0:
            return
        key = _key(token)
        self._entries.pop(key, None)
        self._entries[key] = (self._clock() + life, claims)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def answer(self, token: str, ask: Callable[[], Awaitable[dict[str, object]]]) -> dict[str, object]:
        """The answer kept for `token`, else `ask()`'s (kept if it may be), one question for the requests with
        that token at the same time; one whose shared answer was not kept (not active) asks for itself."""
        kept = self.get(token)
        if kept is not None or self.seconds <= 0:
            return kept if kept is not None else await ask()
        key = _key(token)
        asking = self._asking.get(key)
        if asking is not None:
            await asking.wait()
            kept = self.get(token)
            return kept if kept is not None else await ask()
        self._asking[key] = done = anyio.Event()
        try:
            claims = await ask()
            self.put(token, claims)
            return claims
        finally:
            del self._asking[key]
            done.set()
