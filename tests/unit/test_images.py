"""Project images as recipes (tags, build contexts, labels, what runs use) and the missing-library hint."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.dispatcher import ProgressFnT
from mcp_types import CallToolResult, TextContent

from llm_sandbox_mcp import cli, images
from llm_sandbox_mcp.backends import ImageBuild, ImageInfo
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.images.detached import BuildFiles
from llm_sandbox_mcp.languages import LANGUAGES
from llm_sandbox_mcp.run.hints import missing_library, missing_library_hint
from llm_sandbox_mcp.server.app import build_server
from llm_sandbox_mcp.server.state import AppState
from tests.support.fakes import FakeBackend, ok


@pytest.mark.parametrize("language", sorted(LANGUAGES))
def test_every_language_has_a_project_image_built_from_its_configured_base(language: str) -> None:
    base: dict[str, Any] = {f"sandbox_image_{language}": "example.invalid/base:1"}
    settings = Settings(**base)
    recipe = images.recipe(settings, language)
    assert recipe.base == "example.invalid/base:1"
    assert images.run_image(settings, language) == recipe.tag
    assert recipe.tag.startswith(images.REPOSITORY + language + ":")
    with tarfile.open(fileobj=io.BytesIO(recipe.context())) as tar:
        names = tar.getnames()
        dockerfile = tar.extractfile("Dockerfile")
        assert dockerfile is not None and b"FROM ${BASE}" in dockerfile.read()
    assert names[0] == "Dockerfile"
    if images.library_specs(language):
        assert f"{language}.txt" in names
    assert images.build_args(settings, recipe.base)["BASE"] == recipe.base


def test_the_tag_follows_the_recipe_so_a_new_base_is_a_new_image() -> None:
    one = images.recipe(Settings(sandbox_image_python="python:3.12-slim"), "python")
    again = images.recipe(Settings(sandbox_image_python="python:3.12-slim"), "python")
    other = images.recipe(Settings(sandbox_image_python="python:3.13-slim"), "python")
    assert one.tag == again.tag != other.tag


def test_the_pinned_libraries_are_the_ones_agents_reach_for_and_land_in_the_labels() -> None:
    python = {images.library_name(spec): spec for spec in images.library_specs("python")}
    wanted = "numpy pandas matplotlib scipy scikit-learn sympy seaborn pillow requests beautifulsoup4 openpyxl pyarrow"
    assert set(wanted.split()) <= set(python)
    assert all("==" in spec for spec in python.values())
    assert all("@" in spec[1:] for spec in images.library_specs("javascript"))
    assert {"ggplot2", "dplyr", "tidyr", "data.table", "jsonlite"} <= set(images.library_specs("r"))
    labels = images.recipe(Settings(), "python").labels("sha256:abc")
    assert labels[images.LIBRARIES_LABEL].split() == images.library_specs("python")
    assert labels[images.BASE_ID_LABEL] == "sha256:abc" and labels[images.BASE_LABEL] == "python:3.12-slim"


def test_registries_configured_for_libraries_reach_the_builds() -> None:
    settings = Settings(sandbox_pip_index_url="https://mirror.example/simple", sandbox_npm_registry=None)
    assert images.build_args(settings, "b") == {"BASE": "b", "PIP_INDEX_URL": "https://mirror.example/simple"}


@pytest.mark.parametrize(
    ("overrides", "derived"),
    [({}, True), ({"sandbox_project_images": False}, False), ({"backend": "kubernetes"}, False)],
)
def test_runs_use_sandbox_image_as_it_is_without_project_images_and_on_kubernetes(
    overrides: dict[str, Any], derived: bool
) -> None:
    settings = Settings(sandbox_image_r="my/r:1", **overrides)
    assert images.derived(settings) is derived
    assert (images.run_image(settings, "r") == "my/r:1") is not derived


def test_library_versions_come_only_from_names_on_the_list() -> None:
    output = "numpy 2.2.6\npandas 2.2.3\nevil 1.0\nnumpy\n" + "x" * 10_000
    assert images.parse_probe("python", output) == {"numpy": "2.2.6", "pandas": "2.2.3"}
    probe = images.probe_argv("python")
    assert probe is not None and probe[-1] == "pyarrow"
    assert images.probe_argv("go") is None


@pytest.mark.parametrize(
    ("language", "stderr", "library"),
    [
        ("python", "Traceback ...\nModuleNotFoundError: No module named 'numpy'\n", "numpy"),
        ("python", "ModuleNotFoundError: No module named 'sklearn.linear_model'", "scikit-learn"),
        ("python", "ModuleNotFoundError: No module named 'PIL'", "pillow"),
        ("python", "ModuleNotFoundError: No module named 'my_lib'", "my-lib"),
        ("python", "ModuleNotFoundError: No module named '_tkinter'", None),
        ("python", "ModuleNotFoundError: No module named 'tkinter'", None),
        ("python", "NameError: name 'x' is not defined", None),
        ("r", "Error in library(ggplot2) : there is no package called ‘ggplot2’", "ggplot2"),
        ("javascript", "Error: Cannot find module 'lodash/fp'\nRequire stack:", "lodash"),
        ("javascript", "Error [ERR_MODULE_NOT_FOUND]: Cannot find package '@scope/pkg' imported from", "@scope/pkg"),
        ("javascript", "Error: Cannot find module '/workspace/other.js'", None),
        ("ruby", "main.rb:1:in 'require': cannot load such file -- rainbow (LoadError)", "rainbow"),
        ("go", "no required module provides package github.com/x/y", None),
    ],
)
def test_a_run_missing_a_library_is_told_the_libraries_value_that_fixes_it(
    language: str, stderr: str, library: str | None
) -> None:
    assert missing_library(language, stderr) == library
    hint = missing_library_hint(language, stderr)
    if library is None:
        assert hint == ""
    else:
        assert f"libraries={json.dumps([library])}" in hint
        assert LANGUAGES[language].check_libraries([library]) == [library]


def test_images_without_an_engine_that_builds_says_what_to_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BACKEND", "bubblewrap")
    monkeypatch.setenv("SANDBOX_BWRAP_PATH", str(tmp_path / "bwrap"))
    assert cli.main(["images", "list"]) == 2
    error = capsys.readouterr().err
    assert "The bubblewrap backend builds no images" in error and "BACKEND=docker or BACKEND=podman" in error


@dataclass
class BuildingBackend(FakeBackend):
    """A fake engine that has no project image until it builds one, logging a step a while."""

    built: list[str] = field(default_factory=lambda: [])

    async def image_info(self, image: str) -> ImageInfo | None:
        return ImageInfo("sha256:" + image, {}) if image in self.built or ":3.12-slim" in image else None

    async def build_image(self, build: ImageBuild, on_line: Callable[[str], None]) -> None:
        for step in range(1, 4):
            on_line(f"Step {step}/3 : RUN pip install")
            await anyio.sleep(0.05)
        self.built.append(build.tag)


def _payload(result: CallToolResult) -> dict[str, Any]:
    first = result.content[0]
    assert isinstance(first, TextContent)
    return json.loads(first.text)


async def _call(
    client: Client, arguments: dict[str, Any], on_progress: ProgressFnT, results: list[CallToolResult]
) -> None:
    results.append(await client.call_tool("execute_code", arguments, progress_callback=on_progress))


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():  # noqa: ASYNC110 - what it waits for happens in another process
        await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_calls_run_on_the_base_image_while_the_project_image_is_built_and_switch_once_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The build process stands in for the detached `images build` (the engine tier runs the real one)."""
    monkeypatch.setattr("llm_sandbox_mcp.run.jobs.PROGRESS_EVERY", 0.01)
    monkeypatch.setattr("llm_sandbox_mcp.images.background.POLL_SECONDS", 0.01)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    backend = BuildingBackend()
    processes: list[subprocess.Popen[bytes]] = []

    def start(settings: Settings, engine: str, recipe: images.Recipe, files: BuildFiles) -> subprocess.Popen[bytes]:
        files.log.parent.mkdir(parents=True, exist_ok=True)
        files.log.write_text("Step 2/3 : RUN pip install\nDownloading numpy\n")
        process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        processes.append(process)
        return process

    monkeypatch.setattr("llm_sandbox_mcp.images.background.start", start)
    messages: list[str] = []
    note = "on the base image python:3.12-slim: the python project image is being built in the background"
    noted = anyio.Event()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")
        if note in (message or "") and "step 2/3: Downloading numpy" in (message or ""):
            noted.set()

    settings = Settings(sandbox_pool_size=0)
    tag = images.recipe(settings, "python").tag
    state = AppState(settings)
    missing = b"Traceback ...\nModuleNotFoundError: No module named 'numpy'\n"
    backend.handler = lambda call: ok(stderr=missing, exit_code=1) if b"numpy" in call.stdin else ok(b"1\n")
    try:
        async with Client(build_server(settings, backend, state)) as client:
            with anyio.fail_after(10):
                results: list[CallToolResult] = []
                backend.gate = anyio.Event()  # the run lasts until the progress said what happens
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(lambda: _call(client, {"code": "print(1)"}, on_progress, results))
                    await noted.wait()
                    backend.gate.set()
                assert _payload(results[0])["status"] == "finished" and _payload(results[0])["stdout"] == "1\n"
                assert backend.created[-1].image == "python:3.12-slim" and len(processes) == 1
                numpy = _payload(await client.call_tool("execute_code", {"code": "import numpy"}))
                assert "'numpy' comes with the python project image, which is not ready yet" in numpy["stderr"]
                assert 'Call again with libraries=["numpy"]' in numpy["stderr"]
                backend.built.append(tag)  # the build process tagged it, and ends
                assert processes[0].stdin is not None
                processes[0].stdin.close()
                await _until(lambda: state.executor.images.image("python") == tag)
                after = _payload(await client.call_tool("execute_code", {"code": "import numpy"}))
                assert backend.created[-1].image == tag and "comes with the python project image" not in after["stderr"]
        assert len(processes) == 1
    finally:
        for process in processes:
            process.kill()
            process.wait()
