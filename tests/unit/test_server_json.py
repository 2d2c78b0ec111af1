"""server.json: generated from the package, and within the MCP registry's rules for its `$schema` version.

No package on PyPI or npm ships the registry's schema, and tests must not reach the network, so the rules
below are transcribed by hand from the public `modelcontextprotocol/registry` repository:
`internal/validators/schemas/2025-12-11.json` (the schema published at the `$schema` URL: required fields,
patterns, lengths, enums, and the properties each object may have) and `internal/validators/validators.go`
and `registries/pypi.go` (the publisher's semantic checks: no version ranges or `latest`, no spaces in the
identifier, no `url` on stdio, and `mcp-name: NAME` in the package README for PyPI ownership).
When `$schema` moves to a newer version, re-read those files and update this test with it.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import tomlkit

from llm_sandbox_mcp import __version__
from llm_sandbox_mcp.config import Settings, env_name

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"
SERVER_KEYS = {
    "$schema", "_meta", "description", "icons", "name", "packages", "remotes", "repository", "title", "version",
    "websiteUrl",
}  # fmt: skip
PACKAGE_KEYS = {
    "environmentVariables", "fileSha256", "identifier", "packageArguments", "registryBaseUrl", "registryType",
    "runtimeArguments", "runtimeHint", "transport", "version",
}  # fmt: skip
INPUT_KEYS = {"choices", "default", "description", "format", "isRequired", "isSecret", "placeholder", "value"}
FORMATS = {"string", "number", "boolean", "filepath"}
RANGE = re.compile(r"^\s*(\^|~|>=|<=|>|<|=)|\|\||\s-\s|(^|\.)[xX*](\.|$)")


def _manifest() -> dict[str, Any]:
    return json.loads((ROOT / "server.json").read_text(encoding="utf-8"))


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("server_json", ROOT / "scripts" / "server_json.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _specific_version(version: object) -> bool:
    return isinstance(version, str) and 0 < len(version) <= 255 and version != "latest" and not RANGE.search(version)


def test_server_json_is_what_the_generator_writes() -> None:
    assert (ROOT / "server.json").read_text(encoding="utf-8") == _generator().render(), (
        "server.json is stale: run python scripts/server_json.py"
    )


def test_description_and_version_are_the_packages() -> None:
    project = tomlkit.parse((ROOT / "pyproject.toml").read_text()).unwrap()["project"]
    manifest = _manifest()
    assert manifest["description"] == project["description"]
    assert manifest["version"] == __version__
    assert [package["version"] for package in manifest["packages"]] == [__version__]


def test_the_server_object_follows_the_registry_schema() -> None:
    manifest = _manifest()
    assert manifest["$schema"] == SCHEMA
    assert set(manifest) <= SERVER_KEYS
    assert {"name", "description", "version"} <= set(manifest)
    name = manifest["name"]
    assert 3 <= len(name) <= 200 and re.fullmatch(r"[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+", name)
    assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9.-]*[a-zA-Z0-9]/[a-zA-Z0-9][a-zA-Z0-9._-]*[a-zA-Z0-9]", name)
    assert 1 <= len(manifest["description"]) <= 100
    assert _specific_version(manifest["version"])
    title = manifest.get("title")
    assert title is None or (1 <= len(title) <= 100 and title.strip())
    assert "registryBaseUrl" not in json.dumps(manifest)  # optional; registries' hosts stay out of the repository


def test_the_package_follows_the_registry_schema() -> None:
    (package,) = _manifest()["packages"]
    assert set(package) <= PACKAGE_KEYS
    assert {"registryType", "identifier", "transport"} <= set(package)
    assert package["registryType"] == "pypi" and package["identifier"] == "llm-sandbox-mcp"
    assert " " not in package["identifier"] and _specific_version(package["version"])
    assert package["transport"] == {"type": "stdio"}  # stdio: a type, and no url


def test_every_environment_variable_is_a_valid_input_named_after_a_setting() -> None:
    (package,) = _manifest()["packages"]
    names = {env_name(field) for field in Settings.model_fields} | {"SANDBOX_MEMORY"}
    seen: set[str] = set()
    for variable in package["environmentVariables"]:
        assert set(variable) <= INPUT_KEYS | {"name", "variables"}, variable
        assert isinstance(variable["name"], str) and variable["name"] in names
        assert variable["format"] in FORMATS and isinstance(variable["isRequired"], bool)
        assert all(isinstance(variable.get(key, ""), str) for key in ("description", "default"))
        choices = variable.get("choices", [])
        assert all(isinstance(choice, str) for choice in choices)
        assert not choices or variable.get("default", choices[0]) in choices
        seen.add(variable["name"])
    assert seen == names


def test_formats_follow_the_settings_types() -> None:
    variables = {item["name"]: item for item in _manifest()["packages"][0]["environmentVariables"]}
    assert variables["SANDBOX_READ_ONLY"]["format"] == "boolean"
    assert variables["SANDBOX_TIMEOUT"]["format"] == "number"
    assert variables["SANDBOX_MEM_LIMIT"]["format"] == "string"  # sizes take 512m
    assert variables["KUBECONFIG"]["format"] == "filepath"
    assert variables["BACKEND"]["choices"] == ["auto", "docker", "podman", "kubernetes", "bubblewrap", "nsjail"]


def test_the_readme_names_the_server_for_the_pypi_ownership_check() -> None:
    assert f"mcp-name: {_manifest()['name']}" in (ROOT / "README.md").read_text(encoding="utf-8")
