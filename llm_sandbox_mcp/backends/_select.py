"""BACKEND=auto: the first engine that answers, in the order Docker, Podman, bubblewrap."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from llm_sandbox_mcp.backends import Backend, load_backend
from llm_sandbox_mcp.errors import BackendUnavailable, SandboxError

if TYPE_CHECKING:
    from llm_sandbox_mcp.config import Settings

logger = logging.getLogger(__name__)

AUTO_ORDER = ("docker", "podman", "bubblewrap")
_PROBE_SECONDS = 10.0


async def select_backend(settings: Settings) -> tuple[Backend, str]:
    """The backend to use and why. An explicit BACKEND is used as is (its errors surface on first use)."""
    if settings.backend != "auto":
        return load_backend(settings.backend, settings), f"BACKEND={settings.backend}"
    reasons: list[str] = []
    for name in AUTO_ORDER:
        try:
            backend = load_backend(name, settings)
        except SandboxError as exc:
            reasons.append(f"{name}: {exc}")
            continue
        try:
            with anyio.fail_after(_PROBE_SECONDS):
                line = await backend.describe()
        except (SandboxError, TimeoutError) as exc:
            reasons.append(f"{name}: {exc or 'no answer within 10 s'}")
            await backend.aclose()
            continue
        why = f"BACKEND=auto chose {name} ({line})"
        if reasons:
            why += "; skipped " + "; ".join(reasons)
        return backend, why
    raise BackendUnavailable(
        "BACKEND=auto found no usable engine. " + " | ".join(reasons) + " — start Docker or Podman, or install "
        "bubblewrap with unprivileged user namespaces enabled; `llm-sandbox-mcp doctor` shows the details."
    )
