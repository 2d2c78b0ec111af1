"""What clients show about the server and its tools: title, description, icon, each tool's behaviour hints, and
the words for a session's lifetime."""

from __future__ import annotations

import base64
from importlib.resources import files
from typing import TYPE_CHECKING

from mcp_types import Icon, ToolAnnotations

from llm_sandbox_mcp.durations import duration

if TYPE_CHECKING:
    from llm_sandbox_mcp.config import Settings

TITLE = "LLM Sandbox"
# Kept equal to pyproject's description, at most 100 characters for the MCP registry (tests check both).
DESCRIPTION = "Run the code an AI agent writes in a hardened sandbox: Docker, Podman, Kubernetes or bubblewrap."


def icons() -> list[Icon]:
    """The server's icon, shipped in the package and sent inline as data: URIs (no network needed): SVG for
    clients that scale it, and a 256x256 PNG (made from the SVG with `rsvg-convert -w 256`) for those that
    only render bitmaps, the format every client must support."""
    return [_inline("icon.svg", "image/svg+xml", "any"), _inline("icon.png", "image/png", "256x256")]


def _inline(name: str, mime_type: str, size: str) -> Icon:
    data = files("llm_sandbox_mcp").joinpath(name).read_bytes()
    source = f"data:{mime_type};base64," + base64.b64encode(data).decode("ascii")
    return Icon(src=source, mime_type=mime_type, sizes=[size])


def hints(title: str, *, read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> ToolAnnotations:
    """All four hints, always explicit: a client must never fall back to the spec's pessimistic defaults."""
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=open_world,
    )


def lifetime(settings: Settings) -> str:
    """How long a session lives, for the model that creates one: it cannot ask."""
    idle, most = settings.sandbox_session_idle_ttl, settings.sandbox_session_max_lifetime
    return f"expires after {duration(idle)} idle, {duration(most)} at most"
