"""`llm-sandbox-mcp images build|list`: the project images, built on the configured engine through its API."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import anyio
import anyio.to_thread

from llm_sandbox_mcp import images
from llm_sandbox_mcp.backends import Backend, ImageBuilder, select_backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxError
from llm_sandbox_mcp.file_lock import ProcessLock
from llm_sandbox_mcp.images.build import Status, build, status
from llm_sandbox_mcp.images.detached import FAILED_PREFIX, BuildFiles
from llm_sandbox_mcp.languages import LANGUAGES


def add_parser(add: Callable[..., argparse.ArgumentParser]) -> None:
    parser = add(
        "images",
        help="build or list the project images (the SANDBOX_IMAGE_* bases with the preinstalled libraries)",
    )
    commands = parser.add_subparsers(dest="images_command", required=True)
    build_parser = commands.add_parser(
        "build",
        help="build the project images that are missing or out of date on the engine (BACKEND); optional: the "
        "server builds a missing one in the background at first use, running calls on the base image meanwhile",
    )
    listing = commands.add_parser("list", help="each language's project image and whether the engine has it")
    for sub in (build_parser, listing):
        sub.add_argument(
            "--language", "-l", action="append", choices=sorted(LANGUAGES), help="only this language (repeatable)"
        )
    build_parser.add_argument(
        "--pull", action="store_true", help="pull the base images first and rebuild even images that are current"
    )


def describe(current: Status, size: int = 0) -> str:
    recipe = current.recipe
    state = "missing" if not current.present else f"out of date ({current.stale})" if current.stale else "present"
    shown = f" {size / 1024**2:.0f} MiB" if size else ""
    return f"{recipe.language:<11} {state:<9}{shown}  {recipe.tag}  FROM {recipe.base}"


async def doctor_lines(settings: Settings, backend: Backend) -> list[str]:
    """For `doctor`: which project images the engine has (nothing for backends that build none)."""
    if not isinstance(backend, ImageBuilder):
        return []
    lines: list[str] = []
    for language in LANGUAGES:
        current = await status(backend, images.recipe(settings, language))
        files = BuildFiles.of(backend.name, current.recipe)
        building = not current.ready and await anyio.to_thread.run_sync(files.locked)
        lines.append(
            f"  project image {describe(current)}" + (f" (being built now; log: {files.log})" if building else "")
        )
    used = "used" if images.derived(settings) else "not used (SANDBOX_PROJECT_IMAGES=false or Kubernetes)"
    missing = sum(line.split()[3] != "present" for line in lines)
    hint = (
        f"; {missing} missing: built in the background at first use (calls run on the base image meanwhile), or "
        "now with `llm-sandbox-mcp images build`"
        if missing
        else ""
    )
    return [*lines, f"  project images {used}{hint}"]


async def _builder(settings: Settings) -> tuple[Backend, ImageBuilder]:
    backend, _ = await select_backend(settings)
    if not isinstance(backend, ImageBuilder):
        await backend.aclose()
        raise SandboxError(
            f"The {backend.name} backend builds no images. Build them with BACKEND=docker or BACKEND=podman (for "
            "a cluster: then push them and point SANDBOX_IMAGE_* at the pushed names; see docs/languages.md)."
        )
    return backend, backend


async def run(settings: Settings, args: argparse.Namespace) -> int:
    try:
        backend, builder = await _builder(settings)
    except SandboxError as exc:
        sys.stderr.write(f"llm-sandbox-mcp: {exc}\n")
        return 2
    failed = 0
    try:
        for language in args.language or list(LANGUAGES):
            recipe = images.recipe(settings, language)
            current = await status(builder, recipe)
            if args.images_command == "build" and (args.pull or not current.ready):
                failed += not await _build(settings, builder, backend.name, current, args.pull)
                current = await status(builder, recipe)
            found = await builder.image_info(recipe.tag)
            sys.stdout.write(describe(current, found.size if found is not None else 0) + "\n")
    finally:
        await backend.aclose()
    if not images.derived(settings):
        sys.stdout.write(
            "note: runs use SANDBOX_IMAGE_* as they are (SANDBOX_PROJECT_IMAGES=false, or Kubernetes), not these\n"
        )
    return 1 if failed else 0


async def _build(settings: Settings, builder: ImageBuilder, engine: str, current: Status, pull: bool) -> bool:
    """Build under the image's lock: where another process builds it already (a server's background build, or
    another `images build`), wait for that one and build only if it ended without the image."""
    recipe = current.recipe
    files = BuildFiles.of(engine, recipe)
    lock = ProcessLock(files.lock)
    if not lock.acquire():
        sys.stderr.write(f"== {recipe.tag}: another process is building it (its log: {files.log}); waiting\n")
        while not lock.acquire():  # noqa: ASYNC110 - held by another process: nothing here could set an event
            await anyio.sleep(1)
    try:
        if not pull and (current := await status(builder, recipe)).ready:
            sys.stderr.write(f"== {recipe.tag} is there now\n")
            return True
        sys.stderr.write(f"== building {recipe.tag} FROM {recipe.base}\n")
        started = time.monotonic()

        def on_line(line: str) -> None:
            sys.stderr.write(f"   {line}\n")
            sys.stderr.flush()

        try:
            await build(settings, builder, recipe, pull, on_line)
        except SandboxError as exc:
            sys.stderr.write(f"{FAILED_PREFIX}{exc}\n")
            return False
        sys.stderr.write(f"== built {recipe.tag} in {time.monotonic() - started:.0f} s\n")
        return True
    finally:
        lock.release()
