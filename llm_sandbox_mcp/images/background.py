"""Which image a language's sandboxes run now, and the project images built in the background meanwhile.

No call waits for a project image: where a language's is missing or stale, its calls run on the base image
(SANDBOX_IMAGE_*) while a detached `images build` process builds it (`images.detached`), one per image on this
host (`file_lock.ProcessLock`). A server that finds such a build running, its own from before a restart or another
server's, follows it rather than starting another. Once the image is there, new sandboxes use it and the
server drops those it made ready on the base image (`switched`). A build that fails leaves calls on the base
image, says why in their notes, and is tried again after a while.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from llm_sandbox_mcp import images
from llm_sandbox_mcp.backends import Backend, ImageBuilder
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxError
from llm_sandbox_mcp.images import Recipe
from llm_sandbox_mcp.images.build import status
from llm_sandbox_mcp.images.detached import BuildFiles, start

logger = logging.getLogger(__name__)

# Build processes that went on after the server that started them stopped following them, as they are meant
# to: kept referenced, so that they are not reported as leaked while this process lives.
_DETACHED: list[subprocess.Popen[bytes]] = []

# How often a build is looked at (its process, its lock, its log).
POLL_SECONDS = 1.0
# How long after a failed build the next call starts another.
RETRY_SECONDS = 600.0


@dataclass
class Build:
    """A project image being built in the background, as this server follows it."""

    recipe: Recipe
    files: BuildFiles
    why: str
    started: float = field(default_factory=time.monotonic)
    # The `images build` process this server started (None while another process builds the image).
    process: subprocess.Popen[bytes] | None = None
    # Where the build is, from its log (refreshed by the follower).
    progress: str = ""
    # Why it failed, and when; calls then run on the base image until it is tried again.
    failed: str | None = None
    ended: float = 0.0


class ProjectImages:
    """The image each language's sandboxes run: `image` (after `prepare`), with `pending` saying what calls on
    the base image are missing. Use as an async context manager: it owns the tasks that follow the builds (the
    build processes themselves outlive it)."""

    def __init__(
        self, settings: Settings, backend: Backend, switched: Callable[[str, str], Awaitable[None]] | None = None
    ) -> None:
        self.settings = settings
        self.builder = backend if isinstance(backend, ImageBuilder) and images.derived(settings) else None
        self.engine = backend.name
        self._switched = switched
        self._recipes: dict[str, Recipe] = {}
        self._ready: set[str] = set()
        self.builds: dict[str, Build] = {}
        self._locks: defaultdict[str, anyio.Lock] = defaultdict(anyio.Lock)
        self._tasks: TaskGroup | None = None

    async def __aenter__(self) -> ProjectImages:
        self._tasks = anyio.create_task_group()
        await self._tasks.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._tasks is not None
        self._tasks.cancel_scope.cancel()
        await self._tasks.__aexit__(exc_type, exc, tb)
        self._tasks = None
        _DETACHED.extend(b.process for b in self.builds.values() if b.process is not None)
        _DETACHED[:] = [process for process in _DETACHED if process.poll() is None]

    def recipe(self, language: str) -> Recipe:
        if language not in self._recipes:
            self._recipes[language] = images.recipe(self.settings, language)
        return self._recipes[language]

    def image(self, language: str) -> str:
        """The image new sandboxes of `language` get: its project image once it is known to be on the engine,
        else the base image."""
        if self.builder is None:
            return images.run_image(self.settings, language)
        if language in self._ready:
            return self.recipe(language).tag
        return self.settings.base_image_for(language)

    async def prepare(self, language: str) -> None:
        """Learn whether the project image of `language` is on the engine (once), and start its build in the
        background when it is not. Never waits for a build."""
        if self.builder is None or language in self._ready or not self._retry(language):
            return
        async with self._locks[language]:
            if language in self._ready or not self._retry(language):
                return
            recipe = self.recipe(language)
            current = await status(self.builder, recipe)
            if current.ready:
                self._ready.add(language)
                return
            if await self.builder.image_info(recipe.base) is None:
                return  # the first sandbox pulls it (or says why it cannot); the build starts at the next call
            build = Build(recipe, BuildFiles.of(self.engine, recipe), current.stale or "not built yet")
            self.builds[language] = build
            assert self._tasks is not None, "ProjectImages is used as an async context manager"
            self._tasks.start_soon(self._follow, self.builder, build)

    def _retry(self, language: str) -> bool:
        """Whether a build of `language` may start now: none is under way, and a failed one is old enough."""
        build = self.builds.get(language)
        return build is None or (build.failed is not None and time.monotonic() - build.ended > RETRY_SECONDS)

    def pending(self, language: str) -> str | None:
        """While calls of `language` run on the base image for want of the project image: one line saying so."""
        build = self.builds.get(language)
        if build is None or language in self._ready:
            return None
        if build.failed is not None:
            return (
                f"the {language} project image could not be built ({build.failed}); `llm-sandbox-mcp images build "
                f"--language {language}` shows the whole build"
            )
        elapsed = time.monotonic() - build.started
        where = f", {build.progress}" if build.progress else ""
        return (
            f"the {language} project image is being built in the background ({elapsed:.0f} s so far{where}; "
            "a first build usually takes 1-5 minutes)"
        )

    async def _follow(self, builder: ImageBuilder, build: Build) -> None:
        """Until the image is there: start the build process when none runs, follow it, and switch when it is
        done. In the background: never raises."""
        recipe = build.recipe
        try:
            while True:
                _DETACHED[:] = [process for process in _DETACHED if process.poll() is None]
                ours = build.process is not None and build.process.poll() is None
                if not ours and not await anyio.to_thread.run_sync(build.files.locked):
                    if (await status(builder, recipe)).ready:
                        await self._switch(build)
                        return
                    if build.process is not None:
                        break
                    logger.info(
                        "Building the %s project image %s FROM %s in the background (%s); calls run on %s "
                        "meanwhile. Its log: %s",
                        recipe.language,
                        recipe.tag,
                        recipe.base,
                        build.why,
                        recipe.base,
                        build.files.log,
                    )
                    await anyio.to_thread.run_sync(self._start, build)
                build.progress = await anyio.to_thread.run_sync(build.files.progress)
                await anyio.sleep(POLL_SECONDS)
            build.failed = await anyio.to_thread.run_sync(build.files.failure)
        except (SandboxError, OSError) as exc:
            build.failed = str(exc)
        except Exception as exc:  # background work never ends the server
            logger.exception("Following the build of %s failed", recipe.tag)
            build.failed = f"{type(exc).__name__}: {exc}"
        build.ended = time.monotonic()
        logger.warning(
            "The %s project image %s could not be built: %s. Calls run on %s; `llm-sandbox-mcp images build "
            "--language %s` shows the whole build.",
            recipe.language,
            recipe.tag,
            build.failed,
            recipe.base,
            recipe.language,
        )

    def _start(self, build: Build) -> None:
        build.process = start(self.settings, self.engine, build.recipe, build.files)

    async def _switch(self, build: Build) -> None:
        recipe = build.recipe
        self._ready.add(recipe.language)
        self.builds.pop(recipe.language, None)
        logger.info(
            "The %s project image %s is ready (%.0f s): new sandboxes use it",
            recipe.language,
            recipe.tag,
            time.monotonic() - build.started,
        )
        if self._switched is not None:
            await self._switched(recipe.language, recipe.base)
