"""Independent MCP clients our users run, against the installed console script (../shared/CLIENTS.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_stdio import ENV, SCRIPT
from tests.engines.conftest import require_now
from tests.support.offline import CLAUDE_OFFLINE

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

CLIENTS = Path.home() / ".cache" / "llm-sandbox-mcp-tests" / "clients"


def _npm_client(package: str, binary: str, folder: str | None = None) -> Path:
    """Install an npm client once into a cache (the npm registry is reachable; later runs reuse it), in
    `folder` (default: the binary's name; another one for a second version of the same client)."""
    prefix = CLIENTS / (folder or binary)
    path = prefix / "bin" / binary
    if not path.exists():
        npm = shutil.which("npm")
        assert npm is not None, "npm is needed for the client acceptance tests (scripts/provision.sh installs it)"
        subprocess.run([npm, "install", "-g", "--prefix", str(prefix), package], check=True, capture_output=True)
    return path


@pytest.fixture
def docker_required(request: pytest.FixtureRequest) -> None:
    require_now(request, "docker")


def test_mcp_inspector_cli_lists_and_calls_tools(docker_required: None, tmp_path: Path) -> None:
    inspector = _npm_client("@modelcontextprotocol/inspector@0.15", "mcp-inspector")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **CLAUDE_OFFLINE, **ENV}
    listed = subprocess.run(
        [str(inspector), "--cli", SCRIPT, "--method", "tools/list"], capture_output=True, timeout=120, env=env
    )
    names = {tool["name"] for tool in json.loads(listed.stdout)["tools"]}
    assert {"execute_code", "create_session", "upload_file"} <= names
    called = subprocess.run(
        [str(inspector), "--cli", SCRIPT, "--method", "tools/call", "--tool-name", "execute_code",
         "--tool-arg", "code=print(6 * 7)"],
        capture_output=True, timeout=120, env=env,
    )  # fmt: skip
    result = json.loads(called.stdout)
    assert result["isError"] is False
    assert result["structuredContent"]["stdout"] == "42\n"


def test_claude_code_health_check_connects(docker_required: None, tmp_path: Path) -> None:
    claude = _npm_client("@anthropic-ai/claude-code", "claude")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **CLAUDE_OFFLINE, **ENV}
    added = subprocess.run(
        [str(claude), "mcp", "add", "llm-sandbox", "--", SCRIPT],
        capture_output=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    listed = subprocess.run(
        [str(claude), "mcp", "list"], capture_output=True, timeout=120, env=env, cwd=tmp_path
    ).stdout.decode()
    assert "llm-sandbox" in listed and "Connected" in listed and "Failed" not in listed, listed
