from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from mcp import Client
from mcp_types import CallToolResult, EmbeddedResource, ImageContent, TextContent, TextResourceContents

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable, ImageMissing
from llm_sandbox_mcp.models import ExecResult
from llm_sandbox_mcp.server.app import build_server
from tests.support.fakes import Call, FakeBackend, ok
from tests.support.protocol import TOOLS

pytestmark = pytest.mark.anyio

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


def _text(result: CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return first.text


async def _call(backend: FakeBackend, arguments: dict[str, Any], **settings: Any) -> CallToolResult:
    server = build_server(Settings(**settings), backend)
    async with Client(server) as client:
        return await client.call_tool("execute_code", arguments)


async def test_tools_have_strict_input_schemas_and_output_schemas() -> None:
    async with Client(build_server(Settings(), FakeBackend())) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.input_schema.get("additionalProperties") is False
        assert tool.output_schema is not None and tool.output_schema["type"] == "object"
        assert tool.description
    execute = tools["execute_code"]
    assert execute.input_schema["required"] == ["code"]
    assert execute.output_schema is not None
    assert set(execute.output_schema["properties"]) >= {"exit_code", "stdout", "stderr", "timed_out", "artifacts"}


async def test_code_reaches_the_sandbox_on_stdin_and_output_comes_back_as_object() -> None:
    backend = FakeBackend(handler=lambda call: ok(stdout=b"hi\n", stderr=b"warn\n", exit_code=3))
    result = await _call(backend, {"code": "print('hi')"})
    assert not result.is_error
    run = backend.calls[0]
    assert run.stdin == b"print('hi')"
    assert run.argv[:2] == ["python3", "-c"]
    payload = json.loads(_text(result))
    assert payload == result.structured_content
    assert payload["exit_code"] == 3 and payload["stdout"] == "hi\n" and payload["stderr"] == "warn\n"
    assert payload["language"] == "python" and payload["backend"] == "fake"
    assert payload["timed_out"] is False and payload["truncated"] is False


async def test_the_servers_environment_never_reaches_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    backend = FakeBackend()
    await _call(backend, {"code": "pass"})
    assert "AWS_SECRET_ACCESS_KEY" not in backend.calls[0].env
    assert backend.calls[0].env["HOME"] == "/tmp"


async def test_every_plot_comes_back_as_its_own_image_and_files_are_listed() -> None:
    backend = FakeBackend(
        outputs={"figure_001.png": PNG, "figure_002.png": PNG + b"2", "chart.svg": b"<svg/>", "data.csv": b"a,b\n1,2\n"}
    )
    result = await _call(backend, {"code": "..."})
    images = [block for block in result.content if isinstance(block, ImageContent)]
    assert [image.mime_type for image in images] == ["image/svg+xml", "image/png", "image/png"]
    assert base64.b64decode(images[1].data) == PNG
    embedded = [block for block in result.content if isinstance(block, EmbeddedResource)]
    assert len(embedded) == 1
    assert isinstance(embedded[0].resource, TextResourceContents) and embedded[0].resource.text == "a,b\n1,2\n"
    assert result.structured_content is not None
    names = [(a["name"], a["mime_type"], a["size"]) for a in result.structured_content["artifacts"]]
    assert names == [
        ("chart.svg", "image/svg+xml", 6),
        ("data.csv", "text/csv", 8),
        ("figure_001.png", "image/png", 40),
        ("figure_002.png", "image/png", 41),
    ]


async def test_invalid_utf8_is_replaced_not_a_crash() -> None:
    backend = FakeBackend(handler=lambda call: ok(stdout=b"ok \xff\xfe end", stderr=b"\xc3"))
    result = await _call(backend, {"code": "..."})
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["stdout"] == "ok \ufffd\ufffd end"


async def test_a_timeout_is_a_result_that_says_what_to_do() -> None:
    backend = FakeBackend(handler=lambda call: ExecResult(137, b"partial", b"", timed_out=True))
    result = await _call(backend, {"code": "while True: pass", "timeout": 0.2})
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["timed_out"] is True
    assert result.structured_content["stdout"] == "partial"
    assert "timed out after 0.2 s" in result.structured_content["stderr"]
    assert len(backend.killed) == 1  # the deadline killed every process in that sandbox


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"code": "x", "language": "cobol"}, "Unsupported language 'cobol'"),
        ({"code": "x", "libraries": ["numpy; rm -rf /"]}, "Invalid Python library"),
        ({"code": "x", "timeout": 10_000}, "above the maximum of 300 s (SANDBOX_MAX_TIMEOUT)"),
        ({"code": "x", "timeout": -1}, "timeout"),
        ({"code": "x", "unknown_argument": 1}, "unknown_argument"),
        ({"language": "python"}, "code"),
        ({"code": 42}, "code"),
    ],
)
async def test_unservable_requests_are_tool_errors_that_run_nothing(arguments: dict[str, Any], message: str) -> None:
    backend = FakeBackend()
    result = await _call(backend, arguments)
    assert result.is_error
    assert message in _text(result)
    assert backend.calls == []


