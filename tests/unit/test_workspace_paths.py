"""A session file path that leaves the workspace is refused before anything reaches the engine.

This is string validation (`safe_relative`), the same whatever the engine: it was run on every engine in the engine
tier, a session each; here the fake backend also proves no command ran at all.
"""

from __future__ import annotations

import pytest

from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import FileTransferError
from llm_sandbox_mcp.models import Limits, SandboxRef, SandboxSpec
from llm_sandbox_mcp.run.files import Files
from tests.support.fakes import FakeBackend

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("path", ["../etc/passwd", "/etc/passwd", "a/../../etc/passwd", "", "."])
async def test_paths_that_leave_the_workspace_are_refused_and_nothing_runs(path: str) -> None:
    backend = FakeBackend()
    files = Files(Settings(), backend)
    ref = SandboxRef("fake-1", SandboxSpec("python:3.12-slim", Limits()))
    with pytest.raises(FileTransferError):
        await files.upload(ref, path, b"x")
    with pytest.raises(FileTransferError):
        await files.download(ref, path)
    assert backend.calls == []
