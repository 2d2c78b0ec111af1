"""Print the manifest.json of the Claude Desktop bundle (.mcpb); scripts/build-mcpb writes, validates and packs it.

The bundle carries the package's source and pyproject.toml and uses the `uv` server type: the host installs
Python and the dependencies with uv, so users need no Python of their own. The engine settings users are most
likely to need are fields Claude Desktop asks for at install time; an empty field leaves the variable unset
(the server ignores empty values).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import tomlkit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llm_sandbox_mcp import __version__  # noqa: E402
from llm_sandbox_mcp.config import Settings  # noqa: E402
from llm_sandbox_mcp.server.app import build_server  # noqa: E402
from llm_sandbox_mcp.server.metadata import TITLE  # noqa: E402

# (user_config key, variable, type, title, description)
USER_CONFIG = (
    ("backend", "BACKEND", "string", "Backend",
     "docker, podman, kubernetes, bubblewrap or nsjail; auto (or empty) uses the first of Docker, Podman, "
     "bubblewrap, NsJail that answers."),
    ("docker_host", "DOCKER_HOST", "string", "Docker socket",
     "e.g. unix:///var/run/docker.sock or unix:///Users/me/.colima/default/docker.sock; empty: Docker's default."),
    ("podman_host", "PODMAN_HOST", "string", "Podman socket",
     "For BACKEND=podman, e.g. unix:///run/user/1000/podman/podman.sock; empty: found on its own."),
    ("kubeconfig", "KUBECONFIG", "file", "Kubeconfig",
     "For BACKEND=kubernetes; empty: ~/.kube/config."),
)  # fmt: skip


async def _tools() -> list[dict[str, str]]:
    """The tools as the server lists them, first sentence of each description (the bundle's summary)."""
    tools = await build_server(Settings(backend="docker")).list_tools()
    return [{"name": tool.name, "description": _first_sentence(tool.description or "")} for tool in tools]


def _first_sentence(text: str) -> str:
    return text.split(". ")[0].rstrip(".") + "."


def manifest() -> dict[str, Any]:
    project: Any = tomlkit.parse((ROOT / "pyproject.toml").read_text(encoding="utf-8")).unwrap()["project"]
    user_config = {
        key: {"type": kind, "title": title, "description": description, "required": False, "default": ""}
        for key, _, kind, title, description in USER_CONFIG
    }
    user_config["backend"]["default"] = "auto"
    return {
        "manifest_version": "0.4",
        "name": "llm-sandbox-mcp",
        "display_name": TITLE,
        "version": __version__,
        "description": project["description"],
        "author": {"name": "llm-sandbox-mcp contributors"},
        "license": project["license"],
        "keywords": project["keywords"],
        "icon": "icon.png",
        "server": {
            "type": "uv",
            "entry_point": "llm_sandbox_mcp/__main__.py",
            "mcp_config": {
                "command": "uv",
                "args": ["run", "--directory", "${__dirname}", "--no-dev", "llm-sandbox-mcp"],
                "env": {variable: f"${{user_config.{key}}}" for key, variable, *_ in USER_CONFIG},
            },
        },
        "tools": anyio.run(_tools),
        "compatibility": {"platforms": ["darwin", "linux"], "runtimes": {"python": project["requires-python"]}},
        "user_config": user_config,
    }


if __name__ == "__main__":
    sys.stdout.write(json.dumps(manifest(), indent=2, ensure_ascii=False) + "\n")
