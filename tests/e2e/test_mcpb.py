"""The Claude Desktop bundle: built and validated by the official `mcpb` tool, then started as the host would."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import TextContent

from llm_sandbox_mcp import __version__
from tests.e2e.test_clients import _npm_client  # pyright: ignore[reportPrivateUsage]

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
MISSING_SOCKET = "unix:///nonexistent/llm-sandbox-test.sock"


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mcpb = _npm_client("@anthropic-ai/mcpb", "mcpb")
    output = tmp_path_factory.mktemp("mcpb") / "llm-sandbox-mcp.mcpb"
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-mcpb"), str(output)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "MCPB": str(mcpb), "PYTHON": sys.executable},
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    assert "Manifest schema validation passes" in built.stdout
    return output


def _substitute(value: Any, variables: dict[str, str]) -> Any:
    """What the host does to mcp_config: `${__dirname}` and `${user_config.KEY}` replaced."""
    if isinstance(value, str):
        return re.sub(r"\$\{([^}]+)\}", lambda match: variables[match.group(1)], value)
    if isinstance(value, list):
        return [_substitute(item, variables) for item in value]  # pyright: ignore[reportUnknownVariableType]
    return {key: _substitute(item, variables) for key, item in value.items()}


def test_the_manifest_is_the_packages_with_engine_fields_for_the_user(bundle: Path) -> None:
    with zipfile.ZipFile(bundle) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        names = set(archive.namelist())
    assert manifest["version"] == __version__ and manifest["server"]["type"] == "uv"
    assert {"pyproject.toml", "icon.png", "llm_sandbox_mcp/__main__.py", "llm_sandbox_mcp/icon.svg"} <= names
    assert not any("__pycache__" in name for name in names)
    assert set(manifest["user_config"]) == {"backend", "docker_host", "podman_host", "kubeconfig"}
    assert manifest["server"]["mcp_config"]["env"]["BACKEND"] == "${user_config.backend}"
    assert {tool["name"] for tool in manifest["tools"]} >= {"execute_code", "create_session", "upload_file"}


async def test_the_bundle_starts_with_uv_and_the_users_settings_reach_the_server(bundle: Path, tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv is not None, "uv is needed to run a uv-type bundle"
    with zipfile.ZipFile(bundle) as archive:
        archive.extractall(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    values = {"__dirname": str(tmp_path), "user_config.backend": "docker", "user_config.docker_host": MISSING_SOCKET}
    values |= {"user_config.podman_host": "", "user_config.kubeconfig": ""}
    config = _substitute(manifest["server"]["mcp_config"], values)
    env = {"PATH": f"{Path(uv).parent}:/usr/bin:/bin", "HOME": str(Path.home()), **config["env"]}
    if os.environ.get("SSL_CERT_FILE"):
        env["SSL_CERT_FILE"] = os.environ["SSL_CERT_FILE"]  # uv reaches the package index to install dependencies
    params = StdioServerParameters(command=config["command"], args=config["args"], env=env)
    with anyio.fail_after(240):
        async with Client(params) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert "execute_code" in tools
            result = await client.call_tool("execute_code", {"code": "print(1)"})
    # BACKEND=docker never falls back, so the error names the socket the user gave: both settings arrived.
    assert result.is_error
    first = result.content[0]
    assert isinstance(first, TextContent)
    assert "nonexistent/llm-sandbox-test.sock" in first.text, first.text
