"""`install` / `uninstall` into every client's own file format, in a temporary home and project."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import tomlkit

from llm_sandbox_mcp import cli
from llm_sandbox_mcp.commands.install import (
    CLIENTS,
    PASSED_VARIABLES,
    ClientName,
    InstallError,
    Launch,
    Places,
    Scope,
    default_launch,
    install,
    parse_assignments,
    resolve,
    server_environment,
    snippet,
    tool_timeout,
    uninstall,
)

LAUNCH = Launch("/usr/local/bin/uvx", ("llm-sandbox-mcp",), {"DOCKER_HOST": "unix:///d.sock"}, 660)
CASES: list[tuple[ClientName, Scope]] = [(name, scope) for name, client in CLIENTS.items() for scope in client.scopes]


@pytest.fixture
def places(tmp_path: Path) -> Places:
    (tmp_path / "home").mkdir()
    (tmp_path / "project").mkdir()
    return Places(tmp_path / "home", tmp_path / "project", {}, "Linux")


def shell(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The installing shell: `home` as HOME, the engine at DOCKER_HOST, none of the other variables install copies."""
    for name in PASSED_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("DOCKER_HOST", "unix:///d.sock")


def _read(path: Path) -> dict[str, Any]:
    text = path.read_text()
    return tomlkit.parse(text).unwrap() if path.suffix == ".toml" else json.loads(text)


def _entry(client: ClientName, scope: Scope, places: Places, name: str = "llm-sandbox") -> Any:
    _, location = resolve(client, scope, places)
    table: Any = _read(location.path)
    for key in location.keys:
        table = table.get(key, {})  # an emptied TOML super-table is not written at all
    return table.get(name)


@pytest.mark.parametrize(("client", "scope"), CASES)
def test_install_writes_the_entry_the_client_reads_and_uninstall_takes_it_out(
    client: ClientName, scope: Scope, places: Places
) -> None:
    outcome = install(client, LAUNCH, places, scope=scope)
    assert outcome.changed
    entry = _entry(client, scope, places)
    assert entry == CLIENTS[client].render(LAUNCH)
    assert entry["command"] == "/usr/local/bin/uvx" and entry["args"] == ["llm-sandbox-mcp"]
    assert entry["env"] == {"DOCKER_HOST": "unix:///d.sock"}
    assert not install(client, LAUNCH, places, scope=scope).changed  # the same entry again: nothing to do
    assert uninstall(client, places, scope=scope).changed
    assert _entry(client, scope, places) is None
    assert not uninstall(client, places, scope=scope).changed


EXPECTED_PATHS = {
    ("claude-code", "local"): ("home/.claude.json", ("projects", "<project>", "mcpServers")),
    ("claude-code", "user"): ("home/.claude.json", ("mcpServers",)),
    ("claude-code", "project"): ("project/.mcp.json", ("mcpServers",)),
    ("claude-desktop", "user"): ("home/.config/Claude/claude_desktop_config.json", ("mcpServers",)),
    ("codex", "user"): ("home/.codex/config.toml", ("mcp_servers",)),
    ("codex", "project"): ("project/.codex/config.toml", ("mcp_servers",)),
    ("gemini", "user"): ("home/.gemini/settings.json", ("mcpServers",)),
    ("gemini", "project"): ("project/.gemini/settings.json", ("mcpServers",)),
    ("cursor", "user"): ("home/.cursor/mcp.json", ("mcpServers",)),
    ("cursor", "project"): ("project/.cursor/mcp.json", ("mcpServers",)),
    ("vscode", "user"): ("home/.config/Code/User/mcp.json", ("servers",)),
    ("vscode", "project"): ("project/.vscode/mcp.json", ("servers",)),
}


@pytest.mark.parametrize(("client", "scope"), CASES)
def test_each_client_and_scope_has_its_documented_file_and_key(
    client: ClientName, scope: Scope, places: Places, tmp_path: Path
) -> None:
    relative, keys = EXPECTED_PATHS[(client, scope)]
    _, location = resolve(client, scope, places)
    assert location.path == tmp_path / relative
    assert location.keys == tuple(str(places.project.resolve()) if key == "<project>" else key for key in keys)


def test_every_client_and_scope_is_covered() -> None:
    assert set(EXPECTED_PATHS) == set(CASES)


