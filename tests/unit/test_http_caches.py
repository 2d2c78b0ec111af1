"""Over HTTP, each principal's calls use library stores of their own, within their quota; over stdio the one
principal's keys are what they always were. Served through the real HTTP stack with tokens, on the fake engine
(the engine tests prove the same from inside real sandboxes: tests/engines/test_principal_caches.py)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.models import ExecResult
from llm_sandbox_mcp.run.libraries import QUOTA_SETTING
from tests.support.fakes import Call, FakeBackend, ok
from tests.support.http_serving import serving

pytestmark = pytest.mark.anyio

TOKENS = {"alice": "a" * 40, "bob": "b" * 40}
MIB = 1024**2


@pytest.fixture(autouse=True)
def own_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _installer(call: Call) -> ExecResult:
    if call.argv[0] == "du":
        return ok(stdout=b"1024\t/opt/llm-sandbox/libs\n")
    if call.argv[:2] == ["test", "-f"]:
        return ok(exit_code=1)  # not installed yet
    return ok()


@asynccontextmanager
async def _served(tmp_path: Path, backend: FakeBackend, **extra: Any) -> AsyncGenerator[str]:
    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{principal} {token}\n" for principal, token in TOKENS.items()))
    tokens.chmod(0o600)

    def settings_for(port: int) -> Settings:
        return Settings(sandbox_pool_size=0, sandbox_http_tokens_file=tokens, **extra)

    async with serving(settings_for, backend) as (base, _):
        yield f"{base}/mcp"


@asynccontextmanager
async def _client(url: str, principal: str) -> AsyncGenerator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKENS[principal]}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        yield client


def _mounted(backend: FakeBackend) -> list[str]:
    return [spec.cache.key for spec in backend.created if spec.cache is not None]


async def test_each_principals_calls_and_sessions_mount_stores_of_their_own(tmp_path: Path) -> None:
    backend = FakeBackend(handler=_installer)
    six = {"code": "import six", "libraries": ["six"]}
    with anyio.fail_after(60):
        async with _served(tmp_path, backend) as url:
            seen: dict[str, set[str]] = {}
            for principal in ("alice", "bob"):
                before = len(backend.created)
                async with _client(url, principal) as client:
                    ran = await client.call_tool("execute_code", six)
                    assert not ran.is_error, ran.content
                    session = await client.call_tool("create_session", {"libraries": ["six"]})
                    assert not session.is_error, session.content
                seen[principal] = set(_mounted(backend)[before:])
    assert len(seen["alice"]) == len(seen["bob"]) == 1  # the session mounts the store the call installed
    assert not seen["alice"] & seen["bob"]
    installs = [call for call in backend.calls if call.argv == get_language("python").install_argv(["six"])]
    assert len(installs) == 2  # Bob's install ran afresh


async def test_a_principal_past_the_cache_quota_gets_a_tool_error_naming_the_setting(tmp_path: Path) -> None:
    backend = FakeBackend(handler=_installer)
    with anyio.fail_after(60):
        async with _served(tmp_path, backend, sandbox_http_max_cache_bytes_per_principal=2 * MIB) as url:
            async with _client(url, "alice") as client:
                for library in ("six", "tomli"):
                    ran = await client.call_tool("execute_code", {"code": "pass", "libraries": [library]})
                    assert not ran.is_error, ran.content
                refused = await client.call_tool("execute_code", {"code": "pass", "libraries": ["idna"]})
            async with _client(url, "bob") as client:  # Alice's quota is hers only
                ran = await client.call_tool("execute_code", {"code": "pass", "libraries": ["idna"]})
                assert not ran.is_error, ran.content
    assert refused.is_error
    text = " ".join(getattr(block, "text", "") for block in refused.content)
    assert QUOTA_SETTING in text and "Traceback" not in text
