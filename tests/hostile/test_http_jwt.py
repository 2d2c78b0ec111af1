"""Forged and misused JWT access tokens against `serve --http` configured with the authorization server's JWKS: every
one gets 401 with the Bearer challenge (never a 200, a 500 or a traceback), none reaches a tool, none is written
to the log, and no number of forged key ids makes the server fetch the keys more than once per
SANDBOX_HTTP_OAUTH_JWKS_REFETCH.

The attack is on the HTTP face, not on a sandbox: the fake engine stands behind it, so the tier's host check
(which counts sandbox processes) has nothing to check here; that every tool call was refused is checked instead
(the audit log has no line).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Generator
from pathlib import Path

import anyio
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.support.authorization_server import AuthorizationServer, authorization_server, public_jwk, public_pem
from tests.unit.test_http_jwt import SCOPE, post, serving_jwt

pytestmark = pytest.mark.anyio

Forgery = Callable[[AuthorizationServer, str], str]


@pytest.fixture(autouse=True)
def host_unharmed() -> None:
    """No sandbox is made (the fake engine): the tier's check of sandbox processes does not apply."""


@pytest.fixture
def double() -> Generator[AuthorizationServer]:
    with authorization_server() as server:
        yield server


def _tampered(double: AuthorizationServer, resource: str) -> str:
    """A genuine token of mallory's whose payload is swapped for one naming alice, the signature kept."""
    header, _payload, signature = double.mint("mallory", resource, SCOPE).split(".")
    claims = double.claims("alice", resource, SCOPE)
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{payload}.{signature}"


def _own_key(double: AuthorizationServer, resource: str) -> str:
    """Signed with the attacker's own key under the genuine key's id."""
    return double.mint("alice", resource, SCOPE, kid="rsa-1", key=rsa.generate_private_key(65537, 2048))


def _embedded_jwk(double: AuthorizationServer, resource: str) -> str:
    """Signed with the attacker's key, which the header carries itself (`jwk`) for a careless verifier to trust."""
    mine = ec.generate_private_key(ec.SECP256R1())
    return double.mint("alice", resource, SCOPE, kid=None, key=mine, header={"jwk": public_jwk("mine", mine)})


FORGERIES: dict[str, Forgery] = {
    "alg-none": lambda d, r: d.mint("alice", r, SCOPE, alg="none"),
    "alg-none-no-kid": lambda d, r: d.mint("alice", r, SCOPE, alg="none", kid=None),
    "hs256-keyed-with-the-public-pem": lambda d, r: d.mint(
        "alice", r, SCOPE, alg="HS256", key=public_pem(d.keys["rsa-1"])
    ),
    "hs256-keyed-with-the-public-jwk": lambda d, r: d.mint(
        "alice", r, SCOPE, alg="HS256", key=json.dumps(public_jwk("rsa-1", d.keys["rsa-1"])).encode()
    ),
    "rs256-claimed-by-an-ec-key": lambda d, r: d.mint("alice", r, SCOPE, kid="ec-1", alg="RS256", key=d.keys["rsa-1"]),
    "unknown-kid": lambda d, r: d.mint("alice", r, SCOPE, kid="forged-kid"),
    "own-key-under-the-genuine-kid": _own_key,
    "own-key-in-the-header": _embedded_jwk,
    "tampered-payload": _tampered,
    "expired": lambda d, r: d.mint("alice", r, SCOPE, exp=int(time.time()) - 60),
    "no-expiry": lambda d, r: d.mint("alice", r, SCOPE, exp=None),
    "not-yet-valid": lambda d, r: d.mint("alice", r, SCOPE, nbf=int(time.time()) + 3600),
    "wrong-audience": lambda d, r: d.mint("alice", "https://other.example.org/mcp", SCOPE),
    "no-audience": lambda d, r: d.mint("alice", None, SCOPE),
    "wrong-issuer": lambda d, r: d.mint("alice", r, SCOPE, iss="https://issuer.example.org"),
    "no-issuer": lambda d, r: d.mint("alice", r, SCOPE, iss=None),
    "no-subject": lambda d, r: d.mint(None, r, SCOPE),
    "critical-extension": lambda d, r: d.mint("alice", r, SCOPE, header={"crit": ["exp"], "exp": 1}),
    "unencoded-payload": lambda d, r: d.mint("alice", r, SCOPE, header={"b64": False, "crit": ["b64"]}),
    "huge": lambda d, r: d.mint("alice", r, SCOPE, padding="x" * 9000),
    "huge-header": lambda d, r: d.mint("alice", r, SCOPE, header={"x5c": ["A" * 9000]}),
    "four-parts": lambda d, r: d.mint("alice", r, SCOPE) + ".AAAA",
    "signature-stripped": lambda d, r: d.mint("alice", r, SCOPE).rsplit(".", 1)[0] + ".",
}


async def test_each_forged_or_misused_jwt_gets_401_and_reaches_no_tool(
    tmp_path: Path, double: AuthorizationServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "llm_sandbox_mcp")
    with anyio.fail_after(120):
        async with serving_jwt(tmp_path, double) as (url, resource):
            genuine = double.mint("alice", resource, SCOPE)
            assert (await post(url, genuine)).status_code == 200  # the keys are in hand
            audited = caplog.text.count("call principal=")
            forged = {name: forge(double, resource) for name, forge in FORGERIES.items()}
            for name, token in forged.items():
                response = await post(url, token)
                assert response.status_code == 401, (name, response.status_code, response.text)
                challenge = response.headers["www-authenticate"]
                assert challenge.startswith("Bearer ") and 'error="invalid_token"' in challenge, name
                assert "resource_metadata=" in challenge, name
                assert "Traceback" not in response.text and "sessions" not in response.text, name
    assert caplog.text.count("call principal=") == audited
    assert "Traceback" not in caplog.text
    for name, token in forged.items():
        signature = token.split(".")[-1]
        assert token not in caplog.text and (not signature or signature not in caplog.text), name
    # Shaped as JWTs, they were never sent to the authorization server; four parts are no JWT: introspected.
    assert double.introspected == [forged["four-parts"]]
    assert double.jwks_fetches == 1  # the unknown kid came within SANDBOX_HTTP_OAUTH_JWKS_REFETCH of the first


async def test_a_flood_of_forged_key_ids_costs_the_authorization_server_one_request(
    tmp_path: Path, double: AuthorizationServer
) -> None:
    with anyio.fail_after(120):
        async with serving_jwt(tmp_path, double) as (url, resource):
            for index in range(50):
                token = double.mint("alice", resource, SCOPE, kid=f"forged-{index}")
                assert (await post(url, token)).status_code == 401
            assert (await post(url, double.mint("alice", resource, SCOPE))).status_code == 200
    assert double.jwks_fetches == 1
