"""Generate server.json (the MCP registry's description of this package) from the package itself.

    python scripts/server_json.py           # rewrite server.json
    python scripts/server_json.py --check   # exit 1 when server.json is out of date

Description and version come from pyproject.toml and llm_sandbox_mcp/__init__.py; every environment variable
comes from Settings (its format, and its choices when it has a fixed set) and from the table in
docs/configuration.md (its meaning and its default as people write it, `512m` rather than bytes).
tests/unit/test_server_json.py fails when server.json is stale or breaks the registry's rules.
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

import tomlkit
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llm_sandbox_mcp import __version__  # noqa: E402
from llm_sandbox_mcp.config import Settings, env_name, parse_size, parse_size_or_zero  # noqa: E402
from llm_sandbox_mcp.server.metadata import TITLE  # noqa: E402

SCHEMA = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"
NAME = "io.github.llm-sandbox-mcp/llm-sandbox-mcp"
PACKAGE = "llm-sandbox-mcp"
CONFIGURATION = ROOT / "docs" / "configuration.md"
ALIASES = {"SANDBOX_MEMORY": "sandbox_mem_limit"}  # synonyms documented in their own row
_ROW = re.compile(r"^\| `([A-Z0-9_]+)` \| (.*?) \| (.*) \|$", flags=re.MULTILINE)


def variable_format(field: FieldInfo) -> tuple[str, list[str] | None]:
    """The registry's input format (string, number, boolean, filepath) and the allowed values, if fixed."""
    kind: Any = field.annotation
    if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
    if typing.get_origin(kind) is typing.Literal:
        return "string", [str(choice) for choice in typing.get_args(kind)]
    if typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    parsed_as_size = any(getattr(item, "func", None) in (parse_size, parse_size_or_zero) for item in field.metadata)
    if kind is bool:
        return "boolean", None
    if kind in (int, float) and not parsed_as_size:
        return "number", None
    if kind is Path:
        return "filepath", None
    return "string", None


def environment_variables(readme: str) -> list[dict[str, Any]]:
    fields = {env_name(name): field for name, field in Settings.model_fields.items()}
    variables: list[dict[str, Any]] = []
    for name, default, meaning in _ROW.findall(readme):
        kind, choices = variable_format(fields.get(name) or Settings.model_fields[ALIASES[name]])
        item: dict[str, Any] = {"name": name, "description": meaning.replace("`", ""), "isRequired": False}
        item["format"] = kind
        if choices:
            item["choices"] = choices
        value = default.strip("`")
        if value not in ("unset", "—"):
            item["default"] = value
        variables.append(item)
    return variables


def build() -> dict[str, Any]:
    project = tomlkit.parse((ROOT / "pyproject.toml").read_text(encoding="utf-8")).unwrap()["project"]
    return {
        "$schema": SCHEMA,
        "name": NAME,
        "title": TITLE,
        "description": project["description"],
        "version": __version__,
        "packages": [
            {
                "registryType": "pypi",
                "identifier": PACKAGE,
                "version": __version__,
                "runtimeHint": "uvx",
                "transport": {"type": "stdio"},
                "environmentVariables": environment_variables(CONFIGURATION.read_text(encoding="utf-8")),
            }
        ],
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    path = ROOT / "server.json"
    if argv[1:] == ["--check"]:
        if path.read_text(encoding="utf-8") != render():
            sys.stderr.write("server.json is out of date: run python scripts/server_json.py\n")
            return 1
        return 0
    path.write_text(render(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
