"""Two replicas of one service, as an operator runs them: two `serve --http` processes of the installed command on
loopback (bubblewrap), one tokens file, one peer secret. A session made at replica A is used through replica B:
its cells keep their state, files go in and come out, a background job is polled, progress comes through; another
principal's ids are unknown through B as at A; and once A is stopped, B says its sessions and jobs are lost.

Worth its 7 to 15 s (two servers' starts, by the machine's load): it is the one test where a call crosses from
one server process to another, through the peer token, the forwarding and the owner's own checks.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import AsyncGenerator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult

from tests.e2e.test_stdio import SCRIPT
from tests.engines.conftest import require_now
from tests.support.protocol import structured_of, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.bubblewrap]

PRINCIPALS = ("alice", "bob")


@dataclass
class Replica:
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


@pytest.fixture
def tokens() -> dict[str, str]:
    return {principal: secrets.token_hex(32) for principal in PRINCIPALS}


@pytest.fixture
def replicas(request: pytest.FixtureRequest, tmp_path: Path, tokens: dict[str, str]) -> Iterator[tuple[Replica, ...]]:
    require_now(request, "bubblewrap")
    tokens_file = _private(tmp_path / "tokens", "".join(f"{who} {token}\n" for who, token in tokens.items()))
    peer_secret = _private(tmp_path / "peer-secret", secrets.token_hex(32) + "\n")
    keep = ("PATH", "HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "TMPDIR")
    started: list[Replica] = []
    try:
        for name in ("a", "b"):
            port = _free_port()
            env = {
                **{variable: os.environ[variable] for variable in keep if variable in os.environ},
                "BACKEND": "bubblewrap",
                "SANDBOX_POOL_SIZE": "0",
                "SANDBOX_HTTP_TOKENS_FILE": str(tokens_file),
                # On loopback a replica's port is its id: the template puts the id where the port goes.
                "SANDBOX_HTTP_REPLICA_ID": str(port),
                "SANDBOX_HTTP_PEER_URL": "http://127.0.0.1:{replica}",
                "SANDBOX_HTTP_PEER_SECRET_FILE": str(peer_secret),
            }
            log = tmp_path / f"{name}.log"
            with log.open("wb") as err:
                process = subprocess.Popen(
                    [SCRIPT, "serve", "--http", f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL, stderr=err
                )
            started.append(Replica(port, process, log))
        deadline = time.monotonic() + 60
        for replica in started:
            while True:
                assert replica.process.poll() is None, replica.log.read_text()
                try:
                    if httpx2.get(f"{replica.base}/readyz").status_code == 200:
                        break
                except httpx2.TransportError:
                    pass
                assert time.monotonic() < deadline, replica.log.read_text()
                time.sleep(0.2)
        yield tuple(started)
    finally:
        for replica in started:
            if replica.process.poll() is None:
                replica.process.kill()
                replica.process.wait()


@asynccontextmanager
async def _client(replica: Replica, token: str) -> AsyncGenerator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(f"{replica.base}/mcp", http_client=http)) as client:
        yield client


def _refused(result: CallToolResult, words: str) -> None:
    assert result.is_error and words in text_of(result), text_of(result)


async def test_a_session_and_a_job_made_at_one_replica_are_served_through_the_other_until_it_is_gone(
    replicas: tuple[Replica, Replica], tokens: dict[str, str]
) -> None:
    a, b = replicas
    with anyio.fail_after(120):
        async with _client(a, tokens["alice"]) as alice_at_a:
            session_id = structured_of(await alice_at_a.call_tool("create_session", {}))["session_id"]
            structured_of(await alice_at_a.call_tool("execute_code", {"code": "x = 41", "session_id": session_id}))
        assert session_id.endswith(f".{a.port}")

        async with _client(b, tokens["alice"]) as alice_at_b:
            reports: list[str | None] = []

            async def progressed(progress: float, total: float | None, message: str | None) -> None:
                reports.append(message)

            # A waiting call reports progress at once, then every 2 s: A's reports come through B as they happen.
            cell = {"code": "import time\ntime.sleep(1)\nprint(x + 1)", "session_id": session_id}
            result = structured_of(await alice_at_b.call_tool("execute_code", cell, progress_callback=progressed))
            assert "42" in result["stdout"] and result["session_id"] == session_id, result
            assert reports, "no progress came through"

            upload = {"session_id": session_id, "path": "notes.txt", "content": "kept at A"}
            structured_of(await alice_at_b.call_tool("upload_file", upload))
            read = {"code": "print(open('notes.txt').read())", "session_id": session_id}
            assert structured_of(await alice_at_b.call_tool("execute_code", read))["stdout"] == "kept at A\n"
            download = {"session_id": session_id, "path": "notes.txt"}
            assert structured_of(await alice_at_b.call_tool("download_file", download))["content"] == "kept at A"

            job = {"code": "print(x * 2)", "session_id": session_id, "background": True}
            job_id = structured_of(await alice_at_b.call_tool("execute_code", job))["job_id"]
            assert job_id.endswith(f".{a.port}")  # made where the session is
            finished = structured_of(await alice_at_b.call_tool("get_job", {"job_id": job_id, "wait": 30}))
            assert finished["status"] == "finished" and finished["stdout"] == "82\n", finished

            # What B lists is B's: a session is answered for wherever it is, but listed where it lives.
            assert structured_of(await alice_at_b.call_tool("list_sessions", {}))["sessions"] == []

        async with _client(b, tokens["bob"]) as bob_at_b:
            _refused(await bob_at_b.call_tool("execute_code", read), "no session with that id")
            _refused(await bob_at_b.call_tool("download_file", download), "no session with that id")
            _refused(await bob_at_b.call_tool("get_job", {"job_id": job_id}), "is not known")

        a.process.terminate()
        assert a.process.wait(timeout=60) == -signal.SIGTERM
        async with _client(b, tokens["alice"]) as alice_at_b:
            gone = await alice_at_b.call_tool("execute_code", read)
            _refused(gone, f"The server replica that held session {session_id} ({a.port}) cannot be reached")
            assert "its sessions and jobs are lost" in text_of(gone) and "create a new session" in text_of(gone)
            _refused(await alice_at_b.call_tool("get_job", {"job_id": job_id}), "run the code again")

    audit_a = [line for line in a.log.read_text().splitlines() if "llm_sandbox_mcp.audit" in line]
    audit_b = [line for line in b.log.read_text().splitlines() if "llm_sandbox_mcp.audit" in line]
    # Each call is audited once as a call, where it ran; B says where it sent each.
    assert sum("call principal=alice tool=get_job" in line for line in audit_a) == 1, audit_a
    assert not any("call principal=alice tool=get_job" in line for line in audit_b), audit_b
    assert sum(f"forward principal=alice tool=get_job to={a.port}" in line for line in audit_b) == 2, audit_b
    assert any(f"forward principal=bob tool=execute_code to={a.port}" in line for line in audit_b), audit_b
    for replica in (a, b):
        assert "Traceback" not in replica.log.read_text()
