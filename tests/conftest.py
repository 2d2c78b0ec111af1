from __future__ import annotations

import pytest

from llm_sandbox_mcp.config import Settings, env_name


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--require-engines",
        default="",
        help="comma-separated engines that must be usable; a missing one fails instead of skipping",
    )


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never depend on the developer's shell: every variable Settings reads starts unset."""
    for name in Settings.model_fields:
        monkeypatch.delenv(env_name(name), raising=False)
    for alias in ("SANDBOX_MEMORY", "SANDBOX_MEM_LIMIT", "CONTAINER_HOST"):
        monkeypatch.delenv(alias, raising=False)
