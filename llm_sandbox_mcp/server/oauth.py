"""OAuth 2.1 as a protected resource (the MCP authorization spec): access tokens issued by the operator's
authorization server, verified by asking it (token introspection, RFC 7662), as the MCP SDK's TokenVerifier.

Introspection rather than JWTs checked against the issuer's keys: the SDK's own resource-server example
verifies by introspection, it works for opaque tokens and JWTs alike, and a token the authorization server
revoked is refused on its next request instead of at its expiry. The cost is one request to the authorization
server per HTTP request (no cache: a cache would be exactly the delay in revocation that introspection avoids).

What this verifier checks: the token is active, was issued by the configured issuer (`iss`, when the answer
carries it), has not expired (`exp`) and is already valid (`nbf`), and names a subject (`sub`, the principal).
The audience (`aud`, this server's URL) goes into `AccessToken.resource`, which the SDK's bearer middleware
compares with the resource URL; the required scopes are the SDK's too (403 `insufficient_scope`).
"""

from __future__ import annotations

import logging
import re
import stat
import time
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

logger = logging.getLogger(__name__)

# RFC 6750's b64token: anything else is no access token, and is not sent to the authorization server.
_B64TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
MAX_TOKEN_LENGTH = 8192
# What a subject may look like to be a principal (it goes into log lines and error texts as it is).
SUBJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+|:-]{0,254}")
TIMEOUT_SECONDS = 5.0
RETRY_AFTER_SECONDS = 5
# Clocks differ a little between this host and the authorization server: a token just issued is not refused.
LEEWAY_SECONDS = 30


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
    introspection_url: str
    resource: str
    scopes: tuple[str, ...]
    client_id: str | None = None
    client_secret: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> OAuthConfig | None:
        """The OAuth settings, or None where OAuth is not configured (config.py checked their shape)."""
        if settings.sandbox_http_oauth_issuer is None:
            return None
        assert settings.sandbox_http_oauth_introspection_url is not None
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


def _same_url(one: str, other: str) -> bool:
    return one.rstrip("/") == other.rstrip("/")


def _audience(claims: dict[str, object], resource: str) -> str | None:
    """The audience that is this server's resource URL, else the first one (which the SDK then refuses)."""
    aud = claims.get("aud")
    audiences: list[str] = []
    if isinstance(aud, str):
        audiences = [aud]
    elif isinstance(aud, list):
        audiences = [entry for entry in cast("list[object]", aud) if isinstance(entry, str)]
    for audience in audiences:
        if _same_url(audience, resource):
            return audience
    return audiences[0] if audiences else None


def _number(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class IntrospectionVerifier:
    """The SDK's TokenVerifier over the authorization server's introspection endpoint."""

    def __init__(self, config: OAuthConfig) -> None:
        self.config = config
        self._http: httpx2.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def verify_token(self, token: str) -> AccessToken | None:
        if len(token) > MAX_TOKEN_LENGTH or not _B64TOKEN.fullmatch(token):
            return None
        claims = await self._introspect(token)
        if claims.get("active") is not True:
            return None
        return self._access(token, claims)

    def _access(self, token: str, claims: dict[str, object]) -> AccessToken | None:
        config, now = self.config, time.time()
        issuer = claims.get("iss")
        if issuer is not None and not (isinstance(issuer, str) and _same_url(issuer, config.issuer)):
            logger.warning("OAuth token refused: issued by %r, not by %s", _shown(issuer), config.issuer)
            return None
        subject = claims.get("sub")
        if not isinstance(subject, str) or not SUBJECT.fullmatch(subject):
            logger.warning(
                "OAuth token refused: its subject (sub) %s is not usable as a principal (1 to 255 letters, digits "
                "or . _ @ + | : -)",
                "is missing" if subject is None else repr(_shown(subject)),
            )
            return None
        expires = _number(claims.get("exp"))
        not_before = _number(claims.get("nbf"))
        if (expires is not None and expires <= now) or (not_before is not None and not_before - LEEWAY_SECONDS > now):
            return None
        scope = claims.get("scope")
        client_id = claims.get("client_id")
        return AccessToken(
            token=token,
            client_id=client_id if isinstance(client_id, str) else subject,
            scopes=scope.split() if isinstance(scope, str) else [],
            expires_at=expires,
            resource=_audience(claims, config.resource),
            subject=subject,
            claims={"iss": config.issuer},
        )

    async def _introspect(self, token: str) -> dict[str, object]:
        config = self.config
        if self._http is None:
            auth = None
            if config.client_id is not None and config.client_secret is not None:
                auth = httpx2.BasicAuth(config.client_id, config.client_secret)
            self._http = httpx2.AsyncClient(timeout=TIMEOUT_SECONDS, follow_redirects=False, auth=auth)
        try:
            response = await self._http.post(
                config.introspection_url,
                data={"token": token, "token_type_hint": "access_token"},
                headers={"Accept": "application/json"},
            )
        except httpx2.HTTPError as exc:
            logger.error("OAuth: the introspection endpoint %s cannot be reached: %s", config.introspection_url, exc)
            raise AuthorizationServerUnavailable("authorization server unavailable") from None
        if response.status_code != 200:
            hint = " (check SANDBOX_HTTP_OAUTH_CLIENT_ID and its secret)" if response.status_code in (401, 403) else ""
            logger.error(
                "OAuth: the introspection endpoint %s answered HTTP %d%s",
                config.introspection_url,
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
                config.introspection_url,
            )
            raise AuthorizationServerUnavailable("authorization server unavailable")
        return cast("dict[str, object]", claims)


def _shown(value: object) -> str:
    """A value from a token's claims, cut short for a log line."""
    return str(value)[:80]
