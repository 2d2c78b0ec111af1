"""How the agent CLIs run in tests without reaching anything but 127.0.0.1: no model service but a local
stand-in, no telemetry, no update checks, no plugin downloads (the workplace allows no other traffic)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# `codex app-server` otherwise opens the OpenAI Responses socket and clones its plugin repository at start.
CODEX_OFFLINE = [
    "-c", 'openai_base_url="http://127.0.0.1:9/v1"', "-c", "analytics.enabled=false",
    "--disable", "plugins", "--disable", "remote_plugin", "--disable", "apps", "--disable", "in_app_updates",
]  # fmt: skip

CLAUDE_OFFLINE = {
    "ENABLE_TOOL_SEARCH": "false",
    "MCP_CONNECTION_NONBLOCKING": "0",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


def quiet_gemini(home: Path) -> None:
    """Gemini CLI's user settings with usage statistics, telemetry and update checks off, the rest kept."""
    path = home / ".gemini" / "settings.json"
    settings: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    settings["privacy"] = {"usageStatisticsEnabled": False}
    settings["telemetry"] = {"enabled": False}
    settings["general"] = {"disableAutoUpdate": True, "disableUpdateNag": True}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings))
