"""The one TokenVerifier the SDK's bearer middleware is given over HTTP: the operator's tokens file, the
authorization server (OAuth), or both.

With both, a token the file holds is its principal's, without asking the authorization server (the file is
checked first, in constant time); any other token is OAuth's: a JWT is checked against the authorization
server's keys where SANDBOX_HTTP_OAUTH_JWKS_URL is set, and any other token (or every token, without that
setting) is introspected. A file's principal and an OAuth subject of the same name are the same principal: they
share sessions, jobs and quotas.
"""

from __future__ import annotations

from mcp.server.auth.provider import AccessToken

from llm_sandbox_mcp.server.bearer_tokens import TokenFile
from llm_sandbox_mcp.server.jwt_access import JwtVerifier, jwt_header
from llm_sandbox_mcp.server.oauth import IntrospectionVerifier, OAuthConfig


def vouched(token: str, principal: str, oauth: OAuthConfig | None) -> AccessToken:
    """The access of a principal the server vouches for (a token of its tokens file, or a replica's peer token):
    whatever an OAuth token would need here (the scopes, this server as its audience), it has."""
    return AccessToken(
        token=token,
        client_id=principal,
        subject=principal,
        scopes=list(oauth.scopes) if oauth else [],
        resource=oauth.resource if oauth else None,
    )


class Verifier:
    def __init__(self, tokens: TokenFile | None, oauth: OAuthConfig | None) -> None:
        self.tokens = tokens
        self.oauth = oauth
        self._introspection = IntrospectionVerifier(oauth) if oauth and oauth.introspection_url else None
        self._jwt = JwtVerifier(oauth) if oauth and oauth.jwks_url else None

    async def aclose(self) -> None:
        if self._introspection is not None:
            await self._introspection.aclose()
        if self._jwt is not None:
            await self._jwt.aclose()

    async def verify_token(self, token: str) -> AccessToken | None:
        if self.tokens is not None:
            principal = self.tokens.principal_of(token)
            if principal is not None:
                return vouched(token, principal, self.oauth)  # the operator's own token
        if self._jwt is not None and jwt_header(token) is not None:
            return await self._jwt.verify_token(token)
        if self._introspection is not None:
            return await self._introspection.verify_token(token)
        return None
