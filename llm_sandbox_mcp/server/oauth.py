"""OAuth 2.1 as a protected resource (the MCP authorization spec): the settings, what a client gets when the
authorization server cannot answer, and access tokens verified by asking that server (token introspection,
RFC 7662), as the MCP SDK's TokenVerifier. JWT access tokens checked here against the server's keys are
server/jwt_access.py's; what the claims must say, either way, server/token_claims.py's.

Introspection works for opaque tokens and JWTs alike, and a token the authorization server revoked is refused
within seconds instead of at its expiry. The cost is one request to the authorization server per token and
SANDBOX_HTTP_OAUTH_INTROSPECTION_CACHE seconds (server/introspection_cache.py).
"""

from __future__ import annotations

import logging
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import httpx2
from mcp.server.auth.provider import AccessToken
from starlette.authentication import AuthenticationError
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse, Response

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.server.introspection_cache import IntrospectionCache
from llm_sandbox_mcp.server.token_claims import access_token

logger = logging.getLogger(__name__)

# RFC 6750's b64token: anything else is no access token, and is not sent to the authorization server.
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
MAX_TOKEN_LENGTH = 8192
TIMEOUT_SECONDS = 5.0
RETRY_AFTER_SECONDS = 5


def well_formed(token: str) -> bool:
    """Whether `token` may be an access token at all (RFC 6750's syntax, at most 8 KiB); one that is not is
    refused without a request to the authorization server or a look at its contents."""
    return len(token) <= MAX_TOKEN_LENGTH and _B64TOKEN.fullmatch(token) is not None


class AuthorizationServerUnavailable(AuthenticationError):
    """The authorization server could not say whether a token is valid: the request is not served (503)."""


def unavailable_response(_conn: HTTPConnection, exc: AuthenticationError) -> Response:
    """What a client gets when its token could not be verified: 503, nothing of the cause but the fact."""
    if not isinstance(exc, AuthorizationServerUnavailable):
        return JSONResponse({"error": "invalid_request", "error_description": "Bad credentials"}, status_code=400)
    return JSONResponse(
        {
            "error": "temporarily_unavailable",
            "error_description": "The authorization server could not verify the access token; try again later",
        },
        status_code=503,
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


@dataclass(frozen=True)
class OAuthConfig:
    issuer: str
    introspection_url: str | None
    resource: str
    scopes: tuple[str, ...]
    client_id: str | None = None
    client_secret: str | None = None
    jwks_url: str | None = None
    jwks_refetch: float = 60.0
    introspection_cache: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> OAuthConfig | None:
        """The OAuth settings, or None where OAuth is not configured (config.py checked their shape)."""
        if settings.sandbox_http_oauth_issuer is None:
            return None
        assert settings.sandbox_http_oauth_resource is not None
        secret = None
        if settings.sandbox_http_oauth_client_secret_file is not None:
            secret = _read_secret(settings.sandbox_http_oauth_client_secret_file)
        return cls(
            issuer=settings.sandbox_http_oauth_issuer,
            introspection_url=settings.sandbox_http_oauth_introspection_url,
            resource=settings.sandbox_http_oauth_resource,
            scopes=tuple(settings.sandbox_http_oauth_scopes),
            client_id=settings.sandbox_http_oauth_client_id,
            client_secret=secret,
            jwks_url=settings.sandbox_http_oauth_jwks_url,
            jwks_refetch=settings.sandbox_http_oauth_jwks_refetch,
            introspection_cache=settings.sandbox_http_oauth_introspection_cache,
        )


def _read_secret(path: Path) -> str:
    name = "SANDBOX_HTTP_OAUTH_CLIENT_SECRET_FILE"
    try:
        info = path.stat()
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{name} ({path}): cannot be read: {getattr(exc, 'strerror', None) or exc}"]) from None
    if stat.S_IMODE(info.st_mode) & 0o007:
        raise ConfigError([f"{name} ({path}): is readable by every user of this host; make it private (chmod 600)"])
    if not text or "\n" in text:
        raise ConfigError([f"{name} ({path}): expected the client secret alone, on one line"])
    return text


class IntrospectionVerifier:
    """The SDK's TokenVerifier over the authorization server's introspection endpoint."""

    def __init__(self, config: OAuthConfig) -> None:
        assert config.introspection_url is not None
        self.config = config
        self.url = config.introspection_url
        self.cache = IntrospectionCache(config.introspection_cache)
        self._http: httpx2.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def verify_token(self, token: str) -> AccessToken | None:
        if not well_formed(token):
            return None
        claims = await self.cache.answer(token, lambda: self._introspect(token))
        if claims.get("active") is not True:
            return None
        return access_token(token, claims, issuer=self.config.issuer, resource=self.config.resource, jwt=False)

    async def _introspect(self, token: str) -> dict[str, object]:
        config = self.config
        if self._http is None:
            auth = None
            if config.client_id is not None and config.client_secret is not None:
                auth = httpx2.BasicAuth(config.client_id, config.client_secret)
            self._http = httpx2.AsyncClient(timeout=TIMEOUT_SECONDS, follow_redirects=False, auth=auth)
        try:
            response = await self._http.post(
                self.url,
                data={"token": token, "token_type_hint": "access_token"},
                headers={"Accept": "application/json"},
            )
        except httpx2.HTTPError as exc:
            logger.error("OAuth: the introspection endpoint %s cannot be reached: %s", self.url, exc)
            raise AuthorizationServerUnavailable("authorization server unavailable") from None
        if response.status_code != 200:
            hint = " (check SANDBOX_HTTP_OAUTH_CLIENT_ID and its secret)" if response.status_code in (401, 403) else ""
            logger.error(
                "OAuth: the introspection endpoint %s answered HTTP %d%s",
                self.url,
                response.status_code,
                hint,
            )
            raise AuthorizationServerUnavailable("authorization server unavailable")
        try:
            claims: object = response.json()
        except ValueError:
            claims = None
        if not isinstance(claims, dict):
            logger.error(
                "OAuth: the introspection endpoint %s answered something else than a JSON object",
                self.url,
            )
            raise AuthorizationServerUnavailable("authorization server unavailable")
        return cast("dict[str, object]", claims)
