"""Where the container engines users have listen, by platform: the addresses to try, in order, each with where
we heard of it (so `doctor` and a refusal can say). Reading files only; connecting is the engines' business.

Docker, after DOCKER_HOST and the current Docker context (`_docker_discovery`): Docker Desktop's socket on macOS,
/var/run/docker.sock, rootless Docker and Docker Desktop for Linux, Colima's profiles, OrbStack, Rancher Desktop;
on Windows Docker Desktop's named pipes. Podman, after PODMAN_HOST and CONTAINER_HOST: the connections Podman
itself keeps (Podman 5's podman-connections.json, containers.conf's service destinations), a Podman machine's
API socket on this host, then the rootful and rootless sockets (`_podman.service`).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote, urlparse

import tomlkit
import tomlkit.exceptions

# Connections the Docker client keeps: as many as worker threads may call it at once (anyio's default limit),
# not the SDK's 10, which under load drops a connection after each call over it ("Connection pool is full").
# Podman's client keeps its 10: a run with 40 met an unexplained empty answer from Podman 4.3 once, not yet
# tied to the pool or ruled out.
ENGINE_CONNECTIONS = 40


@dataclass(frozen=True)
class Candidate:
    """An address that may be the engine, and where we heard of it."""

    url: str
    source: str
    explicit: bool = False
    """Named by the user: used or reported, never skipped."""
    tls: object | None = None
    """A Docker context's TLS settings (docker.tls.TLSConfig), when it has any."""


def shown(path: Path, home: Path) -> str:
    """`path` with the home directory as ~, as a user would write it."""
    try:
        return "~/" + path.relative_to(home).as_posix()
    except ValueError:
        return str(path)


def docker_sockets(home: Path, environ: Mapping[str, str], platform: str) -> list[Candidate]:
    """The sockets and pipes Docker's distributions listen on, in the order to try them."""
    if platform == "win32":
        return [
            Candidate("npipe:////./pipe/docker_engine", "Docker Desktop's named pipe"),
            Candidate("npipe:////./pipe/dockerDesktopLinuxEngine", "Docker Desktop's Linux engine pipe"),
        ]
    places: list[tuple[Path, str]] = [
        (home / ".docker" / "run" / "docker.sock", "Docker Desktop socket"),
        (Path("/var/run/docker.sock"), "the default socket"),
    ]
    if platform == "linux":
        if environ.get("XDG_RUNTIME_DIR"):
            places.append((Path(environ["XDG_RUNTIME_DIR"]) / "docker.sock", "rootless Docker socket"))
        places.append((home / ".docker" / "desktop" / "docker.sock", "Docker Desktop for Linux socket"))
    places += [(path, "Colima socket") for path in _colima_sockets(home, environ)]
    places += [
        (home / ".orbstack" / "run" / "docker.sock", "OrbStack socket"),
        (home / ".rd" / "docker.sock", "Rancher Desktop socket"),
    ]
    return [Candidate(f"unix://{path.as_posix()}", f"{source} {shown(path, home)}") for path, source in places]


def _colima_sockets(home: Path, environ: Mapping[str, str]) -> list[Path]:
    """Each Colima profile's socket, the default profile's first ($COLIMA_HOME, ~/.colima, ~/.config/colima)."""
    roots = [Path(environ["COLIMA_HOME"])] if environ.get("COLIMA_HOME") else []
    roots += [home / ".colima", home / ".config" / "colima"]
    found: list[Path] = []
    for root in roots:
        default = root / "default" / "docker.sock"
        others = sorted(path for path in root.glob("*/docker.sock") if path != default) if root.is_dir() else []
        for path in [default, *others]:
            if path not in found:
                found.append(path)
    return found


