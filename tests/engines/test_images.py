"""Images as users get them, on every engine: the project images have the libraries agents import first,
a bare official-like image says which `libraries` value fixes a missing import, and a missing project
image is built once, in the background at first use (calls run on the base image meanwhile), by a detached
`images build` process that drives the engine's API.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from llm_sandbox_mcp import images
from llm_sandbox_mcp.backends import ImageBuild, ImageInfo, load_backend
from llm_sandbox_mcp.backends._threaded import ThreadedBuilder
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import ImageMissing
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.run.executor import Executor
from tests.engines.conftest import RecordingBackend, engine_settings, require

pytestmark = pytest.mark.anyio

PNG = b"\x89PNG\r\n\x1a\n"
IMAGE_ENGINES = [pytest.param(name, marks=getattr(pytest.mark, name)) for name in ("docker", "podman", "kubernetes")]
BUILDING_ENGINES = [pytest.param(name, marks=getattr(pytest.mark, name)) for name in ("docker", "podman")]

DATA_ANALYSIS = """\
import pandas as pd
import matplotlib.pyplot as plt
import numpy, scipy, sklearn, sympy, seaborn, PIL, requests, bs4, openpyxl, pyarrow
frame = pd.DataFrame({"x": [1, 2, 3], "y": [1, 4, 9]})
print(int(frame["y"].sum()))
frame.plot(x="x", y="y")
plt.show()
"""


def _pinned(language: str) -> dict[str, str]:
    specs = images.library_specs(language)
    return {images.library_name(spec): spec.removeprefix(images.library_name(spec)).lstrip("=@") for spec in specs}


@pytest.mark.parametrize("engine", IMAGE_ENGINES, indirect=True)
async def test_with_the_project_images_a_plot_and_pandas_need_no_libraries(executor: Executor) -> None:
    result = await executor.execute(DATA_ANALYSIS, "python", timeout=120)
    assert (result.exit_code, result.stdout.strip()) == (0, "14"), result.stderr
    pngs = [a for a in result.artifacts if a.mime_type == "image/png"]
    assert len(pngs) == 1 and pngs[0].data is not None and pngs[0].data.startswith(PNG)


@pytest.mark.parametrize("engine", IMAGE_ENGINES, indirect=True)
@pytest.mark.parametrize("language", ["python", "javascript", "r"])
async def test_language_details_report_the_versions_really_in_the_image(executor: Executor, language: str) -> None:
    version, found = await executor.probe(get_language(language))
    assert version.split()[0] in ("Python", "Node.js", "Rscript"), version
    if language == "r":  # Debian's r-cran-* packages: whatever version the base's archive has
        assert set(found) == set(_pinned("r")) and all(found.values())
    else:
        assert found == _pinned(language)


def _bare(engine: str) -> dict[str, Any]:
    if engine == "kubernetes":  # on a cluster SANDBOX_IMAGE_* is what runs: point it at the bare image
        return {"sandbox_image_python": engine_settings("docker").base_image_for("python")}
    return {"sandbox_project_images": False}


async def test_with_a_bare_image_a_missing_import_says_which_libraries_value_fixes_it(
    request: pytest.FixtureRequest, engine: str
) -> None:
    """Bubblewrap runs the host's Python, which has no pandas either (provisioning installs none)."""
    await require(request, engine)
    settings = engine_settings(engine, **_bare(engine))
    backend = RecordingBackend(load_backend(engine, settings))
    code = "import pandas as pd\nprint(int(pd.Series([1, 4, 9]).sum()))\n"
    try:
        async with Executor(settings, backend) as executor:
            first = await executor.execute(code, "python", timeout=60)
            assert first.exit_code == 1 and "ModuleNotFoundError" in first.stderr
            assert 'call again with libraries=["pandas"]' in first.stderr
            again = await executor.execute(code, "python", ["pandas"], timeout=60)
            assert (again.exit_code, again.stdout.strip()) == (0, "14"), again.stderr
            if engine not in ("bubblewrap", "nsjail"):  # those run the host's runtimes, not images
                assert (await executor.probe(get_language("python")))[1] == {}
    finally:
        await backend.aclose()


@pytest.fixture
def fresh_base(request: pytest.FixtureRequest, engine: str) -> Iterator[str]:
    """A new name for a language's base image (Ruby's unless parametrized), so that its project image (same
    Dockerfile, another base) is missing."""
    language: str = getattr(request, "param", "ruby")
    name = f"localhost/llm-sandbox-test-base:{secrets.token_hex(4)}"
    source = engine_settings(engine).base_image_for(language)
    if engine == "docker":
        import docker

        client = docker.from_env()
        client.images.get(source).tag(name)
        remove = client.images.remove
    else:
        from podman import PodmanClient

        client = PodmanClient(base_url="unix:///run/podman/podman.sock")
        repository, tag = name.rsplit(":", 1)
        client.images.get(source).tag(repository, tag)
        remove = client.images.remove
    try:
        yield name
    finally:
        tag = images.recipe(engine_settings(engine, **{f"sandbox_image_{language}": name}), language).tag
        for image in (tag, name):
            with contextlib.suppress(Exception):  # already gone
                remove(image)
        client.close()


