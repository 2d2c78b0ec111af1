"""`llm-sandbox-mcp install --client …` read back by the real clients (../shared/CLIENTS.md), in a throwaway HOME.

Each client is installed from the npm registry once (a missing client fails, never skips); the entry runs the
console script under test, and each client then starts it and checks the connection its own way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_clients import _npm_client  # pyright: ignore[reportPrivateUsage]
from tests.e2e.test_stdio import SCRIPT
from tests.support.offline import CLAUDE_OFFLINE, CODEX_OFFLINE, quiet_gemini

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
QUIET = ["--env", "SANDBOX_LOG_LEVEL=WARNING"]


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), **CLAUDE_OFFLINE, **extra}


def _run(argv: list[str], home: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env(home, **extra), cwd=home)


def test_claude_code_connects_to_the_installed_entry_and_forgets_it_after_uninstall(tmp_path: Path) -> None:
    claude = str(_npm_client("@anthropic-ai/claude-code", "claude"))
    installed = _run([SCRIPT, "install", "--client", "claude-code", "--command", SCRIPT, *QUIET], tmp_path)
    assert installed.returncode == 0, installed.stderr
    got = _run([claude, "mcp", "get", "llm-sandbox"], tmp_path)
    assert "Connected" in got.stdout and "Failed" not in got.stdout, got.stdout + got.stderr
    assert "Scope: Local" in got.stdout and SCRIPT in got.stdout
    removed = _run([SCRIPT, "uninstall", "--client", "claude-code"], tmp_path)
    assert removed.returncode == 0, removed.stderr
    gone = _run([claude, "mcp", "get", "llm-sandbox"], tmp_path)
    assert gone.returncode != 0 and "No MCP server" in gone.stderr, gone.stdout + gone.stderr


def test_claude_code_starts_the_default_uvx_entry_with_a_minimal_path(tmp_path: Path) -> None:
    """The entry users get: `uvx llm-sandbox-mcp` by uvx's full path, with the CA bundle uvx needs.

    The package comes from a wheel built here (UV_FIND_LINKS), its dependencies from the package index.
    """
    claude = str(_npm_client("@anthropic-ai/claude-code", "claude"))
    uv, uvx = shutil.which("uv"), shutil.which("uvx")
    assert uv is not None and uvx is not None, "uv is needed for the uvx entry"
    wheels = tmp_path / "wheels"
    subprocess.run([uv, "build", "--wheel", "-q", "--out-dir", str(wheels)], cwd=ROOT, check=True, timeout=300)
    cache = subprocess.run([uv, "cache", "dir"], capture_output=True, text=True, check=True).stdout.strip()
    shell = {"PATH": f"{Path(uvx).parent}:/usr/bin:/bin"}
    if os.environ.get("SSL_CERT_FILE"):
        shell["SSL_CERT_FILE"] = os.environ["SSL_CERT_FILE"]
    extra = ["--env", f"UV_FIND_LINKS={wheels}", "--env", f"UV_CACHE_DIR={cache}"]
    installed = _run([SCRIPT, "install", "--client", "claude-code", *QUIET, *extra], tmp_path, **shell)
    assert installed.returncode == 0, installed.stderr
    entry = json.loads((tmp_path / ".claude.json").read_text())["projects"][str(tmp_path.resolve())]["mcpServers"]
    assert entry["llm-sandbox"]["command"] == uvx and entry["llm-sandbox"]["args"] == ["llm-sandbox-mcp"]
    got = _run([claude, "mcp", "get", "llm-sandbox"], tmp_path, MCP_TIMEOUT="120000")  # PATH without uvx
    assert "Connected" in got.stdout and "Failed" not in got.stdout, got.stdout + got.stderr


def test_gemini_connects_and_the_variables_it_would_redact_reach_the_server(tmp_path: Path) -> None:
    """Gemini CLI strips inherited variables named like secrets (…CERT…); the entry must still deliver them."""
    gemini = str(_npm_client("@google/gemini-cli", "gemini"))
    guard = tmp_path / "guarded-server"
    guard.write_text(
        "#!/bin/sh\n"
        f'[ "$SSL_CERT_FILE" = "{CA_BUNDLE}" ] || {{ echo "SSL_CERT_FILE did not arrive" >&2; exit 3; }}\n'
        '[ "$DOCKER_HOST" = "unix:///var/run/docker.sock" ] || { echo "DOCKER_HOST did not arrive" >&2; exit 3; }\n'
        f'exec "{SCRIPT}" "$@"\n'
    )
    guard.chmod(0o755)
    installed = _run(
        [SCRIPT, "install", "--client", "gemini", "--command", str(guard), *QUIET], tmp_path,
        SSL_CERT_FILE=CA_BUNDLE, DOCKER_HOST="unix:///var/run/docker.sock",
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    settings = json.loads((tmp_path / ".gemini" / "settings.json").read_text())
    assert settings["mcpServers"]["llm-sandbox"]["command"] == "env"
    # Gemini itself runs with the variable set: it is the redaction, not a missing value, that the entry survives.
    quiet_gemini(tmp_path)
    listed = _run([gemini, "mcp", "list"], tmp_path, GEMINI_CLI_TRUST_WORKSPACE="true", SSL_CERT_FILE=CA_BUNDLE)
    output = listed.stdout + listed.stderr  # Gemini CLI prints the list on stderr
    line = next((line for line in output.splitlines() if "llm-sandbox:" in line), "")
    assert "Connected" in line and "Disconnected" not in line, output


def test_codex_reads_the_entry_and_its_app_server_connects(tmp_path: Path) -> None:
    codex = str(_npm_client("@openai/codex", "codex"))
    installed = _run(
        [SCRIPT, "install", "--client", "codex", "--command", SCRIPT, *QUIET], tmp_path, DOCKER_HOST="unix:///x.sock"
    )
    assert installed.returncode == 0, installed.stderr
    got = _run([codex, "mcp", "get", "llm-sandbox", "--json"], tmp_path)
    entry = json.loads(got.stdout)
    assert entry["transport"]["command"] == SCRIPT
    assert entry["transport"]["env"] == {"DOCKER_HOST": "unix:///x.sock", "SANDBOX_LOG_LEVEL": "WARNING"}
    assert entry["startup_timeout_sec"] == 120 and entry["tool_timeout_sec"] == 660
    assert _codex_server_tools(codex, tmp_path) >= {"execute_code", "create_session"}
    assert _run([SCRIPT, "uninstall", "--client", "codex"], tmp_path).returncode == 0
    assert "llm-sandbox" not in _run([codex, "mcp", "list"], tmp_path).stdout


def _codex_server_tools(codex: str, home: Path) -> set[str]:
    """The tools `codex app-server` found by starting the server (JSON-RPC `mcpServerStatus/list`)."""
    requests: list[dict[str, Any]] = [
        {"id": 0, "method": "initialize", "params": {"clientInfo": {"name": "test", "title": None, "version": "1"}}},
        {"method": "initialized"},
        {"id": 1, "method": "mcpServerStatus/list", "params": {}},
    ]
    with subprocess.Popen(
        [codex, "app-server", *CODEX_OFFLINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=_env(home), cwd=home,
    ) as server:  # fmt: skip
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write("".join(json.dumps(request) + "\n" for request in requests))
        server.stdin.flush()
        watchdog = threading.Timer(60, server.kill)
        watchdog.start()
        try:
            for line in server.stdout:
                message = json.loads(line)
                if message.get("id") == 1:
                    statuses = {status["name"]: status for status in message["result"]["data"]}
                    return set(statuses["llm-sandbox"]["tools"] or {})
        finally:
            watchdog.cancel()
            server.kill()
    raise AssertionError("codex app-server ended without answering mcpServerStatus/list")
