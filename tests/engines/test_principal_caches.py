"""Over HTTP each principal's library stores are their own, proven from inside real sandboxes: a second
principal asking for the same library installs it afresh and cannot see the first one's store; a principal's
name, however hostile, never becomes a path or a volume name; and a principal past the cache quota is refused,
naming the setting, without touching anyone else's stores.

The run core gets the principal as the `owner` of a call (the HTTP face passes the verified principal; the
unit tier proves that part, tests/unit/test_http_caches.py); the packages come from a local index on loopback,
through the egress proxy, so every install is real and fresh.
"""

from __future__ import annotations

import re
import secrets
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from llm_sandbox_mcp.backends import load_backend
from llm_sandbox_mcp.backends._daemonless.host import cache_root
from llm_sandbox_mcp.cache_index import CacheIndex
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import InstallFailed
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.models import LIBS_DIR, SandboxRef, SandboxSpec
from llm_sandbox_mcp.run.executor import Executor
from llm_sandbox_mcp.run.libraries import QUOTA_SETTING
from tests.engines.conftest import RecordingBackend, engine_settings, require
from tests.support.registries import Package, pip_index, serve

pytestmark = pytest.mark.anyio

PYTHON = get_language("python")
MARKER = ".alice-was-here"
# What a sandbox sees of the library store it mounts, and whether the marker planted in Alice's store is
# anywhere in its filesystem.
LOOK = f"""
import os, subprocess
print("own store:", sorted(os.listdir({str(LIBS_DIR / "python")!r})) != [])
print("marker in the store:", os.path.exists({str(LIBS_DIR / MARKER)!r}))
found = subprocess.run(
    ["find", "/", "(", "-path", "/proc", "-o", "-path", "/sys", "-o", "-path", "/dev", ")", "-prune",
     "-o", "-name", {MARKER!r}, "-print"],
    capture_output=True, text=True,
).stdout.split()
print("marker found at:", found)
"""
HEX_KEY = re.compile(r"[0-9a-f]{32}")


