"""What clients show: titles, the four behaviour hints, the icon, and texts short enough for their UIs."""

from __future__ import annotations

import base64
from importlib.resources import files
from pathlib import Path

import pytest
import tomlkit
from mcp import Client

from llm_sandbox_mcp import __version__
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.server.app import build_server
from llm_sandbox_mcp.server.metadata import DESCRIPTION
from tests.support.fakes import FakeBackend

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 2048
# The truth, tool by tool: (read-only, destructive, idempotent, open world). Changing a tool's behaviour
# means changing this table on purpose.
HINTS = {
    "execute_code": (False, True, False, True),
    "get_supported_languages": (True, False, True, False),
    "get_language_details": (True, False, True, False),
    "create_session": (False, False, False, True),
    "close_session": (False, True, True, False),
    "list_sessions": (True, False, True, False),
    "request_network": (False, False, False, True),
    "upload_file": (False, True, True, False),
    "download_file": (False, True, True, False),
    "list_files": (True, False, True, False),
    "get_job": (True, False, True, False),
    "cancel_job": (False, True, True, False),
}


async def test_every_tool_has_a_title_all_four_hints_and_a_short_description() -> None:
    async with Client(build_server(Settings(), FakeBackend())) as client:
        tools = (await client.list_tools()).tools
    assert {tool.name for tool in tools} == set(HINTS)
    for tool in tools:
        annotations = tool.annotations
        assert annotations is not None and tool.title and annotations.title == tool.title, tool.name
        hints = (
            annotations.read_only_hint,
            annotations.destructive_hint,
            annotations.idempotent_hint,
            annotations.open_world_hint,
        )
        assert hints == HINTS[tool.name], tool.name
        assert tool.description and len(tool.description.encode()) < LIMIT, tool.name


async def test_the_server_introduces_itself_with_title_description_icon_and_short_instructions() -> None:
    async with Client(build_server(Settings(), FakeBackend())) as client:
        info = client.server_info
        instructions = client.instructions
    assert info is not None
    assert info.name == "llm-sandbox" and info.version == __version__ and info.title
    assert info.description == DESCRIPTION
    assert instructions and len(instructions.encode()) < LIMIT
    assert info.icons is not None
    shapes = [(icon.mime_type, icon.sizes) for icon in info.icons]
    assert shapes == [("image/svg+xml", ["any"]), ("image/png", ["256x256"])]
    for icon, name in zip(info.icons, ("icon.svg", "icon.png"), strict=True):
        prefix = f"data:{icon.mime_type};base64,"
        assert icon.src.startswith(prefix)
        assert base64.b64decode(icon.src[len(prefix) :]) == files("llm_sandbox_mcp").joinpath(name).read_bytes()
    assert files("llm_sandbox_mcp").joinpath("icon.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_description_is_the_packages() -> None:
    project = tomlkit.parse((ROOT / "pyproject.toml").read_text()).unwrap()["project"]
    assert project["description"] == DESCRIPTION
