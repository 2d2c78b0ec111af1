"""JWT access tokens (RFC 9068) checked here against the authorization server's keys (server/jwks.py), as the MCP
SDK's TokenVerifier, without a request to the authorization server per token.

The header must name an asymmetric algorithm that the key its `kid` names may verify (never `none`, never an
HMAC: a token "signed" with the public key as an HMAC secret is refused before any check), and no critical
extension; PyJWT checks the signature; the claims are then checked as an introspection answer's are, but
stricter (server/token_claims.py: `iss`, `exp` and an audience required). The cost of not asking: a token
revoked at the authorization server works until it expires.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import cast

import jwt
from mcp.server.auth.provider import AccessToken

from llm_sandbox_mcp.server.jwks import ASYMMETRIC, KeySet
from llm_sandbox_mcp.server.oauth import OAuthConfig, well_formed
from llm_sandbox_mcp.server.token_claims import access_token, shown

logger = logging.getLogger(__name__)


def _segment(text: str) -> object:
    """A JWT's base64url JSON part, or None."""
    try:
        return json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, binascii.Error):
        return None


def jwt_header(token: str) -> dict[str, object] | None:
    """The header of a token shaped as a JWS in compact form (three parts, a JSON object first), else None."""
    if not well_formed(token):
        return None
    parts = token.split(".")
    if len(parts) != 3:
        return None
    header = _segment(parts[0])
    return cast("dict[str, object]", header) if isinstance(header, dict) else None


class JwtVerifier:
    """The SDK's TokenVerifier for JWT access tokens signed by the keys at SANDBOX_HTTP_OAUTH_JWKS_URL."""

    def __init__(self, config: OAuthConfig) -> None:
        assert config.jwks_url is not None
        self.config = config
        self.keys = KeySet(config.jwks_url, config.jwks_refetch)

    async def aclose(self) -> None:
        await self.keys.aclose()

    async def verify_token(self, token: str) -> AccessToken | None:
        header = jwt_header(token)
        if header is None:
            return None
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg not in ASYMMETRIC:
            logger.warning(
                "OAuth JWT refused: its algorithm %r is not one of %s", shown(alg), ", ".join(sorted(ASYMMETRIC))
            )
            return None
        if "crit" in header or (kid is not None and not isinstance(kid, str)):
            logger.warning("OAuth JWT refused: a critical header extension (crit), or a key id that is not a string")
            return None
        key = await self.keys.key_for(kid)
        if key is None:
            named = "names no key (kid), and the keys are several" if kid is None else f"no key {shown(kid)!r}"
            logger.warning("OAuth JWT refused: %s at %s", named, self.keys.url)
            return None
        if alg not in key.algorithms:
            logger.warning("OAuth JWT refused: key %r does not sign with %s", shown(kid), alg)
            return None
        try:
            payload = jwt.api_jws.decode(token, key.jwk.key, algorithms=[alg])
        except jwt.PyJWTError as exc:
            logger.warning("OAuth JWT refused: %s", shown(exc))
            return None
        try:
            claims: object = json.loads(payload)
        except ValueError:
            claims = None
        if not isinstance(claims, dict):
            logger.warning("OAuth JWT refused: its payload is not a JSON object")
            return None
        return access_token(
            token, cast("dict[str, object]", claims), issuer=self.config.issuer, resource=self.config.resource, jwt=True
        )