class RecordingBuilder(RecordingBackend):
    """A real Docker or Podman backend that also builds images (the server checks images through it)."""

    def __init__(self, inner: ThreadedBuilder) -> None:
        super().__init__(inner)
        self.builder = inner

    async def image_info(self, image: str) -> ImageInfo | None:
        return await self.builder.image_info(image)

    async def build_image(self, build: ImageBuild, on_line: Callable[[str], None]) -> None:
        await self.builder.build_image(build, on_line)


def _builder(engine: str, settings: Settings) -> RecordingBuilder:
    backend = load_backend(engine, settings)
    assert isinstance(backend, ThreadedBuilder)
    return RecordingBuilder(backend)


async def _until(condition: Callable[[], bool], seconds: float = 300) -> None:
    with anyio.fail_after(seconds):  # a bound for a hung engine, not a speed check
        while not condition():  # noqa: ASYNC110 - what it waits for happens in another process
            await anyio.sleep(0.2)


@pytest.mark.parametrize("engine", BUILDING_ENGINES, indirect=True)
async def test_a_missing_project_image_is_built_once_in_the_background_while_calls_run_on_the_base(
    request: pytest.FixtureRequest, engine: str, fresh_base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await require(request, engine)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # this test's own build locks and logs
    settings = engine_settings(engine, sandbox_image_ruby=fresh_base, sandbox_image_build_network="host")
    backend = _builder(engine, settings)
    results: list[str] = []

    async def call(executor: Executor) -> None:
        results.append((await executor.execute("puts 6 * 7", "ruby")).stdout.strip())

    try:
        async with Executor(settings, backend) as executor:
            async with anyio.create_task_group() as tasks:
                for _ in range(3):
                    tasks.start_soon(call, executor)
            tag = images.recipe(settings, "ruby").tag
            assert results == ["42"] * 3
            builds = list(executor.images.builds.values())
            assert [build.recipe.tag for build in builds] == [tag]  # one build for the three calls
            await _until(lambda: executor.images.image("ruby") == tag)
            assert builds[0].process is not None and builds[0].process.wait() == 0
            assert (await executor.execute("puts 6 * 7", "ruby")).stdout == "42\n"
            image = await backend.image_info(tag)
            assert image is not None and image.labels[images.BASE_LABEL] == fresh_base
            base = await backend.image_info(fresh_base)
            assert base is not None and image.labels[images.BASE_ID_LABEL] == base.id
    finally:
        await backend.aclose()


@pytest.mark.parametrize("engine", BUILDING_ENGINES, indirect=True)
async def test_a_base_image_that_cannot_be_pulled_is_one_clear_line(
    request: pytest.FixtureRequest, engine: str
) -> None:
    await require(request, engine)
    base = f"localhost:9/llm-sandbox-absent:{secrets.token_hex(4)}"
    settings = engine_settings(engine, sandbox_image_ruby=base)
    backend = _builder(engine, settings)
    try:
        async with Executor(settings, backend) as executor:
            with pytest.raises(ImageMissing) as failure:
                await executor.execute(get_language("ruby").examples[0], "ruby")
            assert executor.images.builds == {}  # nothing to build on
    finally:
        await backend.aclose()
    message = str(failure.value)
    assert message.startswith(f"Image {base!r} is not") and "could not be pulled" in message
    assert "SANDBOX_IMAGE_*" in message and "\n" not in message


@pytest.mark.parametrize("engine", BUILDING_ENGINES, indirect=True)
@pytest.mark.parametrize("fresh_base", ["python"], indirect=True)
async def test_a_project_image_that_cannot_be_built_leaves_calls_on_the_base_saying_why(
    request: pytest.FixtureRequest, engine: str, fresh_base: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await require(request, engine)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    settings = engine_settings(
        engine,
        sandbox_image_python=fresh_base,
        sandbox_image_build_network="host",
        sandbox_pip_index_url="http://127.0.0.1:9/simple",  # nothing listens there: pip fails
    )
    backend = _builder(engine, settings)
    try:
        async with Executor(settings, backend) as executor:
            assert (await executor.execute("print(1)", "python")).stdout == "1\n"
            await _until(lambda: executor.images.builds["python"].failed is not None)
            result = await executor.execute("import numpy", "python")
    finally:
        await backend.aclose()
    assert result.exit_code == 1 and "ModuleNotFoundError" in result.stderr
    hint = result.stderr.split("[hint: ", 1)[1]
    assert hint.startswith("'numpy' comes with the python project image, which is not ready yet: the python project")
    assert "could not be built (Docker's build of" in hint or "could not be built (Podman's build of" in hint
    assert "images build --language python` shows the whole build" in hint and 'libraries=["numpy"]' in hint