def podman_connections(home: Path, environ: Mapping[str, str], platform: str) -> list[Candidate]:
    """The services Podman's own configuration names (its default first), with a Podman machine's API socket on
    this host in place of its ssh:// address, which this server cannot use."""
    config = Path(environ.get("XDG_CONFIG_HOME") or home / ".config") / "containers"
    named: list[tuple[str, str, bool, str]] = []  # name, uri, is a machine, where it was read
    default: str | None = None
    connections = config / "podman-connections.json"
    document = _json(connections)
    if document is not None:
        section = cast(dict[str, Any], document.get("Connection") or {})
        default = str(section.get("Default") or "") or None
        for name, entry in cast(dict[str, Any], section.get("Connections") or {}).items():
            if isinstance(entry, dict):
                fields = cast(dict[str, Any], entry)
                where = shown(connections, home)
                named.append((str(name), str(fields.get("URI", "")), bool(fields.get("IsMachine")), where))
    conf = config / "containers.conf"
    engine = _toml(conf).get("engine")
    if isinstance(engine, dict):
        engine = cast(dict[str, Any], engine)
        default = default or str(engine.get("active_service") or "") or None
        for name, entry in cast(dict[str, Any], engine.get("service_destinations") or {}).items():
            if isinstance(entry, dict) and all(name != known for known, *_ in named):
                fields = cast(dict[str, Any], entry)
                where = shown(conf, home) + " [engine.service_destinations]"
                named.append((str(name), str(fields.get("uri", "")), bool(fields.get("is_machine")), where))
    named.sort(key=lambda item: item[0] != default)
    found: list[Candidate] = []
    for name, uri, machine, where in named:
        source = f"Podman connection {name!r} ({where})"
        if machine or (urlparse(uri).scheme == "ssh" and name.startswith("podman-machine")):
            found += machine_sockets(_machine_name(name), home, environ, platform, source)
        elif uri:
            found.append(Candidate(uri, source))
    if not found and platform != "linux":
        found = machine_sockets("podman-machine-default", home, environ, platform, "the default Podman machine")
    unique: dict[str, Candidate] = {}
    for candidate in found:
        unique.setdefault(candidate.url, candidate)
    return list(unique.values())


def _machine_name(connection: str) -> str:
    """The machine behind a connection: Podman names a machine's rootful connection `<machine>-root`."""
    return connection.removesuffix("-root")


def machine_sockets(
    machine: str, home: Path, environ: Mapping[str, str], platform: str, source: str
) -> list[Candidate]:
    """Where a Podman machine forwards its API socket to this host: Podman 5 under $TMPDIR/podman (macOS's
    per-user temporary directory), Podman 4 under ~/.local/share/containers/podman/machine."""
    if platform == "win32":
        return []  # a named pipe, which the podman SDK cannot open
    data = Path(environ.get("XDG_DATA_HOME") or home / ".local" / "share") / "containers" / "podman" / "machine"
    temporary = Path(environ.get("TMPDIR") or "/tmp") / "podman"
    places = [
        temporary / f"{machine}-api.sock",
        data / machine / "podman.sock",
        data / "podman.sock",
    ]
    if platform == "linux" and environ.get("XDG_RUNTIME_DIR"):
        places.insert(0, Path(environ["XDG_RUNTIME_DIR"]) / "podman" / f"{machine}-api.sock")
    return [
        Candidate(f"unix://{path.as_posix()}", f"{source}: machine {machine!r} API socket {shown(path, home)}")
        for path in places
    ]


def _json(path: Path) -> dict[str, Any] | None:
    try:
        document: object = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cast(dict[str, Any], document) if isinstance(document, dict) else None


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomlkit.parse(path.read_text(encoding="utf-8")).unwrap()
    except (OSError, ValueError, tomlkit.exceptions.TOMLKitError):
        return {}


def unix_path(url: str) -> str | None:
    """The file of a unix-socket URL (`unix:///run/x.sock`, `http+unix://%2Frun%2Fx.sock`), else None."""
    parsed = urlparse(url)
    if parsed.scheme not in ("unix", "http+unix"):
        return None
    return unquote(parsed.netloc) + parsed.path


def absent(url: str) -> bool:
    """True for a UNIX socket path that is not there (nothing to connect to); other addresses may answer."""
    path = unix_path(url)
    return path is not None and not os.path.exists(path)


def connect(url: str, timeout: float) -> socket.socket:
    """A new stream connection to the service at `url` (unix or tcp). Raises OSError."""
    path = unix_path(url)
    if path is None:
        parsed = urlparse(url)
        return socket.create_connection((parsed.hostname or "localhost", parsed.port or 80), timeout=timeout)
    if sys.platform == "win32":
        raise OSError(errno.EAFNOSUPPORT, "this Python has no UNIX sockets on Windows; use a tcp:// address")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def refuses(url: str) -> str | None:
    """Why nothing answers on a UNIX socket URL (e.g. "Connection refused"), or None when something listens or
    the address is not a UNIX socket. Checked before an SDK connects: they leak the socket of a failed connection."""
    if unix_path(url) is None or sys.platform == "win32":
        return None
    try:
        connect(url, timeout=10).close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