@pytest.mark.parametrize(
    ("system", "environ", "desktop", "vscode"),
    [
        ("Darwin", {}, "home/Library/Application Support/Claude", "home/Library/Application Support/Code/User"),
        ("Windows", {"APPDATA": "<tmp>/roaming"}, "roaming/Claude", "roaming/Code/User"),
        ("Linux", {"XDG_CONFIG_HOME": "<tmp>/xdg"}, "xdg/Claude", "xdg/Code/User"),
    ],
)
def test_desktop_apps_keep_their_files_where_each_system_puts_them(
    system: str, environ: dict[str, str], desktop: str, vscode: str, tmp_path: Path
) -> None:
    environ = {key: value.replace("<tmp>", str(tmp_path)) for key, value in environ.items()}
    places = Places(tmp_path / "home", tmp_path, environ, system)
    assert resolve("claude-desktop", None, places)[1].path == tmp_path / desktop / "claude_desktop_config.json"
    assert resolve("vscode", "user", places)[1].path == tmp_path / vscode / "mcp.json"


def test_config_home_variables_move_claude_code_and_codex_files(tmp_path: Path) -> None:
    environ = {"CLAUDE_CONFIG_DIR": str(tmp_path / "claude"), "CODEX_HOME": str(tmp_path / "codex")}
    places = Places(tmp_path / "home", tmp_path, environ, "Linux")
    assert resolve("claude-code", "user", places)[1].path == tmp_path / "claude" / ".claude.json"
    assert resolve("codex", None, places)[1].path == tmp_path / "codex" / "config.toml"


def test_default_scopes_follow_the_clients_own_add_commands(places: Places) -> None:
    assert resolve("claude-code", None, places)[1].keys[0] == "projects"  # `claude mcp add` is local by default
    assert resolve("codex", None, places)[1].path.parent.name == ".codex"


def test_a_scope_the_client_does_not_have_is_refused(places: Places) -> None:
    with pytest.raises(InstallError, match="Claude Desktop has no project scope"):
        install("claude-desktop", LAUNCH, places, scope="project")


@pytest.mark.parametrize("client", ["claude-code", "gemini", "vscode"])
def test_everything_else_in_a_json_file_is_kept(client: ClientName, places: Places) -> None:
    _, location = resolve(client, "user", places)
    servers_key = location.keys[-1]
    original = {"theme": "dark", servers_key: {"other": {"command": "x", "args": ["y"]}}, "z": [1, 2]}
    location.path.parent.mkdir(parents=True, exist_ok=True)
    location.path.write_text(json.dumps(original))
    install(client, LAUNCH, places, scope="user")
    written = _read(location.path)
    assert written["theme"] == "dark" and written["z"] == [1, 2]
    assert set(written[servers_key]) == {"other", "llm-sandbox"}
    assert list(written) == ["theme", servers_key, "z"]  # key order kept
    uninstall(client, places, scope="user")
    assert _read(location.path) == original


CODEX_CONFIG = """\
# Codex settings, by hand
model = "o3"  # the default model

[mcp_servers.other]
command = "npx"  # keep this comment
args = ["-y", "other"]

[mcp_servers.other.env]
TOKEN = "x"

[profiles.fast]
model = "o4-mini"
"""


def test_codex_toml_keeps_comments_and_other_tables_through_install_and_uninstall(places: Places) -> None:
    path = places.home / ".codex" / "config.toml"
    path.parent.mkdir()
    path.write_text(CODEX_CONFIG)
    install("codex", LAUNCH, places)
    text = path.read_text()
    assert "# keep this comment" in text and "# the default model" in text
    parsed = tomlkit.parse(text).unwrap()
    assert parsed["mcp_servers"]["llm-sandbox"] == {
        "command": "/usr/local/bin/uvx",
        "args": ["llm-sandbox-mcp"],
        "env": {"DOCKER_HOST": "unix:///d.sock"},
        "startup_timeout_sec": 120,
        "tool_timeout_sec": 660,
    }
    assert parsed["mcp_servers"]["other"]["env"] == {"TOKEN": "x"}
    assert parsed["profiles"] == {"fast": {"model": "o4-mini"}}
    uninstall("codex", places)
    assert path.read_text() == CODEX_CONFIG


