"""The server leaves nothing behind: not when its client goes away, not when it is sent SIGTERM. Each case has a
warm pool and a session given a host (its egress relay runs in the sandbox, its proxy in the server), so there is
something of every kind to remove."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, cast

import docker
import pytest

from llm_sandbox_mcp.backends._daemonless.host import state_root
from llm_sandbox_mcp.backends._owner import PID
from tests.e2e.test_stdio import ENV, SCRIPT
from tests.engines.conftest import require_now

pytestmark = [pytest.mark.e2e]

ALLOWED = "shutdown.test"
# Containers the engine removes after the server has gone would still be found within this bound.
_SETTLE_SECONDS = 10.0


def _message(id_: int | None, method: str, params: dict[str, Any]) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id_ is not None:
        message["id"] = id_
    return json.dumps(message).encode() + b"\n"


INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
MESSAGES = (
    _message(1, "initialize", INIT),
    _message(None, "notifications/initialized", {}),
    _message(2, "tools/call", {"name": "execute_code", "arguments": {"code": "print('up')"}}),
    _message(3, "tools/call", {"name": "create_session", "arguments": {"network": [ALLOWED]}}),
)


def _containers_of(pid: int) -> list[str]:
    client = docker.from_env()
    try:
        # The low-level listing: the high-level one inspects each container and races with their removal.
        listing = client.api.containers  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        found = cast("list[dict[str, Any]]", listing(all=True, filters={"label": f"{PID}={pid}"}))
        return [str(container["Id"]) for container in found]
    finally:
        client.close()


def _host_records_of(pid: int) -> list[dict[str, Any]]:
    """The bubblewrap backend's records of the sandboxes of server `pid`."""
    found: list[dict[str, Any]] = []
    for record in (state_root() / "sandboxes").glob("*.json"):
        try:
            state = json.loads(record.read_text())
        except (OSError, ValueError):
            continue  # removed while being read
        if state.get("labels", {}).get(PID) == str(pid):
            found.append(state)
    return found


ENGINES = [pytest.param("docker", marks=pytest.mark.docker), pytest.param("bubblewrap", marks=pytest.mark.bubblewrap)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("how", ["stdin closed", "SIGTERM"])
def test_every_sandbox_is_removed_when_the_server_stops(request: pytest.FixtureRequest, engine: str, how: str) -> None:
    require_now(request, engine)
    server = subprocess.Popen(
        [SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", **ENV, "BACKEND": engine, "SANDBOX_SESSION_ALLOW_HOSTS": ALLOWED},
    )
    assert server.stdin is not None and server.stdout is not None
    pid = server.pid

    def sandboxes() -> list[str]:
        if engine == "docker":
            return _containers_of(pid)
        return [str(state.get("cgroups")) for state in _host_records_of(pid)]

    try:
        for message in MESSAGES:
            server.stdin.write(message)
        server.stdin.flush()
        answers: dict[int, dict[str, Any]] = {}
        while len(answers) < 3:
            answer = json.loads(server.stdout.readline())
            if "id" in answer:  # not a notification
                answers[answer["id"]] = answer
        assert not answers[3]["result"].get("isError"), answers[3]
        deadline = time.monotonic() + 30
        while len(sandboxes()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)  # the pool refills in the background
        assert len(sandboxes()) >= 2, "the warm pool and the session should each hold a sandbox"
        cgroups = [Path(d) for state in _host_records_of(pid) for d in state.get("cgroups", [])]
        assert (engine == "docker") != bool(cgroups), "bubblewrap sandboxes each have cgroups, containers none here"
        if how == "SIGTERM":
            server.send_signal(signal.SIGTERM)
        else:
            server.stdin.close()
        assert server.wait(timeout=60) in (0, 128 + signal.SIGTERM)
        deadline = time.monotonic() + _SETTLE_SECONDS
        while sandboxes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sandboxes() == []
        assert [d for d in cgroups if d.exists()] == []
    finally:
        if server.poll() is None:
            server.kill()
        server.stdout.close()
        if not server.stdin.closed:
            server.stdin.close()
