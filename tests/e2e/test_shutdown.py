"""The server leaves nothing behind: not when its client goes away, not when it is sent SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from typing import Any, cast

import docker
import pytest

from tests.e2e.test_stdio import ENV, SCRIPT
from tests.engines.conftest import require_now

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}
CALL = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "execute_code", "arguments": {"code": "print('up')"}},
}


def _containers_of(client: docker.DockerClient, pid: int) -> list[str]:
    # The low-level listing: the high-level one inspects each container and races with their removal.
    listing = client.api.containers  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    found = cast("list[dict[str, Any]]", listing(all=True, filters={"label": f"llm-sandbox-mcp.pid={pid}"}))
    return [str(container["Id"]) for container in found]


@pytest.mark.parametrize("how", ["stdin closed", "SIGTERM"])
def test_every_sandbox_is_removed_when_the_server_stops(request: pytest.FixtureRequest, how: str) -> None:
    require_now(request, "docker")
    client = docker.from_env()
    server = subprocess.Popen(
        [SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", **ENV, "BACKEND": "docker"},
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        for message in (INIT, {"jsonrpc": "2.0", "method": "notifications/initialized"}, CALL):
            server.stdin.write(json.dumps(message).encode() + b"\n")
        server.stdin.flush()
        while json.loads(server.stdout.readline()).get("id") != 2:
            pass
        deadline = time.monotonic() + 30
        while not _containers_of(client, server.pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # the pool refills in the background
        assert _containers_of(client, server.pid), "the warm pool should hold a sandbox"
        if how == "SIGTERM":
            server.send_signal(signal.SIGTERM)
        else:
            server.stdin.close()
        assert server.wait(timeout=60) in (0, -signal.SIGTERM, 128 + signal.SIGTERM)
        assert _containers_of(client, server.pid) == []
    finally:
        if server.poll() is None:
            server.kill()
        server.stdout.close()
        if not server.stdin.closed:
            server.stdin.close()
        client.close()
