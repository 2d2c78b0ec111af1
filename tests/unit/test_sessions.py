from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult, TextContent

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxNotFound
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.sessions import SessionRegistry
from llm_sandbox_mcp.server.app import build_server
from llm_sandbox_mcp.server.state import AppState
from tests.support.fakes import Call, FakeBackend, ok

pytestmark = pytest.mark.anyio


def _text(result: CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return first.text


def _payload(result: CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return json.loads(first.text)


async def test_a_session_keeps_one_sandbox_across_calls_until_closed() -> None:
    backend = FakeBackend(handler=lambda call: ok(stdout=call.stdin))
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        created = await client.call_tool("create_session", {"language": "python"})
        session_id = _payload(created)["session_id"]
        for code in ("x = 1", "x"):
            result = await client.call_tool("execute_code", {"code": code, "session_id": session_id})
            assert not result.is_error
            assert _payload(result)["session_id"] == session_id
        listed = _payload(await client.call_tool("list_sessions", {}))["sessions"]
        assert [(s["session_id"], s["calls"]) for s in listed] == [(session_id, 2)]
        assert len(backend.created) == 1
        await client.call_tool("close_session", {"session_id": session_id})
        assert backend.destroyed == ["fake-1"]
        gone = await client.call_tool("execute_code", {"code": "x", "session_id": session_id})
    assert gone.is_error
    first = gone.content[0]
    assert isinstance(first, TextContent)
    assert "it was closed" in first.text and "create_session" in first.text


async def test_an_unknown_session_tells_the_model_to_create_one() -> None:
    async with Client(build_server(Settings(), FakeBackend())) as client:
        result = await client.call_tool("execute_code", {"code": "1", "session_id": "s-nope"})
    assert result.is_error
    first = result.content[0]
    assert isinstance(first, TextContent) and "create_session" in first.text


async def test_session_limits_are_capped_by_the_operator() -> None:
    settings = Settings(sandbox_max_sessions=1, sandbox_session_max_memory=1024**3, sandbox_pool_size=0)
    async with Client(build_server(settings, FakeBackend())) as client:
        too_big = await client.call_tool("create_session", {"memory": "4g"})
        network = await client.call_tool("create_session", {"network": True})
        first = await client.call_tool("create_session", {"memory": "256m", "cpus": 0.5})
        second = await client.call_tool("create_session", {})
    for result, needle in (
        (too_big, "SANDBOX_SESSION_MAX_MEMORY"),
        (network, "SANDBOX_SESSION_NETWORK_MODE"),
        (second, "SANDBOX_MAX_SESSIONS"),
    ):
        assert result.is_error
        block = result.content[0]
        assert isinstance(block, TextContent) and needle in block.text
    assert not first.is_error
    assert _payload(first)["memory_limit_bytes"] == 256 * 1024**2 and _payload(first)["cpus"] == 0.5


async def test_idle_sessions_expire_and_say_why() -> None:
    from llm_sandbox_mcp.run.executor import Executor
    from llm_sandbox_mcp.run.sessions import SessionRegistry

    backend = FakeBackend()
    settings = Settings(sandbox_session_idle_ttl=0.01, sandbox_pool_size=0)
    async with Executor(settings, backend) as executor:
        registry = SessionRegistry(settings, executor)
        session = await registry.create("python", [])
        import anyio

        await anyio.sleep(0.05)
        assert await registry.reap() == 1
        with pytest.raises(Exception, match="expired after 0.01 s idle"):
            registry.get(session.id)
    assert backend.destroyed == ["fake-1"]


async def test_create_session_states_the_lifetime_the_operator_configured() -> None:
    for settings, lifetime in (
        (Settings(), "expires after 30 min idle, 8 h at most"),
        (Settings(sandbox_session_idle_ttl=90, sandbox_session_max_lifetime=5400), "after 1.5 min idle, 1.5 h at most"),
    ):
        async with Client(build_server(settings, FakeBackend())) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        description = tools["create_session"].description
        assert description is not None and lifetime in description and "create a new session" in description


@pytest.mark.parametrize(
    ("age", "why"),
    [("last_used", "it expired after 30 min idle"), ("created", "it reached its maximum lifetime of 8 h")],
)
async def test_every_call_with_an_expired_session_is_an_error_that_says_to_create_a_new_one(age: str, why: str) -> None:
    settings = Settings(sandbox_pool_size=0)
    state = AppState(settings)
    backend = FakeBackend()
    async with Client(build_server(settings, backend, state)) as client:
        session_id = _payload(await client.call_tool("create_session", {}))["session_id"]
        session = state.sessions.get(session_id)
        # Backdated rather than slept through: the reaper's decision, without waiting for the clock.
        setattr(session, age, getattr(session, age) - settings.sandbox_session_max_lifetime - 1)
        assert await state.sessions.reap() == 1
        assert backend.destroyed == ["fake-1"]
        calls = {
            "execute_code": {"code": "1"},
            "upload_file": {"path": "a.txt", "content": "a"},
            "download_file": {"path": "a.txt"},
            "list_files": {},
        }
        for name, arguments in calls.items():
            result = await client.call_tool(name, {"session_id": session_id, **arguments})
            assert result.is_error, name
            assert _text(result).endswith(
                f"Session {session_id!r} is gone: {why}. Create a new one with create_session; "
                "none of its variables or files are kept."
            ), name
        listed = _payload(await client.call_tool("list_sessions", {}))["sessions"]
        closed = await client.call_tool("close_session", {"session_id": session_id})
    assert listed == []
    assert not closed.is_error  # closing is idempotent: the session is closed, as asked


async def test_an_unknown_session_id_is_an_error_that_says_to_create_a_new_one() -> None:
    async with Client(build_server(Settings(), FakeBackend())) as client:
        for name, arguments in (("execute_code", {"code": "1"}), ("list_files", {}), ("close_session", {})):
            result = await client.call_tool(name, {"session_id": "s-0123456789abcdef", **arguments})
            assert result.is_error, name
            assert "is gone: this server has no session with that id" in _text(result), name
            assert "Create a new one with create_session" in _text(result), name


async def test_libraries_must_be_given_at_creation() -> None:
    backend = FakeBackend(handler=lambda call: ok(exit_code=1) if call.argv[0] == "test" else ok())
    async with Client(build_server(Settings(sandbox_pool_size=0), backend)) as client:
        session_id = _payload(await client.call_tool("create_session", {"libraries": ["six"]}))["session_id"]
        same = await client.call_tool("execute_code", {"code": "1", "session_id": session_id, "libraries": ["six"]})
        other = await client.call_tool("execute_code", {"code": "1", "session_id": session_id, "libraries": ["attrs"]})
    assert not same.is_error
    assert other.is_error


async def test_host_files_are_refused_unless_the_operator_allows_a_directory() -> None:
    def handler(call: Call) -> Any:
        return ok()

    async with Client(build_server(Settings(sandbox_pool_size=0), FakeBackend(handler=handler))) as client:
        session_id = _payload(await client.call_tool("create_session", {}))["session_id"]
        result = await client.call_tool(
            "upload_file", {"session_id": session_id, "path": "a.txt", "host_path": "/etc/passwd"}
        )
    assert result.is_error
    block = result.content[0]
    assert isinstance(block, TextContent) and "SANDBOX_HOST_DIRS" in block.text


async def test_a_cpu_limit_too_small_to_enforce_is_refused() -> None:
    async with Client(build_server(Settings(sandbox_pool_size=0), FakeBackend())) as client:
        result = await client.call_tool("create_session", {"language": "python", "cpus": 1e-10})
    assert result.is_error
    assert "0.01" in _text(result)


async def test_a_session_closed_while_the_reaper_closes_it_ends_once_and_quietly() -> None:
    backend = FakeBackend()
    settings = Settings(sandbox_pool_size=0, sandbox_session_idle_ttl=0.001)
    async with Executor(settings, backend) as executor:
        registry = SessionRegistry(settings, executor)
        session = await registry.create("python", [])
        await anyio.sleep(0.01)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(registry.close, session.id)
            tasks.start_soon(registry.reap)
            tasks.start_soon(registry.close, session.id)
        await registry.close(session.id)  # closing a closed session again is not an error
        await registry.aclose()
    assert backend.destroyed == ["fake-1"]


async def test_an_engine_error_of_any_type_in_the_background_does_not_end_the_server() -> None:
    backend = FakeBackend(create_error=RuntimeError("the engine's own exception type"))
    async with Client(build_server(Settings(sandbox_pool_size=2), backend)) as client:
        await anyio.sleep(0.05)  # the pool's refill fails in the background meanwhile
        failed = await client.call_tool("execute_code", {"code": "print(1)"})
        listed = await client.call_tool("get_supported_languages", {})
    assert failed.is_error and "RuntimeError" not in _text(failed)
    assert not listed.is_error


@pytest.mark.parametrize(
    ("allowed", "wanted", "problem"),
    [
        ([], ["api.example.org"], "SANDBOX_SESSION_ALLOW_HOSTS"),
        (["api.example.org"], ["other.example.org"], "not within the hosts this server allows sessions"),
        (["api.example.org"], ["*.example.org"], "not within"),
        (["api.example.org:8443"], ["api.example.org"], "not within"),
        (["*.example.org"], ["not a host"], "network: not a host name"),
    ],
)
async def test_session_hosts_must_be_within_the_operators_list(
    allowed: list[str], wanted: list[str], problem: str
) -> None:
    backend = FakeBackend(handler=lambda call: ok())
    backend.install_network = "egress"
    settings = Settings(sandbox_pool_size=0, sandbox_session_allow_hosts=allowed)
    async with Client(build_server(settings, backend)) as client:
        result = await client.call_tool("create_session", {"language": "python", "network": wanted})
    assert result.is_error and problem in _text(result)
    assert backend.created == []


async def test_session_hosts_are_explicit_only_where_the_operator_named_them() -> None:
    backend = FakeBackend(handler=lambda call: ok())
    backend.install_network = "egress"
    settings = Settings(sandbox_session_allow_hosts=["mirror.corp", "*.example.org", "api.example.org:8443"])
    async with Executor(settings, backend) as executor:
        policy = SessionRegistry(settings, executor)._egress(  # pyright: ignore[reportPrivateUsage]
            ["mirror.corp", "cdn.example.org", "*.eu.example.org", "api.example.org:8443"]
        )
    assert [(rule.display(), rule.explicit) for rule in policy.rules] == [
        ("mirror.corp", True),
        ("cdn.example.org", False),
        ("*.eu.example.org", False),
        ("api.example.org:8443", True),
    ]


async def test_sessions_on_an_engine_without_the_proxy_cannot_be_given_hosts() -> None:
    backend = FakeBackend(handler=lambda call: ok())
    settings = Settings(sandbox_pool_size=0, sandbox_session_allow_hosts=["api.example.org"])
    async with Client(build_server(settings, backend)) as client:
        result = await client.call_tool("create_session", {"language": "python", "network": ["api.example.org"]})
    assert result.is_error and "cannot reach the server's egress proxy" in _text(result)


async def test_the_record_of_closed_sessions_is_bounded_and_keeps_the_most_recent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("llm_sandbox_mcp.run.sessions._REMEMBERED_CLOSES", 3)
    settings = Settings(sandbox_pool_size=0, sandbox_max_sessions=10)
    async with Executor(settings, FakeBackend(handler=lambda call: ok())) as executor:
        registry = SessionRegistry(settings, executor)
        ids = [(await registry.create("javascript", [])).id for _ in range(5)]
        for session_id in ids:
            await registry.close(session_id)
        with pytest.raises(SandboxNotFound, match="it was closed"):
            registry.get(ids[-1])
        with pytest.raises(SandboxNotFound, match="no session with that id"):
            registry.get(ids[0])


async def test_a_session_and_a_job_are_unknown_to_any_owner_but_their_own() -> None:
    """What the HTTP face relies on for principals: another owner's id reads exactly as one that never existed."""
    import anyio.lowlevel

    from llm_sandbox_mcp.errors import InvalidRequest
    from llm_sandbox_mcp.models import Execution, Live
    from llm_sandbox_mcp.run.jobs import Job, JobRegistry

    settings = Settings(sandbox_pool_size=0)
    quota = (1, "SANDBOX_HTTP_MAX_SESSIONS_PER_PRINCIPAL")
    async with Executor(settings, FakeBackend()) as executor:
        registry = SessionRegistry(settings, executor)
        mine = await registry.create("python", [], owner="alice", owner_quota=quota)
        with pytest.raises(
            InvalidRequest, match=r"maximum of 1 sessions .*\(SANDBOX_HTTP_MAX_SESSIONS_PER_PRINCIPAL\)"
        ):
            await registry.create("python", [], owner="alice", owner_quota=quota)
        theirs = await registry.create("python", [], owner="bob", owner_quota=quota)
        assert [s.id for s in registry.list("alice")] == [mine.id] and registry.list() == []
        with pytest.raises(SandboxNotFound) as never:
            registry.get("s-0000000000000000", "bob")
        for owner in ("bob", ""):
            with pytest.raises(SandboxNotFound) as other:
                registry.get(mine.id, owner)
            assert str(other.value) == str(never.value).replace("s-0000000000000000", mine.id)
            with pytest.raises(SandboxNotFound):
                await registry.close(mine.id, owner=owner)
        await registry.close(mine.id, owner="alice")
        await registry.close(mine.id, owner="alice")  # closing one's own closed session again is not an error
        with pytest.raises(SandboxNotFound, match="no session with that id"):  # not "it was closed"
            await registry.close(mine.id, owner="bob")
        with pytest.raises(SandboxNotFound, match="it was closed"):
            registry.get(mine.id, "alice")
        assert registry.get(theirs.id, "bob") is theirs
        await registry.aclose()

    async def work(live: Live) -> Execution:
        await anyio.lowlevel.checkpoint()
        raise InvalidRequest("not run")

    async with JobRegistry(settings) as jobs:
        job = await jobs.run(work, "python", None, background=True, owner="alice")
        assert isinstance(job, Job)
        assert (await jobs.wait(job.id, 5, owner="alice")).state == "failed"
        for owner in ("bob", ""):
            with pytest.raises(SandboxNotFound, match="is not known: it never existed"):
                await jobs.wait(job.id, 0, owner=owner)
            with pytest.raises(SandboxNotFound, match="is not known: it never existed"):
                await jobs.cancel(job.id, owner=owner)
        release = anyio.Event()

        async def blocked(live: Live) -> Execution:
            await release.wait()
            raise InvalidRequest("not run")

        jobs_quota = (1, "SANDBOX_HTTP_MAX_JOBS_PER_PRINCIPAL")
        running = await jobs.run(blocked, "python", None, background=True, owner="alice", owner_quota=jobs_quota)
        with pytest.raises(
            InvalidRequest, match=r"maximum of 1 running jobs .*\(SANDBOX_HTTP_MAX_JOBS_PER_PRINCIPAL\)"
        ):
            await jobs.run(blocked, "python", None, background=True, owner="alice", owner_quota=jobs_quota)
        other = await jobs.run(blocked, "python", None, background=True, owner="bob", owner_quota=jobs_quota)
        release.set()
        for job_of, owner in ((running, "alice"), (other, "bob")):
            assert isinstance(job_of, Job) and (await jobs.wait(job_of.id, 5, owner=owner)).state == "failed"


@pytest.mark.parametrize("over_http", [False, True], ids=["stdio", "http"])
async def test_over_http_host_files_are_refused_even_below_an_allowed_directory(
    tmp_path: Path, over_http: bool
) -> None:
    (tmp_path / "shared.txt").write_text("the host's")
    settings = Settings(sandbox_pool_size=0, sandbox_host_dirs=[str(tmp_path)])
    state = AppState(settings, over_http=over_http)
    async with Client(build_server(settings, FakeBackend(handler=lambda call: ok()), state)) as client:
        session = {"session_id": _payload(await client.call_tool("create_session", {}))["session_id"]}
        upload = await client.call_tool(
            "upload_file", {**session, "path": "a.txt", "host_path": str(tmp_path / "shared.txt")}
        )
        download = await client.call_tool("download_file", {**session, "path": "a.txt", "host_path": str(tmp_path)})
    if over_http:
        for result in (upload, download):
            assert result.is_error and "host_path is not available over HTTP" in _text(result)
    else:
        assert not upload.is_error, _text(upload)
        assert "not available over HTTP" not in _text(download)
