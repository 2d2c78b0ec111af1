from __future__ import annotations

import pytest

from llm_sandbox_mcp.backends import select_backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable
from tests.engines.conftest import require

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


async def test_auto_prefers_docker_when_it_answers(request: pytest.FixtureRequest) -> None:
    await require(request, "docker")
    backend, why = await select_backend(Settings(backend="auto"))
    try:
        assert backend.name == "docker"
        assert why.startswith("BACKEND=auto chose docker (Docker Engine")
    finally:
        await backend.aclose()


async def test_auto_skips_an_unreachable_docker_and_says_why() -> None:
    # Podman or bubblewrap answer on a provisioned machine, so auto moves on to one of them.
    backend, why = await select_backend(Settings(backend="auto", docker_host="unix:///nonexistent/docker.sock"))
    try:
        assert backend.name != "docker"
        assert "skipped docker: The Docker engine socket /nonexistent/docker.sock does not exist" in why
    finally:
        await backend.aclose()


async def test_an_explicit_backend_never_falls_back() -> None:
    backend, why = await select_backend(Settings(backend="docker", docker_host="unix:///nonexistent/docker.sock"))
    try:
        assert backend.name == "docker" and why == "BACKEND=docker"
        with pytest.raises(BackendUnavailable, match="Docker engine socket .* does not exist"):
            await backend.describe()
    finally:
        await backend.aclose()
