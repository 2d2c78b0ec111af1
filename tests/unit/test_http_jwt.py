"""JWT access tokens checked against the authorization server's keys (SANDBOX_HTTP_OAUTH_JWKS_URL): the server on
loopback under uvicorn (the fake engine behind it), the authorization-server double serving its JWKS and minting
the tokens with `cryptography`, and the key set's fetching rules on a clock the test moves.

The attacks (forged algorithms, keys and claims) are tests/hostile/test_http_jwt.py's.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Generator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.jwks import MAX_AGE_SECONDS, KeySet, signing_keys
from llm_sandbox_mcp.server.oauth import AuthorizationServerUnavailable
from tests.support.authorization_server import (
    CLIENT_ID,
    CLIENT_SECRET,
    AuthorizationServer,
    authorization_server,
    public_jwk,
)
from tests.support.fakes import FakeBackend
from tests.support.http_serving import serving

pytestmark = pytest.mark.anyio

SCOPE = "sandbox:run"
HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
LIST: dict[str, Any] = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {"name": "list_sessions", "arguments": {}},
}


@pytest.fixture
def double() -> Generator[AuthorizationServer]:
    with authorization_server() as server:
        yield server


def jwt_settings(tmp_path: Path, double: AuthorizationServer, port: int, **extra: Any) -> Settings:
    """OAuth by JWKS and by introspection both, as an operator whose server issues both kinds would set it."""
    secret = tmp_path / "client-secret"
    secret.write_text(CLIENT_SECRET + "\n")
    secret.chmod(0o600)
    values: dict[str, Any] = {
        "sandbox_pool_size": 0,
        "sandbox_http_oauth_issuer": double.issuer,
        "sandbox_http_oauth_jwks_url": double.jwks_url,
        "sandbox_http_oauth_introspection_url": double.introspection_url,
        "sandbox_http_oauth_client_id": CLIENT_ID,
        "sandbox_http_oauth_client_secret_file": secret,
        "sandbox_http_oauth_resource": f"http://127.0.0.1:{port}/mcp",
        "sandbox_http_oauth_scopes": SCOPE,
        **extra,
    }
    return Settings(**values)


@asynccontextmanager
async def serving_jwt(tmp_path: Path, double: AuthorizationServer, **extra: Any) -> AsyncGenerator[tuple[str, str]]:
    """Serve until the block ends; yield the /mcp URL and the resource (the audience tokens must name)."""

    def settings_for(port: int) -> Settings:
        return jwt_settings(tmp_path, double, port, **extra)

    async with serving(settings_for, FakeBackend()) as (base, settings):
        yield f"{base}/mcp", settings.sandbox_http_oauth_resource or ""


async def post(url: str, token: str) -> httpx2.Response:
    http = httpx2.AsyncClient()
    async with http:
        return await http.post(url, json=LIST, headers={**HEADERS, "Authorization": f"Bearer {token}"})


async def test_jwts_signed_by_the_servers_keys_are_served_as_their_subject_without_asking_it(
    tmp_path: Path, double: AuthorizationServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "llm_sandbox_mcp.audit")
    with anyio.fail_after(60):
        async with serving_jwt(tmp_path, double) as (url, resource):
            tokens = [
                double.mint("alice", resource, f"openid {SCOPE}", kid="rsa-1"),
                double.mint("alice", [resource, "https://other.example.org/mcp"], SCOPE, kid="rsa-1", alg="PS256"),
                double.mint("alice", resource, "", kid="ec-1", scp=[SCOPE]),  # Entra's and Okta's scope claim
            ]
            for token in tokens * 3:
                response = await post(url, token)
                assert response.status_code == 200, response.text
            opaque = double.issue("bob", resource, SCOPE)
            assert (await post(url, opaque)).status_code == 200
    assert double.introspected == [opaque]  # a JWT is checked here, an opaque token by the authorization server
    assert double.jwks_fetches == 1  # nine JWTs, one fetch of the keys
    assert "call principal=alice tool=list_sessions" in caplog.text
    assert "call principal=bob tool=list_sessions" in caplog.text
    assert all(token not in caplog.text for token in tokens)


async def test_the_jwks_unreachable_at_the_first_token_gives_503(
    tmp_path: Path, double: AuthorizationServer, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(60):
        async with serving_jwt(tmp_path, double) as (url, resource):
            token = double.mint("alice", resource, SCOPE)
            double.jwks_answer = (500, "<html>down</html>")
            response = await post(url, token)
            assert response.status_code == 503, response.text
            assert response.json()["error"] == "temporarily_unavailable"
            double.jwks_answer = None
            response = await post(url, token)  # the next fetch waits SANDBOX_HTTP_OAUTH_JWKS_REFETCH (60 s)
            assert response.status_code == 503
    assert f"OAuth: the JWKS at {double.jwks_url} answered HTTP 500" in caplog.text
    assert double.jwks_fetches == 1


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


async def test_an_unknown_key_id_fetches_the_keys_again_at_most_once_per_refetch_interval(
    double: AuthorizationServer,
) -> None:
    clock = Clock()
    keys = KeySet(double.jwks_url, refetch=60.0, clock=clock)
    try:
        with anyio.fail_after(30):
            first = await keys.key_for("rsa-1")
            assert first is not None and "RS256" in first.algorithms and "PS256" in first.algorithms
            ec_key = await keys.key_for("ec-1")
            assert ec_key is not None and ec_key.algorithms == {"ES256"}
            assert double.jwks_fetches == 1
            for forged in range(200):  # a flood of forged key ids: no request to the authorization server
                assert await keys.key_for(f"forged-{forged}") is None
            assert double.jwks_fetches == 1
            double.keys["ec-2"] = ec.generate_private_key(ec.SECP256R1())  # a rotation
            clock.now += 59.0
            assert await keys.key_for("ec-2") is None
            clock.now += 1.0
            assert await keys.key_for("ec-2") is not None  # the new key, fetched once the interval is over
            assert double.jwks_fetches == 2
            del double.keys["rsa-1"]
            assert await keys.key_for("rsa-1") is not None  # a known key: no fetch before MAX_AGE_SECONDS
            clock.now += MAX_AGE_SECONDS
            assert await keys.key_for("rsa-1") is None  # the keys refreshed: a key withdrawn is gone
            assert double.jwks_fetches == 3
            double.jwks_answer = (200, "not json")
            clock.now += MAX_AGE_SECONDS
            assert await keys.key_for("ec-1") is not None  # a failed refresh keeps the keys in hand
            assert double.jwks_fetches == 4
    finally:
        await keys.aclose()


async def test_a_key_set_never_fetched_is_unavailable_and_fetches_no_more_than_allowed(
    double: AuthorizationServer, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    keys = KeySet(double.jwks_url, refetch=60.0, clock=clock)
    double.jwks_answer = (200, '{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"}]}')
    try:
        with anyio.fail_after(30):
            for _ in range(3):
                with pytest.raises(AuthorizationServerUnavailable):
                    await keys.key_for("hmac")
            assert double.jwks_fetches == 1
            double.jwks_answer = None
            clock.now += 60.0
            assert await keys.key_for("ec-1") is not None
    finally:
        await keys.aclose()
    assert "holds no public signing key this server can use" in caplog.text


def test_only_public_keys_of_asymmetric_algorithms_are_kept(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    ec_jwk = public_jwk("ec", ec.generate_private_key(ec.SECP256R1()))
    private = {**public_jwk("private", ec.generate_private_key(ec.SECP256R1())), "d": "AAAA"}
    document = {
        "keys": [
            ec_jwk,
            {**ec_jwk, "kid": "pinned", "alg": "ES256"},
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
            {**ec_jwk, "kid": "encryption", "use": "enc"},
            {**ec_jwk, "kid": "hs-on-ec", "alg": "HS256"},
            {**ec_jwk, "kid": "secp256k1", "crv": "secp256k1"},
            {**ec_jwk, "kid": "broken", "x": "not-base64!"},
            {"kty": "RSA", "kid": "no-modulus", "e": "AQAB"},
            private,
            "not an object",
        ]
    }
    assert [(key.kid, sorted(key.algorithms)) for key in signing_keys(document)] == [
        ("ec", ["ES256"]),
        ("pinned", ["ES256"]),
    ]
    for kid in ("hmac", "encryption", "hs-on-ec", "secp256k1", "broken", "no-modulus", "private"):
        assert f"key '{kid}' of the JWKS left out" in caplog.text, kid
    assert signing_keys([]) == [] and signing_keys({"keys": "x"}) == []


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (
            {"sandbox_http_oauth_jwks_url": "https://issuer.example.org/jwks"},
            "OAuth needs SANDBOX_HTTP_OAUTH_ISSUER and",
        ),
        ({"sandbox_http_oauth_jwks_url": None}, "OAuth needs SANDBOX_HTTP_OAUTH_INTROSPECTION_URL .* or both"),
        ({"sandbox_http_oauth_jwks_url": "http://issuer.example.org/jwks"}, "JWKS_URL must be https://"),
        ({"sandbox_http_oauth_client_id": "x"}, "CLIENT_ID and SANDBOX_HTTP_OAUTH_CLIENT_SECRET_FILE go together"),
    ],
    ids=["jwks-alone", "no-verifier", "plain-http", "client-id-without-introspection"],
)
def test_jwks_settings_that_cannot_work_are_refused(values: dict[str, Any], problem: str) -> None:
    complete: dict[str, Any] = {
        "sandbox_http_oauth_issuer": "https://issuer.example.org",
        "sandbox_http_oauth_jwks_url": "https://issuer.example.org/jwks",
        "sandbox_http_oauth_resource": "https://sandbox.example.org/mcp",
    }
    if (values.get("sandbox_http_oauth_jwks_url") or "").startswith("https"):
        complete = {}
    with pytest.raises(ValueError, match=problem):
        Settings(**{**complete, **values})


def test_credentials_without_an_introspection_endpoint_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="CLIENT_ID is set without SANDBOX_HTTP_OAUTH_INTROSPECTION_URL"):
        Settings(
            sandbox_http_oauth_issuer="https://issuer.example.org",
            sandbox_http_oauth_jwks_url="https://issuer.example.org/jwks",
            sandbox_http_oauth_resource="https://sandbox.example.org/mcp",
            sandbox_http_oauth_client_id="sandbox-mcp",
            sandbox_http_oauth_client_secret_file=tmp_path / "secret",
        )