def test_a_different_entry_of_the_same_name_is_replaced_only_with_force(places: Places) -> None:
    install("cursor", LAUNCH, places)
    changed = Launch("uvx", ("llm-sandbox-mcp",), {"BACKEND": "podman"}, 660)
    with pytest.raises(InstallError, match="different server named 'llm-sandbox'.*--force"):
        install("cursor", changed, places)
    assert _entry("cursor", "user", places)["env"] == {"DOCKER_HOST": "unix:///d.sock"}
    outcome = install("cursor", changed, places, force=True)
    assert "replaced" in outcome.message
    assert _entry("cursor", "user", places)["env"] == {"BACKEND": "podman"}


def test_another_name_lives_beside_ours(places: Places) -> None:
    install("gemini", LAUNCH, places)
    install("gemini", LAUNCH, places, name="sandbox-2")
    uninstall("gemini", places)
    assert _entry("gemini", "user", places, "sandbox-2") is not None
    with pytest.raises(InstallError, match="--name"):
        install("gemini", LAUNCH, places, name="bad name")


def test_dry_run_changes_nothing(places: Places) -> None:
    outcome = install("claude-desktop", LAUNCH, places, dry_run=True)
    assert not outcome.location.path.exists() and not outcome.changed
    install("claude-desktop", LAUNCH, places)
    before = outcome.location.path.read_text()
    assert not uninstall("claude-desktop", places, dry_run=True).changed
    assert outcome.location.path.read_text() == before


def test_dry_run_shows_the_entry_with_the_keys_that_lead_to_it(places: Places) -> None:
    _, location = resolve("codex", None, places)
    entry = CLIENTS["codex"].render(LAUNCH)
    assert snippet(entry, location, "llm-sandbox").startswith("[mcp_servers.llm-sandbox]\n")
    _, location = resolve("vscode", "project", places)
    assert json.loads(snippet({"command": "uvx"}, location, "s")) == {"servers": {"s": {"command": "uvx"}}}


def test_a_file_that_is_not_plain_json_is_left_alone(places: Places) -> None:
    path = places.project / ".vscode" / "mcp.json"
    path.parent.mkdir()
    path.write_text('{\n  // my servers\n  "servers": {}\n}\n')
    with pytest.raises(InstallError, match="not valid plain JSON.*by hand"):
        install("vscode", LAUNCH, places, scope="project")
    assert "// my servers" in path.read_text()


@pytest.mark.skipif(sys.platform == "win32", reason="Windows files have no POSIX mode bits")
def test_new_user_files_are_private_and_existing_files_keep_their_mode(places: Places) -> None:
    install("claude-code", LAUNCH, places, scope="user")
    assert stat.S_IMODE((places.home / ".claude.json").stat().st_mode) == 0o600
    shared = places.project / ".mcp.json"
    shared.write_text("{}")
    shared.chmod(0o640)
    install("claude-code", LAUNCH, places, scope="project")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o640


def test_gemini_gets_variables_it_would_redact_through_env_on_the_command_line() -> None:
    launch = Launch("uvx", ("llm-sandbox-mcp",), {"SSL_CERT_FILE": "/ca.pem", "DOCKER_HOST": "unix:///d"}, 100)
    entry = CLIENTS["gemini"].render(launch)
    assert entry == {
        "command": "env",
        "args": ["SSL_CERT_FILE=/ca.pem", "uvx", "llm-sandbox-mcp"],
        "env": {"DOCKER_HOST": "unix:///d"},
        "timeout": 100_000,
    }
    plain = CLIENTS["gemini"].render(Launch("uvx", ("llm-sandbox-mcp",), {"DOCKER_HOST": "unix:///d"}, 100))
    assert plain["command"] == "uvx"
    windows = CLIENTS["gemini"].render(Launch("uvx", (), {"SSL_CERT_FILE": "/ca.pem"}, 100, posix=False))
    assert windows["command"] == "uvx" and windows["env"] == {"SSL_CERT_FILE": "/ca.pem"}


def test_the_server_gets_the_engine_ca_and_backend_variables_of_this_shell() -> None:
    environ = {"DOCKER_HOST": "unix:///d", "SSL_CERT_FILE": "/ca.pem", "UV_NATIVE_TLS": "1", "HOME": "/root"}
    env = server_environment(environ, "docker", parse_assignments(["SANDBOX_TIMEOUT=60", "UV_NATIVE_TLS="]))
    assert env == {"DOCKER_HOST": "unix:///d", "SSL_CERT_FILE": "/ca.pem", "BACKEND": "docker", "SANDBOX_TIMEOUT": "60"}
    with pytest.raises(InstallError, match="NAME=VALUE"):
        parse_assignments(["NOVALUE"])


