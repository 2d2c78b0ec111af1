"""A run's outcome: its output files read from outside its sandbox, and the one shape every run's result takes
(an `Execution`)."""

from __future__ import annotations

import logging

import anyio.to_thread

from llm_sandbox_mcp.artifacts import Artifact, collect
from llm_sandbox_mcp.backends import Backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxFailure
from llm_sandbox_mcp.images.background import ProjectImages
from llm_sandbox_mcp.languages import COMPILE_FAILED_MARKER, Language
from llm_sandbox_mcp.models import OUTPUT_DIR, ExecResult, Execution, SandboxRef, SandboxSpec
from llm_sandbox_mcp.run.hints import missing_library_hint
from llm_sandbox_mcp.run.transfer import unpack

logger = logging.getLogger(__name__)


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def shape(
    settings: Settings,
    images: ProjectImages,
    engine: str,
    lang: Language,
    result: ExecResult,
    seconds: float,
    lost: bool,
    spec: SandboxSpec,
) -> Execution:
    """The outcome of a run of `seconds` at most on `engine`: a failed build told apart from a failed run, a hint
    where a library seems missing, what a timeout did. `lost`: a session's interpreter was lost."""
    phase = "run"
    raw_stderr = result.stderr
    if raw_stderr.endswith(COMPILE_FAILED_MARKER):
        phase, raw_stderr = "compile", raw_stderr[: -len(COMPILE_FAILED_MARKER)]
    stderr = decode(raw_stderr)
    if result.exit_code not in (0, None):
        on_base = spec.image == settings.base_image_for(lang.name)
        pending = images.pending(lang.name) if on_base else None
        coming = images.recipe(lang.name).specs if pending is not None else []
        stderr += missing_library_hint(lang.name, stderr, pending, coming)
    if result.timed_out:
        stderr += (
            f"\n[timed out after {seconds:g} s: every process was killed; raise `timeout` "
            f"(maximum {settings.sandbox_max_timeout:g} s) if the work needs longer]\n"
        )
    return Execution(
        exit_code=result.exit_code,
        stdout=decode(result.stdout),
        stderr=stderr,
        timed_out=result.timed_out,
        truncated=result.truncated,
        duration_ms=round(result.duration_ms),
        language=lang.name,
        backend=engine,
        phase="compile" if phase == "compile" else "run",
        session_id=None,
        interpreter_lost=lost,
        artifacts=result.artifacts,
    )


async def outputs_from_outside(backend: Backend, ref: SandboxRef, result: ExecResult, limit: int) -> list[Artifact]:
    """The output files (`limit` bytes inline at most), read after everything in the sandbox was killed from
    outside; none, and `result` says so, when the sandbox is gone."""
    try:
        return await _collect_outputs(backend, ref, limit)
    except SandboxFailure as exc:  # a kill that could not be proven removed the sandbox, files and all
        logger.info("No outputs of %s: %s", ref.id[:12], exc)
        result.stderr += b"\n[the sandbox was removed before its output files could be read]\n"
        return []


async def _collect_outputs(backend: Backend, ref: SandboxRef, limit: int) -> list[Artifact]:
    """Every file in the output directory (for languages without a kernel, which reports changes itself)."""
    listing = await backend.exec(ref, ["tar", "-c", "-C", str(OUTPUT_DIR), "."], timeout=30, output_limit=limit * 2)
    if listing.exit_code != 0 or listing.truncated:
        if listing.truncated:
            logger.warning("Output directory of %s exceeds %d bytes; artifacts not returned", ref.id[:12], limit)
        return []
    files = await anyio.to_thread.run_sync(unpack, listing.stdout)
    return collect(files, inline_limit=limit)
