"""`install` / `uninstall`: write our server entry into an MCP client's own configuration file, or take it out.

Every client keeps its servers in its own file, format and key (`CLIENTS` below). An install writes one entry
that starts `uvx llm-sandbox-mcp` with the variables the server needs on this machine (the engine socket, the
CA bundle and proxy `uvx` needs to reach the package index, `BACKEND`), passed the way that client passes
them, and leaves the rest of the file as it was. Clients start servers with a minimal environment, so the
values are written out, not referenced.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, cast, get_args

import tomlkit
from tomlkit.exceptions import TOMLKitError

from llm_sandbox_mcp.config import Settings

ClientName = Literal["claude-code", "claude-desktop", "codex", "gemini", "cursor", "vscode"]
Scope = Literal["user", "project", "local"]
SERVER_NAME = "llm-sandbox"
PACKAGE = "llm-sandbox-mcp"

# Variables copied from the installing shell when set: the engine, then what `uvx` needs to reach the index.
PASSED_VARIABLES = (
    "BACKEND",
    "DOCKER_HOST",
    "PODMAN_HOST",
    "CONTAINER_HOST",
    "KUBECONFIG",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "UV_NATIVE_TLS",
    "UV_DEFAULT_INDEX",
    "UV_INDEX_URL",
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
)
# Gemini CLI removes inherited variables whose name contains one of these (0.61 keeps them in an entry's own
# `env` block, some earlier versions did not): such values go on the command line of `env` instead.
GEMINI_REDACTED = ("KEY", "TOKEN", "SECRET", "PASSWORD", "AUTH", "CREDENTIAL", "PRIVATE", "CERT")
# A variable whose name says it holds a secret, or whose value is a URL with a password in it (a proxy's or an
# index's), carries a credential: it is never copied from the shell into a shared file.
CREDENTIAL_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL", "PRIVATE")
_URL_PASSWORD = re.compile(r"://[^/@\s:]*:[^/@\s]+@")
STARTUP_TIMEOUT_S = 120  # the first `uvx` run downloads the package and its dependencies
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class InstallError(Exception):
    """An install or uninstall that cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class Launch:
    """How the client starts the server: the command line, its environment and how long to wait for it."""

    command: str
    args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=lambda: {})
    tool_timeout_s: int = 660
    posix: bool = True


@dataclass(frozen=True)
class Places:
    """Where configuration files live: the user's home, the project, the environment and the operating system."""

    home: Path
    project: Path
    environ: Mapping[str, str]
    system: str  # platform.system(): Linux, Darwin, Windows


@dataclass(frozen=True)
class Location:
    """One configuration file and the keys that lead to its table of servers."""

    path: Path
    keys: tuple[str, ...]
    shared: bool = False  # a project file others use too: portable entry; a new file is world-readable

    @property
    def toml(self) -> bool:
        return self.path.suffix == ".toml"


@dataclass(frozen=True)
class Client:
    title: str
    scopes: tuple[Scope, ...]  # the first is the default
    locate: Callable[[Scope, Places], Location]
    render: Callable[[Launch], dict[str, Any]]


# Entries, one shape per client.


def _typed_entry(launch: Launch) -> dict[str, Any]:
    return {"type": "stdio", **_plain_entry(launch)}


def _plain_entry(launch: Launch) -> dict[str, Any]:
    entry: dict[str, Any] = {"command": launch.command, "args": list(launch.args)}
    if launch.env:
        entry["env"] = dict(launch.env)
    return entry


def _codex_entry(launch: Launch) -> dict[str, Any]:
    return {**_plain_entry(launch), "startup_timeout_sec": STARTUP_TIMEOUT_S, "tool_timeout_sec": launch.tool_timeout_s}


def _gemini_entry(launch: Launch) -> dict[str, Any]:
    """Variables Gemini CLI would redact go on the command line of `env`, which sets them for the server."""
    hidden = {name: value for name, value in launch.env.items() if gemini_redacts(name)}
    if hidden and launch.posix:
        kept = {name: value for name, value in launch.env.items() if name not in hidden}
        assignments = tuple(f"{name}={value}" for name, value in hidden.items())
        launch = replace(launch, command="env", args=(*assignments, launch.command, *launch.args), env=kept)
    return {**_plain_entry(launch), "timeout": launch.tool_timeout_s * 1000}


def gemini_redacts(name: str) -> bool:
    return any(word in name.upper() for word in GEMINI_REDACTED)


