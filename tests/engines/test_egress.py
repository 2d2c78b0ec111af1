"""Library installs through the egress proxy (SANDBOX_INSTALL_NETWORK_MODE unset), from local registries on
this machine's loopback, named as an operator would configure them; and the install error when the proxy
refused a host the installer needed."""

from __future__ import annotations

import hashlib
import json
import platform
import re
import secrets
import tempfile
import textwrap
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest

from llm_sandbox_mcp.backends import load_backend
from llm_sandbox_mcp.errors import InstallFailed
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.sessions import SessionRegistry
from llm_sandbox_mcp.seccomp.policy import AUDIT_ARCH_AARCH64, AUDIT_ARCH_X86_64, SYSCALLS
from tests.engines.conftest import engine_settings, require
from tests.engines.test_contract import SYSCALL_ANSWERS, SYSCALL_PROBE
from tests.support.egress import loopback_name
from tests.support.registries import (
    Package,
    cran_repo,
    gem_source,
    go_proxy,
    maven_repo,
    npm_registry,
    pip_index,
    serve,
)

pytestmark = pytest.mark.anyio

# The client-side proxy support differs per package manager, so every language is installed on one engine;
# the engine's part (network none, the socket mount or Kubernetes' tunnel, the relay) is the same for every
# language, so the other engines install one (Kubernetes also npm's, whose connections run in parallel).
CASES = (
    [
        pytest.param("docker", language, marks=pytest.mark.docker, id=f"docker-{language}")
        for language in ("python", "javascript", "go", "ruby", "java", "r")
    ]
    + [
        pytest.param(engine, "python", marks=getattr(pytest.mark, engine), id=f"{engine}-python")
        for engine in ("podman", "bubblewrap", "nsjail", "kubernetes", "docker-remote", "podman-remote")
    ]
    + [pytest.param("kubernetes", "javascript", marks=pytest.mark.kubernetes, id="kubernetes-javascript")]
)


@dataclass(frozen=True)
class Registries:
    settings: dict[str, str]
    packages: dict[str, Package]
    # A pip mirror whose index is configured, but whose wheels are served from another host.
    mirror_index: str
    mirror_package: Package
    mirror_files: str


@pytest.fixture(scope="module")
def registries() -> Iterator[Registries]:
    """npm, Go, Ruby, Java and R registries under the host's own name (Go, Ruby and Java skip their proxy for
    127.0.0.1 and localhost); pip's on 127.0.0.1, the only plain-HTTP host pip trusts."""
    name, address = loopback_name()
    token = str(secrets.randbelow(10**9))
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-egress-registries-") as tmp:
        root = Path(tmp)
        packages: dict[str, Package] = {}
        for language, directory, build in (
            ("go", "go", go_proxy),
            ("ruby", "gems", gem_source),
            ("java", "maven", maven_repo),
            ("r", "cran", cran_repo),
        ):
            (root / directory).mkdir()
            packages[language] = build(root / directory, token)
        packages["python"] = pip_index(root / "pip", token)
        (root / "npm").mkdir()
        (root / "mirror").mkdir()
        with (
            serve(root, address, name) as named,
            serve(root / "pip") as pip,
            serve(root / "mirror") as mirror,
            serve(root / "mirror") as mirror_files,
        ):
            packages["javascript"] = npm_registry(root / "npm", token, f"{named}/npm")
            yield Registries(
                settings={
                    "sandbox_pip_index_url": f"{pip}/simple",
                    "sandbox_npm_registry": f"{named}/npm",
                    "sandbox_goproxy": f"{named}/go",
                    "sandbox_gosumdb": "off",
                    "sandbox_gem_source": f"{named}/gems",
                    "sandbox_maven_repo": f"{named}/maven",
                    "sandbox_cran_repo": f"{named}/cran/",
                },
                packages=packages,
                mirror_index=f"{mirror}/simple",
                mirror_package=pip_index(root / "mirror", token + "0", files_url=f"{mirror_files}/files"),
                mirror_files=mirror_files.removeprefix("http://"),
            )


@asynccontextmanager
async def _executor(
    request: pytest.FixtureRequest, engine: str, specs: set[str], **settings: object
) -> AsyncGenerator[Executor]:
    """An executor whose installers go through the egress proxy; the stores of `specs` are dropped after."""
    await require(request, engine)
    configured = engine_settings(engine, sandbox_install_network_mode=None, **settings)
    backend = load_backend(configured.backend, configured)
    try:
        async with Executor(configured, backend) as executor:
            yield executor
        for entry in await anyio.to_thread.run_sync(executor.libraries.index.entries, backend.name):
            if specs.intersection(entry.libraries):
                await backend.drop_cache(entry.key)
    finally:
        await backend.aclose()


@pytest.fixture
async def proxied(request: pytest.FixtureRequest, registries: Registries) -> AsyncIterator[Executor]:
    specs = {package.spec for package in registries.packages.values()}
    async with _executor(request, request.param, specs, **registries.settings) as executor:
        yield executor


