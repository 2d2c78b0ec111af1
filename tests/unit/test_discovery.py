"""Finding the engine a user has, from a home directory laid out as Docker Desktop, Colima or Podman machine lay it
out: real context and connection files in those tools' formats, and a real listening socket for the one that
should win (a small HTTP server answering as Docker or Podman would: the ping, the version and the info).

The sockets are UNIX sockets, which Python has on Linux and macOS only; the candidate lists are checked everywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any

import pytest

from llm_sandbox_mcp.backends import load_backend
from llm_sandbox_mcp.backends._docker_discovery import START_HINT, docker_candidates, find_docker
from llm_sandbox_mcp.backends._endpoints import Candidate
from llm_sandbox_mcp.backends._podman.service import candidates as podman_candidates
from llm_sandbox_mcp.backends._podman.service import find as find_podman
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable

UNIX_SOCKETS = pytest.mark.skipif(
    sys.platform == "win32", reason="serves on a UNIX socket, which Windows' Python lacks"
)


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty home directory, short enough for socket paths under it, that the docker SDK reads as ~."""
    directory = Path(tempfile.mkdtemp(prefix="home-"))
    monkeypatch.setenv("HOME", str(directory))
    monkeypatch.setenv("USERPROFILE", str(directory))
    for name in ("DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_HOST", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "COLIMA_HOME"):
        monkeypatch.delenv(name, raising=False)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def docker_context(home: Path, name: str, host: str, current: bool = True) -> None:
    """A context as `docker context create NAME --docker host=HOST` (and `docker context use NAME`) write it."""
    meta = home / ".docker" / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest() / "meta.json"
    meta.parent.mkdir(parents=True)
    endpoint = {"Host": host, "SkipTLSVerify": False}
    meta.write_text(json.dumps({"Name": name, "Metadata": {}, "Endpoints": {"docker": endpoint}}))
    if current:
        (home / ".docker" / "config.json").write_text(json.dumps({"auths": {}, "currentContext": name}))


class _Engine(BaseHTTPRequestHandler):
    podman = False
    delay = 0.0  # seconds each answer takes, so that calls overlap

    def do_GET(self) -> None:
        time.sleep(self.delay)
        path = self.path.split("?")[0]
        body: Any
        if path.endswith("/_ping"):
            body = "OK"
        elif path.endswith("/version"):
            body = {"Version": "27.0.0-fake", "ApiVersion": "1.45", "MinAPIVersion": "1.24"}
        else:
            self.send_error(404)
            return
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Api-Version", "1.45")
        if self.podman:
            self.send_header("Libpod-Api-Version", "5.2.0")
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: object) -> None:
        pass


class _PodmanEngine(_Engine):
    podman = True