def test_tool_timeouts_cover_an_install_and_the_longest_run() -> None:
    assert tool_timeout({}) == 300 + 300 + 60
    assert tool_timeout({"SANDBOX_MAX_TIMEOUT": "100", "SANDBOX_INSTALL_TIMEOUT": "50"}) == 210


def test_shared_files_name_uvx_without_this_machines_path() -> None:
    assert default_launch({}, command=None, portable=True, posix=True).command == "uvx"
    assert default_launch({}, command="/opt/bin/llm-sandbox-mcp", portable=False, posix=True).args == ()


def test_the_command_line_installs_refuses_and_forces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shell(tmp_path, monkeypatch)
    base = ["install", "--client", "codex", "--command", "/opt/llm-sandbox-mcp"]
    assert cli.main([*base, "--dry-run"]) == 0
    assert 'command = "/opt/llm-sandbox-mcp"' in capsys.readouterr().out
    assert not (tmp_path / ".codex").exists()
    assert cli.main([*base, "--backend", "docker"]) == 0
    assert cli.main([*base, "--backend", "podman"]) == 1
    assert "--force" in capsys.readouterr().err
    assert cli.main([*base, "--backend", "podman", "--force"]) == 0
    config = _read(tmp_path / ".codex" / "config.toml")
    assert config["mcp_servers"]["llm-sandbox"]["env"] == {"DOCKER_HOST": "unix:///d.sock", "BACKEND": "podman"}
    assert cli.main(["uninstall", "--client", "codex"]) == 0
    assert "llm-sandbox" not in _read(tmp_path / ".codex" / "config.toml").get("mcp_servers", {})


def test_credentials_of_the_shell_stay_out_of_shared_files_and_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shell(tmp_path, monkeypatch)
    monkeypatch.setenv("HTTPS_PROXY", "http://alice:s3cret@proxy:3128")
    monkeypatch.setenv("UV_INDEX_URL", "https://bob:t0ken@index.example/simple")
    project = tmp_path / "project"
    project.mkdir()
    base = ["install", "--client", "claude-code", "--scope", "project", "--project", str(project)]
    assert cli.main(base) == 0
    shared = (project / ".mcp.json").read_text()
    assert "s3cret" not in shared and "t0ken" not in shared and "unix:///d.sock" in shared
    err = capsys.readouterr().err
    assert "HTTPS_PROXY, UV_INDEX_URL" in err and "credentials" in err
    # Given explicitly, a credential is written, and the install says it is now in a shared file.
    assert cli.main([*base, "--force", "--env", "API_TOKEN=xyz"]) == 0
    assert '"API_TOKEN": "xyz"' in (project / ".mcp.json").read_text()
    assert "API_TOKEN carry credentials" in capsys.readouterr().err
    # The user's own file gets them, private.
    assert cli.main(["install", "--client", "claude-code", "--scope", "user"]) == 0
    assert "s3cret" in (tmp_path / ".claude.json").read_text()
    assert "note:" not in capsys.readouterr().err


@pytest.mark.skipif(sys.platform == "win32", reason="Windows files have no POSIX mode bits")
def test_a_credential_written_to_a_file_others_can_read_is_said(places: Places) -> None:
    path = places.home / ".claude.json"
    path.write_text("{}")
    path.chmod(0o644)
    launch = Launch("uvx", ("llm-sandbox-mcp",), {"HTTP_PROXY": "http://u:pw@proxy:8080"}, 660)
    outcome = install("claude-code", launch, places, scope="user")
    assert "readable by other users" in outcome.message and "HTTP_PROXY" in outcome.message
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges on Windows")
def test_a_linked_configuration_file_is_written_where_it_points_and_stays_a_link(places: Places) -> None:
    target = places.home / "dotfiles" / "mcp.json"
    target.parent.mkdir()
    target.write_text('{"mcpServers": {"other": {"command": "x"}}}')
    target.chmod(0o640)
    link = places.project / ".mcp.json"
    link.symlink_to(target)
    install("claude-code", LAUNCH, places, scope="project")
    assert link.is_symlink() and link.resolve() == target
    written = json.loads(target.read_text())["mcpServers"]
    assert set(written) == {"other", "llm-sandbox"}
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    uninstall("claude-code", places, scope="project")
    assert link.is_symlink() and set(json.loads(target.read_text())["mcpServers"]) == {"other"}
