"""What an OAuth access token's claims must say for it to be served, whichever way they were learned: from the
authorization server's introspection answer (server/oauth.py) or from a JWT whose signature was checked against
its keys (server/jwt_access.py).

Checked here: the issuer (`iss`) is the configured one, the subject (`sub`) is usable as a principal, the token
has not expired (`exp`) and is valid already (`nbf`). The audience (`aud`, this server's URL) goes into
`AccessToken.resource`, which the SDK's bearer middleware compares with the resource URL; the required scopes are
the SDK's too (403 `insufficient_scope`). A JWT must carry `iss`, `exp` and `aud`; an introspection answer may
leave `iss` and `exp` out (the authorization server itself said the token is active).
"""

from __future__ import annotations

import logging
import re
import time
from typing import cast

from mcp.server.auth.provider import AccessToken

logger = logging.getLogger(__name__)

# What a subject may look like to be a principal (it goes into log lines and error texts as it is).
SUBJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+|:-]{0,254}")
# Clocks differ a little between this host and the authorization server: a token just issued is not refused.
LEEWAY_SECONDS = 30


def same_url(one: str, other: str) -> bool:
    return one.rstrip("/") == other.rstrip("/")


def audiences(claims: dict[str, object]) -> list[str]:
    aud = claims.get("aud")
    if isinstance(aud, str):
        return [aud]
    if isinstance(aud, list):
        return [entry for entry in cast("list[object]", aud) if isinstance(entry, str)]
    return []


def _audience(claims: dict[str, object], resource: str) -> str | None:
    """The audience that is this server's resource URL, else the first one (which the SDK then refuses)."""
    named = audiences(claims)
    for audience in named:
        if same_url(audience, resource):
            return audience
    return named[0] if named else None


def number(value: object) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _scopes(claims: dict[str, object]) -> list[str]:
    """RFC 9068's and introspection's `scope` (one string) and the `scp` some servers send (a list or a string)."""
    scopes: list[str] = []
    for name in ("scope", "scp"):
        value = claims.get(name)
        if isinstance(value, str):
            scopes += value.split()
        elif isinstance(value, list):
            scopes += [entry for entry in cast("list[object]", value) if isinstance(entry, str)]
    return scopes


def shown(value: object) -> str:
    """A value from a token's claims, cut short for a log line."""
    return str(value)[:80]


def access_token(token: str, claims: dict[str, object], *, issuer: str, resource: str, jwt: bool) -> AccessToken | None:
    """The SDK's AccessToken for `claims` of a token that `issuer` issued, for `resource` (this server's URL), or
    None (with a warning in the log saying why, never the token)."""
    now, kind = time.time(), "JWT" if jwt else "token"
    claimed = claims.get("iss")
    if (claimed is not None or jwt) and not (isinstance(claimed, str) and same_url(claimed, issuer)):
        logger.warning("OAuth %s refused: issued by %r, not by %s", kind, shown(claimed), issuer)
        return None
    subject = claims.get("sub")
    if not isinstance(subject, str) or not SUBJECT.fullmatch(subject):
        logger.warning(
            "OAuth %s refused: its subject (sub) %s is not usable as a principal (1 to 255 letters, digits "
            "or . _ @ + | : -)",
            kind,
            "is missing" if subject is None else repr(shown(subject)),
        )
        return None
    expires = number(claims.get("exp"))
    not_before = number(claims.get("nbf"))
    if jwt and expires is None:
        logger.warning("OAuth JWT refused: it has no expiry (exp)")
        return None
    if (expires is not None and expires <= now) or (not_before is not None and not_before - LEEWAY_SECONDS > now):
        return None
    audience = _audience(claims, resource)
    if jwt and (audience is None or not same_url(audience, resource)):
        logger.warning("OAuth JWT refused: issued for %r, not for %s", shown(audience), resource)
        return None
    client_id = claims.get("client_id")
    return AccessToken(
        token=token,
        client_id=client_id if isinstance(client_id, str) else subject,
        scopes=_scopes(claims),
        expires_at=expires,
        resource=audience,
        subject=subject,
        claims={"iss": issuer},
    )
