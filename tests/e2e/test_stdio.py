"""The installed console script, driven over real stdio by the official MCP client: the process boundary itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import ImageContent, TextContent

from tests.engines.conftest import HOST_CA_BUNDLE, require_now

pytestmark = [pytest.mark.anyio, pytest.mark.e2e, pytest.mark.docker]

# scripts/test points this at the console script installed from the built wheel.
SCRIPT = os.environ.get("LLM_SANDBOX_MCP_COMMAND") or str(Path(sys.executable).parent / "llm-sandbox-mcp")
ENV = {"SANDBOX_LOG_LEVEL": "WARNING"}  # installers as a user has them: through the egress proxy
if Path(HOST_CA_BUNDLE).is_file():
    ENV["SANDBOX_INSTALL_CA_BUNDLE"] = HOST_CA_BUNDLE


@pytest.fixture
def docker_required(request: pytest.FixtureRequest) -> None:
    require_now(request, "docker")


async def test_a_client_with_a_minimal_environment_runs_code_and_gets_plots(docker_required: None) -> None:
    params = StdioServerParameters(command=SCRIPT, env=ENV)
    with anyio.fail_after(120):
        async with Client(params) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            assert {"execute_code", "get_supported_languages", "get_language_details"} <= tools
            result = await client.call_tool("execute_code", {"code": "print(6 * 7)"})
            first = result.content[0]
            assert isinstance(first, TextContent)
            assert json.loads(first.text)["stdout"] == "42\n"
            assert result.structured_content is not None and result.structured_content["exit_code"] == 0
            plot = await client.call_tool(
                "execute_code",
                {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nplt.plot([2, 1])\nplt.show()"},
            )
            images = [block for block in plot.content if isinstance(block, ImageContent)]
            assert [image.mime_type for image in images] == ["image/png", "image/png"]
            bad = await client.call_tool("execute_code", {"code": "1", "language": "brainfuck"})
            assert bad.is_error
            created = await client.call_tool("create_session", {})
            assert created.structured_content is not None
            session = {"session_id": created.structured_content["session_id"]}
            await client.call_tool("execute_code", {"code": "total = 40", **session})
            cell = await client.call_tool("execute_code", {"code": "total + 2", **session})
            assert cell.structured_content is not None and cell.structured_content["stdout"] == "42\n"
            upload = {"path": "in.txt", "content": "hi", **session}
            assert not (await client.call_tool("upload_file", upload)).is_error
            download = await client.call_tool("download_file", {"path": "in.txt", **session})
            assert download.structured_content is not None and download.structured_content["content"] == "hi"


async def test_over_stdio_a_long_call_sends_progress_and_a_foreground_call_past_the_limit_becomes_a_job(
    docker_required: None,
) -> None:
    """Waits for events, never for the machine to be fast enough. The handover cannot miss: the foreground limit
    (5 s) is counted from the job's start, the program's ten steps take 7.5 s of its own time, and it starts only
    after its sandbox does. Progress notifications come every 2 s of the foreground wait, whatever the run is doing
    (on a loaded or fresh machine it may still be starting its sandbox at the handover: the first version of this
    test expected a line of output by then and failed so); the run's output in the progress summary is read from
    get_job while the job runs, and each poll returns within 3 s, so one lands inside the program's 7.5 s.

    Worst case: start-up and the first sandbox (seconds here; the 120 s bound is for a cold, loaded machine), then
    the 5 s limit, the rest of the program's 7.5 s and one 3 s poll."""
    env = {**ENV, "SANDBOX_FOREGROUND_LIMIT": "5"}
    code = "import time\nfor step in range(10):\n    print(f'step {step}', flush=True)\n    time.sleep(0.75)"
    messages: list[str] = []
    summaries: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    with anyio.fail_after(120):
        async with Client(StdioServerParameters(command=SCRIPT, env=env)) as client:
            handed = await client.call_tool("execute_code", {"code": code}, progress_callback=on_progress)
            assert handed.structured_content is not None and handed.structured_content["status"] == "running"
            job = {"job_id": handed.structured_content["job_id"], "wait": 3}
            info = handed.structured_content
            while info.get("status") == "running":
                polled = await client.call_tool("get_job", job)
                assert polled.structured_content is not None
                info = polled.structured_content
                if info["status"] == "running":
                    summaries.append(info["progress"])
    assert info["status"] == "finished" and info["result"]["stdout"].endswith("step 9\n")
    assert messages, "no progress notification while the call waited in the foreground"
    assert all(re.match(r"^[a-z].*, \d+ s\b", message) for message in messages), messages
    assert any(text.startswith("running python") and "last line: step" in text for text in summaries), summaries