# Locations, one function per client.


def _app_data(places: Places) -> Path:
    """The per-user application folder of desktop apps: XDG on Linux, Application Support, %APPDATA%."""
    if places.system == "Darwin":
        return places.home / "Library" / "Application Support"
    if places.system == "Windows":
        return Path(places.environ.get("APPDATA", places.home / "AppData" / "Roaming"))
    return Path(places.environ.get("XDG_CONFIG_HOME") or places.home / ".config")


def _claude_code(scope: Scope, places: Places) -> Location:
    if scope == "project":
        return Location(places.project / ".mcp.json", ("mcpServers",), shared=True)
    config_dir = places.environ.get("CLAUDE_CONFIG_DIR")
    path = Path(config_dir) / ".claude.json" if config_dir else places.home / ".claude.json"
    if scope == "local":  # Claude Code keys local servers by the project's real path
        return Location(path, ("projects", str(places.project.resolve()), "mcpServers"))
    return Location(path, ("mcpServers",))


def _claude_desktop(scope: Scope, places: Places) -> Location:
    return Location(_app_data(places) / "Claude" / "claude_desktop_config.json", ("mcpServers",))


def _codex(scope: Scope, places: Places) -> Location:
    if scope == "project":  # read only when the user trusts the project
        return Location(places.project / ".codex" / "config.toml", ("mcp_servers",), shared=True)
    codex_home = places.environ.get("CODEX_HOME")
    return Location((Path(codex_home) if codex_home else places.home / ".codex") / "config.toml", ("mcp_servers",))


def _gemini(scope: Scope, places: Places) -> Location:
    if scope == "project":
        return Location(places.project / ".gemini" / "settings.json", ("mcpServers",), shared=True)
    return Location(places.home / ".gemini" / "settings.json", ("mcpServers",))


def _cursor(scope: Scope, places: Places) -> Location:
    if scope == "project":
        return Location(places.project / ".cursor" / "mcp.json", ("mcpServers",), shared=True)
    return Location(places.home / ".cursor" / "mcp.json", ("mcpServers",))


def _vscode(scope: Scope, places: Places) -> Location:
    if scope == "project":
        return Location(places.project / ".vscode" / "mcp.json", ("servers",), shared=True)
    return Location(_app_data(places) / "Code" / "User" / "mcp.json", ("servers",))  # the user profile's mcp.json


CLIENTS: dict[ClientName, Client] = {
    "claude-code": Client("Claude Code", ("local", "user", "project"), _claude_code, _typed_entry),
    "claude-desktop": Client("Claude Desktop", ("user",), _claude_desktop, _plain_entry),
    "codex": Client("Codex", ("user", "project"), _codex, _codex_entry),
    "gemini": Client("Gemini CLI", ("user", "project"), _gemini, _gemini_entry),
    "cursor": Client("Cursor", ("user", "project"), _cursor, _typed_entry),
    "vscode": Client("VS Code", ("user", "project"), _vscode, _typed_entry),
}
assert set(CLIENTS) == set(get_args(ClientName))


# What the entry runs.


def parse_assignments(items: Sequence[str]) -> dict[str, str]:
    """`--env K=V` options; an empty value leaves K out of the entry (even when found in the environment)."""
    pairs: dict[str, str] = {}
    for item in items:
        name, equals, value = item.partition("=")
        if not equals or not _VARIABLE.match(name):
            raise InstallError(f"--env {item!r}: expected NAME=VALUE, e.g. --env DOCKER_HOST=unix:///run/docker.sock")
        pairs[name] = value
    return pairs


def server_environment(environ: Mapping[str, str], backend: str | None, extra: Mapping[str, str]) -> dict[str, str]:
    env = {name: environ[name] for name in PASSED_VARIABLES if environ.get(name)}
    if backend:
        env["BACKEND"] = backend
    env.update(extra)
    return {name: value for name, value in env.items() if value}


def carries_credential(name: str, value: str) -> bool:
    return any(word in name.upper() for word in CREDENTIAL_WORDS) or _URL_PASSWORD.search(value) is not None


def held_back(env: Mapping[str, str], explicit: Mapping[str, str], location: Location) -> list[str]:
    """The variables copied from the shell that carry a credential, when the file is shared (a project file
    meant to be committed): they are left out; one given with --env is written, and the install says so."""
    if not location.shared:
        return []
    return sorted(name for name, value in env.items() if name not in explicit and carries_credential(name, value))