class StoreKeys(RecordingBackend):
    """The real backend, with the store key of every sandbox made (what becomes a directory or a volume name)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(load_backend(settings.backend, settings))
        self.keys: list[str] = []

    async def create(self, spec: SandboxSpec) -> SandboxRef:
        if spec.cache is not None:
            self.keys.append(spec.cache.key)
        return await super().create(spec)


@pytest.fixture(scope="module")
def package() -> Iterator[tuple[Package, str]]:
    """A package of a version no earlier run installed, in a pip index on loopback (and that index's URL)."""
    with tempfile.TemporaryDirectory(prefix="llm-sandbox-principal-caches-") as tmp:
        made = pip_index(Path(tmp), str(secrets.randbelow(10**9)))
        with serve(Path(tmp)) as url:
            yield made, f"{url}/simple"


@pytest.fixture
async def stores(
    request: pytest.FixtureRequest, engine: str, package: tuple[Package, str]
) -> AsyncIterator[tuple[StoreKeys, Settings]]:
    """The backend, and the settings installing from the local index; every store made is removed after."""
    await require(request, engine)
    settings = engine_settings(engine, sandbox_install_network_mode=None, sandbox_pip_index_url=package[1])
    backend = StoreKeys(settings)
    try:
        yield backend, settings
    finally:
        with anyio.CancelScope(shield=True):
            for key in set(backend.keys):
                await backend.inner.drop_cache(key)
                await anyio.to_thread.run_sync(CacheIndex().forget, backend.name, key)
            await backend.aclose()


def _traces_on_the_host(token: str) -> list[str]:
    """What a hostile name holding `token` made on the server's host: files its shell commands would have
    touched, and anything named after it beside the daemonless engines' stores (where `../` would lead)."""
    touched = [f"/tmp/{token}{end}" for end in ("", "b", "c") if Path(f"/tmp/{token}{end}").exists()]
    home = cache_root().parent
    beside = [*home.iterdir(), *cache_root().iterdir()] if cache_root().is_dir() else []
    return touched + [str(path) for path in beside if token in path.name]


def _installs(backend: RecordingBackend, spec: str) -> int:
    return backend.argvs.count(PYTHON.install_argv([spec]))


@pytest.mark.parametrize(
    "engine", [pytest.param(e, marks=getattr(pytest.mark, e)) for e in ("bubblewrap", "docker", "docker-remote")]
)
async def test_each_principal_has_library_stores_of_their_own(
    engine: str, stores: tuple[StoreKeys, Settings], package: tuple[Package, str]
) -> None:
    """Four real installs of a tiny package (about 20 s on docker, 10 on bubblewrap): the one engine test of
    per-principal stores, on a host-directory engine, a volume engine and a volume engine across a filesystem
    boundary (where the stores live on the far side)."""
    backend, settings = stores
    lib, _ = package
    token = secrets.token_hex(4)
    alice = f"alice-{token}"
    # No tokens file or OAuth subject allows such a name; the run core must not care.
    hostile = f"../{token}/x;touch /tmp/{token}`touch /tmp/{token}b`$(touch /tmp/{token}c)|y"
    async with Executor(settings, backend) as executor:
        first = await executor.execute(lib.code, "python", [lib.spec], timeout=120, owner=alice)
        assert (first.exit_code, first.stdout) == (0, lib.expected), first.stderr
        assert _installs(backend, lib.spec) == 1
        alices = executor.libraries.key(PYTHON, [lib.spec], alice)

        # Alice's store gets a mark no sandbox of hers could write (they mount it read-only).
        spec = executor.spec_for(PYTHON, alices)
        assert spec.cache is not None
        ref = await backend.create(replace(spec, cache=replace(spec.cache, writable=True)))
        try:
            planted = await backend.exec(ref, ["touch", str(LIBS_DIR / MARKER)], timeout=30)
            assert planted.exit_code == 0, planted.stderr
        finally:
            await backend.destroy(ref)

        theirs = await executor.execute(lib.code + LOOK, "python", [lib.spec], timeout=120, owner=hostile)
        assert theirs.exit_code == 0, theirs.stderr
        assert _installs(backend, lib.spec) == 2, "the second principal was given the first one's store"
        assert theirs.stdout == (f"{lib.expected}own store: True\nmarker in the store: False\nmarker found at: []\n"), (
            theirs.stdout
        )
        # The look can fail: Alice's own sandbox sees her mark.
        hers = await executor.execute(LOOK, "python", [lib.spec], timeout=120, owner=alice)
        assert "marker in the store: True" in hers.stdout, (hers.stdout, hers.stderr)
        assert _installs(backend, lib.spec) == 2
        size = next(e.size_bytes for e in CacheIndex().entries(backend.name) if e.key == alices)

    hostiles = executor.libraries.key(PYTHON, [lib.spec], hostile)
    assert set(backend.keys) == {alices, hostiles}
    assert all(HEX_KEY.fullmatch(key) for key in backend.keys), backend.keys
    assert _traces_on_the_host(token) == []
    if engine == "bubblewrap":
        assert await anyio.Path(cache_root() / hostiles).is_dir()

    # Carol's quota holds one such store: her second set is refused, naming the setting, and no one else's
    # store is touched.
    carol = f"carol-{token}"
    tight = settings.model_copy(update={"sandbox_http_max_cache_bytes_per_principal": size + size // 2})
    async with Executor(tight, backend) as executor:
        kept = await executor.execute(lib.code, "python", [lib.spec], timeout=120, owner=carol)
        assert kept.exit_code == 0, kept.stderr
        with pytest.raises(InstallFailed, match=rf"each user may hold on this server \({QUOTA_SETTING}\)"):
            await executor.execute(lib.code, "python", [lib.spec.replace("==", "<=")], timeout=120, owner=carol)
    owners = {e.owner for e in CacheIndex().entries(backend.name) if e.key in backend.keys}
    assert owners == {alice, hostile, carol}
