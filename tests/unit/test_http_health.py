"""`/healthz` and `/readyz` over real HTTP (uvicorn on loopback, the fake engine): answered without a token even
when every other request needs one, and saying nothing but yes or no."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx2
import pytest

from llm_sandbox_mcp.config import Settings
from tests.support.fakes import FakeBackend
from tests.support.http_serving import serving

pytestmark = pytest.mark.anyio

# What a failing engine says, which must not reach an unauthenticated prober.
ENGINE_SECRET = "Docker Engine 27.1.1 at unix:///run/user/1000/docker.sock"


@dataclass
class ProbedEngine(FakeBackend):
    fails: bool = False
    described: int = 0

    async def describe(self) -> str:
        self.described += 1
        if self.fails:
            raise RuntimeError(ENGINE_SECRET)
        return ENGINE_SECRET


def _with_tokens(tmp_path: Path) -> Settings:
    tokens = tmp_path / "tokens"
    tokens.write_text("alice " + "a1" * 20 + "\n")
    tokens.chmod(0o600)
    return Settings(sandbox_pool_size=0, sandbox_http_tokens_file=tokens)


async def _ready_answer(http: httpx2.AsyncClient, base: str, engine: ProbedEngine) -> httpx2.Response:
    """/readyz's answer once it asked the engine (which starts beside the first requests)."""
    while True:
        response = await http.get(f"{base}/readyz")
        if engine.described:
            return response
        await anyio.sleep(0.05)


@pytest.mark.parametrize("engine", ["answers", "fails"])
async def test_the_probes_need_no_token_and_say_only_yes_or_no(tmp_path: Path, engine: str) -> None:
    backend = ProbedEngine(fails=engine == "fails")
    with anyio.fail_after(30):
        async with serving(lambda _port: _with_tokens(tmp_path), backend) as (base, _settings):
            http = httpx2.AsyncClient()
            async with http:
                assert (await http.post(f"{base}/mcp", json={})).status_code == 401  # the rest needs a token
                live = await http.get(f"{base}/healthz")
                assert (live.status_code, live.text) == (200, "ok\n")
                assert (await http.head(f"{base}/healthz")).status_code == 200
                ready = await _ready_answer(http, base, backend)
                expected = (503, "not ready\n") if engine == "fails" else (200, "ok\n")
                assert (ready.status_code, ready.text) == expected
                for response in (live, ready):
                    assert set(response.headers) <= {"content-type", "content-length", "cache-control", "date"}
                    assert "fake" not in response.text and ENGINE_SECRET not in response.text