def _credential_notes(location: Location, env: Mapping[str, str]) -> str:
    """What the written entry exposes: a credential in a shared file, or in a file other users can read."""
    names = sorted(name for name, value in env.items() if carries_credential(name, value))
    if not names:
        return ""
    if location.shared:
        return f"; note: {', '.join(names)} carry credentials and are now in {location.path}: do not commit it"
    target = location.path.resolve()
    if sys.platform != "win32" and target.exists() and target.stat().st_mode & 0o077:
        mode = oct(target.stat().st_mode & 0o777)
        return f"; note: {target} (mode {mode}) is readable by other users and now holds {', '.join(names)}"
    return ""


def tool_timeout(env: Mapping[str, str]) -> int:
    """Long enough for the longest call the server allows: a library install, then the longest run."""

    def seconds(name: str) -> float:
        default = Settings.model_fields[name.lower()].default
        try:
            return float(env.get(name, default))
        except ValueError:
            return float(default)

    return int(seconds("SANDBOX_MAX_TIMEOUT") + seconds("SANDBOX_INSTALL_TIMEOUT")) + 60


def default_launch(env: Mapping[str, str], *, command: str | None, portable: bool, posix: bool) -> Launch:
    """`uvx llm-sandbox-mcp`, with uvx's full path unless the file is shared (clients' PATH is often minimal).

    `command` replaces it with an installed console script (e.g. from `uv tool install llm-sandbox-mcp`).
    """
    if command is not None:
        program, args = command, ()
    else:
        found = None if portable else shutil.which("uvx")
        program, args = found or "uvx", (PACKAGE,)
    return Launch(program, args, dict(env), tool_timeout(env), posix)


# Reading and writing configuration files.


Table = MutableMapping[str, Any]  # a JSON object, or a tomlkit document or table


def _load(location: Location) -> Table:
    if not location.path.exists():
        return tomlkit.document() if location.toml else {}
    text = location.path.read_text(encoding="utf-8")
    try:
        document: Any = tomlkit.parse(text) if location.toml else json.loads(text or "{}")
    except (json.JSONDecodeError, TOMLKitError) as exc:
        kind = "TOML" if location.toml else "plain JSON (comments or trailing commas are not supported here)"
        problem = f"{location.path} is not valid {kind}: {exc}."
        raise InstallError(f"{problem} Add the entry by hand (see --dry-run).") from exc
    if not isinstance(document, dict):
        raise InstallError(f"{location.path} does not hold an object at the top level; add the entry by hand.")
    return cast("Table", document)


def _servers(document: Table, location: Location, *, create: bool) -> Table | None:
    """The table of servers inside `document`, created on the way when `create`; None when absent."""
    table = document
    for key in location.keys:
        inner: object = table.get(key)
        if inner is None:
            if not create:
                return None
            inner = tomlkit.table(is_super_table=True) if location.toml else {}
            table[key] = inner
        if not isinstance(inner, MutableMapping):
            raise InstallError(f"{location.path}: {'.'.join(location.keys)} is not a table; fix the file by hand.")
        table = cast("Table", inner)
    return table


def _ensure_servers(document: Table, location: Location) -> Table:
    servers = _servers(document, location, create=True)
    assert servers is not None
    return servers


def _plain(value: Any) -> Any:
    return value.unwrap() if hasattr(value, "unwrap") else value


def _toml_entry(entry: Mapping[str, Any]) -> Any:
    table = tomlkit.table()
    for key, value in entry.items():
        if isinstance(value, dict):
            inline = tomlkit.inline_table()
            for inner_key, inner_value in cast("dict[str, Any]", value).items():
                inline[inner_key] = inner_value
            table[key] = inline
        else:
            table[key] = value
    table.add(tomlkit.nl())
    return table


def _dump(document: Any, location: Location) -> str:
    if location.toml:
        return tomlkit.dumps(document)
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _write(location: Location, text: str) -> None:
    """Replace the file atomically, keeping its permissions (a new user file is readable by its owner only) and
    its links: a linked file is replaced where the link points, and the link stays."""
    path = location.path.resolve() if location.path.is_symlink() else location.path
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else (0o644 if location.shared else 0o600)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def snippet(entry: Mapping[str, Any], location: Location, name: str) -> str:
    """The entry as it appears in the file, with the keys that lead to it."""
    if location.toml:
        document = tomlkit.document()
        servers = _ensure_servers(document, location)
        servers[name] = _toml_entry(entry)
        return tomlkit.dumps(document)
    nested: Any = {name: dict(entry)}
    for key in reversed(location.keys):
        nested = {key: nested}
    return json.dumps(nested, indent=2, ensure_ascii=False) + "\n"


