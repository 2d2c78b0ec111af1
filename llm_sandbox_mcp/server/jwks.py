"""The authorization server's signing keys (its JWKS, RFC 7517), fetched from SANDBOX_HTTP_OAUTH_JWKS_URL and kept.

Only public keys of asymmetric algorithms are kept (RSA, EC, OKP), each with the algorithms it may verify:
the one its `alg` names, else its type's (RS*/PS* for RSA, the curve's ES* for EC, EdDSA for OKP). A symmetric
(`oct`) key, or one whose `use` is not `sig`, is left out: a public document must never hold what checks an
HMAC.

The keys are fetched on the first token, again when they are older than MAX_AGE_SECONDS, and again when a token
names a key id (`kid`) they do not hold, which is how a rotation shows. Every fetch, whatever set it off, waits
for SANDBOX_HTTP_OAUTH_JWKS_REFETCH seconds after the one before, successful or not: tokens with forged key ids,
however many, cost the authorization server one request per that time at most.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import anyio
import httpx2
from jwt import PyJWK
from jwt.exceptions import PyJWTError

from llm_sandbox_mcp.server.oauth import TIMEOUT_SECONDS, AuthorizationServerUnavailable
from llm_sandbox_mcp.server.token_claims import shown

logger = logging.getLogger(__name__)

MAX_AGE_SECONDS = 600.0
MAX_JWKS_BYTES = 256 * 1024
MAX_KEYS = 64
RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_CURVE_ALGORITHMS = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512", "Ed25519": "EdDSA", "Ed448": "EdDSA"}
# Every algorithm a key here may verify: asymmetric ones only (never `none`, never HS*).
ASYMMETRIC = RSA_ALGORITHMS | frozenset(_CURVE_ALGORITHMS.values())


@dataclass(frozen=True)
class SigningKey:
    kid: str | None
    algorithms: frozenset[str]
    jwk: PyJWK


def _algorithms(jwk: dict[str, object]) -> frozenset[str]:
    """What the key may verify (empty: a key this server does not use)."""
    kty, alg, crv = jwk.get("kty"), jwk.get("alg"), jwk.get("crv")
    if kty == "RSA":
        family = RSA_ALGORITHMS
    elif kty in ("EC", "OKP") and isinstance(crv, str) and crv in _CURVE_ALGORITHMS:
        family = frozenset({_CURVE_ALGORITHMS[crv]})
    else:
        return frozenset()
    if alg is not None:
        return family & {alg} if isinstance(alg, str) else frozenset()
    return family


def signing_keys(document: object) -> list[SigningKey]:
    """The usable keys of a JWKS document (the rest skipped, each with a line in the log)."""
    if not isinstance(document, dict):
        return []
    entries = cast("dict[str, object]", document).get("keys")
    if not isinstance(entries, list):
        return []
    keys: list[SigningKey] = []
    for entry in cast("list[object]", entries)[:MAX_KEYS]:
        if not isinstance(entry, dict):
            continue
        jwk = cast("dict[str, object]", entry)
        kid = jwk.get("kid")
        use, algorithms = jwk.get("use"), _algorithms(jwk)
        private = "d" in jwk  # a private key published: never used, whatever it would verify
        if not algorithms or private or use not in (None, "sig") or (kid is not None and not isinstance(kid, str)):
            logger.info(
                "OAuth: key %r of the JWKS left out: not a public key for signatures by %s",
                shown(kid),
                "/".join(sorted(ASYMMETRIC)),
            )
            continue
        try:
            key = PyJWK(jwk, algorithm=min(algorithms))
        except PyJWTError as exc:
            logger.warning("OAuth: key %r of the JWKS left out: %s", shown(kid), shown(exc))
            continue
        keys.append(SigningKey(kid, algorithms, key))
    return keys


class KeySet:
    """The keys of SANDBOX_HTTP_OAUTH_JWKS_URL, fetched when needed and no more often than `refetch` seconds."""

    def __init__(self, url: str, refetch: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self.refetch = refetch
        self._clock = clock
        self._keys: list[SigningKey] = []
        self._fetched: float | None = None  # when the keys in hand were fetched
        self._attempted: float | None = None  # when the last fetch was tried, whatever came of it
        self._lock = anyio.Lock()
        self._http: httpx2.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def key_for(self, kid: str | None) -> SigningKey | None:
        """The key a token's `kid` names (a token without one: the only key, if there is one), fetching the keys
        if that is allowed now and they are stale or lack it; raise AuthorizationServerUnavailable when no key was
        ever fetched."""
        async with self._lock:
            now = self._clock()
            stale = self._fetched is None or now - self._fetched >= MAX_AGE_SECONDS
            if (stale or self._find(kid) is None) and (
                self._attempted is None or now - self._attempted >= self.refetch
            ):
                self._attempted = now
                keys = await self._fetch()
                if keys is not None:
                    self._keys, self._fetched = keys, now
            if self._fetched is None:
                raise AuthorizationServerUnavailable("authorization server unavailable")
            return self._find(kid)

    def _find(self, kid: str | None) -> SigningKey | None:
        if kid is None:
            return self._keys[0] if len(self._keys) == 1 else None
        return next((key for key in self._keys if key.kid == kid), None)

    async def _fetch(self) -> list[SigningKey] | None:
        """The keys now at the URL, or None (the reason in the log) when there are none to be had."""
        if self._http is None:
            self._http = httpx2.AsyncClient(timeout=TIMEOUT_SECONDS, follow_redirects=False)
        try:
            async with self._http.stream("GET", self.url, headers={"Accept": "application/json"}) as response:
                body = b""
                async for chunk in response.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_JWKS_BYTES:
                        logger.error("OAuth: the JWKS at %s is larger than %d bytes", self.url, MAX_JWKS_BYTES)
                        return None
                status = response.status_code
        except httpx2.HTTPError as exc:
            logger.error("OAuth: the JWKS at %s cannot be fetched: %s", self.url, exc)
            return None
        if status != 200:
            logger.error("OAuth: the JWKS at %s answered HTTP %d", self.url, status)
            return None
        try:
            document: object = json.loads(body)
        except ValueError:
            document = None
        keys = signing_keys(document)
        if not keys:
            logger.error("OAuth: the JWKS at %s holds no public signing key this server can use", self.url)
            return None
        logger.info("OAuth: %d signing key(s) fetched from %s", len(keys), self.url)
        return keys
