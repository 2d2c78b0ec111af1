"""Off Linux the daemonless engines say they need Linux and what to use instead, and BACKEND=auto does not try
them. Checked here by taking the macOS and Windows branches (`sys.platform`); the workflow meets the real ones."""

from __future__ import annotations

import sys

import pytest

from llm_sandbox_mcp.backends import auto_order, load_backend, select_backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable

NOWHERE = "tcp://127.0.0.1:9"


@pytest.mark.parametrize(("platform", "system"), [("darwin", "macOS"), ("win32", "Windows")])
@pytest.mark.parametrize("engine", ["bubblewrap", "nsjail"])
def test_a_daemonless_engine_chosen_off_linux_names_the_engines_to_use(
    monkeypatch: pytest.MonkeyPatch, platform: str, system: str, engine: str
) -> None:
    monkeypatch.setattr(sys, "platform", platform)
    with pytest.raises(BackendUnavailable) as refused:
        load_backend(engine, Settings())
    message = str(refused.value)
    assert message.startswith(f"Backend {engine!r} needs Linux (it builds sandboxes from Linux namespaces) and this is")
    assert f"this is {system}" in message
    assert "BACKEND=docker" in message and "BACKEND=podman" in message and "BACKEND=kubernetes" in message
    assert ("WSL2" in message) == (platform == "win32")


def test_auto_tries_the_daemonless_engines_on_linux_only() -> None:
    assert auto_order("linux") == ("docker", "podman", "bubblewrap", "nsjail")
    assert auto_order("darwin") == auto_order("win32") == ("docker", "podman")


@pytest.mark.anyio
async def test_off_linux_auto_with_no_engine_says_so_without_the_daemonless_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(BackendUnavailable) as refused:
        await select_backend(Settings(backend="auto", docker_host=NOWHERE, podman_host=NOWHERE))
    message = str(refused.value)
    assert message.startswith("BACKEND=auto found no usable engine. docker: ")
    assert " | podman: " in message and "start Docker or Podman;" in message
    assert "bubblewrap" not in message and "nsjail" not in message
