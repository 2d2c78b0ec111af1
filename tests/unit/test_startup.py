"""What serving loads before it can answer tools/list: the MCP SDK and the tool declarations, not the engine side
(its SDK, the executor, the pool, the runners' hosts, sessions, jobs) nor the other commands' modules."""

from __future__ import annotations

import json
import subprocess
import sys

# Everything `llm-sandbox-mcp` (serve) runs before the lifespan starts the engine beside the protocol.
_BEFORE_TOOLS_LIST = """
import json, sys
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.app import build_server
from llm_sandbox_mcp.server.state import AppState
import llm_sandbox_mcp.cli
settings = Settings()
build_server(settings, state=AppState(settings))
print(json.dumps(sorted(sys.modules)))
"""

# Whole folders: the run core and the other commands, and the engines' SDKs.
_NOT_NEEDED = ("llm_sandbox_mcp.run", "llm_sandbox_mcp.commands", "docker", "podman", "kubernetes")
_NOT_NEEDED_ENGINES = ("llm_sandbox_mcp.backends._docker", "llm_sandbox_mcp.backends._bubblewrap")


def _within(module: str, roots: tuple[str, ...]) -> bool:
    return any(module == root or module.startswith(root + ".") for root in roots)


def test_declaring_the_tools_imports_neither_the_engine_side_nor_other_commands() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _BEFORE_TOOLS_LIST], capture_output=True, text=True, check=True, timeout=60
    )
    loaded = set(json.loads(done.stdout))
    assert "llm_sandbox_mcp.server.app" in loaded
    assert sorted(m for m in loaded if _within(m, _NOT_NEEDED + _NOT_NEEDED_ENGINES)) == []
