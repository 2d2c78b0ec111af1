"""Real engines. A backend whose engine is missing is skipped locally, and fails when required.

`--require-engines=docker,...` (the README's test command passes it) turns a missing engine into a failure,
so CI can never pass by skipping.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

import anyio
import pytest

from llm_sandbox_mcp import images
from llm_sandbox_mcp.backends import Backend, SandboxProcess, load_backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxError
from llm_sandbox_mcp.executor import Executor
from llm_sandbox_mcp.languages import LANGUAGES
from llm_sandbox_mcp.models import WORKDIR, ExecResult, OutputListener, SandboxRef, SandboxSpec
from llm_sandbox_mcp.sessions import SessionRegistry
from tests.engines import kube
from tests.support.egress import public_registry_hosts

ENGINES = ("docker", "podman", "bubblewrap", "nsjail", "kubernetes")
# The host's trust store: behind a TLS-inspecting proxy the images' own bundles are not enough to install.
HOST_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


_probed: dict[str, str | None] = {}


async def _probe(name: str) -> str | None:
    """None when the engine answers, else why not."""
    if name not in _probed:
        try:
            backend = load_backend(name, engine_settings(name))
            try:
                await backend.describe()
                _probed[name] = None
            finally:
                await backend.aclose()
        except SandboxError as exc:
            _probed[name] = str(exc)
    return _probed[name]


async def require(request: pytest.FixtureRequest, name: str) -> None:
    reason = await _probe(name)
    if reason is None:
        return
    required = {e.strip() for e in str(request.config.getoption("--require-engines")).split(",") if e.strip()}
    if name in required:
        pytest.fail(f"engine {name!r} is required (--require-engines) but unusable: {reason}")
    pytest.skip(f"engine {name!r} unusable here: {reason}")


def require_now(request: pytest.FixtureRequest, name: str) -> None:
    """`require` for synchronous tests."""
    anyio.run(require, request, name)


def engine_settings(name: str, **overrides: Any) -> Settings:
    # Installers reach the registries through the egress proxy, as on a user's machine.
    base: dict[str, Any] = {
        "backend": name,
        "sandbox_pool_size": 0,
        "sandbox_install_allow_hosts": list(public_registry_hosts()),
    }
    if os.path.isfile(HOST_CA_BUNDLE):
        base["sandbox_install_ca_bundle"] = HOST_CA_BUNDLE
    if name == "kubernetes":
        base["kubeconfig"] = kube.kubeconfig()
        base["sandbox_k8s_seccomp_profile"] = kube.SECCOMP_PROFILE
        # A cluster builds no images: as the README's recipe says, it runs project images built and pushed
        # elsewhere, here those built on the Docker engine the test double runs its pods in.
        base.update({f"sandbox_image_{lang}": images.recipe(Settings(), lang).tag for lang in LANGUAGES})
    return Settings(**{**base, **overrides})


class RecordingBackend:
    """A real backend, with every exec argv recorded (to prove what ran and what did not)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.install_network = inner.install_network
        self.argvs: list[list[str]] = []
        self._watched: list[tuple[str, anyio.Event]] = []

    def exec_of(self, word: str) -> anyio.Event:
        """An event set once an exec whose argv mentions `word` is made."""
        event = anyio.Event()
        self._watched.append((word, event))
        return event

    def _record(self, argv: Sequence[str]) -> None:
        self.argvs.append(list(argv))
        for word, event in self._watched:
            if any(word in part for part in argv):
                event.set()

    async def create(self, spec: SandboxSpec) -> SandboxRef:
        return await self.inner.create(spec)

    async def exec(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes = b"",
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
        output_limit: int | None = None,
        on_output: OutputListener | None = None,
    ) -> ExecResult:
        self._record(argv)
        return await self.inner.exec(
            ref,
            argv,
            timeout=timeout,
            stdin=stdin,
            env=env,
            workdir=workdir,
            output_limit=output_limit,
            on_output=on_output,
        )

    async def start(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
    ) -> SandboxProcess:
        self._record(argv)
        return await self.inner.start(ref, argv, env=env, workdir=workdir)

    async def kill_all(self, ref: SandboxRef) -> None:
        await self.inner.kill_all(ref)

    async def destroy(self, ref: SandboxRef) -> None:
        await self.inner.destroy(ref)

    async def drop_cache(self, key: str) -> None:
        await self.inner.drop_cache(key)

    async def sweep(self) -> int:
        return await self.inner.sweep()

    async def describe(self) -> str:
        return await self.inner.describe()

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="session", autouse=True)
def kube_double_stopped() -> Iterator[None]:
    yield
    kube.stop()


@pytest.fixture(params=[pytest.param(name, marks=getattr(pytest.mark, name)) for name in ENGINES])
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
async def backend(request: pytest.FixtureRequest, engine: str) -> AsyncIterator[RecordingBackend]:
    await require(request, engine)
    real = RecordingBackend(load_backend(engine, engine_settings(engine)))
    try:
        yield real
    finally:
        await real.aclose()


@pytest.fixture
async def executor(backend: RecordingBackend, engine: str) -> AsyncIterator[Executor]:
    async with Executor(engine_settings(engine), backend) as executor:
        yield executor


@pytest.fixture
async def registry(executor: Executor) -> AsyncIterator[SessionRegistry]:
    sessions = SessionRegistry(executor.settings, executor)
    try:
        yield sessions
    finally:
        await sessions.aclose()
