"""Several replicas of one service: the settings that make one, the ids that name their replica, the peer tokens
with which a replica asserts a principal to another, and (two in-process replicas on loopback, the fake engine
behind each) a call about a session that the other replica holds, answered by it.

The same, on a real engine with the installed command, is tests/e2e/test_http_replicas.py; forged peer tokens
against a real server are in tests/hostile/test_http_peer_tokens.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import ValidationError

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import ConfigError
from llm_sandbox_mcp.replica_ids import new_id, replica_of
from llm_sandbox_mcp.server.http import check_authentication, parse_listen
from llm_sandbox_mcp.server.peers import WINDOW, PeerAccess, Peers, PeerVerifier, load_secrets
from tests.support.fakes import FakeBackend
from tests.support.http_serving import serving
from tests.support.protocol import structured_of, text_of

pytestmark = pytest.mark.anyio

SECRET = b"s" * 40
TOKENS = {"alice": "a" * 40, "bob": "b" * 40}
TEMPLATE = "http://127.0.0.1:{replica}"


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_ids_name_their_replica_and_keep_their_random_part() -> None:
    session, job = new_id("s", 8, "llm-sandbox-mcp-0"), new_id("j", 6, "llm-sandbox-mcp-0")
    assert session.startswith("s-") and len(session) == len("s-") + 16 + len(".llm-sandbox-mcp-0")
    assert replica_of(session) == replica_of(job) == "llm-sandbox-mcp-0"
    assert new_id("s", 8, None).count(".") == 0 and replica_of(new_id("s", 8, None)) is None
    longest = new_id("s", 8, "r" * 40)
    assert len(longest) <= 64  # the tools' session_id and job_id schemas
    for foreign in ("s-00.Bad", "s-00.", "s-00.-x", "s-00.a.b", "s-" + "0" * 60):
        assert replica_of(foreign) is None


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"sandbox_http_replica_id": "r0"}, "needs SANDBOX_HTTP_PEER_URL, SANDBOX_HTTP_PEER_SECRET_FILE too"),
        ({"sandbox_http_peer_url": TEMPLATE}, "needs SANDBOX_HTTP_REPLICA_ID, SANDBOX_HTTP_PEER_SECRET_FILE"),
        ({"sandbox_http_replica_id": "R_0"}, "SANDBOX_HTTP_REPLICA_ID must be 1 to 40 lower-case"),
        ({"sandbox_http_replica_id": "r" * 41}, "SANDBOX_HTTP_REPLICA_ID must be 1 to 40 lower-case"),
        ({"sandbox_http_peer_url": "http://127.0.0.1:8000"}, "with {replica} where its id goes"),
        ({"sandbox_http_peer_url": "http://{replica}:8000/mcp"}, "and no path"),
        ({"sandbox_http_peer_url": "ftp://{replica}:8000"}, "SANDBOX_HTTP_PEER_URL must be"),
        ({"sandbox_http_peer_url": "http://u:p@{replica}:8000"}, "SANDBOX_HTTP_PEER_URL must be"),
    ],
    ids=["id-alone", "url-alone", "upper-case-id", "long-id", "no-field", "path", "scheme", "credentials"],
)
def test_replica_settings_go_together_and_are_checked(tmp_path: Path, values: dict[str, Any], problem: str) -> None:
    complete: dict[str, Any] = {
        "sandbox_http_replica_id": "r0",
        "sandbox_http_peer_url": TEMPLATE,
        "sandbox_http_peer_secret_file": _private(tmp_path / "peer", SECRET.decode()),
    }
    Settings(**complete)
    # "needs": the setting alone; else the complete set with the one value changed.
    arguments = values if "needs" in problem else {**complete, **values}
    with pytest.raises(ValidationError) as refused:
        Settings(**arguments)
    assert problem in str(refused.value)


def test_a_replica_without_authentication_is_refused_at_start(tmp_path: Path) -> None:
    settings = Settings(
        sandbox_http_replica_id="r0",
        sandbox_http_peer_url=TEMPLATE,
        sandbox_http_peer_secret_file=_private(tmp_path / "peer", SECRET.decode()),
    )
    with pytest.raises(ConfigError, match="SANDBOX_HTTP_REPLICA_ID is set without authentication"):
        check_authentication(settings, parse_listen("127.0.0.1:8000"), True)


@pytest.mark.parametrize(
    ("text", "mode", "problem"),
    [
        ("short\n", 0o600, "line 1: a secret must be 32 to 512 ASCII characters"),
        ("# none\n", 0o600, "holds no secret"),
        (SECRET.decode(), 0o640, "readable or writable by others than its owner (mode 0640)"),
    ],
    ids=["short", "empty", "group-readable"],
)
def test_a_bad_peer_secret_file_is_refused_without_showing_a_secret(
    tmp_path: Path, text: str, mode: int, problem: str
) -> None:
    path = tmp_path / "peer"
    path.write_text(text)
    path.chmod(mode)
    with pytest.raises(ConfigError) as refused:
        load_secrets(path)
    assert problem in str(refused.value) and SECRET.decode() not in str(refused.value)


async def test_a_peer_token_asserts_its_principal_only_with_the_shared_secret_to_its_owner_in_its_time() -> None:
    class Inner:
        async def verify_token(self, token: str) -> None:
            seen.append(token)

    seen: list[str] = []
    sender = Peers("r0", TEMPLATE, (SECRET,), 60)
    owner = PeerVerifier(Peers("r1", TEMPLATE, (b"n" * 40, SECRET), 60), Inner(), None)
    token = sender.token_for("alice", "r1")
    access = await owner.verify_token(token)
    assert isinstance(access, PeerAccess) and access.subject == "alice" and access.via == "r0"
    assert SECRET.decode() not in token
    forged = Peers("r0", TEMPLATE, (b"w" * 40,), 60)
    now = time.time()
    refused = {
        "wrong secret": forged.token_for("alice", "r1"),
        "another owner": sender.token_for("alice", "r2"),
        "expired": sender.token_for("alice", "r1", now - WINDOW - 5),
        "from the future": sender.token_for("alice", "r1", now + WINDOW + 5),
        "principal changed": token.replace(token.split(".")[3], "Ym9i"),  # "bob"
        "malformed": "lsp1.r0.r1.!!.1.2",
    }
    for why, bad in refused.items():
        assert await owner.verify_token(bad) is None, why
    assert seen == []  # a peer token is never handed to the tokens file or the authorization server
    assert await owner.verify_token(TOKENS["alice"]) is None and seen == [TOKENS["alice"]]


@asynccontextmanager
async def _replica(tmp_path: Path, shared: bytes = SECRET) -> AsyncGenerator[str]:
    tokens = _private(tmp_path / "tokens", "".join(f"{who} {token}\n" for who, token in TOKENS.items()))
    secret = _private(tmp_path / f"peer-{shared.hex()[:8]}", shared.decode())

    def settings_for(port: int) -> Settings:
        return Settings(
            sandbox_pool_size=0,
            sandbox_http_tokens_file=tokens,
            sandbox_http_replica_id=str(port),  # the template makes the port of a replica its id
            sandbox_http_peer_url=TEMPLATE,
            sandbox_http_peer_secret_file=secret,
        )

    async with serving(settings_for, FakeBackend()) as (base, _settings):
        yield base


@asynccontextmanager
async def _client(base: str, who: str) -> AsyncGenerator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKENS[who]}"})
    async with http, Client(streamable_http_client(f"{base}/mcp", http_client=http)) as client:
        yield client


async def test_a_call_about_another_replicas_session_is_answered_by_that_replica_until_it_is_gone(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(60):
        async with _replica(tmp_path) as b:
            async with _replica(tmp_path) as a:
                async with _client(a, "alice") as alice_at_a:
                    session_id = structured_of(await alice_at_a.call_tool("create_session", {}))["session_id"]
                assert replica_of(session_id) == a.rsplit(":", 1)[1]
                async with _client(b, "alice") as alice_at_b:
                    upload = {"session_id": session_id, "path": "x.txt", "content": "x"}
                    assert structured_of(await alice_at_b.call_tool("upload_file", upload))["path"] == "x.txt"
                    assert structured_of(await alice_at_b.call_tool("list_sessions", {}))["sessions"] == []
                # A client of an earlier generation, without a handshake (stateless): answered in its generation.
                legacy = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
                call = {"name": "list_files", "arguments": {"session_id": session_id}}
                http = httpx2.AsyncClient()
                async with http:
                    answer = await http.post(
                        f"{b}/mcp",
                        json={"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": call},
                        headers={**legacy, "Authorization": f"Bearer {TOKENS['alice']}"},
                    )
                assert answer.status_code == 200 and '"id":7,"result":{' in answer.text, answer.text
                assert '"structuredContent":{"files":[' in answer.text, answer.text
                async with _client(b, "bob") as bob_at_b:
                    unknown = await bob_at_b.call_tool("close_session", {"session_id": session_id})
                    assert unknown.is_error and "no session with that id" in text_of(unknown), text_of(unknown)
            async with _client(b, "alice") as alice_at_b:
                gone = await alice_at_b.call_tool("list_files", {"session_id": session_id})
        assert gone.is_error and "cannot be reached: it is gone" in text_of(gone), text_of(gone)
        assert "create a new session" in text_of(gone)


async def test_replicas_that_do_not_share_the_secret_say_so_instead_of_not_found(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with anyio.fail_after(60):
        async with _replica(tmp_path, b"x" * 40) as b, _replica(tmp_path) as a:
            async with _client(a, "alice") as alice_at_a:
                session_id = structured_of(await alice_at_a.call_tool("create_session", {}))["session_id"]
            async with _client(b, "alice") as alice_at_b:
                refused = await alice_at_b.call_tool("list_files", {"session_id": session_id})
    assert refused.is_error and "refused this replica's forwarded call" in text_of(refused), text_of(refused)
    assert "every replica needs the same SANDBOX_HTTP_PEER_SECRET_FILE" in caplog.text
    assert "no secret of SANDBOX_HTTP_PEER_SECRET_FILE signed it" in caplog.text
