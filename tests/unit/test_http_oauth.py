"""OAuth 2.1 over HTTP: the server as a protected resource of an authorization server double on loopback, served
by uvicorn on loopback (the fake engine behind it), called by the official SDK client and by plain HTTP.

Each refusal must be 401 (or 403 for a missing scope) with the Bearer challenge pointing at the resource
metadata, and the authorization server being unreachable or broken must be 503: never a 200, never a traceback.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.server.http import check_authentication, parse_listen
from llm_sandbox_mcp.server.introspection_cache import IntrospectionCache
from tests.support.authorization_server import CLIENT_ID, CLIENT_SECRET, AuthorizationServer, authorization_server
from tests.support.fakes import FakeBackend
from tests.support.http_serving import serving

pytestmark = pytest.mark.anyio

SCOPE = "sandbox:run"
FILE_TOKEN = "file-token-" + "7a" * 16
HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
LIST: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}


@dataclass
class Served:
    url: str
    resource: str
    double: AuthorizationServer

    @property
    def metadata_url(self) -> str:
        return self.url.removesuffix("/mcp") + "/.well-known/oauth-protected-resource/mcp"


@pytest.fixture
def double() -> Generator[AuthorizationServer]:
    with authorization_server() as server:
        yield server


def _settings(tmp_path: Path, double: AuthorizationServer, port: int, **extra: Any) -> Settings:
    secret = tmp_path / "client-secret"
    secret.write_text(CLIENT_SECRET + "\n")
    secret.chmod(0o600)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {FILE_TOKEN}\n")
    tokens.chmod(0o600)
    values: dict[str, Any] = {
        "sandbox_pool_size": 0,
        "sandbox_http_tokens_file": tokens,
        "sandbox_http_oauth_issuer": double.issuer,
        "sandbox_http_oauth_introspection_url": double.introspection_url,
        "sandbox_http_oauth_resource": f"http://127.0.0.1:{port}/mcp",
        "sandbox_http_oauth_scopes": SCOPE,
        "sandbox_http_oauth_client_id": CLIENT_ID,
        "sandbox_http_oauth_client_secret_file": secret,
        **extra,
    }
    return Settings(**values)


@asynccontextmanager
async def _serving(tmp_path: Path, double: AuthorizationServer, **extra: Any) -> AsyncGenerator[Served]:
    def settings_for(port: int) -> Settings:
        return _settings(tmp_path, double, port, **extra)

    async with serving(settings_for, FakeBackend()) as (base, settings):
        yield Served(f"{base}/mcp", settings.sandbox_http_oauth_resource or "", double)


async def _post(served: Served, token: str | None, authorization: bytes | None = None) -> httpx2.Response:
    headers: list[tuple[bytes, bytes]] = [(name.encode(), value.encode()) for name, value in HEADERS.items()]
    if token is not None:
        authorization = f"Bearer {token}".encode()
    if authorization is not None:
        headers.append((b"Authorization", authorization))
    http = httpx2.AsyncClient()
    async with http:
        return await http.post(served.url, json=LIST, headers=headers)


@asynccontextmanager
async def _client(served: Served, token: str) -> AsyncGenerator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(served.url, http_client=http)) as client:
        yield client


def _sessions(result: Any) -> list[str]:
    assert not result.is_error
    return [session["session_id"] for session in result.structured_content["sessions"]]


async def test_a_valid_token_is_served_as_its_subject_and_a_file_token_of_that_name_is_the_same_principal(
    tmp_path: Path, double: AuthorizationServer
) -> None:
    with anyio.fail_after(60):
        async with _serving(tmp_path, double) as served:
            alice = double.issue("alice", served.resource, f"openid {SCOPE}")
            bob = double.issue("bob", [served.resource, "https://other.example.org/mcp"], SCOPE)
            async with _client(served, alice) as client:
                created = await client.call_tool("create_session", {})
                assert not created.is_error, created.content
                assert created.structured_content is not None
                session_id = created.structured_content["session_id"]
            async with _client(served, bob) as client:
                assert _sessions(await client.call_tool("list_sessions", {})) == []
            async with _client(served, FILE_TOKEN) as client:
                assert _sessions(await client.call_tool("list_sessions", {})) == [session_id]
            assert alice in double.introspected and bob in double.introspected
            assert FILE_TOKEN not in double.introspected  # the file's token never leaves this server


def _challenge(response: httpx2.Response, served: Served, status: int, error: str) -> None:
    assert response.status_code == status, response.text
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith("Bearer ") and f'error="{error}"' in challenge, challenge
    assert f'resource_metadata="{served.metadata_url}"' in challenge, challenge
    assert "execute_code" not in response.text and "Traceback" not in response.text


REFUSED: dict[str, dict[str, Any]] = {
    "expired": {"exp": int(time.time()) - 120},
    "not-yet-valid": {"nbf": int(time.time()) + 3600},
    "wrong-audience": {"aud": "https://other.example.org/mcp"},
    "no-audience": {"aud": None},
    "wrong-issuer": {"iss": "https://issuer.example.org"},
    "no-subject": {"sub": None},
    "unusable-subject": {"sub": "alice bob\n"},
}


async def test_each_bad_token_gets_401_or_403_with_the_challenge(
    tmp_path: Path, double: AuthorizationServer, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(60):
        # No cache of answers: a revoked token is refused on its very next request.
        async with _serving(tmp_path, double, sandbox_http_oauth_introspection_cache=0) as served:
            for case, claims in REFUSED.items():
                token = double.issue("carol", served.resource, SCOPE, **claims)
                _challenge(await _post(served, token), served, 401, "invalid_token")
                assert token not in caplog.text, case
            revoked = double.issue("carol", served.resource, SCOPE)
            assert (await _post(served, revoked)).status_code == 200
            double.revoke(revoked)
            _challenge(await _post(served, revoked), served, 401, "invalid_token")
            _challenge(await _post(served, "never-issued-" + "9f" * 16), served, 401, "invalid_token")
            _challenge(await _post(served, None), served, 401, "invalid_token")
            asked = len(double.introspected)
            for malformed in (b"Bearer two words", "Bearer ünïcode".encode(), b"Bearer " + b"a" * 9000, b"Bearer"):
                _challenge(await _post(served, None, malformed), served, 401, "invalid_token")
            assert len(double.introspected) == asked  # not even sent to the authorization server
            missing_scope = double.issue("carol", served.resource, "openid")
            _challenge(await _post(served, missing_scope), served, 403, "insufficient_scope")


@pytest.mark.parametrize("seconds", [30.0, 0.0], ids=["cached", "not-cached"])
async def test_one_tokens_requests_in_a_row_cost_one_introspection_while_the_answer_is_kept(
    tmp_path: Path, double: AuthorizationServer, caplog: pytest.LogCaptureFixture, seconds: float
) -> None:
    with anyio.fail_after(60):
        async with _serving(tmp_path, double, sandbox_http_oauth_introspection_cache=seconds) as served:
            alice = double.issue("alice", served.resource, SCOPE)
            for _ in range(5):
                assert (await _post(served, alice)).status_code == 200
            unknown = "never-issued-" + "8e" * 16
            for _ in range(2):
                assert (await _post(served, unknown)).status_code == 401
            expired = double.issue("alice", served.resource, SCOPE, exp=int(time.time()) - 1)
            for _ in range(2):
                assert (await _post(served, expired)).status_code == 401
    # An answer that a token is not active, or about an expired one, is never kept.
    assert double.introspected == [alice] * (1 if seconds else 5) + [unknown] * 2 + [expired] * 2
    assert alice not in caplog.text


async def test_requests_with_one_new_token_at_the_same_time_share_one_introspection(
    tmp_path: Path, double: AuthorizationServer
) -> None:
    double.delay = 0.5  # the first question is still out when the others come
    with anyio.fail_after(60):
        async with _serving(tmp_path, double) as served:
            alice = double.issue("alice", served.resource, SCOPE)
            statuses: list[int] = []

            async def call() -> None:
                statuses.append((await _post(served, alice)).status_code)

            async with anyio.create_task_group() as tasks:
                for _ in range(5):
                    tasks.start_soon(call)
    assert statuses == [200] * 5
    assert double.introspected == [alice]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_an_answer_is_kept_no_longer_than_the_setting_or_the_tokens_expiry_and_never_by_its_token() -> None:
    clock, wall = Clock(100.0), Clock(1_000_000.0)
    cache = IntrospectionCache(30.0, clock, wall, max_entries=3)
    long_lived: dict[str, object] = {"active": True, "sub": "alice", "exp": 1_000_000 + 3600}
    short_lived: dict[str, object] = {"active": True, "sub": "bob", "exp": 1_000_000 + 10}
    cache.put("long-" + "1" * 32, long_lived)
    cache.put("short-" + "2" * 32, short_lived)
    cache.put("inactive-" + "3" * 32, {"active": False})
    cache.put("expired-" + "4" * 32, {"active": True, "sub": "carol", "exp": 1_000_000 - 1})
    assert len(cache) == 2
    assert cache.get("long-" + "1" * 32) == long_lived and cache.get("short-" + "2" * 32) == short_lived
    assert "long-" not in repr(vars(cache)) and "1" * 32 not in repr(vars(cache))  # kept by digest only
    clock.now += 10.0
    assert cache.get("short-" + "2" * 32) is None  # its expiry came first
    assert cache.get("long-" + "1" * 32) == long_lived
    clock.now += 20.0
    assert cache.get("long-" + "1" * 32) is None  # the setting's 30 seconds
    for index in range(5):
        cache.put(f"token-{index}-" + "5" * 32, long_lived)
    assert len(cache) == 3 and cache.get("token-0-" + "5" * 32) is None and cache.get("token-4-" + "5" * 32)
    off = IntrospectionCache(0.0, clock, wall)
    off.put("long-" + "1" * 32, long_lived)
    assert len(off) == 0


@pytest.mark.parametrize("fault", ["down", "500", "html", "wrong-client-secret"])
async def test_an_authorization_server_that_cannot_answer_gives_503_and_serves_nothing(
    tmp_path: Path, double: AuthorizationServer, caplog: pytest.LogCaptureFixture, fault: str
) -> None:
    extra: dict[str, Any] = {}
    if fault == "wrong-client-secret":
        wrong = tmp_path / "wrong-secret"
        wrong.write_text("not-the-secret")
        wrong.chmod(0o600)
        extra["sandbox_http_oauth_client_secret_file"] = wrong
    with anyio.fail_after(60):
        async with _serving(tmp_path, double, **extra) as served:
            token = double.issue("carol", served.resource, SCOPE)
            if fault == "down":
                double.stop()
            elif fault == "500":
                double.failing = 500
            elif fault == "html":
                double.failing, double.failing_body = 200, "<html>a login page</html>"
            response = await _post(served, token)
            assert response.status_code == 503, response.text
            assert response.headers["retry-after"].isdigit()
            assert response.json()["error"] == "temporarily_unavailable"
            assert "Traceback" not in response.text and "execute_code" not in response.text
            # The file's tokens are still served while the authorization server is away.
            assert (await _post(served, FILE_TOKEN)).status_code == 200
    assert "Traceback" not in caplog.text and token not in caplog.text
    assert "OAuth: the introspection endpoint" in caplog.text
    if fault == "wrong-client-secret":
        assert "check SANDBOX_HTTP_OAUTH_CLIENT_ID and its secret" in caplog.text


async def test_the_protected_resource_metadata_is_served_where_clients_look(
    tmp_path: Path, double: AuthorizationServer
) -> None:
    with anyio.fail_after(60):
        async with _serving(tmp_path, double) as served:
            root = served.url.removesuffix("/mcp") + "/.well-known/oauth-protected-resource"
            http = httpx2.AsyncClient()
            async with http:
                for url in (served.metadata_url, root):
                    response = await http.get(url)
                    assert response.status_code == 200, url
                    metadata = response.json()
                    assert metadata["resource"] == served.resource
                    assert [issuer.rstrip("/") for issuer in metadata["authorization_servers"]] == [double.issuer]
                    assert metadata["scopes_supported"] == [SCOPE]


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"sandbox_http_oauth_issuer": "https://issuer.example.org"}, "OAuth needs SANDBOX_HTTP_OAUTH_RESOURCE too"),
        ({"sandbox_http_oauth_scopes": "a"}, "SANDBOX_HTTP_OAUTH_SCOPES is set without"),
        ({"sandbox_http_oauth_resource": "http://sandbox.example.org/mcp"}, "must be https://"),
        ({"sandbox_http_oauth_resource": "https://sandbox.example.org/"}, "must be the URL clients use for"),
        ({"sandbox_http_oauth_client_id": None}, "go together"),
    ],
    ids=["partial", "scopes-alone", "plain-http", "not-mcp", "id-without-secret"],
)
def test_incomplete_or_unsafe_oauth_settings_are_refused(tmp_path: Path, values: dict[str, Any], problem: str) -> None:
    complete: dict[str, Any] = {
        "sandbox_http_oauth_issuer": "https://issuer.example.org",
        "sandbox_http_oauth_introspection_url": "https://issuer.example.org/introspect",
        "sandbox_http_oauth_resource": "https://sandbox.example.org/mcp",
        "sandbox_http_oauth_client_id": "sandbox-mcp",
        "sandbox_http_oauth_client_secret_file": tmp_path / "secret",
    }
    if "sandbox_http_oauth_issuer" in values or "sandbox_http_oauth_scopes" in values:
        complete = {}
    with pytest.raises(ValueError, match=problem):
        Settings(**{**complete, **values})


def test_a_client_secret_file_others_can_read_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text(CLIENT_SECRET)
    secret.chmod(0o644)
    settings = Settings(
        sandbox_http_oauth_issuer="https://issuer.example.org",
        sandbox_http_oauth_introspection_url="https://issuer.example.org/introspect",
        sandbox_http_oauth_resource="https://sandbox.example.org/mcp",
        sandbox_http_oauth_client_id="sandbox-mcp",
        sandbox_http_oauth_client_secret_file=secret,
    )
    with pytest.raises(ConfigError, match=r"readable by every user of this host; make it private") as refused:
        check_authentication(settings, parse_listen("0.0.0.0:8000"), unauthenticated_loopback=False)
    assert CLIENT_SECRET not in str(refused.value)


def test_oauth_alone_is_authentication_enough_to_listen_beyond_loopback() -> None:
    settings = Settings(
        sandbox_http_oauth_issuer="https://issuer.example.org",
        sandbox_http_oauth_introspection_url="https://issuer.example.org/introspect",
        sandbox_http_oauth_resource="https://sandbox.example.org/mcp",
    )
    authentication = check_authentication(settings, parse_listen("0.0.0.0:8000"), unauthenticated_loopback=False)
    assert authentication.tokens is None and authentication.oauth is not None
