"""The server's own image (deploy/Dockerfile), built as an operator builds it, holds the package and nothing of
the build: a non-root numeric user, the installed command, no source tree, no build-time CA."""

from __future__ import annotations

import io
import json
import os
import secrets
import socket
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from llm_sandbox_mcp import __version__
from tests.engines.conftest import HOST_CA_BUNDLE, require_now

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
TAG = "llm-sandbox-mcp-server:test"
INITIALIZE = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
_CONTEXT = ("pyproject.toml", "README.md", "LICENSE", "deploy/Dockerfile")


def _context() -> io.BytesIO:
    """The build context the Dockerfile reads, and this machine's CA as deploy/install-ca.pem (its package index
    is reached through a TLS-inspecting proxy), as the Dockerfile tells such an operator to do."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in _CONTEXT:
            tar.add(ROOT / name, arcname=name)
        for path in sorted((ROOT / "llm_sandbox_mcp").rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                tar.add(path, arcname=str(path.relative_to(ROOT)))
        if os.path.isfile(HOST_CA_BUNDLE):
            tar.add(HOST_CA_BUNDLE, arcname="deploy/install-ca.pem")
    buffer.seek(0)
    return buffer


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> Iterator[str]:
    require_now(request, "docker")
    client = docker.from_env(timeout=900)
    try:
        # This machine's Docker has no bridge network: builds use the host's (a user's engine needs no option).
        client.images.build(
            fileobj=_context(),
            custom_context=True,
            dockerfile="deploy/Dockerfile",
            tag=TAG,
            network_mode="host",
            rm=True,
        )
        yield TAG
    finally:
        client.close()


def _run(image: str, *command: str, entrypoint: str | None = None) -> str:
    client = docker.from_env()
    try:
        output = client.containers.run(image, list(command), entrypoint=entrypoint, network_mode="none", remove=True)
        return output.decode()
    finally:
        client.close()


def test_the_image_runs_the_installed_server_as_a_numeric_non_root_user(image: str) -> None:
    assert _run(image, "--version").strip() == f"llm-sandbox-mcp {__version__}"
    assert _run(image, "-c", "id -u; id -g", entrypoint="sh").split() == ["10001", "0"]
    client = docker.from_env()
    try:
        config = client.images.get(image).attrs["Config"]
    finally:
        client.close()
    assert config["User"] == "10001" and config["Entrypoint"] == ["llm-sandbox-mcp"]
    assert config["Cmd"] == ["serve", "--http", "0.0.0.0:8080"] and "BACKEND=kubernetes" in config["Env"]


def test_nothing_of_the_build_is_left_in_the_image(image: str) -> None:
    leftovers = "for p in /src /wheel /opt/builder; do [ -e $p ] && echo $p; done; find / -xdev -name install-ca.pem"
    assert _run(image, "-c", f"({leftovers}) 2>/dev/null; true", entrypoint="sh").strip() == ""


def test_the_image_serves_http_only_with_a_token_from_a_secret_mounted_as_a_kubelet_mounts_it(
    image: str, tmp_path: Path
) -> None:
    token = secrets.token_hex(32)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {token}\n")
    os.chown(tokens, 0, 10001)  # a Secret with fsGroup 10001: root's, readable by the server's group only
    tokens.chmod(0o440)
    tmp_path.chmod(0o755)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = docker.from_env()
    container = client.containers.run(
        image,
        ["serve", "--http", f"127.0.0.1:{port}"],
        user="10001:10001",
        environment={"SANDBOX_HTTP_TOKENS_FILE": "/etc/llm-sandbox-mcp/tokens"},
        volumes={str(tokens): {"bind": "/etc/llm-sandbox-mcp/tokens", "mode": "ro"}},
        network_mode="host",  # this machine's Docker has no bridge network
        read_only=True,
        tmpfs={"/tmp": ""},
        detach=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE}).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        deadline = time.monotonic() + 60
        while True:  # until it listens
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except OSError:
                container.reload()
                assert container.status == "running", container.logs().decode()[-2000:]
                assert time.monotonic() < deadline, "the server did not listen within 60 s"
                time.sleep(0.5)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30)
        refused.value.close()
        assert refused.value.code == 401 and refused.value.headers["WWW-Authenticate"].startswith("Bearer")
        authorized = urllib.request.Request(url, body, {**headers, "Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(authorized, timeout=30) as answer:
            assert answer.status == 200 and b'"name":"llm-sandbox"' in answer.read()
        container.stop(timeout=20)
        assert container.wait(timeout=30)["StatusCode"] in (0, 143, -15)
        assert token not in container.logs().decode()
    finally:
        container.remove(force=True)
        client.close()
