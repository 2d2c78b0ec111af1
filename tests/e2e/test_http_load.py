"""A bounded load test of `serve --http` on loopback: four principals calling at once, each with as many calls in
flight as its quota allows, on bubblewrap (the cheapest engine to start).

Worth its 10 to 20 s (the server's start included, by the machine's load): it is the one test where principals
overlap on one server, so a session, a job or a quota that leaked from one principal to another under
concurrency shows here and nowhere else.
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

PRINCIPALS = ("ana", "ben", "cai", "dee")
QUOTA = 3  # SANDBOX_HTTP_MAX_CALLS_PER_PRINCIPAL
ONE_SHOTS = 4  # per lane; two lanes per principal, beside the lane that looks at the others' ids
NOT_FOUND = "no session with that id"


@dataclass
class Served:
    base: str
    process: subprocess.Popen[bytes]
    log: Path
    tokens: dict[str, str]


@pytest.fixture
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    require_now(request, "bubblewrap")
    tokens = {principal: secrets.token_hex(32) for principal in PRINCIPALS}
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("".join(f"{principal} {token}\n" for principal, token in tokens.items()))
    tokens_file.chmod(0o600)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    keep = ("PATH", "HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR", "TMPDIR")
    env = {
        **{name: os.environ[name] for name in keep if name in os.environ},
        "BACKEND": "bubblewrap",
        "SANDBOX_POOL_SIZE": "0",
        "SANDBOX_HTTP_TOKENS_FILE": str(tokens_file),
        "SANDBOX_HTTP_MAX_CALLS_PER_PRINCIPAL": str(QUOTA),
        "SANDBOX_HTTP_MAX_SESSIONS_PER_PRINCIPAL": "1",
        # Every principal's calls at the quota at once: none waits for a slot another principal holds.
        "SANDBOX_MAX_CONCURRENCY": str(QUOTA * len(PRINCIPALS)),
    }
    log = tmp_path / "stderr.log"
    with log.open("wb") as err:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--http", f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, log.read_text()
        try:
            if httpx2.get(f"{base}/readyz").status_code == 200:
                break
        except httpx2.TransportError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    try:
        yield Served(base, process, log, tokens)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@asynccontextmanager
async def _client(served: Served, principal: str) -> AsyncGenerator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {served.tokens[principal]}"})
    async with http, Client(streamable_http_client(f"{served.base}/mcp", http_client=http)) as client:
        yield client


def _refused(result: CallToolResult, words: str) -> None:
    assert result.is_error and words in text_of(result), text_of(result)


class Board:
    """Each principal's session and job, once all four have theirs."""

    def __init__(self) -> None:
        self.ids: dict[str, tuple[str, str]] = {}
        self.all_posted = anyio.Event()

    def post(self, principal: str, session_id: str, job_id: str) -> None:
        self.ids[principal] = (session_id, job_id)
        if len(self.ids) == len(PRINCIPALS):
            self.all_posted.set()


async def _one_principal(served: Served, me: str, board: Board) -> None:
    async with _client(served, me) as client:
        session_id = structured_of(await client.call_tool("create_session", {}))["session_id"]
        _refused(await client.call_tool("create_session", {}), "SANDBOX_HTTP_MAX_SESSIONS_PER_PRINCIPAL")
        structured_of(await client.call_tool("execute_code", {"code": f"me = {me!r}", "session_id": session_id}))
        upload = {"session_id": session_id, "path": "mine.txt", "content": me}
        structured_of(await client.call_tool("upload_file", upload))
        job = {"code": f"import time\ntime.sleep(1)\nprint({me!r})", "background": True}
        job_id = structured_of(await client.call_tool("execute_code", job))["job_id"]
        board.post(me, session_id, job_id)
        await board.all_posted.wait()

        async def one_shots(lane: int) -> None:
            for i in range(ONE_SHOTS):
                said = f"{me} {lane} {i}"
                result = await client.call_tool("execute_code", {"code": f"print({said!r})"})
                assert structured_of(result)["stdout"] == said + "\n"

        async def looking_at_the_others() -> None:
            listed = structured_of(await client.call_tool("list_sessions", {}))["sessions"]
            assert [session["session_id"] for session in listed] == [session_id]
            for other, (their_session, their_job) in board.ids.items():
                if other == me:
                    continue
                tries = [
                    ("execute_code", {"code": "print(me)", "session_id": their_session}),
                    ("download_file", {"session_id": their_session, "path": "mine.txt"}),
                    ("close_session", {"session_id": their_session}),
                ]
                for tool, arguments in tries:
                    _refused(await client.call_tool(tool, arguments), NOT_FOUND)
                _refused(await client.call_tool("get_job", {"job_id": their_job}), "is not known")
            mine = await client.call_tool("execute_code", {"code": "print(me)", "session_id": session_id})
            assert structured_of(mine)["stdout"] == me + "\n"
            downloaded = await client.call_tool("download_file", {"session_id": session_id, "path": "mine.txt"})
            assert structured_of(downloaded)["content"] == me

        # QUOTA lanes at once, while the other principals run theirs.
        async with anyio.create_task_group() as lanes:
            for lane in range(QUOTA - 1):
                lanes.start_soon(one_shots, lane)
            lanes.start_soon(looking_at_the_others)

        # The quota: QUOTA calls surely in progress (each has sent its first progress), then one more.
        started = [anyio.Event() for _ in range(QUOTA)]
        held: list[str] = []

        async def hold(i: int) -> None:
            async def progressed(progress: float, total: float | None, message: str | None) -> None:
                started[i].set()

            code = f"import time\ntime.sleep(3)\nprint('held {i}')"
            result = await client.call_tool("execute_code", {"code": code}, progress_callback=progressed)
            held.append(structured_of(result)["stdout"])

        async with anyio.create_task_group() as holding:
            for i in range(QUOTA):
                holding.start_soon(hold, i)
            for event in started:
                await event.wait()
            _refused(await client.call_tool("get_supported_languages", {}), "SANDBOX_HTTP_MAX_CALLS_PER_PRINCIPAL")
        assert sorted(held) == [f"held {i}\n" for i in range(QUOTA)]

        finished = structured_of(await client.call_tool("get_job", {"job_id": job_id, "wait": 30}))
        assert finished["status"] == "finished" and finished["stdout"] == me + "\n"
        structured_of(await client.call_tool("close_session", {"session_id": session_id}))
        assert structured_of(await client.call_tool("list_sessions", {}))["sessions"] == []


async def test_four_principals_calling_at_once_each_see_only_their_own_within_their_quota(served: Served) -> None:
    board = Board()
    with anyio.fail_after(120):
        async with anyio.create_task_group() as principals:
            for principal in PRINCIPALS:
                principals.start_soon(_one_principal, served, principal, board)
        http = httpx2.AsyncClient()
        async with http:
            for probe in ("healthz", "readyz"):
                answer = await http.get(f"{served.base}/{probe}")
                assert (answer.status_code, answer.text) == (200, "ok\n"), probe
    log = served.log.read_text()
    audit = [line for line in log.splitlines() if "llm_sandbox_mcp.audit" in line]
    for principal in PRINCIPALS:
        refusals = [line for line in audit if f"principal={principal} " in line and "too many calls" in line]
        assert len(refusals) == 1, refusals
    assert "Traceback" not in log
    # Healthy to the end: a stop finds no session left to close, and the server ends by the signal it got.
    served.process.terminate()
    assert served.process.wait(timeout=60) == -signal.SIGTERM
    log = served.log.read_text()
    assert "closed: the server shut down" not in log, log[-3000:]
