"""`serve --http` as an OAuth protected resource, configured as an operator does (the environment), the
installed console script on bubblewrap, against the authorization-server double on loopback: a token the
double issued runs code through the official SDK client, and a JWT it signed is served by its keys (the
JWKS); one issued for another server gets the challenge that points at the resource metadata the server
serves. The unit tier covers each refusal in-process
(tests/unit/test_http_oauth.py); this proves the command line and the environment wire the same thing, which
is worth its 8 seconds or so (the server's start and one call on bubblewrap)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.e2e.test_http import _environment, _free_port  # pyright: ignore[reportPrivateUsage]
from tests.e2e.test_stdio import SCRIPT
from tests.engines.conftest import require_now
from tests.support.authorization_server import CLIENT_ID, CLIENT_SECRET, AuthorizationServer, authorization_server
from tests.support.protocol import structured_of

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.bubblewrap]


@dataclass
class Served:
    base: str
    log: Path
    double: AuthorizationServer


@pytest.fixture
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Generator[Served]:
    require_now(request, "bubblewrap")
    secret = tmp_path / "secret"
    secret.write_text(CLIENT_SECRET + "\n")
    secret.chmod(0o600)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with authorization_server() as double:
        env = _environment(
            SANDBOX_HTTP_OAUTH_ISSUER=double.issuer,
            SANDBOX_HTTP_OAUTH_INTROSPECTION_URL=double.introspection_url,
            SANDBOX_HTTP_OAUTH_RESOURCE=f"{base}/mcp",
            SANDBOX_HTTP_OAUTH_SCOPES="sandbox:run,sandbox:files",
            SANDBOX_HTTP_OAUTH_CLIENT_ID=CLIENT_ID,
            SANDBOX_HTTP_OAUTH_CLIENT_SECRET_FILE=str(secret),
            SANDBOX_HTTP_OAUTH_JWKS_URL=double.jwks_url,
        )
        log = tmp_path / "server.log"
        with log.open("wb") as err:
            server = subprocess.Popen(
                [SCRIPT, "serve", "--http", f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL, stderr=err
            )
        try:
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None, log.read_text()
                try:
                    if httpx2.get(f"{base}/healthz").status_code == 200:
                        break
                except httpx2.TransportError:
                    pass
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            yield Served(base, log, double)
        finally:
            server.terminate()
            server.wait(timeout=60)


async def test_an_operator_configured_oauth_server_serves_its_tokens_and_challenges_others(served: Served) -> None:
    base, double = served.base, served.double
    token = double.issue("dana", f"{base}/mcp", "sandbox:run sandbox:files")
    elsewhere = double.issue("dana", "https://other.example.org/mcp", "sandbox:run sandbox:files")
    with anyio.fail_after(120):
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
            result = structured_of(await client.call_tool("execute_code", {"code": "print(6 * 7)"}))
            assert result["stdout"] == "42\n"
        # A JWT of the same authorization server: checked against its keys, never introspected.
        signed = double.mint("erin", f"{base}/mcp", "sandbox:run sandbox:files")
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {signed}"})
        async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
            assert structured_of(await client.call_tool("list_sessions", {}))["sessions"] == []
        plain = httpx2.AsyncClient()
        async with plain:
            refused = await plain.post(f"{base}/mcp", json={}, headers={"Authorization": f"Bearer {elsewhere}"})
            metadata = (await plain.get(f"{base}/.well-known/oauth-protected-resource/mcp")).json()
    assert refused.status_code == 401
    challenge = refused.headers["www-authenticate"]
    assert f'resource_metadata="{base}/.well-known/oauth-protected-resource/mcp"' in challenge, challenge
    assert metadata["resource"] == f"{base}/mcp"
    assert metadata["scopes_supported"] == ["sandbox:run", "sandbox:files"]
    text = served.log.read_text()
    assert "call principal=dana tool=execute_code language=python" in text
    assert "call principal=erin tool=list_sessions" in text and signed not in double.introspected
    assert token not in text and elsewhere not in text and signed not in text and CLIENT_SECRET not in text
