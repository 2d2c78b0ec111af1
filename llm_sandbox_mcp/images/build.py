"""Building project images through the engine's API: at first use (once, under a lock) and from the CLI."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from llm_sandbox_mcp import images
from llm_sandbox_mcp.backends import Backend, ImageBuild, ImageBuilder
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import ImageMissing, SandboxError
from llm_sandbox_mcp.images import Recipe
from llm_sandbox_mcp.models import Live

logger = logging.getLogger(__name__)

_PHASE_CHARS = 160


@dataclass(frozen=True)
class Status:
    """Whether a project image is on the engine and current."""

    recipe: Recipe
    present: bool
    # Why a present image must be built again (its base image changed), else None.
    stale: str | None = None

    @property
    def ready(self) -> bool:
        return self.present and self.stale is None


async def status(builder: ImageBuilder, recipe: Recipe) -> Status:
    found = await builder.image_info(recipe.tag)
    if found is None:
        return Status(recipe, present=False)
    built_on = found.labels.get(images.BASE_ID_LABEL)
    base = await builder.image_info(recipe.base)
    if built_on and base is not None and base.id != built_on:
        return Status(recipe, present=True, stale=f"{recipe.base} changed since it was built")
    return Status(recipe, present=True)


async def build(
    settings: Settings, builder: ImageBuilder, recipe: Recipe, pull: bool, on_line: Callable[[str], None]
) -> None:
    """Build `recipe` on the engine (SandboxFailure with the engine's message when that fails).

    The image records the base image it was built on, unless the build pulls that base: then it is not known
    beforehand, and the image is never considered stale (`images build --pull` rebuilds it anyway)."""
    base = None if pull else await builder.image_info(recipe.base)
    bundle = settings.sandbox_install_ca_bundle
    ca = await anyio.Path(bundle).read_bytes() if bundle is not None else b""
    await builder.build_image(
        ImageBuild(
            tag=recipe.tag,
            context=recipe.context(ca),
            args=images.build_args(settings, recipe.base),
            labels=recipe.labels(base.id if base is not None else None),
            network=settings.sandbox_image_build_network,
            pull=pull,
        ),
        on_line,
    )


class ProjectImages:
    """Makes sure the project image of a language exists before its first sandbox: built once, at first use.

    Concurrent callers wait for the one build; each waiting or building call's `live` phase says what is
    happening (MCP progress for calls with a token), and the log goes to stderr.
    """

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self.builder = backend if isinstance(backend, ImageBuilder) else None
        self.engine = backend.name.capitalize()
        self._ready: set[str] = set()
        self._locks: dict[str, anyio.Lock] = {}

    async def ensure(self, language: str, live: Live | None = None) -> None:
        """Return once the project image of `language` is on the engine; raise ImageMissing saying what to do when
        it cannot be built. Nothing to do when project images are not derived here or the backend builds none."""
        if self.builder is None or not images.derived(self.settings):
            return
        recipe = images.recipe(self.settings, language)
        if recipe.tag in self._ready:
            return
        lock = self._locks.setdefault(recipe.tag, anyio.Lock())
        if lock.locked() and live is not None:
            live.phase = f"waiting for the {language} project image, which another call is building (first use)"
        async with lock:
            if recipe.tag in self._ready:
                return
            current = await status(self.builder, recipe)
            if not current.ready:
                await self._build(self.builder, current, live)
            self._ready.add(recipe.tag)

    async def _build(self, builder: ImageBuilder, current: Status, live: Live | None) -> None:
        recipe = current.recipe
        why = current.stale or "not built yet"
        logger.info("Building the %s project image %s FROM %s (%s)", recipe.language, recipe.tag, recipe.base, why)
        prefix = f"building the {recipe.language} project image (first use, usually 1-5 minutes)"
        if live is not None:
            live.phase = prefix

        def on_line(line: str) -> None:
            if line.startswith("Step ") or line.startswith("STEP "):
                logger.info("%s: %s", recipe.tag, line)
            else:
                logger.debug("%s: %s", recipe.tag, line)
            if live is not None:
                live.phase = f"{prefix}: {line}"[:_PHASE_CHARS]

        started = anyio.current_time()
        base_present = await builder.image_info(recipe.base) is not None
        try:
            await build(self.settings, builder, recipe, pull=False, on_line=on_line)
        except SandboxError as exc:
            if not base_present:
                first = str(exc).splitlines()[0]
                raise ImageMissing(
                    f"Image {recipe.base!r} is not on the {self.engine} engine and could not be pulled to build the "
                    f"{recipe.language} project image ({first}). Pull or build it, or point "
                    f"SANDBOX_IMAGE_{recipe.language.upper()} at an image you have."
                ) from exc
            raise ImageMissing(
                f"The {recipe.language} project image {recipe.tag} (FROM {recipe.base}, with the preinstalled "
                f"libraries) could not be built: {exc}\nFix the cause and call again; `llm-sandbox-mcp images build "
                f"--language {recipe.language}` shows the whole build. Or set SANDBOX_PROJECT_IMAGES=false to run "
                f"{recipe.base} as it is (libraries then come only through `libraries`)."
            ) from exc
        logger.info("Built %s in %.0f s", recipe.tag, anyio.current_time() - started)
