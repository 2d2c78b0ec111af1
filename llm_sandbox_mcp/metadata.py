"""What clients show about the server and its tools: title, description, icon, and each tool's behaviour hints."""

from __future__ import annotations

import base64
from importlib.resources import files

from mcp_types import Icon, ToolAnnotations

TITLE = "LLM Sandbox"
# Kept equal to pyproject's description, at most 100 characters for the MCP registry (tests check both).
DESCRIPTION = "Run the code an AI agent writes in a hardened sandbox: Docker, Podman, Kubernetes or bubblewrap."


def icons() -> list[Icon]:
    """The server's icon, shipped in the package and sent inline as a data: URI (no network needed)."""
    svg = files("llm_sandbox_mcp").joinpath("icon.svg").read_bytes()
    source = "data:image/svg+xml;base64," + base64.b64encode(svg).decode("ascii")
    return [Icon(src=source, mime_type="image/svg+xml", sizes=["any"])]


def hints(title: str, *, read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> ToolAnnotations:
    """All four hints, always explicit: a client must never fall back to the spec's pessimistic defaults."""
    return ToolAnnotations(
        title=title,
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=open_world,
    )
