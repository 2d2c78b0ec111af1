"""The macOS and Windows workflow parses, runs on both systems with the oldest and newest Python, runs only files
that exist, and says that it has not run on the project's own machines."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import yaml

WORKFLOW = Path(__file__).parents[2] / ".github" / "workflows" / "platforms.yml"


def test_the_platforms_workflow_covers_macos_and_windows_with_what_exists() -> None:
    text = WORKFLOW.read_text(encoding="utf-8")
    workflow = cast(dict[str, Any], yaml.safe_load(text))
    job = workflow["jobs"]["server"]
    assert job["strategy"]["matrix"] == {"os": ["macos-latest", "windows-latest"], "python": ["3.10", "3.13"]}
    runs = "\n".join(str(step.get("run", "")) for step in job["steps"])
    for path in re.findall(r"tests/[\w/]+(?:\.py)?", runs):
        assert (WORKFLOW.parents[2] / path).exists(), path
    assert "llm-sandbox-mcp install --client" in runs and "--dry-run" in runs
    assert "NOT been run on the project's" in text.split("name:")[0]