def test_malformed_protocol_messages_do_not_kill_the_server(docker_required: None) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    }
    lines = [
        b"this is not json\n",
        b"\xff\xfe\x00garbage\n",
        b'{"jsonrpc": "2.0", "id": 7, "method": "no/such/method"}\n',
        json.dumps(init).encode() + b"\n",
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n',
        b'{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "execute_code", "arguments": 5}}\n',
        b'{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}\n',
    ]
    server = subprocess.Popen(
        [SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", **ENV},
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        server.stdin.write(b"".join(lines))
        server.stdin.flush()
        replies: dict[object, dict[str, object]] = {}
        while 3 not in replies:
            line = server.stdout.readline()  # the test's timeout bounds this
            assert line, "server closed stdout before answering"
            reply = json.loads(line)
            replies[reply.get("id")] = reply
            assert b"Traceback" not in line
        assert "result" in replies[1]
        assert "error" in replies[7] and "error" in replies[2]
        assert "execute_code" in json.dumps(replies[3]["result"])
        assert server.poll() is None
    finally:
        server.stdin.close()
        server.wait(timeout=30)
        server.stdout.close()
        if server.stderr is not None:
            server.stderr.close()


def test_bad_configuration_exits_2_with_one_line_per_variable() -> None:
    completed = subprocess.run(
        [SCRIPT],
        capture_output=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "SANDBOX_PIDS_LIMIT": "lots", "BACKEND": "vmware"},
        stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 2
    assert completed.stdout == b""
    lines = completed.stderr.decode().strip().splitlines()
    assert [line.split(":")[1].strip() for line in lines] == ["invalid configuration"] * 2
    assert any("BACKEND" in line for line in lines) and any("SANDBOX_PIDS_LIMIT" in line for line in lines)


def test_doctor_reports_the_configured_backend(docker_required: None) -> None:
    env = {"PATH": "/usr/bin:/bin", "SANDBOX_POOL_SIZE": "3", "SANDBOX_MEMORY_BUDGET": "3g"}
    completed = subprocess.run([SCRIPT, "doctor"], capture_output=True, timeout=120, env=env)
    out = completed.stdout.decode()
    assert completed.returncode == 0, out
    assert "docker      ok" in out and "configured backend: docker (usable; BACKEND=auto chose docker" in out
    pool = next(line for line in out.splitlines() if line.startswith("pool: "))
    assert pool.startswith("pool: 3 warm sandbox(es)") and "all sandboxes together 3072 MiB" in pool


def test_doctor_fails_when_the_engine_is_unreachable() -> None:
    completed = subprocess.run(
        [SCRIPT, "doctor"],
        capture_output=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "BACKEND": "docker", "DOCKER_HOST": "unix:///nonexistent/docker.sock"},
    )
    assert completed.returncode == 1
    assert "docker      unavailable" in completed.stdout.decode()


def test_run_prints_output_and_returns_the_programs_exit_code(docker_required: None) -> None:
    completed = subprocess.run(
        [SCRIPT, "run", "-"],
        input=b"import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)\n",
        capture_output=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert completed.returncode == 3
    assert completed.stdout == b"out\n"
    assert completed.stderr == b"err\n"


def test_run_with_a_missing_image_is_one_clear_line_not_a_traceback(docker_required: None) -> None:
    completed = subprocess.run(
        [SCRIPT, "run", "-"],
        input=b"print(1)\n",
        capture_output=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "BACKEND": "docker", "SANDBOX_IMAGE_PYTHON": "llm-sandbox-missing:none"},
    )
    assert completed.returncode == 2
    stderr = completed.stderr.decode()
    assert "Traceback" not in stderr
    assert "llm-sandbox-mcp: Image 'llm-sandbox-missing:none' is not on the Docker engine" in stderr


async def test_a_background_job_longer_than_any_wait_is_polled_to_its_end_with_all_its_output_and_a_plot(
    docker_required: None,
) -> None:
    """A run longer than any client waits in one call: handed back at once, then polled as a model would, with
    only new output each time.

    What makes a run "longer than any wait" is the server's foreground limit, which also caps each get_job wait:
    with it at 1 s (SANDBOX_FOREGROUND_LIMIT, for this server only) a job of 6 s of its own time outlives every
    poll (at least five return while it runs), as a 3-minute one does at the default 50 s. The default timeout
    is lowered below the job's length too (SANDBOX_TIMEOUT), so the job's own longer timeout is what lets it
    finish. Nothing waits on the clock but the program's own 6 s: each poll returns when the job ends or after
    1 s, whichever comes first.
    """
    env = {**ENV, "SANDBOX_FOREGROUND_LIMIT": "1", "SANDBOX_TIMEOUT": "3"}
    code = (
        "import time\nimport matplotlib.pyplot as plt\n"
        "for tick in range(12):\n    print(f'tick {tick}', flush=True)\n    time.sleep(0.5)\n"
        "plt.plot([1, 3, 2])\nplt.show()\nprint('done')"
    )
    with anyio.fail_after(150):
        async with Client(StdioServerParameters(command=SCRIPT, env=env)) as client:
            started = await client.call_tool("execute_code", {"code": code, "timeout": 120, "background": True})
            assert started.structured_content is not None and started.structured_content["status"] == "running"
            job_id, since, seen, polls = started.structured_content["job_id"], 0, "", 0
            while True:
                polled = await client.call_tool("get_job", {"job_id": job_id, "since": since, "wait": 55})
                info = polled.structured_content
                assert info is not None and info["skipped_bytes"] == 0
                seen += info["stdout"]
                since, polls = info["next_since"], polls + 1
                if info["status"] != "running":
                    break
            images = [block for block in polled.content if isinstance(block, ImageContent)]
    assert info["status"] == "finished" and info["result"]["exit_code"] == 0, info
    assert seen == "".join(f"tick {tick}\n" for tick in range(12)) + "done\n"
    assert polls >= 3, "the job outlived several polls"
    assert [image.mime_type for image in images] == ["image/png"]
