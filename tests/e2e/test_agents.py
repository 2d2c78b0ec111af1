"""Real agent CLIs call our tools, and the tests read what each CLI relays back (../shared/CLIENTS.md).

Each CLI runs from the npm cache in a throwaway HOME with our entry written by `llm-sandbox-mcp install`. Codex
is driven without a model through `codex app-server`; Gemini CLI and Claude Code get a scripted stand-in model
on 127.0.0.1 (tests/support/model_stand_ins.py), which records the requests that carry the tool results back.
Nothing leaves 127.0.0.1: every model URL points there and the CLIs' own network features are switched off.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_clients import _npm_client  # pyright: ignore[reportPrivateUsage]
from tests.e2e.test_stdio import SCRIPT
from tests.engines.conftest import require_now
from tests.support.model_stand_ins import JSON, AnthropicStandIn, GeminiStandIn, Say, ToolCall
from tests.support.offline import CLAUDE_OFFLINE, CODEX_OFFLINE, quiet_gemini

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

PNG = b"\x89PNG\r\n\x1a\n"
PLOT = "import matplotlib.pyplot as plt\nprint('hello from the sandbox')\nplt.plot([1, 2, 3])\nplt.show()"


@pytest.fixture
def docker_required(request: pytest.FixtureRequest) -> None:
    require_now(request, "docker")


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), **extra}


def _install(client: str, home: Path) -> None:
    installed = subprocess.run(
        [SCRIPT, "install", "--client", client, "--command", SCRIPT, "--env", "SANDBOX_LOG_LEVEL=WARNING"],
        capture_output=True, text=True, timeout=60, env=_env(home), cwd=home,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr


def _is_png(data: str) -> bool:
    return base64.b64decode(data).startswith(PNG)


# Codex: the model URL goes to a closed port on 127.0.0.1; plugins (a git clone from GitHub), apps and update
# checks are off.


def _codex_call(codex: str, home: Path, tool: str, arguments: JSON) -> JSON:
    """`mcpServer/tool/call` in a fresh ephemeral thread of `codex app-server`: the result Codex relays."""
    answer = _codex_answer(codex, home, "llm-sandbox", tool, arguments)
    assert "result" in answer, answer
    result: JSON = answer["result"]
    return result


def _codex_answer(codex: str, home: Path, server_name: str, tool: str, arguments: JSON, **env: str) -> JSON:
    """The JSON-RPC answer (`result` or `error`) of `codex app-server` to `mcpServer/tool/call` of `tool` on the
    configured server `server_name`, in a fresh ephemeral thread, with `env` added to Codex's environment."""
    with subprocess.Popen(
        [codex, "app-server", *CODEX_OFFLINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True, env=_env(home, **env), cwd=home,
    ) as server:  # fmt: skip
        assert server.stdin is not None and server.stdout is not None
        stdin = server.stdin

        def send(message: JSON) -> None:
            stdin.write(json.dumps(message) + "\n")
            stdin.flush()

        watchdog = threading.Timer(120, server.kill)
        watchdog.start()
        try:
            send(
                {
                    "id": 0,
                    "method": "initialize",
                    "params": {"clientInfo": {"name": "e2e", "title": None, "version": "1"}},
                }
            )
            send({"method": "initialized"})
            send({"id": 1, "method": "thread/start", "params": {"ephemeral": True, "cwd": str(home)}})
            for line in server.stdout:
                message: JSON = json.loads(line)
                if message.get("id") == 1:
                    assert "result" in message, message
                    thread = message["result"]["thread"]["id"]
                    params = {"server": server_name, "threadId": thread, "tool": tool, "arguments": arguments}
                    send({"id": 2, "method": "mcpServer/tool/call", "params": params})
                elif message.get("id") == 2:
                    return message
        finally:
            watchdog.cancel()
            server.kill()
    raise AssertionError("codex app-server ended without answering mcpServer/tool/call")


def test_codex_relays_stdout_exit_code_and_the_plot(docker_required: None, tmp_path: Path) -> None:
    codex = str(_npm_client("@openai/codex", "codex"))
    _install("codex", tmp_path)
    result = _codex_call(codex, tmp_path, "execute_code", {"code": PLOT})
    assert result.get("isError") in (None, False), result
    content: list[JSON] = result["content"]
    text = json.loads(content[0]["text"])
    assert text["stdout"] == "hello from the sandbox\n" and text["exit_code"] == 0
    structured: JSON = result["structuredContent"]
    assert structured["stdout"] == "hello from the sandbox\n" and structured["exit_code"] == 0
    images = [block for block in content if block["type"] == "image"]
    assert [image["mimeType"] for image in images] == ["image/png"]
    assert _is_png(images[0]["data"])


def _gemini_home(home: Path, project: Path) -> None:
    """Our entry, API-key auth, the project trusted, and no telemetry or update checks."""
    _install("gemini", home)
    path = home / ".gemini" / "settings.json"
    settings: JSON = json.loads(path.read_text())
    settings["security"] = {"auth": {"selectedType": "gemini-api-key"}}
    path.write_text(json.dumps(settings))
    quiet_gemini(home)
    (home / ".gemini" / "trustedFolders.json").write_text(json.dumps({str(project): "TRUST_FOLDER"}))


def test_gemini_relays_stdout_exit_code_and_the_plot_to_its_model(docker_required: None, tmp_path: Path) -> None:
    gemini = str(_npm_client("@google/gemini-cli", "gemini"))
    project = tmp_path / "project"
    project.mkdir()
    _gemini_home(tmp_path, project)

    def script(body: JSON) -> ToolCall | Say:
        if any("functionResponse" in part for part in GeminiStandIn.parts(body)):
            return Say("The sandbox printed a line and drew a plot.")
        names = [name for name in GeminiStandIn.declared_tools(body) if name.endswith("execute_code")]
        assert len(names) == 1, GeminiStandIn.declared_tools(body)
        return ToolCall(names[0], {"code": PLOT})

    with GeminiStandIn(script) as model:
        env = _env(tmp_path, GOOGLE_GEMINI_BASE_URL=model.url, GEMINI_API_KEY="dummy")
        ran = subprocess.run(
            [gemini, "-p", "Run the plot in the sandbox.", "--yolo", "-o", "json"],
            capture_output=True, text=True, timeout=150, env=env, cwd=project,
        )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert json.loads(ran.stdout)["response"] == "The sandbox printed a line and drew a plot."
    turns = [request for request in model.requests if GeminiStandIn.declared_tools(request.body)]
    follow_ups = [turn for turn in turns if any("functionResponse" in p for p in GeminiStandIn.parts(turn.body))]
    assert len(follow_ups) == 1, [request.path for request in model.requests]
    parts = GeminiStandIn.parts(follow_ups[0].body)
    response = next(part["functionResponse"] for part in parts if "functionResponse" in part)
    assert response["name"].endswith("execute_code")
    output: str = response["response"]["output"]  # our JSON text, wrapped in Gemini CLI's own markers
    result, end = json.JSONDecoder().raw_decode(output, output.index("{"))
    assert "image/png" in output[end:]  # and a note that an image follows
    assert result["stdout"] == "hello from the sandbox\n" and result["exit_code"] == 0
    images = [part["inlineData"] for part in parts if "inlineData" in part]
    assert [image["mimeType"] for image in images] == ["image/png"]
    assert _is_png(images[0]["data"])


def test_claude_code_relays_a_background_job_and_then_its_result(docker_required: None, tmp_path: Path) -> None:
    """Issue 14 through a real agent: `execute_code(background=true)` hands back a job, `get_job` its end."""
    claude = str(_npm_client("@anthropic-ai/claude-code", "claude"))
    _install("claude-code", tmp_path)
    execute, get_job = "mcp__llm-sandbox__execute_code", "mcp__llm-sandbox__get_job"
    code = "import time\ntime.sleep(3)\nprint('slept well')"
    seen: list[Any] = []

    def script(body: JSON) -> ToolCall | Say:
        results = AnthropicStandIn.tool_results(body)
        if not results:
            return ToolCall(execute, {"code": code, "background": True})
        relayed = json.loads(AnthropicStandIn.text_of(results[-1]))
        seen.append(relayed)
        if len(results) == 1:
            return ToolCall(get_job, {"job_id": relayed["job_id"], "wait": 30})
        return Say("The job finished.")

    with AnthropicStandIn(script) as model:
        env = _env(tmp_path, ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="dummy", **CLAUDE_OFFLINE)
        ran = subprocess.run(
            [claude, "-p", "Run it in the background and wait for it.", "--allowedTools", f"{execute},{get_job}",
             "--output-format", "json"],
            capture_output=True, text=True, timeout=150, env=env, cwd=tmp_path,
        )  # fmt: skip
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert json.loads(ran.stdout)["result"] == "The job finished."
    assert len(seen) == 2, seen
    handle, finished = seen
    assert handle["status"] == "running" and handle["exit_code"] is None
    assert handle["job_id"].startswith("j-") and f"get_job(job_id='{handle['job_id']}'" in handle["message"]
    assert finished["job_id"] == handle["job_id"] and finished["status"] == "finished"
    assert finished["stdout"] == "slept well\n"
    assert finished["result"]["exit_code"] == 0 and finished["result"]["stdout"] == "slept well\n"
    assert finished["result"]["duration_ms"] >= 3000
