"""Long runs over the protocol: cancellation stops the run, progress reaches the client, background jobs."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult, ImageContent, TextContent

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.models import ExecResult, Live
from llm_sandbox_mcp.server.app import build_server
from tests.support.fakes import Call, FakeBackend, ok

pytestmark = pytest.mark.anyio


def _payload(result: CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return json.loads(first.text)


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


def _text(result: CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return first.text


def _hung(call: Call) -> ExecResult:
    """A kernel cell that never finishes by itself."""
    return ExecResult(137, b"working\n", b"", timed_out=True)


async def _cancel_while_running(client: Client, backend: FakeBackend, arguments: dict[str, Any]) -> None:
    """Call execute_code, and cancel the call (notifications/cancelled) once its run has started."""
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(client.call_tool, "execute_code", arguments)
            await backend.running.wait()
            tasks.cancel_scope.cancel()
        await backend.kill_seen.wait()


@pytest.mark.parametrize("language", ["javascript", "python"])
async def test_a_cancelled_call_kills_every_process_and_its_sandbox_is_destroyed(language: str) -> None:
    backend = FakeBackend(hang=True, handler=_hung)
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        await _cancel_while_running(client, backend, {"code": "while True: pass", "language": language})
        with anyio.fail_after(10):
            await backend.destroy_seen.wait()
        assert set(backend.killed) == {"fake-1"} and backend.destroyed == ["fake-1"]
        backend.hang, backend.handler = False, lambda call: ok(stdout=b"next\n")
        after = await client.call_tool("execute_code", {"code": "print('next')", "language": language})
    assert _payload(after)["stdout"] == "next\n"


async def test_a_cancelled_cell_is_interrupted_and_the_session_keeps_its_state() -> None:
    backend = FakeBackend(handler=_hung, interruptible=True)
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        session_id = _payload(await client.call_tool("create_session", {}))["session_id"]
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(client.call_tool, "execute_code", {"code": "slow()", "session_id": session_id})
                await backend.running.wait()
                tasks.cancel_scope.cancel()
        backend.handler = lambda call: ok(stdout=b"42\n")
        with anyio.fail_after(10):
            after = await client.call_tool("execute_code", {"code": "x", "session_id": session_id})
    payload = _payload(after)
    assert payload["stdout"] == "42\n" and "restarted" not in payload["stderr"]
    assert backend.killed == [] and backend.destroyed[:1] == ["fake-1"]
    assert backend.interrupts == 1 and not any(call.argv[0] == "kill" for call in backend.calls)


async def test_a_cancelled_cell_that_ignores_the_interrupt_is_killed_and_the_next_cell_answers() -> None:
    backend = FakeBackend(handler=_hung)
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        session_id = _payload(await client.call_tool("create_session", {}))["session_id"]
        await _cancel_while_running(client, backend, {"code": "stubborn()", "session_id": session_id})
        backend.handler = lambda call: ok(stdout=b"fresh\n")
        with anyio.fail_after(10):
            after = await client.call_tool("execute_code", {"code": "1", "session_id": session_id})
    payload = _payload(after)
    assert payload["stdout"] == "fresh\n" and "restarted" in payload["stderr"]
    assert set(backend.killed) == {"fake-1"}


async def test_a_cancelled_install_drops_its_half_written_cache() -> None:
    backend = FakeBackend(hang=True, handler=lambda call: ok(exit_code=1))
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        await _cancel_while_running(client, backend, {"code": "import six", "libraries": ["six"]})
        with anyio.fail_after(10):
            await backend.destroy_seen.wait()
    assert len(backend.dropped) == 1
    assert backend.destroyed[0] == "fake-1"  # the installer, and no sandbox ran the code
    assert len(backend.created) == 1


async def test_progress_reaches_a_request_with_a_token_with_phase_time_output_and_a_clean_last_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("llm_sandbox_mcp.run.jobs.PROGRESS_EVERY", 0.01)
    noisy = b"epoch 1\n\x1b[31mloss\x07 0.5\x1b[0m \xe2\x80\xae" + b"x" * 500 + b"\n"
    backend = FakeBackend(handler=lambda call: ExecResult(137, noisy, b"", timed_out=True))
    seen: list[tuple[float, str]] = []
    got_output = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        assert message is not None
        seen.append((progress, message))
        if "last line" in message:
            got_output.set()

    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(
                    lambda: client.call_tool("execute_code", {"code": "train()"}, progress_callback=on_progress)
                )
                await got_output.wait()
                tasks.cancel_scope.cancel()
    progress = [value for value, _ in seen]
    assert progress == sorted(set(progress))
    message = next(message for _, message in seen if "last line" in message)
    assert message.startswith("running python, ")
    assert f"{len(noisy)} bytes of output" in message
    line = message.split("; last line: ", 1)[1]
    assert line.startswith("loss  0.5")
    assert not any(ord(char) < 32 or char in "\x7f\u202e" for char in line)
    assert len(line) <= 200


async def _job(client: Client, arguments: dict[str, Any]) -> dict[str, Any]:
    started = _payload(await client.call_tool("execute_code", {**arguments, "background": True}))
    assert started["status"] == "running" and started["exit_code"] is None
    assert started["job_id"] in started["message"] and "get_job" in started["message"]
    return started


async def test_a_background_job_returns_at_once_and_its_result_and_plots_come_from_get_job() -> None:
    gate = anyio.Event()
    backend = FakeBackend(gate=gate, handler=lambda call: ok(stdout=b"one\n", stderr=b"two\n"), outputs={"p.png": PNG})
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        job_id = (await _job(client, {"code": "console.log(1)", "language": "javascript"}))["job_id"]
        running = _payload(await client.call_tool("get_job", {"job_id": job_id}))
        assert running["status"] == "running" and running["result"] is None
        gate.set()
        with anyio.fail_after(10):
            done = await client.call_tool("get_job", {"job_id": job_id, "wait": 30})
        info = _payload(done)
        assert info["status"] == "finished" and info["error"] is None
        assert (info["stdout"], info["stderr"], info["next_since"]) == ("one\n", "two\n", 8)
        assert info["result"]["exit_code"] == 0 and info["result"]["stdout"] == "one\n"
        assert [block.mime_type for block in done.content if isinstance(block, ImageContent)] == ["image/png"]
        assert info["expires_in_s"] is not None and info["expires_in_s"] > 0
        later = _payload(await client.call_tool("get_job", {"job_id": job_id, "since": 4}))
        assert (later["stdout"], later["stderr"]) == ("", "two\n")


async def test_a_foreground_call_past_the_limit_turns_into_a_job() -> None:
    gate = anyio.Event()
    backend = FakeBackend(gate=gate, handler=lambda call: ok(stdout=b"slow\n"))
    settings = Settings(sandbox_pool_size=0, sandbox_foreground_limit=0.05)
    async with Client(build_server(settings, backend)) as client:
        with anyio.fail_after(10):
            handed = _payload(await client.call_tool("execute_code", {"code": "x", "language": "ruby"}))
        assert handed["status"] == "running" and "SANDBOX_FOREGROUND_LIMIT" in handed["message"]
        gate.set()
        with anyio.fail_after(10):
            info = handed
            while info["status"] == "running":  # each get_job waits at most the foreground limit
                info = _payload(await client.call_tool("get_job", {"job_id": handed["job_id"], "wait": 30}))
    assert info["status"] == "finished" and info["result"]["stdout"] == "slow\n"


async def test_cancel_job_kills_the_run_and_shutdown_ends_every_job() -> None:
    backend = FakeBackend(hang=True, handler=_hung)
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        first = (await _job(client, {"code": "a", "language": "javascript"}))["job_id"]
        with anyio.fail_after(10):
            await backend.running.wait()
            cancelled = _payload(await client.call_tool("cancel_job", {"job_id": first}))
        assert cancelled["status"] == "cancelled" and cancelled["result"] is None
        assert set(backend.killed) == {"fake-1"}
        again = _payload(await client.call_tool("cancel_job", {"job_id": first}))
        assert again["status"] == "cancelled"
        backend.running = anyio.Event()
        await _job(client, {"code": "b", "language": "javascript"})
        with anyio.fail_after(10):
            await backend.running.wait()
    # Leaving the client shut the server down: the second job's run was killed and its sandbox removed.
    assert "fake-2" in backend.killed and "fake-2" in backend.destroyed


async def test_jobs_are_limited_and_forgotten_after_their_retention() -> None:
    gate = anyio.Event()
    backend = FakeBackend(gate=gate)
    settings = Settings(sandbox_pool_size=0, sandbox_max_jobs=1, sandbox_job_retention=1e-9)
    async with Client(build_server(settings, backend)) as client:
        job_id = (await _job(client, {"code": "a", "language": "javascript"}))["job_id"]
        refused = await client.call_tool("execute_code", {"code": "b", "language": "javascript", "background": True})
        assert refused.is_error and "SANDBOX_MAX_JOBS" in _text(refused)
        gate.set()
        with anyio.fail_after(10):
            finished = _payload(await client.call_tool("get_job", {"job_id": job_id, "wait": 30}))
        assert finished["status"] == "finished"
        forgotten = await client.call_tool("get_job", {"job_id": job_id})
        assert forgotten.is_error and "SANDBOX_JOB_RETENTION" in _text(forgotten)
        room_again = await client.call_tool("execute_code", {"code": "c", "language": "javascript", "background": True})
    assert not room_again.is_error


async def test_finished_jobs_give_their_slots_to_new_ones_oldest_first() -> None:
    backend = FakeBackend()
    settings = Settings(sandbox_pool_size=0, sandbox_max_jobs=2, sandbox_job_retention=3600)
    async with Client(build_server(settings, backend)) as client:
        ids: list[str] = []
        for code in ("a", "b", "c"):  # each finishes before the next starts; the third needs a slot
            ids.append((await _job(client, {"code": code, "language": "javascript"}))["job_id"])
            with anyio.fail_after(10):
                done = _payload(await client.call_tool("get_job", {"job_id": ids[-1], "wait": 30}))
            assert done["status"] == "finished"
        oldest = await client.call_tool("get_job", {"job_id": ids[0]})
        assert oldest.is_error and "SANDBOX_MAX_JOBS" in _text(oldest)
        assert _payload(await client.call_tool("get_job", {"job_id": ids[1]}))["status"] == "finished"


async def test_a_request_that_cannot_be_served_fails_at_once_even_in_the_background() -> None:
    backend = FakeBackend()
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        bad = await client.call_tool("execute_code", {"code": "x", "language": "cobol", "background": True})
        gone = await client.call_tool("execute_code", {"code": "x", "session_id": "s-nope", "background": True})
    assert bad.is_error and "cobol" in _text(bad)
    assert gone.is_error and "create_session" in _text(gone)
    assert backend.calls == []


async def test_a_session_cell_runs_as_a_job_and_the_session_takes_the_next_cell_after_it() -> None:
    gate = anyio.Event()
    backend = FakeBackend(gate=gate, handler=lambda call: ok(stdout=call.stdin + b"\n"))
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        session_id = _payload(await client.call_tool("create_session", {}))["session_id"]
        started = await _job(client, {"code": "long()", "session_id": session_id})
        assert started["session_id"] == session_id
        gate.set()
        with anyio.fail_after(10):
            info = _payload(await client.call_tool("get_job", {"job_id": started["job_id"], "wait": 30}))
            after = _payload(await client.call_tool("execute_code", {"code": "next()", "session_id": session_id}))
    assert info["result"]["stdout"] == "long()\n" and info["session_id"] == session_id
    assert after["stdout"] == "next()\n" and after["status"] == "finished"


def test_live_output_keeps_offsets_across_streams_and_says_what_it_dropped() -> None:
    live = Live(keep=8)
    live.feed("stdout", b"abcd")
    live.feed("stderr", b"EFGH")
    assert live.since(0) == (b"abcd", b"EFGH", 0)
    assert live.since(6) == (b"", b"GH", 0)
    live.feed("stdout", b"ijkl")
    assert live.since(0) == (b"ijkl", b"EFGH", 4)
    assert live.since(12) == (b"", b"", 0)
    assert live.last_line() == "abcdEFGHijkl"


async def test_creating_a_session_reports_its_install_as_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llm_sandbox_mcp.run.jobs.PROGRESS_EVERY", 0.01)
    gate = anyio.Event()

    backend = FakeBackend(gate=gate, handler=lambda call: ok(exit_code=1) if call.argv[0] == "test" else ok())
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        assert message is not None
        messages.append(message)
        if message.startswith("installing six"):
            gate.set()

    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        with anyio.fail_after(10):
            created = await client.call_tool("create_session", {"libraries": ["six"]}, progress_callback=on_progress)
    assert not created.is_error
    assert any(message.startswith("installing six, ") for message in messages)


async def test_a_client_that_goes_away_mid_call_has_its_run_killed() -> None:
    backend = FakeBackend(hang=True, handler=_hung)

    async def call(client: Client) -> None:
        with contextlib.suppress(Exception):  # the connection closes under the call
            await client.call_tool("execute_code", {"code": "x", "language": "go"})

    with anyio.fail_after(10):
        async with (
            anyio.create_task_group() as tasks,
            Client(build_server(Settings(sandbox_pool_size=0), backend)) as client,
        ):
            tasks.start_soon(call, client)
            await backend.running.wait()
        await backend.kill_seen.wait()
    assert backend.killed[0] == "fake-1" and "fake-1" in backend.destroyed and backend.closed