@pytest.mark.parametrize(("proxied", "language"), CASES, indirect=["proxied"])
async def test_a_library_installs_through_the_proxy(proxied: Executor, registries: Registries, language: str) -> None:
    assert proxied.libraries.network() == "egress"
    package = registries.packages[language]
    result = await proxied.execute(package.code, language, libraries=[package.spec], timeout=180)  # type: ignore[arg-type]
    assert (result.exit_code, result.stdout) == (0, package.expected), result.stderr


@pytest.mark.docker
async def test_a_refused_host_is_named_in_the_install_error_with_the_setting(
    request: pytest.FixtureRequest, registries: Registries
) -> None:
    """The mirror's index is configured, so allowed; the wheel it links lives on a host nothing allows."""
    mirror = registries.mirror_index
    async with _executor(request, "docker", set(), sandbox_pip_index_url=mirror) as executor:
        with pytest.raises(InstallFailed) as failure:
            await executor.execute("print(1)", "python", libraries=[registries.mirror_package.spec], timeout=120)
        message = str(failure.value)
        assert f"{registries.mirror_files} was refused" in message, message
        assert "SANDBOX_INSTALL_ALLOW_HOSTS can allow it" in message


# A session's cell fetching through the proxy, as any client honouring HTTP_PROXY does.
FETCH = """
import urllib.request, urllib.error
def fetch(url):
    try:
        return urllib.request.urlopen(url, timeout=20).status
    except urllib.error.HTTPError as e:
        return e.code
print(fetch({allowed!r}), fetch({unlisted!r}))
"""
KILL_RELAY = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if b"perl" in open(f"/proc/{pid}/cmdline", "rb").read():
            os.kill(int(pid), signal.SIGKILL)
    except OSError:
        pass
"""


@pytest.mark.parametrize(
    "engine",
    [
        pytest.param(e, marks=getattr(pytest.mark, e))
        for e in ("docker", "bubblewrap", "nsjail", "kubernetes", "docker-remote", "podman-remote")
    ],
)
async def test_a_session_reaches_its_hosts_and_nothing_else(
    request: pytest.FixtureRequest, registries: Registries, engine: str
) -> None:
    name, _ = loopback_name()
    named = registries.settings["sandbox_goproxy"].removesuffix("/go")
    port = named.rsplit(":", 1)[1]
    pip = registries.settings["sandbox_pip_index_url"]
    async with _executor(request, engine, set(), sandbox_session_allow_hosts=[f"{name}:{port}", "*.test"]) as executor:
        sessions = SessionRegistry(executor.settings, executor)
        try:
            session = await sessions.create("python", [], network=[f"{name}:{port}"])
            assert session.describe()["allowed_hosts"] == [f"{name}:{port}"]
            code = FETCH.format(allowed=f"{named}/go/example.com/greet/@v/list", unlisted=pip)
            first = await sessions.execute(session.id, code, [], 60)
            # Code that kills the relay cuts only itself off, until the next cell, which has it again.
            killed = await sessions.execute(session.id, KILL_RELAY + code, [], 60)
            again = await sessions.execute(session.id, code, [], 60)
        finally:
            await sessions.aclose()
    assert first.stdout == again.stdout == "200 403\n", (first.stderr, again.stderr)
    assert killed.exit_code != 0 and re.search("Connection (refused|reset)", killed.stderr), killed.stderr


# Read in the sandbox: the hardening every sandbox gets, which a profile that never reached the engine would lose.
HARDENING = """
import json, os
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
try:
    open("/usr/probe", "w")
    writable = True
except OSError:
    writable = False
interfaces = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:])
print(json.dumps([status["Seccomp"], status["NoNewPrivs"], status["CapEff"], os.getuid() != 0, writable, interfaces]))
"""


@pytest.mark.parametrize(
    "where",
    [
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("podman", marks=pytest.mark.podman),
        pytest.param("docker-remote", marks=getattr(pytest.mark, "docker-remote")),
        pytest.param("podman-remote", marks=getattr(pytest.mark, "podman-remote")),
    ],
)
async def test_installs_and_sessions_need_nothing_of_the_servers_filesystem(
    request: pytest.FixtureRequest, registries: Registries, where: str
) -> None:
    """On an engine whose filesystem is not the server's (Docker Desktop's VM, a remote DOCKER_HOST), a library
    installs and a session reaches its host through the proxy, as on a local engine: the sandbox's own stream
    carries its connections, and no path of the server's is mounted. Its sandboxes keep every setting, the
    project's seccomp profile included (which Podman takes only as a path on its own host)."""
    x86 = platform.machine() == "x86_64"
    name, _ = loopback_name()
    named = registries.settings["sandbox_goproxy"].removesuffix("/go")
    host = f"{name}:{named.rsplit(':', 1)[1]}"
    package = registries.packages["python"]
    settings = {**registries.settings, "sandbox_session_allow_hosts": [host]}
    async with _executor(request, where, {package.spec}, **settings) as executor:
        hardening = await executor.execute(HARDENING, "python", timeout=60)
        table = SYSCALL_PROBE % json.dumps(SYSCALLS[AUDIT_ARCH_X86_64 if x86 else AUDIT_ARCH_AARCH64])
        syscalls = await executor.execute(textwrap.dedent(table), "python", timeout=60)
        installed = await executor.execute(package.code, "python", libraries=[package.spec], timeout=180)
        sessions = SessionRegistry(executor.settings, executor)
        try:
            session = await sessions.create("python", [], network=[host])
            code = FETCH.format(
                allowed=f"{named}/go/example.com/greet/@v/list", unlisted=registries.settings["sandbox_pip_index_url"]
            )
            fetched = await sessions.execute(session.id, code, [], 60)
        finally:
            await sessions.aclose()
    assert (installed.exit_code, installed.stdout) == (0, package.expected), installed.stderr
    assert fetched.stdout == "200 403\n", fetched.stderr
    assert json.loads(hardening.stdout) == ["2", "1", "0000000000000000", True, False, ["lo"]], hardening.stderr
    assert json.loads(syscalls.stdout) == SYSCALL_ANSWERS, syscalls.stderr