@pytest.mark.parametrize(
    "error",
    [
        BackendUnavailable("The Docker engine at X does not answer. Start Docker"),
        ImageMissing("Image 'python:3.12-slim' is not on the Docker engine. Pull or build it"),
    ],
)
async def test_engine_problems_are_tool_errors_with_the_fix(error: Exception) -> None:
    result = await _call(FakeBackend(create_error=error), {"code": "print(1)"})
    assert result.is_error
    assert _text(result).endswith(str(error))


async def test_an_unexpected_failure_leaks_no_traceback() -> None:
    def explode(call: Call) -> ExecResult:
        raise RuntimeError("secret internal detail /home/user/.aws")

    result = await _call(FakeBackend(handler=explode), {"code": "x"})
    assert result.is_error
    assert "secret" not in _text(result) and "Traceback" not in _text(result)


async def test_each_call_gets_a_fresh_sandbox_that_is_destroyed() -> None:
    backend = FakeBackend()
    server = build_server(Settings(sandbox_pool_size=0), backend)
    async with Client(server) as client:
        for _ in range(3):
            await client.call_tool("execute_code", {"code": "pass"})
    assert len(backend.created) == 3
    assert sorted(backend.destroyed) == ["fake-1", "fake-2", "fake-3"]
    assert backend.closed


async def test_libraries_are_installed_once_into_a_cache_with_network_then_mounted_read_only() -> None:
    backend = FakeBackend(handler=lambda call: ok(exit_code=1) if call.argv[0] == "test" else ok())
    server = build_server(Settings(sandbox_pool_size=0, sandbox_install_network_mode="host"), backend)
    async with Client(server) as client:
        for _ in range(2):
            result = await client.call_tool("execute_code", {"code": "import six", "libraries": ["six", "attrs"]})
            assert not result.is_error
    installs = [call for call in backend.calls if "pip" in call.argv]
    assert len(installs) == 1
    assert installs[0].argv[-2:] == ["attrs", "six"]
    install_spec, *run_specs = backend.created
    assert install_spec.limits.network_mode == "host"
    assert install_spec.cache is not None and install_spec.cache.writable
    for spec in run_specs:
        assert spec.limits.network_mode == "none"
        assert spec.cache is not None and not spec.cache.writable and spec.cache.key == install_spec.cache.key
    runs = [call for call in backend.calls if call.argv[:2] == ["python3", "-c"]]
    assert all(call.env["PYTHONPATH"] == "/opt/llm-sandbox/libs/python" for call in runs)


async def test_an_install_failure_carries_the_installers_message_and_drops_the_cache() -> None:
    def handler(call: Call) -> ExecResult:
        if "pip" in call.argv:
            return ok(stderr=b"ERROR: No matching distribution found for nosuchpkg", exit_code=1)
        return ok(exit_code=1)

    result = await _call(FakeBackend(handler=handler), {"code": "x", "libraries": ["nosuchpkg"]}, sandbox_pool_size=0)
    assert result.is_error
    assert "Installing nosuchpkg with pip failed" in _text(result)
    assert "No matching distribution found for nosuchpkg" in _text(result)


async def test_languages_tool_and_resource_return_json_objects() -> None:
    async with Client(build_server(Settings(), FakeBackend())) as client:
        listed = await client.call_tool("get_supported_languages", {})
        resource = await client.read_resource("sandbox://languages")
    payload: dict[str, Any] = json.loads(_text(listed))
    assert [language["name"] for language in payload["languages"]][0] == "python"
    content = resource.contents[0]
    assert isinstance(content, TextResourceContents)
    assert json.loads(content.text) == payload


async def test_language_details_report_the_version_the_image_has() -> None:
    backend = FakeBackend(handler=lambda call: ok(stdout=b"Python 3.12.7\n"))
    async with Client(build_server(Settings(), backend)) as client:
        result = await client.call_tool("get_language_details", {"language": "python"})
        again = await client.call_tool("get_language_details", {"language": "python"})
    assert result.structured_content is not None
    assert result.structured_content["version"] == "Python 3.12.7"
    assert again.structured_content == result.structured_content
    assert [call.argv for call in backend.calls].count(["python3", "--version"]) == 1


async def test_a_compile_failure_is_a_result_in_phase_compile_without_the_marker() -> None:
    from llm_sandbox_mcp.languages import COMPILE_FAILED_MARKER

    backend = FakeBackend(
        handler=lambda call: ok(stderr=b"main.cpp:1: error: x\n" + COMPILE_FAILED_MARKER, exit_code=1)
    )
    result = await _call(backend, {"code": "int main( {"})
    assert not result.is_error
    assert result.structured_content is not None
    assert result.structured_content["phase"] == "compile"
    assert result.structured_content["stderr"] == "main.cpp:1: error: x\n"


async def test_languages_the_backend_cannot_run_are_listed_as_unavailable_with_why() -> None:
    class HostRuntimes(FakeBackend):
        def missing_runtime(self, executable: str) -> str | None:
            return f"{executable} is not installed" if executable == "python3" else None

    async with Client(build_server(Settings(), HostRuntimes())) as client:
        listed = await client.call_tool("get_supported_languages", {})
        details = await client.call_tool("get_language_details", {"language": "python"})
    assert listed.structured_content is not None
    python = listed.structured_content["languages"][0]
    assert python["available"] is False and python["unavailable_reason"] == "python3 is not installed"
    assert details.is_error
