"""Long runs on real engines: a cancelled run leaves no process behind, a session survives a cancelled cell,
and a background job is polled to completion with its output and its plot."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult, ImageContent, TextContent

from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.models import Live
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.leases import Lease
from llm_sandbox_mcp.run.modes import OneShot
from llm_sandbox_mcp.run.sessions import SessionRegistry
from llm_sandbox_mcp.server.app import build_server
from tests.engines.conftest import RecordingBackend, engine_settings
from tests.support.survivors import LISTING, survivors

pytestmark = pytest.mark.anyio


async def _survivors(backend: RecordingBackend, lease: Lease) -> list[str]:
    """The command lines of what runs in the sandbox besides what holds it (run from outside the program)."""
    listing = await backend.exec(lease.ref, ["sh", "-c", LISTING], timeout=30)
    return survivors(listing.stdout)


def _node(command_lines: list[str]) -> bool:
    return any(line.split(" ", 1)[0].rsplit("/", 1)[-1] == "node" for line in command_lines)


async def _cancel_after_output(executor: Executor, lease: Lease, code: str, language: str) -> None:
    """Run `code` as a one-shot program in `lease` and cancel the run once it has printed something."""
    program = executor.program(textwrap.dedent(code), language, [], 120)
    live = Live()
    with anyio.fail_after(60):  # far below the run's own 120 s: only the cancellation can end it in time
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(executor.run, lease, program, OneShot(), live)
            await live.wait_for_output()
            tasks.cancel_scope.cancel()


async def test_a_cancelled_run_leaves_no_process_in_its_sandbox(executor: Executor, backend: RecordingBackend) -> None:
    lease = await executor.open(get_language("python"), [], executor.limits)
    try:
        await _cancel_after_output(
            executor,
            lease,
            """
            import os, subprocess, time
            subprocess.Popen(["sleep", "300"])
            os.system("sleep 301 &")
            print("started", flush=True)
            time.sleep(300)
            """,
            "python",
        )
        # Only what holds the sandbox is left.
        assert await _survivors(backend, lease) == []
    finally:
        await executor.close(lease)


async def test_a_cancelled_run_without_a_warm_interpreter_is_killed_from_outside(
    executor: Executor, backend: RecordingBackend
) -> None:
    lease = await executor.open(get_language("javascript"), [], executor.limits)
    program = executor.program("setInterval(() => {}, 1000)", "javascript", [], 120)
    try:
        with anyio.fail_after(60):  # the exec would otherwise hold on for its 120 s timeout
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(executor.run, lease, program, OneShot())
                while not _node(await _survivors(backend, lease)):  # seen running from the engine's side
                    pass
                tasks.cancel_scope.cancel()
        assert not _node(await _survivors(backend, lease))
    finally:
        await executor.close(lease)


async def test_output_of_a_language_without_a_warm_interpreter_arrives_while_it_runs(
    executor: Executor,
) -> None:
    lease = await executor.open(get_language("javascript"), [], executor.limits)
    # The program prints, then waits for a file that only appears once that first line has been seen.
    code = """
    const fs = require("fs");
    console.log("first line");
    const wait = setInterval(() => {
      if (fs.existsSync("/workspace/seen")) { clearInterval(wait); console.log("done"); }
    }, 20);
    """
    program = executor.program(textwrap.dedent(code), "javascript", [], 60)
    live = Live()
    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(executor.run, lease, program, OneShot(), live)
                await live.wait_for_output()
                first, _, _ = live.since(0)
                assert first == b"first line\n"  # while the program still runs: it has not printed "done"
                await executor.backend.exec(lease.ref, ["touch", "/workspace/seen"], timeout=30)
        everything, _, _ = live.since(0)
        assert everything == b"first line\ndone\n"
    finally:
        await executor.close(lease)


async def test_a_session_survives_a_cancelled_cell(executor: Executor) -> None:
    registry = SessionRegistry(executor.settings, executor)
    try:
        session = await registry.create("python", [])
        await registry.execute(session.id, "kept = 'yes'", [], 30)
        live = Live()
        no_libraries: list[str] = []
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tasks:
                code = "import time\nprint('working', flush=True)\ntime.sleep(300)"
                tasks.start_soon(registry.execute, session.id, code, no_libraries, 120, live)
                await live.wait_for_output()
                tasks.cancel_scope.cancel()
        with anyio.fail_after(60):
            after = await registry.execute(session.id, "print(kept)", [], 30)
        assert (after.stdout, after.interpreter_lost) == ("yes\n", False), after.stderr
    finally:
        await registry.aclose()


async def test_a_cancelled_install_leaves_no_half_written_cache_and_the_next_call_installs(
    executor: Executor, backend: RecordingBackend
) -> None:
    specs = ["six>=1.0"]  # a cache of its own, apart from other tests' "six"
    await backend.drop_cache(executor.libraries.key(get_language("python"), specs))
    installing = backend.exec_of("pip")
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(lambda: executor.execute("import six", "python", specs, 60))
            await installing.wait()
            tasks.cancel_scope.cancel()
    backend.argvs.clear()
    with anyio.fail_after(180):
        after = await executor.execute("import six\nprint(six.__name__)", "python", specs, 60)
    assert (after.exit_code, after.stdout) == (0, "six\n"), after.stderr
    assert any(any("pip" in part for part in argv) for argv in backend.argvs)  # installed afresh, not half-used


def _payload(result: CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return json.loads(first.text)


async def test_a_background_job_is_polled_to_completion_with_its_output_and_plot(
    backend: RecordingBackend, engine: str
) -> None:
    code = textwrap.dedent(
        """
        import time
        import matplotlib.pyplot as plt
        for step in range(3):
            print(f"step {step}", flush=True)
            time.sleep(0.5)
        plt.plot([1, 2, 3])
        """
    )
    server = build_server(engine_settings(engine, sandbox_foreground_limit=20), backend)
    async with Client(server) as client:
        started = _payload(await client.call_tool("execute_code", {"code": code, "background": True}))
        assert started["status"] == "running"
        info, done = started, None
        with anyio.fail_after(120):
            while info["status"] == "running":
                done = await client.call_tool("get_job", {"job_id": started["job_id"], "wait": 20})
                info = _payload(done)
    assert info["status"] == "finished" and done is not None, info
    result = info["result"]
    assert result["exit_code"] == 0 and result["stdout"] == "step 0\nstep 1\nstep 2\n", result["stderr"]
    assert [block.mime_type for block in done.content if isinstance(block, ImageContent)] == ["image/png"]
