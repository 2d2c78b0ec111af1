"""A first answer in seconds on an engine that has only the base image: calls run on it while the project
image is built in the background, by a process that outlives the server, and new sandboxes use the project
image once it is there.

The engine has no project image for a base of a new name (the tag is derived from the recipe, base included).
The recipe is the real one; its libraries come from a stand-in index on 127.0.0.1 (SANDBOX_PIP_INDEX_URL), so
the build takes seconds rather than the ~100 s the real wheels take, and the test decides when it may end.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from mcp import Client
from mcp_types import CallToolResult, TextContent

from llm_sandbox_mcp import images
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.app import build_server
from llm_sandbox_mcp.server.state import AppState
from tests.engines.conftest import engine_settings, require
from tests.support.standin_index import StandInIndex, standin_index

pytestmark = pytest.mark.anyio

BUILDING_ENGINES = [pytest.param(name, marks=getattr(pytest.mark, name)) for name in ("docker", "podman")]


def _client(engine: str) -> Any:
    if engine == "docker":
        import docker

        return docker.from_env()
    from podman import PodmanClient

    return PodmanClient(base_url="unix:///run/podman/podman.sock")


@pytest.fixture
def fresh_python_base(engine: str) -> Iterator[str]:
    """The Python stand-in base under a new name of this test's (its project image is then missing); the name
    and the project image built on it are removed afterwards."""
    repository, tag = "localhost/firstcall-test/python", secrets.token_hex(4)
    client = _client(engine)
    client.images.get(engine_settings(engine).base_image_for("python")).tag(repository, tag)
    name = f"{repository}:{tag}"
    try:
        yield name
    finally:
        project = images.recipe(engine_settings(engine, sandbox_image_python=name), "python").tag
        for image in (project, name):
            with contextlib.suppress(Exception):  # already gone
                client.images.remove(image)
        client.close()


def _payload(result: CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return json.loads(first.text)


async def _until(condition: Any, seconds: float = 300) -> None:
    with anyio.fail_after(seconds):  # a bound for a hung engine, not a speed check
        while not await condition():  # noqa: ASYNC110 - what it waits for happens in another process
            await anyio.sleep(0.2)


async def _execute(client: Client, code: str, messages: list[str] | None = None) -> dict[str, Any]:
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        if messages is not None:
            messages.append(message or "")

    return _payload(
        await client.call_tool("execute_code", {"code": code, "timeout": 60}, progress_callback=on_progress)
    )


def _settings(engine: str, base: str, index: StandInIndex) -> Settings:
    return engine_settings(
        engine,
        sandbox_image_python=base,
        sandbox_image_build_network="host",
        sandbox_pip_index_url=index.url,
        # Today's code turns the waiting first call into a job after this long: the test then sees a job.
        sandbox_foreground_limit=20,
        sandbox_pool_size=1,
    )


@pytest.mark.parametrize("engine", BUILDING_ENGINES, indirect=True)
async def test_first_calls_answer_on_the_base_image_while_a_build_that_outlives_the_server_runs(
    request: pytest.FixtureRequest,
    engine: str,
    fresh_python_base: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One test for the whole story (about 30 s: two servers and one small real build, which is the point)."""
    await require(request, engine)
    monkeypatch.setattr("llm_sandbox_mcp.run.jobs.PROGRESS_EVERY", 0.05)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # this test's own build locks and logs
    with standin_index() as index:
        settings = _settings(engine, fresh_python_base, index)
        tag = images.recipe(settings, "python").tag
        messages: list[str] = []

        # A first server: its first call is a result, not a job, while the build waits at the index.
        async with Client(build_server(settings)) as client:
            first = await _execute(client, "print(1)", messages)
            assert (first["status"], first["exit_code"], first["stdout"]) == ("finished", 0, "1\n"), first
            assert any(f"on the base image {fresh_python_base}: " in message for message in messages), messages
            assert any("project image is being built in the background" in message for message in messages)
            numpy = await _execute(client, "import numpy")
            assert (numpy["status"], numpy["exit_code"]) == ("finished", 1)
            assert "'numpy' comes with the python project image, which is not ready yet" in numpy["stderr"]
            assert 'Call again with libraries=["numpy"]' in numpy["stderr"]
            await _until(lambda: anyio.to_thread.run_sync(lambda: bool(index.requests)))

        # The client went away; the build did not: its process still holds the image's lock.
        from llm_sandbox_mcp.images.detached import BuildFiles

        files = BuildFiles.of(engine, images.recipe(settings, "python"))
        assert await anyio.to_thread.run_sync(files.locked)

        # A second server follows that build rather than starting another, and switches once it is done.
        state = AppState(settings)
        async with Client(build_server(settings, state=state)) as client:
            again = await _execute(client, "print(2)")
            assert (again["status"], again["stdout"]) == ("finished", "2\n"), again
            build = state.executor.images.builds["python"]
            assert build.process is None  # not started here: the first server's goes on
            index.gate.set()

            async def switched() -> bool:
                return state.executor.images.image("python") == tag

            await _until(switched)
            done = await _execute(client, "import numpy\nprint(numpy.STAND_IN)")
            assert (done["exit_code"], done["stdout"]) == (0, "True\n"), done
            pool = state.executor.pool.sizes()
            assert pool and all(key.spec.image == tag for key in pool), pool  # the base image's sandboxes went
        image = await anyio.to_thread.run_sync(_client(engine).images.get, tag)
        assert image.labels[images.BASE_LABEL] == fresh_python_base
        assert not await anyio.to_thread.run_sync(files.locked)