# The two operations.


@dataclass(frozen=True)
class Outcome:
    location: Location
    entry: dict[str, Any]
    changed: bool
    message: str


def resolve(client: ClientName, scope: Scope | None, places: Places) -> tuple[Client, Location]:
    spec = CLIENTS[client]
    chosen = scope or spec.scopes[0]
    if chosen not in spec.scopes:
        raise InstallError(f"{spec.title} has no {chosen} scope; choose one of: {', '.join(spec.scopes)}")
    return spec, spec.locate(chosen, places)


def install(
    client: ClientName, launch: Launch, places: Places, *, scope: Scope | None = None,
    name: str = SERVER_NAME, force: bool = False, dry_run: bool = False,
) -> Outcome:  # fmt: skip
    if not _NAME.match(name):
        raise InstallError(f"--name {name!r}: use letters, digits, '-' and '_' only")
    spec, location = resolve(client, scope, places)
    entry = spec.render(launch)
    document = _load(location)
    existing = _servers(document, location, create=False)
    current = None if existing is None else _plain(existing.get(name))
    if current == entry:
        return Outcome(location, entry, False, f"{name} is already installed in {location.path}; nothing to do")
    if current is not None and not force:
        raise InstallError(
            f"{location.path} already has a different server named {name!r}; "
            f"rerun with --force to replace it, or choose another --name"
        )
    if not dry_run:
        servers = _ensure_servers(document, location)
        servers[name] = _toml_entry(entry) if location.toml else entry
        _write(location, _dump(document, location))
    verb = "would be " if dry_run else ""
    action = "replaced" if current is not None else "added"
    message = f"{name} {verb}{action} in {location.path} ({spec.title})"
    if not dry_run:
        message += f"; restart {spec.title} to load it"
    message += _credential_notes(location, launch.env)
    return Outcome(location, entry, not dry_run, message)


def uninstall(
    client: ClientName, places: Places, *, scope: Scope | None = None, name: str = SERVER_NAME, dry_run: bool = False
) -> Outcome:
    spec, location = resolve(client, scope, places)
    document = _load(location)
    servers = _servers(document, location, create=False)
    if servers is None or name not in servers:
        return Outcome(location, {}, False, f"{name} is not in {location.path}; nothing to do")
    entry: dict[str, Any] = _plain(servers[name])
    if dry_run:
        return Outcome(location, entry, False, f"{name} would be removed from {location.path}")
    del servers[name]
    _write(location, _dump(document, location))
    return Outcome(location, entry, True, f"{name} removed from {location.path} ({spec.title})")


def current_places(project: Path | None = None) -> Places:
    return Places(Path.home(), project or Path.cwd(), dict(os.environ), platform.system())


def main(args: argparse.Namespace) -> int:
    """The `install` and `uninstall` subcommands (arguments from cli.py's parser)."""
    places = current_places(Path(args.project) if args.project else None)
    try:
        if args.command == "uninstall":
            outcome = uninstall(args.client, places, scope=args.scope, name=args.name, dry_run=args.dry_run)
        else:
            explicit = parse_assignments(args.env)
            env = server_environment(places.environ, args.backend, explicit)
            _, location = resolve(args.client, args.scope, places)
            left_out = held_back(env, explicit, location)
            if left_out:
                sys.stderr.write(
                    f"llm-sandbox-mcp: left out of the shared file {location.path}, as they carry credentials: "
                    f"{', '.join(left_out)} (install in the user scope, or pass them with --env to write them)\n"
                )
                env = {name: value for name, value in env.items() if name not in left_out}
            launch = default_launch(
                env, command=args.command_path, portable=location.shared, posix=places.system != "Windows"
            )
            outcome = install(
                args.client, launch, places, scope=args.scope, name=args.name, force=args.force, dry_run=args.dry_run
            )
    except (InstallError, OSError) as exc:
        sys.stderr.write(f"llm-sandbox-mcp: {exc}\n")
        return 1
    if args.dry_run and outcome.entry:
        sys.stdout.write(snippet(outcome.entry, outcome.location, args.name))
    sys.stderr.write(outcome.message + "\n")
    return 0
