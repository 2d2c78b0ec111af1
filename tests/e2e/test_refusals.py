"""Where a sandbox cannot be made, the installed server says why and what to do: on simulations of the Linux
topologies users have and CI lacks (see docs/platforms-linux.md, and tests/support/topologies.py for how each
is made). Every case is checked through a real tool call over stdio and through `doctor`.

- a jail binary refused user namespaces, as Ubuntu 24.04's AppArmor refuses them to an unconfined binary;
- a server that is not root (an ordinary user), without and then with the cgroups it needs delegated;
- a server inside an MCP client's own sandbox: no engine socket, no user namespaces.

They need root to build the simulations (CI runs as root).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult, TextContent

from tests.engines.conftest import require
from tests.support.topologies import NOBODY, as_user, console_reach, in_client_sandbox, refused_jail

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SCRIPT = os.environ.get("LLM_SANDBOX_MCP_COMMAND") or str(Path(sys.executable).parent / "llm-sandbox-mcp")
BASE_ENV = {"SANDBOX_LOG_LEVEL": "ERROR", "SANDBOX_POOL_SIZE": "0", "SANDBOX_ZYGOTE": "0"}
JAILS = {"bubblewrap": ("bwrap", "SANDBOX_BWRAP_PATH"), "nsjail": ("nsjail", "SANDBOX_NSJAIL_PATH")}
ENGINES = [pytest.param(name, marks=getattr(pytest.mark, name), id=name) for name in JAILS]
# Forks until refused, then tries a route out: what the sandbox of a server that is not root holds.
PROBE = """
import json, os, socket, time
children = []
try:
    for _ in range(2000):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        children.append(pid)
    stopped = None
except OSError as exc:
    stopped = exc.errno
try:
    socket.create_connection(("192.0.2.1", 80), timeout=3)
    network = "reached"
except OSError as exc:
    network = exc.strerror
print(json.dumps({"uid": os.getuid(), "forks": len(children), "stopped": stopped, "network": network}))
"""


@pytest.fixture
def root(request: pytest.FixtureRequest) -> None:
    """The simulations switch users and mount namespaces: root only. CI runs as root, so there it fails."""
    if os.geteuid() != 0:
        required = str(request.config.getoption("--require-engines"))
        if "bubblewrap" in required:
            pytest.fail("these simulations need root (CI runs as root)")
        pytest.skip("these simulations need root")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the unprivileged sandbox user can read and, as HOME, an ordinary user can write."""
    directory = Path(tempfile.mkdtemp(prefix="llm-sandbox-refusals-", dir="/tmp"))
    directory.chmod(0o755)
    home = directory / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def _text(result: CallToolResult) -> str:
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


async def _call(command: Sequence[str], env: dict[str, str], code: str = "print(1)") -> CallToolResult:
    params = StdioServerParameters(command=command[0], args=list(command[1:]), env={**BASE_ENV, **env})
    with anyio.fail_after(120):
        async with Client(params) as client:
            return await client.call_tool("execute_code", {"code": code})