# Parallel downloads through one relay: on Kubernetes, streams multiplexed over one exec stream, each whole,
# while another download that is never read holds its own stream up (and only its own).
PARALLEL = """
import hashlib, json, socket, urllib.request
from concurrent.futures import ThreadPoolExecutor
stalled = socket.socket()
stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
stalled.connect(("127.0.0.1", 3128))
stalled.sendall(b"GET {stalled} HTTP/1.1\\r\\n\\r\\n")
assert stalled.recv(12).startswith(b"HTTP/1.0 200"), "the stalled download did not start"
def digest(url):
    with urllib.request.urlopen(url, timeout=60) as answer:
        return hashlib.sha256(answer.read()).hexdigest()
with ThreadPoolExecutor(4) as pool:
    print(json.dumps(list(pool.map(digest, {urls!r}))))
"""


@pytest.mark.parametrize("engine", [pytest.param("kubernetes", marks=pytest.mark.kubernetes)])
async def test_parallel_large_downloads_arrive_whole(request: pytest.FixtureRequest, engine: str) -> None:
    name, address = loopback_name()
    blobs = {f"blob-{index}": secrets.token_bytes(3 * 1024**2 + index) for index in range(4)}
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-egress-blobs-") as tmp:
        for blob, data in blobs.items():
            (Path(tmp) / blob).write_bytes(data)
        (Path(tmp) / "stalled").write_bytes(bytes(16 * 1024**2))
        with serve(Path(tmp), address, name) as base:
            host = base.removeprefix("http://")
            async with _executor(request, engine, set(), sandbox_session_allow_hosts=[host]) as executor:
                sessions = SessionRegistry(executor.settings, executor)
                try:
                    session = await sessions.create("python", [], network=[host])
                    code = PARALLEL.format(urls=[f"{base}/{blob}" for blob in blobs], stalled=f"{base}/stalled")
                    result = await sessions.execute(session.id, code, [], 180)
                finally:
                    await sessions.aclose()
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == [hashlib.sha256(data).hexdigest() for data in blobs.values()]


# A client that drops a download mid-way (a reset, as a process killed or a response left unread gives), then at
# once asks for something else through the same relay: the relay closes the dropped stream while its data is on
# its way, which once cut a frame on the server's side, lost the relay and the request just made with it.
DROPPED = """
import socket, struct, urllib.request
answers = []
for _ in range({rounds}):
    dropped = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    dropped.sendall(b"GET {big} HTTP/1.1\\r\\n\\r\\n")
    assert dropped.recv(4096).startswith(b"HTTP/1.0 200"), "the download did not start"
    dropped.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    dropped.close()
    with urllib.request.urlopen({small!r}, timeout=20) as answer:
        answers.append(answer.read().decode())
print(sorted(set(answers)), len(answers))
"""


@pytest.mark.parametrize(
    "engine",
    [pytest.param(e, marks=getattr(pytest.mark, e)) for e in ("docker", "podman", "bubblewrap", "kubernetes")],
)
async def test_a_dropped_download_never_cuts_off_the_next_request(request: pytest.FixtureRequest, engine: str) -> None:
    name, address = loopback_name()
    rounds = 20
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-egress-dropped-") as tmp:
        (Path(tmp) / "big").write_bytes(secrets.token_bytes(8 * 1024**2))
        (Path(tmp) / "small").write_text("small")
        with serve(Path(tmp), address, name) as base:
            host = base.removeprefix("http://")
            async with _executor(request, engine, set(), sandbox_session_allow_hosts=[host]) as executor:
                sessions = SessionRegistry(executor.settings, executor)
                try:
                    session = await sessions.create("python", [], network=[host])
                    code = DROPPED.format(rounds=rounds, big=f"{base}/big", small=f"{base}/small")
                    result = await sessions.execute(session.id, code, [], 120)
                finally:
                    await sessions.aclose()
    assert (result.exit_code, result.stdout) == (0, f"['small'] {rounds}\n"), result.stderr
