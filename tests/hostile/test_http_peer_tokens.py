"""Forged principals against a replica's HTTP face: a client that asserts someone else's principal, by a peer
token signed with a wrong secret, made for another replica, replayed after its time, or by headers of its own
beside its own token, is refused or stays who its token says; and a call that came from a replica is never sent
on to a third (no forwarding loop), even with a good peer token.

The attack is on the HTTP face, not on a sandbox: the fake engine stands behind it (as in
test_http_slow_clients.py), so the tier's host check of sandbox processes is replaced by what each answer shows.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.peers import WINDOW, Peers
from tests.support.fakes import FakeBackend
from tests.support.http_serving import serving

pytestmark = pytest.mark.anyio

SECRET = b"peer-secret-" + b"5e" * 16
TOKENS = {"alice": "alice-token-" + "1a" * 16, "bob": "bob-token-" + "2b" * 16}
HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
# Headers a proxy or a client might use to name a user: none of them means anything to the server.
CLAIMS = {
    "X-Forwarded-User": "bob",
    "X-Remote-User": "bob",
    "X-Principal": "bob",
    "X-Llm-Sandbox-Principal": "bob",
    "X-Forwarded-Access-Token": TOKENS["bob"],
}


@pytest.fixture(autouse=True)
def host_unharmed() -> None:
    """No sandbox is made (the fake engine): the tier's check of sandbox processes does not apply."""


@asynccontextmanager
async def _replica(tmp_path: Path) -> AsyncGenerator[tuple[str, str]]:
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{who} {token}\n" for who, token in TOKENS.items()))
    tokens.chmod(0o600)
    secret = tmp_path / "peer-secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)

    def settings_for(port: int) -> Settings:
        return Settings(
            sandbox_pool_size=0,
            sandbox_http_tokens_file=tokens,
            sandbox_http_replica_id=str(port),
            sandbox_http_peer_url="http://127.0.0.1:{replica}",
            sandbox_http_peer_secret_file=secret,
        )

    async with serving(settings_for, FakeBackend()) as (base, _settings):
        yield f"{base}/mcp", base.rsplit(":", 1)[1]


async def _call(url: str, token: str, tool: str, arguments: dict[str, Any], **extra: str) -> httpx2.Response:
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    http = httpx2.AsyncClient()
    async with http:
        return await http.post(url, json=request, headers={**HEADERS, **extra, "Authorization": f"Bearer {token}"})


async def test_a_principal_is_never_taken_from_a_forged_peer_token_or_a_header(tmp_path: Path) -> None:
    async with _replica(tmp_path) as (url, replica):
        created = await _call(url, TOKENS["bob"], "create_session", {})
        assert created.status_code == 200 and '"session_id":"s-' in created.text, created.text
        bobs = created.text.split('"session_id":"', 1)[1].split('"', 1)[0]
        looking = {"session_id": bobs}

        now = time.time()
        wrong_secret = Peers("r9", "http://{replica}", (b"guessed-" + b"0" * 32,), 60)
        right_secret = Peers("r9", "http://{replica}", (SECRET,), 60)
        good = right_secret.token_for("bob", replica)
        forged = {
            "wrong secret": wrong_secret.token_for("bob", replica),
            "made for another replica": right_secret.token_for("bob", "r8"),
            "replayed after its time": right_secret.token_for("bob", replica, now - WINDOW - 5),
            "principal swapped": good.replace(good.split(".")[3], "YWxpY2U"),  # "alice", bob's signature
            "no signature": ".".join(good.split(".")[:5] + [""]),
        }
        for why, token in forged.items():
            answer = await _call(url, token, "list_files", looking)
            assert answer.status_code == 401, (why, answer.status_code, answer.text)
            assert 'error="invalid_token"' in answer.headers.get("www-authenticate", ""), why
            assert "files" not in answer.text and bobs not in answer.text, why

        # Alice's own token, with every header that might name someone else: she is still alice.
        answer = await _call(url, TOKENS["alice"], "list_files", looking, **CLAIMS)
        assert answer.status_code == 200 and "no session with that id" in answer.text, answer.text
        assert '"isError":true' in answer.text

        # A good peer token for bob is bob at this replica (what a replica forwards): his session is his.
        assert '"isError":false' in (await _call(url, good, "list_files", looking)).text

        # A call that came from a replica, about an id of a third one, is answered here and not sent on.
        elsewhere = {"session_id": "s-0123456789abcdef.r7"}
        answer = await _call(url, right_secret.token_for("bob", replica), "list_files", elsewhere)
        assert answer.status_code == 200 and "no session with that id" in answer.text, answer.text
        assert "cannot be reached" not in answer.text