async def _doctor(command: Sequence[str], env: dict[str, str]) -> tuple[int, str]:
    """`doctor`'s exit status and report."""
    full = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", **BASE_ENV, **env}
    with anyio.fail_after(120):
        done = await anyio.run_process([*command, "doctor"], env=full, check=False)
    return done.returncode, done.stdout.decode()


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_jail_refused_user_namespaces_gets_the_cause_and_the_apparmor_fix(
    engine: str, root: None, shared_dir: Path, request: pytest.FixtureRequest
) -> None:
    await require(request, engine)
    binary, variable = JAILS[engine]
    found = shutil.which(binary)
    assert found, f"no {binary} on PATH"
    env = {"BACKEND": engine, variable: str(refused_jail(found, shared_dir))}
    result = await _call([SCRIPT], env)
    assert result.is_error
    status, report = await _doctor([SCRIPT], env)
    line = next(line for line in report.splitlines() if line.startswith(engine))
    assert status == 1
    for message in (_text(result), line):
        assert f"BACKEND={engine} cannot create the user namespaces" in message
        assert "EPERM" in message  # what the kernel said, in words
        # The sysctls allow them here, so the cause is a policy on the binary (AppArmor's, on Ubuntu).
        assert "a security policy on" in message and "AppArmor" in message
        assert re.search(r"profile llm-sandbox-\S+ /\S+ flags=\(unconfined\) \{\\n  userns,", message)
        assert "apparmor_parser -r" in message and "BACKEND=docker" in message


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_server_that_is_not_root_says_which_cgroups_to_delegate_and_then_bounds_forks_with_them(
    engine: str, root: None, shared_dir: Path, request: pytest.FixtureRequest
) -> None:
    await require(request, engine)
    session = _session_cgroups(shared_dir.name)
    try:
        command = as_user([SCRIPT], console_reach(SCRIPT), cgroups=session)
        env = {"BACKEND": engine, "HOME": str(shared_dir / "home")}
        refused = await _call(command, env)
        assert refused.is_error
        message = _text(refused)
        assert f"runs as uid {NOBODY}, not root, and may not create cgroups" in message
        delegate = re.search(r"`sudo (mkdir -p [^`]+) && sudo (chown -R [^`]+)`", message)
        assert delegate, message
        assert (await _doctor(command, env))[0] == 1
        # The fix, as the message gives it (as root, which sudo would be), then the same server again.
        await anyio.run_process(delegate[1].split())
        await anyio.run_process(delegate[2].split())
        # With the default zygote: each call's child gets a cgroup of its own under the delegated one.
        result = await _call(command, {**env, "SANDBOX_ZYGOTE": "1"}, PROBE)
        assert not result.is_error, _text(result)
        assert result.structured_content is not None
        seen = json.loads(result.structured_content["stdout"])
        assert seen["uid"] == NOBODY
        assert seen["stopped"] == 11 and seen["forks"] < 256  # EAGAIN at the cgroup's pids limit
        assert seen["network"] == "Network is unreachable"
        assert "cgroups v1" in (await _doctor(command, env))[1]
    finally:
        _remove_cgroups(session)


@pytest.mark.bubblewrap
async def test_inside_a_clients_sandbox_every_call_says_so_and_how_to_leave_it(
    root: None, shared_dir: Path, request: pytest.FixtureRequest
) -> None:
    await require(request, "bubblewrap")
    command = as_user(in_client_sandbox([SCRIPT]), console_reach(SCRIPT))
    env = {"BACKEND": "auto", "HOME": str(shared_dir / "home")}
    result = await _call(command, env)
    assert result.is_error
    status, report = await _doctor(command, env)
    assert status == 1
    configured = next(line for line in report.splitlines() if line.startswith("configured backend"))
    for message in (_text(result), configured):
        assert "appears to run inside a sandbox" in message
        assert "hides the container engines' sockets" in message and "refuses user namespaces" in message
        assert '"sandboxEnabled": false' in message and "codex sandbox" in message
        assert "/var/run/docker.sock" in message
    bubblewrap = next(line for line in report.splitlines() if line.startswith("bubblewrap"))
    assert "runs inside another sandbox or container" in bubblewrap and "ENOSPC" in bubblewrap


def _session_cgroups(name: str) -> list[Path]:
    """A cgroup per v1 controller the backends use, as a login session has: root's, not the user's."""
    made: list[Path] = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in set(controllers.split(",")) & {"pids", "memory", "cpu"}:
            directory = Path(f"/sys/fs/cgroup/{controller}{path.rstrip('/')}/{name}")
            directory.mkdir()
            made.append(directory)
    assert len(made) == 3, "CI's host mounts the cgroup v1 pids, memory and cpu controllers"
    return made


def _remove_cgroups(dirs: list[Path]) -> None:
    for directory in dirs:
        for sub in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if sub.is_dir():
                sub.rmdir()
        directory.rmdir()