@contextmanager
def engine(path: Path, podman: bool = False) -> Generator[None]:
    """A fake engine answering HTTP on the UNIX socket `path` until the block ends."""
    from socketserver import UnixStreamServer

    class Server(ThreadingMixIn, UnixStreamServer):
        request_queue_size = 64  # a burst of connections is queued, not refused (closing joins their threads)

    path.parent.mkdir(parents=True, exist_ok=True)
    server = Server(str(path), _PodmanEngine if podman else _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def dead_socket(path: Path) -> None:
    """A socket file nothing listens on, as a stopped Docker Desktop or Colima leaves behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(str(path))


def sources(found: list[Candidate]) -> list[str]:
    return [candidate.source for candidate in found]


def test_the_current_context_comes_first_then_the_well_known_sockets_of_each_platform(home: Path) -> None:
    docker_context(home, "colima", f"unix://{home}/.colima/default/docker.sock")
    (home / ".colima" / "work").mkdir(parents=True)
    (home / ".colima" / "work" / "docker.sock").touch()
    mac, problems = docker_candidates(None, {}, home, "darwin")
    assert problems == []
    assert sources(mac) == [
        "Docker context 'colima' (currentContext in ~/.docker/config.json)",
        "Docker Desktop socket ~/.docker/run/docker.sock",
        "the default socket /var/run/docker.sock",
        "Colima socket ~/.colima/work/docker.sock",
        "Colima socket ~/.config/colima/default/docker.sock",
        "OrbStack socket ~/.orbstack/run/docker.sock",
        "Rancher Desktop socket ~/.rd/docker.sock",
    ]
    assert mac[0].url == f"unix://{home}/.colima/default/docker.sock"  # the context's, tried once
    linux, _ = docker_candidates(None, {"XDG_RUNTIME_DIR": "/run/user/1000"}, home, "linux")
    assert "rootless Docker socket /run/user/1000/docker.sock" in sources(linux)
    assert "Docker Desktop for Linux socket ~/.docker/desktop/docker.sock" in sources(linux)
    windows, _ = docker_candidates(None, {}, home, "win32")
    assert [c.url for c in windows[1:]] == [
        "npipe:////./pipe/docker_engine",
        "npipe:////./pipe/dockerDesktopLinuxEngine",
    ]


def test_docker_context_overrides_the_current_context_and_docker_host_overrides_both(home: Path) -> None:
    docker_context(home, "colima", "unix:///colima.sock")
    docker_context(home, "orbstack", "unix:///orbstack.sock", current=False)
    found, _ = docker_candidates(None, {"DOCKER_CONTEXT": "orbstack"}, home, "darwin")
    assert (found[0].url, found[0].source) == ("unix:///orbstack.sock", "Docker context 'orbstack' (DOCKER_CONTEXT)")
    found, _ = docker_candidates("tcp://remote:2376", {"DOCKER_CONTEXT": "orbstack"}, home, "darwin")
    assert [(c.url, c.source, c.explicit) for c in found] == [("tcp://remote:2376", "DOCKER_HOST", True)]
    found, _ = docker_candidates(None, {"DOCKER_CONTEXT": "default"}, home, "darwin")
    assert found[0].source == "Docker Desktop socket ~/.docker/run/docker.sock"


def test_a_context_that_cannot_be_read_is_reported_and_the_sockets_are_still_tried(home: Path) -> None:
    (home / ".docker").mkdir()
    (home / ".docker" / "config.json").write_text(json.dumps({"currentContext": "gone"}))
    found, problems = docker_candidates(None, {}, home, "darwin")
    assert problems == [
        "Docker context 'gone' (currentContext in ~/.docker/config.json) does not exist "
        "(`docker context ls` lists them)"
    ]
    assert found[0].source == "Docker Desktop socket ~/.docker/run/docker.sock"


@UNIX_SOCKETS
def test_the_first_engine_that_answers_is_used(home: Path) -> None:
    dead_socket(home / ".docker" / "run" / "docker.sock")  # Docker Desktop installed but stopped
    found, problems = docker_candidates(None, {}, home, sys.platform)
    ours = [candidate for candidate in found if str(home) in candidate.url]  # not this machine's own engines
    with engine(home / ".colima" / "default" / "docker.sock"):
        client, chosen = find_docker(ours, problems)
        assert client.version()["Version"] == "27.0.0-fake"
        client.close()
    assert ours[0].source == "Docker Desktop socket ~/.docker/run/docker.sock"
    assert chosen.source == "Colima socket ~/.colima/default/docker.sock"


@UNIX_SOCKETS
@pytest.mark.parametrize("podman", [False], ids=["docker"])  # Podman's client keeps its default: see _endpoints
def test_the_engine_client_keeps_a_connection_for_each_worker_thread(
    home: Path, podman: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Calls to the engine run in anyio's worker threads (40 at most): with the SDKs' pools of 10, a burst drops
    the connections over 10 as each call ends, with a warning each time."""
    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    monkeypatch.setattr(_Engine, "delay", 0.3)
    sock = home / "engine.sock"
    with engine(sock, podman=podman):
        candidate = Candidate(f"unix://{sock}", "a test engine")
        client: Any = find_podman([candidate])[0] if podman else find_docker([candidate])[0]
        barrier = threading.Barrier(24)

        def call() -> None:
            barrier.wait()
            client.version()

        threads = [threading.Thread(target=call) for _ in range(24)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        client.close()
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


@UNIX_SOCKETS
def test_doctor_says_which_engine_it_found_and_from_where(home: Path) -> None:
    colima = home / ".colima" / "default" / "docker.sock"
    docker_context(home, "colima", f"unix://{colima}")  # what `colima start` sets up
    with engine(colima):
        backend = load_backend("docker", Settings())
        try:
            line = await_describe(backend)
        finally:
            close(backend)
    assert line == (
        f"Docker Engine 27.0.0-fake (API 1.45) at unix://{colima} "
        "(from Docker context 'colima' (currentContext in ~/.docker/config.json))"
    )


@UNIX_SOCKETS
def test_when_no_engine_answers_the_refusal_lists_what_was_tried_and_the_fix(home: Path) -> None:
    desktop = home / ".docker" / "run" / "docker.sock"
    dead_socket(desktop)
    docker_context(home, "colima", f"unix://{home}/.colima/default/docker.sock")
    found, problems = docker_candidates(None, {}, home, "darwin")
    ours = [candidate for candidate in found if str(home) in candidate.url]
    with pytest.raises(BackendUnavailable) as refused:
        find_docker(ours, problems)
    message = str(refused.value)
    assert message.startswith("No Docker engine found (tried ")
    assert f"unix://{desktop} (Docker Desktop socket ~/.docker/run/docker.sock): " in message
    assert "no socket at Docker context 'colima' (currentContext in ~/.docker/config.json), Colima socket" in message
    assert message.endswith(START_HINT) and "colima start" in START_HINT and "DOCKER_HOST" in START_HINT


PODMAN_CONNECTIONS = {
    "Connection": {
        "Default": "podman-machine-default",
        "Connections": {
            "remote": {"URI": "tcp://podman.example:8888"},
            "podman-machine-default": {
                "URI": "ssh://core@127.0.0.1:52345/run/user/501/podman/podman.sock",
                "Identity": "/Users/me/.local/share/containers/podman/machine/machine",
                "IsMachine": True,
            },
            "podman-machine-default-root": {
                "URI": "ssh://root@127.0.0.1:52345/run/podman/podman.sock",
                "Identity": "/Users/me/.local/share/containers/podman/machine/machine",
                "IsMachine": True,
            },
        },
    },
    "Farm": {},
}


def podman_home(home: Path) -> Path:
    """Podman 5 on macOS: its connections file, and the machine's API socket under $TMPDIR/podman."""
    config = home / ".config" / "containers"
    config.mkdir(parents=True)
    (config / "podman-connections.json").write_text(json.dumps(PODMAN_CONNECTIONS))
    return home / "T"


def test_podman_tries_its_default_connection_first_with_the_machine_socket_for_its_ssh_address(home: Path) -> None:
    tmpdir = podman_home(home)
    found = podman_candidates(None, None, {"TMPDIR": str(tmpdir)}, None, home, "darwin")
    connection = "Podman connection 'podman-machine-default' (~/.config/containers/podman-connections.json)"
    assert [(c.url, c.source) for c in found[:3]] == [
        (
            f"unix://{tmpdir}/podman/podman-machine-default-api.sock",
            f"{connection}: machine 'podman-machine-default' API socket ~/T/podman/podman-machine-default-api.sock",
        ),
        (
            f"unix://{home}/.local/share/containers/podman/machine/podman-machine-default/podman.sock",
            f"{connection}: machine 'podman-machine-default' API socket "
            "~/.local/share/containers/podman/machine/podman-machine-default/podman.sock",
        ),
        (
            f"unix://{home}/.local/share/containers/podman/machine/podman.sock",
            f"{connection}: machine 'podman-machine-default' API socket "
            "~/.local/share/containers/podman/machine/podman.sock",
        ),
    ]
    assert not any(c.url.startswith("ssh://") for c in found)
    rest = [(c.url, c.source.split(" (")[0]) for c in found[3:]]
    assert rest == [("tcp://podman.example:8888", "Podman connection 'remote'")]
    linux = podman_candidates(None, None, {"XDG_RUNTIME_DIR": "/run/user/1000"}, 1000, home, "linux")
    assert [c.source for c in linux[-2:]] == ["the rootless default socket", "the rootful default socket"]
    assert podman_candidates(None, None, {"CONTAINER_HOST": "unix:///c.sock"}, None, home, "darwin")[0].explicit
    assert [c.source for c in podman_candidates(None, None, {}, None, home, "win32")] == [
        "Podman connection 'remote' (~/.config/containers/podman-connections.json)"
    ]


def test_containers_conf_service_destinations_are_podman_connections_too(home: Path) -> None:
    config = home / ".config" / "containers"
    config.mkdir(parents=True)
    (config / "containers.conf").write_text(
        '[engine]\nactive_service = "lab"\n\n[engine.service_destinations.other]\nuri = "tcp://other:1"\n\n'
        '[engine.service_destinations.lab]\nuri = "unix:///srv/lab/podman.sock"\n'
    )
    found = podman_candidates(None, None, {}, 1000, home, "linux")
    assert [(c.url, c.source) for c in found[:2]] == [
        (
            "unix:///srv/lab/podman.sock",
            "Podman connection 'lab' (~/.config/containers/containers.conf [engine.service_destinations])",
        ),
        (
            "tcp://other:1",
            "Podman connection 'other' (~/.config/containers/containers.conf [engine.service_destinations])",
        ),
    ]


@UNIX_SOCKETS
def test_podman_machine_is_found_through_its_connection_and_says_so(home: Path) -> None:
    tmpdir = podman_home(home)
    found = podman_candidates(None, None, {"TMPDIR": str(tmpdir)}, 501, home, "darwin")
    ours = [candidate for candidate in found if str(home) in candidate.url]
    dead_socket(home / ".local" / "share" / "containers" / "podman" / "machine" / "podman.sock")
    with engine(tmpdir / "podman" / "podman-machine-default-api.sock", podman=True):
        client, chosen = find_podman(ours)
        client.close()
    assert chosen.source.startswith("Podman connection 'podman-machine-default'")
    assert chosen.url == f"unix://{tmpdir}/podman/podman-machine-default-api.sock"


def await_describe(backend: Any) -> str:
    import anyio

    async def describe() -> str:
        line: str = await backend.describe()
        return line

    return anyio.run(describe)


def close(backend: Any) -> None:
    import anyio

    anyio.run(backend.aclose)
