"""Building project images through the engine's API, in the `images build` process (`images.detached`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import anyio

from llm_sandbox_mcp import images
from llm_sandbox_mcp.backends import ImageBuild, ImageBuilder
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.images import Recipe

logger = logging.getLogger(__name__)


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
