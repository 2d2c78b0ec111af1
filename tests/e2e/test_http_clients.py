"""Real MCP clients against `serve --http` with a bearer token, as a team's users connect (../shared/CLIENTS.md):
the MCP Inspector CLI, Claude Code, Gemini CLI and Codex, each from the npm cache in a throwaway HOME, against the
installed console script on loopback (bubblewrap, the cheapest engine to start) with a tokens file. Each is also
given a wrong token, or none, and must fail: the proof the checks are not blind. Claude Code also runs a call
that a scripted stand-in model asks for (tests/support/model_stand_ins.py), over HTTP.

One server serves the module; its log is read for the principal each call ran as. About 25 seconds in all once
the clients are installed (measured on the shared 2-core machine under load: the server's start with the engine
check about 5, each CLI run 1 to 2, the agent's turn about 3), worth it as the only test of the clients a team
uses against the HTTP face. The first run installs Inspector 0.17.5 (about 20 seconds, 160 MB).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest

from tests.e2e.test_agents import _codex_answer  # pyright: ignore[reportPrivateUsage]
from tests.e2e.test_clients import _npm_client  # pyright: ignore[reportPrivateUsage]
from tests.e2e.test_http import _environment, _free_port  # pyright: ignore[reportPrivateUsage]
from tests.e2e.test_stdio import SCRIPT
from tests.engines.conftest import require_now
from tests.support.model_stand_ins import JSON, AnthropicStandIn, Say, ToolCall
from tests.support.offline import CLAUDE_OFFLINE, quiet_gemini

pytestmark = [pytest.mark.e2e, pytest.mark.bubblewrap]

TOKEN = "carol-token-" + "d4" * 16
WRONG = "carol-token-" + "e5" * 16  # well formed, not in the file
# Inspector 0.15 (test_clients.py, on Node 20) has no way to send a header; 0.17.5 runs on Node 20 too.
INSPECTOR = "@modelcontextprotocol/inspector@0.17.5"


@dataclass
class Served:
    url: str
    log: Path


@pytest.fixture(scope="module")
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    require_now(request, "bubblewrap")
    folder = tmp_path_factory.mktemp("http-clients")
    tokens = folder / "tokens"
    tokens.write_text(f"carol {TOKEN}\n")
    tokens.chmod(0o600)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    log = folder / "server.log"
    env = _environment(SANDBOX_HTTP_TOKENS_FILE=str(tokens))
    with log.open("wb") as err:
        process = subprocess.Popen(
            [SCRIPT, "serve", "--http", f"127.0.0.1:{port}"], env=env, stdout=subprocess.DEVNULL, stderr=err
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield Served(url, log)
    finally:
        process.terminate()
        process.wait(timeout=60)


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), **extra}


def _calls_by_carol(served: Served) -> int:
    return served.log.read_text().count("principal=carol tool=execute_code")


# MCP Inspector: its CLI makes one request per run and prints the result as JSON, or the error and exit 1.


def _inspector(home: Path, served: Served, header: str | None, *method: str) -> subprocess.CompletedProcess[str]:
    inspector = _npm_client(INSPECTOR, "mcp-inspector", "mcp-inspector-0.17.5")
    headers = ["--header", f"Authorization: Bearer {header}"] if header is not None else []
    return subprocess.run(
        [str(inspector), "--cli", served.url, "--transport", "http", *headers, "--method", *method],
        capture_output=True, text=True, timeout=120, env=_env(home), cwd=home,
    )  # fmt: skip


def test_mcp_inspector_lists_and_calls_tools_over_http_with_the_token(served: Served, tmp_path: Path) -> None:
    listed = _inspector(tmp_path, served, TOKEN, "tools/list")
    assert listed.returncode == 0, listed.stderr
    names = {tool["name"] for tool in json.loads(listed.stdout)["tools"]}
    assert {"execute_code", "create_session", "upload_file"} <= names
    before = _calls_by_carol(served)
    called = _inspector(
        tmp_path, served, TOKEN, "tools/call", "--tool-name", "execute_code", "--tool-arg", "code=print(6 * 7)"
    )
    assert called.returncode == 0, called.stderr
    result = json.loads(called.stdout)
    assert result["isError"] is False
    assert result["structuredContent"]["stdout"] == "42\n"
    assert json.loads(result["content"][0]["text"])["stdout"] == "42\n"
    assert _calls_by_carol(served) == before + 1  # the call ran as the token's principal


def test_mcp_inspector_without_the_header_fails_and_says_why(served: Served, tmp_path: Path) -> None:
    """(A wrong token is refused the same way, by the same middleware; the other clients try that.)"""
    before = _calls_by_carol(served)
    called = _inspector(
        tmp_path, served, None, "tools/call", "--tool-name", "execute_code", "--tool-arg", "code=print(6 * 7)"
    )
    assert called.returncode != 0
    assert "42" not in called.stdout
    # The Inspector prints the server's 401 body: the refusal reaches the person, not a generic failure.
    assert "Failed to connect" in called.stderr and "invalid_token" in called.stderr, called.stderr
    assert _calls_by_carol(served) == before


# Claude Code and Gemini CLI: `mcp list` health-checks every configured server (initialize, then tools/list for
# Claude Code, ping for Gemini CLI). One entry per case, checked in one run.

ENTRIES = {"with-token": TOKEN, "wrong-token": WRONG, "no-header": None}


def _statuses(listed: str) -> dict[str, str]:
    """`NAME: URL (transport) - STATUS` lines (after Gemini CLI's `✓ `/`✗ ` mark) by name."""
    statuses: dict[str, str] = {}
    for line in listed.splitlines():
        name, colon, rest = line.lstrip("✓✗ ").partition(": ")
        if colon and name in ENTRIES:
            statuses[name] = rest.rpartition(" - ")[2]
    return statuses


def test_claude_code_connects_over_http_with_the_token_only(served: Served, tmp_path: Path) -> None:
    claude = str(_npm_client("@anthropic-ai/claude-code", "claude"))
    env = _env(tmp_path, **CLAUDE_OFFLINE)
    for name in ("with-token", "wrong-token"):  # (no header: as a wrong token, and each add costs a second)
        added = subprocess.run(
            [claude, "mcp", "add", "--transport", "http", name, served.url,
             "--header", f"Authorization: Bearer {ENTRIES[name]}"],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
    listed = subprocess.run(
        [claude, "mcp", "list"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    ).stdout
    assert _statuses(listed) == {"with-token": "✔ Connected", "wrong-token": "✘ Failed to connect"}, listed


def test_gemini_cli_connects_over_http_with_the_token_only(served: Served, tmp_path: Path) -> None:
    gemini = str(_npm_client("@google/gemini-cli", "gemini"))
    quiet_gemini(tmp_path)
    path = tmp_path / ".gemini" / "settings.json"
    settings: JSON = json.loads(path.read_text())
    settings["mcpServers"] = {
        name: {"httpUrl": served.url, **({"headers": {"Authorization": f"Bearer {token}"}} if token else {})}
        for name, token in ENTRIES.items()
    }
    path.write_text(json.dumps(settings))
    env = _env(tmp_path, GEMINI_CLI_TRUST_WORKSPACE="true")
    ran = subprocess.run([gemini, "mcp", "list"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    listed = ran.stdout + ran.stderr  # the list comes on stderr
    assert _statuses(listed) == {
        "with-token": "Connected",
        "wrong-token": "Disconnected",
        "no-header": "Disconnected",
    }, listed


def test_claude_code_runs_code_over_http_when_its_model_asks(served: Served, tmp_path: Path) -> None:
    """A whole agent turn: the stand-in model asks for `execute_code`, Claude Code calls it over HTTP with the
    token, and relays our result to the model."""
    claude = str(_npm_client("@anthropic-ai/claude-code", "claude"))
    added = subprocess.run(
        [claude, "mcp", "add", "--transport", "http", "team-sandbox", served.url,
         "--header", f"Authorization: Bearer {TOKEN}"],
        capture_output=True, text=True, timeout=120, env=_env(tmp_path, **CLAUDE_OFFLINE), cwd=tmp_path,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    execute = "mcp__team-sandbox__execute_code"
    relayed: list[JSON] = []

    def script(body: JSON) -> ToolCall | Say:
        results = AnthropicStandIn.tool_results(body)
        if not results:
            assert execute in AnthropicStandIn.declared_tools(body), AnthropicStandIn.declared_tools(body)
            return ToolCall(execute, {"code": "print(6 * 7)"})
        relayed.append(json.loads(AnthropicStandIn.text_of(results[-1])))
        return Say("It printed 42.")

    before = _calls_by_carol(served)
    with AnthropicStandIn(script) as model:
        env = _env(tmp_path, ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="dummy", **CLAUDE_OFFLINE)
        ran = subprocess.run(
            [claude, "-p", "Print 6 * 7 in the sandbox.", "--allowedTools", execute, "--output-format", "json"],
            capture_output=True, text=True, timeout=150, env=env, cwd=tmp_path,
        )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert json.loads(ran.stdout)["result"] == "It printed 42."
    assert len(relayed) == 1, relayed
    assert relayed[0]["stdout"] == "42\n" and relayed[0]["exit_code"] == 0
    assert _calls_by_carol(served) == before + 1


@pytest.mark.parametrize("token", [TOKEN, WRONG], ids=["with-token", "wrong-token"])
def test_codex_calls_over_http_with_the_token_only(served: Served, tmp_path: Path, token: str) -> None:
    """Codex's own HTTP entry (`--url`, `--bearer-token-env-var`), driven without a model through `codex
    app-server`'s `mcpServer/tool/call`."""
    codex = str(_npm_client("@openai/codex", "codex"))
    added = subprocess.run(
        [codex, "mcp", "add", "team-sandbox", "--url", served.url, "--bearer-token-env-var", "TEAM_SANDBOX_TOKEN"],
        capture_output=True, text=True, timeout=120, env=_env(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    before = _calls_by_carol(served)
    answer = _codex_answer(
        codex, tmp_path, "team-sandbox", "execute_code", {"code": "print(6 * 7)"}, TEAM_SANDBOX_TOKEN=token
    )
    if token == TOKEN:
        assert answer["result"]["structuredContent"]["stdout"] == "42\n", answer
        assert answer["result"].get("isError") in (None, False), answer
        assert _calls_by_carol(served) == before + 1
    else:
        assert "Auth required" in answer["error"]["message"], answer
        assert _calls_by_carol(served) == before
