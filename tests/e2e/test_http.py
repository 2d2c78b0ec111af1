"""`serve --http`: the installed console script on loopback, driven by the official SDK's streamable-HTTP client
and by plain HTTP, with two principals from a tokens file, on bubblewrap (the cheapest engine to start).

One server process serves the whole module (its log is read at the end for the audit trail).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client import ClientSession
from mcp.client.session import ClientRequestContext, ElicitationFnT
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult, ElicitRequestParams, ElicitResult
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from tests.e2e.test_stdio import SCRIPT
from tests.engines.conftest import require_now
from tests.support.protocol import check_printed_1, check_tools, initialize_at, structured_of, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.bubblewrap]

ALICE = "alice-token-" + "a1" * 16
BOB = "bob-token-" + "b2" * 16
# The code and the output of one call, to look for in the log afterwards.
CODE_MARK = "code_mark_7d1f"
OUTPUT_MARK = "output-mark-93ce"
MAX_CALLS = 2


@dataclass
class Served:
    url: str
    process: subprocess.Popen[bytes]
    log: Path
    stdout: Path
    tokens: Path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _environment(**extra: str) -> dict[str, str]:
    keep = ("PATH", "HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "TMPDIR")
    return {
        **{name: os.environ[name] for name in keep if name in os.environ},
        "BACKEND": "bubblewrap",
        "SANDBOX_POOL_SIZE": "0",
        **extra,
    }


@pytest.fixture(scope="module")
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    require_now(request, "bubblewrap")
    folder = tmp_path_factory.mktemp("http")
    tokens = folder / "tokens"
    tokens.write_text(f"# the team\nalice {ALICE}\n\nbob {BOB}\n")
    tokens.chmod(0o600)
    port = _free_port()
    log, stdout = folder / "stderr.log", folder / "stdout.log"
    env = _environment(
        SANDBOX_HTTP_TOKENS_FILE=str(tokens),
        SANDBOX_HTTP_MAX_CALLS_PER_PRINCIPAL=str(MAX_CALLS),
        SANDBOX_HTTP_MAX_SESSIONS_PER_PRINCIPAL="1",
        SANDBOX_HTTP_MAX_BODY="1m",
        SANDBOX_SESSION_ALLOW_HOSTS="api.example.org",
    )
    with log.open("wb") as err, stdout.open("wb") as out:
        process = subprocess.Popen([SCRIPT, "serve", "--http", f"127.0.0.1:{port}"], env=env, stdout=out, stderr=err)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, log.read_text()
        try:
            if httpx2.post(url, json={}).status_code == 401:
                break
        except httpx2.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    yield Served(url, process, log, stdout, tokens)

    async def open_session() -> str:
        async with _client(Served(url, process, log, stdout, tokens), ALICE) as alice:
            return structured_of(await alice.call_tool("create_session", {}))["session_id"]

    # Stopping with a session open: its sandbox goes with the server, which then ends by the signal it got.
    session_id = anyio.run(open_session)
    process.terminate()
    assert process.wait(timeout=60) == -signal.SIGTERM
    assert f"Session {session_id} closed: the server shut down" in log.read_text()


def _as(token: str) -> httpx2.AsyncClient:
    return create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})


@asynccontextmanager
async def _client(
    served: Served, token: str, mode: str = "auto", elicitation_callback: ElicitationFnT | None = None
) -> AsyncGenerator[Client]:
    # The transport leaves a client it is given open: closed here.
    http = _as(token)
    transport = streamable_http_client(served.url, http_client=http)
    async with http, Client(transport, mode=mode, elicitation_callback=elicitation_callback) as client:
        yield client


@pytest.mark.parametrize("version", [*HANDSHAKE_PROTOCOL_VERSIONS, *MODERN_PROTOCOL_VERSIONS, "discovery"])
async def test_each_protocol_generation_runs_code_over_http_with_a_token(served: Served, version: str) -> None:
    with anyio.fail_after(120):
        if version in HANDSHAKE_PROTOCOL_VERSIONS:
            http = _as(ALICE)
            async with (
                http,
                streamable_http_client(served.url, http_client=http) as (read, write),
                ClientSession(read, write) as session,
            ):
                result = await initialize_at(session, version)
                assert result.protocol_version == version
                check_tools((await session.list_tools()).tools, version)
                check_printed_1(await session.call_tool("execute_code", {"code": "print(1)"}), version)
            return
        # A modern version pinned (no probe), or "discovery": server/discover, no initialize at all.
        async with _client(served, ALICE, "auto" if version == "discovery" else version) as client:
            assert client.session.initialize_result is None
            if version == "discovery":
                assert client.session.discover_result is not None
                version = client.protocol_version
                assert version in MODERN_PROTOCOL_VERSIONS
            check_tools((await client.list_tools()).tools, version)
            check_printed_1(await client.call_tool("execute_code", {"code": "print(1)"}), version)


@pytest.mark.parametrize("token", [None, "wrong-" + "c3" * 16, ALICE[:-1]], ids=["none", "unknown", "truncated"])
async def test_a_request_without_a_known_token_gets_401_and_the_bearer_challenge(
    served: Served, token: str | None
) -> None:
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    http = httpx2.AsyncClient()
    async with http:
        response = await http.post(served.url, json=request, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer ")
    assert "execute_code" not in response.text


async def _status(served: Served, token: str) -> int:
    headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
    request: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    http = httpx2.AsyncClient()
    async with http:
        response = await http.post(served.url, json=request, headers={**headers, "Authorization": f"Bearer {token}"})
    return response.status_code


async def _until_answered(served: Served, token: str, status: int) -> None:
    """Ask until `token` gets `status`: the server looks at the file on a request, at most once a second."""
    with anyio.fail_after(30):
        while True:
            if await _status(served, token) == status:
                return
            await anyio.sleep(0.2)


def _replace_tokens(served: Served, text: str) -> None:
    """A new version of the tokens file, renamed over the old one as docs/http.md tells operators to."""
    new = served.tokens.with_name("tokens.new")
    new.write_text(text)
    new.chmod(0o600)
    new.replace(served.tokens)


async def test_a_token_added_to_the_file_works_and_a_removed_one_gets_401_without_a_restart(served: Served) -> None:
    carol = "carol-token-" + "c5" * 16
    before = served.tokens.read_text()
    _replace_tokens(served, before + f"carol {carol}\n")
    try:
        await _until_answered(served, carol, 200)
        with anyio.fail_after(30):
            async with _client(served, carol) as client:
                assert structured_of(await client.call_tool("list_sessions", {}))["sessions"] == []
    finally:
        _replace_tokens(served, before)
    await _until_answered(served, carol, 401)
    assert await _status(served, ALICE) == 200
    log = served.log.read_text()
    assert "principal=carol tool=list_sessions" in log
    assert "read again: 3 token(s) of alice, bob, carol" in log and "read again: 2 token(s) of alice, bob" in log
    assert carol not in log
    assert served.process.poll() is None


async def test_one_principals_sessions_and_jobs_are_not_found_for_another(served: Served) -> None:
    with anyio.fail_after(120):
        async with _client(served, ALICE) as alice:
            session_id = structured_of(await alice.call_tool("create_session", {}))["session_id"]
            await alice.call_tool("execute_code", {"code": "secret = 41", "session_id": session_id})
            upload = {"session_id": session_id, "path": "mine.txt", "content": "alice's"}
            assert not (await alice.call_tool("upload_file", upload)).is_error
            job = {"code": "import time\ntime.sleep(1)\nprint('done')", "background": True}
            job_id = structured_of(await alice.call_tool("execute_code", job))["job_id"]
            refused = await alice.call_tool("create_session", {})
            assert refused.is_error and "SANDBOX_HTTP_MAX_SESSIONS_PER_PRINCIPAL" in text_of(refused)
            async with _client(served, BOB) as bob:
                assert structured_of(await bob.call_tool("list_sessions", {}))["sessions"] == []
                tries = [
                    ("execute_code", {"code": "print(secret)", "session_id": session_id}),
                    ("list_files", {"session_id": session_id}),
                    ("download_file", {"session_id": session_id, "path": "mine.txt"}),
                    ("upload_file", {"session_id": session_id, "path": "x.txt", "content": "bob's"}),
                    ("request_network", {"session_id": session_id, "host": "api.example.org", "reason": "r"}),
                    ("close_session", {"session_id": session_id}),
                ]
                for tool, arguments in tries:
                    answer = await bob.call_tool(tool, arguments)
                    assert answer.is_error and "no session with that id" in text_of(answer), (tool, text_of(answer))
                for tool in ("get_job", "cancel_job"):
                    answer = await bob.call_tool(tool, {"job_id": job_id})
                    assert answer.is_error and "is not known" in text_of(answer), (tool, text_of(answer))
                # Bob's own session is his, within his own quota: Alice's session does not count against it.
                own = structured_of(await bob.call_tool("create_session", {}))["session_id"]
                assert [
                    s["session_id"] for s in structured_of(await bob.call_tool("list_sessions", {}))["sessions"]
                ] == [own]
                assert not (await bob.call_tool("close_session", {"session_id": own})).is_error
            mine = structured_of(await alice.call_tool("list_sessions", {}))["sessions"]
            assert [s["session_id"] for s in mine] == [session_id]
            kept = await alice.call_tool("execute_code", {"code": "print(secret + 1)", "session_id": session_id})
            assert structured_of(kept)["stdout"] == "42\n"
            downloaded = await alice.call_tool("download_file", {"session_id": session_id, "path": "mine.txt"})
            assert structured_of(downloaded)["content"] == "alice's"
            finished = structured_of(await alice.call_tool("get_job", {"job_id": job_id, "wait": 30}))
            assert finished["status"] == "finished" and finished["stdout"] == "done\n"
            assert not (await alice.call_tool("close_session", {"session_id": session_id})).is_error


async def test_over_stateless_http_the_person_is_asked_in_the_calls_result(served: Served) -> None:
    """Stateless HTTP cannot carry a request from the server mid-call; from 2026-07-28 the question rides the
    call's result and the client's retry, so asking works there too."""
    asked: list[str] = []

    async def person(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"allow": True})

    with anyio.fail_after(120):
        async with _client(served, ALICE, elicitation_callback=person) as alice:
            session_id = structured_of(await alice.call_tool("create_session", {"network": []}))["session_id"]
            try:
                arguments = {"session_id": session_id, "host": "api.example.org", "reason": "the API"}
                answer = structured_of(await alice.call_tool("request_network", arguments))
            finally:
                await alice.call_tool("close_session", {"session_id": session_id})
    assert answer["decision"] == "granted" and answer["allowed_hosts"] == ["api.example.org"]
    assert len(asked) == 1 and session_id in asked[0]


async def test_calls_past_a_principals_quota_are_refused_while_others_call_on(served: Served) -> None:
    slow = {"code": "import time\ntime.sleep(4)\nprint('slept')"}
    answers: list[CallToolResult] = []
    with anyio.fail_after(120):
        async with _client(served, ALICE) as alice, _client(served, BOB) as bob:

            async def call() -> None:
                answers.append(await alice.call_tool("execute_code", slow))

            async with anyio.create_task_group() as tasks:
                for _ in range(MAX_CALLS):
                    tasks.start_soon(call)
                await anyio.sleep(2)  # both in progress: the server has their sandboxes sleeping
                refused = await alice.call_tool("get_supported_languages", {})
                assert refused.is_error and "SANDBOX_HTTP_MAX_CALLS_PER_PRINCIPAL" in text_of(refused)
                assert not (await bob.call_tool("get_supported_languages", {})).is_error
            assert [structured_of(answer)["stdout"] for answer in answers] == ["slept\n"] * MAX_CALLS
            assert not (await alice.call_tool("get_supported_languages", {})).is_error


async def test_an_oversized_body_is_refused_and_many_connections_at_once_are_served(served: Served) -> None:
    headers = {
        "Authorization": f"Bearer {ALICE}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
        "Content-Type": "application/json",
    }
    code = "x" * (2 * 1024**2)  # SANDBOX_HTTP_MAX_BODY is 1m here
    arguments = {"name": "execute_code", "arguments": {"code": code}}
    huge: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": arguments}
    listing: dict[str, Any] = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    with anyio.fail_after(120):
        http = httpx2.AsyncClient(timeout=60)
        async with http:
            refused = await http.post(served.url, content=json.dumps(huge), headers=headers)
        assert refused.status_code == 413

        statuses: list[int] = []

        async def list_tools() -> None:
            # A client of its own each: a connection of its own each.
            client = httpx2.AsyncClient(timeout=60)
            async with client:
                response = await client.post(served.url, json=listing, headers=headers)
                statuses.append(response.status_code if "execute_code" in response.text else -response.status_code)

        async with anyio.create_task_group() as tasks:
            for _ in range(50):
                tasks.start_soon(list_tools)
        assert statuses == [200] * 50
        async with _client(served, ALICE) as alice:
            check_printed_1(await alice.call_tool("execute_code", {"code": "print(1)"}), alice.protocol_version)


async def test_every_call_leaves_an_audit_line_without_the_code_its_output_or_a_token(served: Served) -> None:
    code = f"{CODE_MARK} = 1\nprint('{OUTPUT_MARK}')"
    with anyio.fail_after(120):
        async with _client(served, ALICE) as alice:
            assert not (await alice.call_tool("list_sessions", {})).is_error
        async with _client(served, BOB) as bob:
            assert structured_of(await bob.call_tool("execute_code", {"code": code}))["stdout"] == OUTPUT_MARK + "\n"
            failing = await bob.call_tool("execute_code", {"code": "1", "language": "cobol"})
            assert failing.is_error
        log = served.log.read_text()
        lines = [line for line in log.splitlines() if "llm_sandbox_mcp.audit" in line]
        assert any(
            "principal=bob tool=execute_code language=python" in line and line.endswith("outcome=ok") for line in lines
        ), lines
        assert any(
            "principal=bob tool=execute_code language=cobol" in line and "outcome=error" in line for line in lines
        )
        assert any("principal=alice tool=list_sessions language=- " in line for line in lines)
        assert all("duration_ms=" in line for line in lines)
        for secret in (CODE_MARK, OUTPUT_MARK, ALICE, BOB):
            assert secret not in log
        assert served.stdout.read_bytes() == b""
        assert served.process.poll() is None
