"""What is specific to the Docker backend: labels, the sweep of dead servers' sandboxes, cleanup at shutdown."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from llm_sandbox_mcp.backends import _owner, load_backend
from llm_sandbox_mcp.backends._container import CACHE_PREFIX
from llm_sandbox_mcp.cache_index import CacheEntry, CacheIndex
from llm_sandbox_mcp.cli import main
from llm_sandbox_mcp.languages import get_language
from llm_sandbox_mcp.run.executor import Executor
from tests.engines.conftest import engine_settings, require_now

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


@pytest.fixture
def client(request: pytest.FixtureRequest) -> Iterator[docker.DockerClient]:
    require_now(request, "docker")
    api = docker.from_env()
    try:
        yield api
    finally:
        api.close()


def _ours(client: docker.DockerClient) -> list[str]:
    found = client.containers.list(
        all=True, ignore_removed=True, filters={"label": f"{_owner.INSTANCE}={_owner.INSTANCE_ID}"}
    )
    return [c.id or "" for c in found]


async def test_sandboxes_are_labelled_hardened_and_removed_at_shutdown(client: docker.DockerClient) -> None:
    backend = load_backend("docker", engine_settings("docker"))
    async with Executor(engine_settings("docker"), backend) as executor:
        ref = await backend.create(executor.spec_for(get_language("python")))
        attrs = client.containers.get(ref.id).attrs
        host = attrs["HostConfig"]
        assert attrs["Config"]["Labels"][_owner.MANAGED] == "true"
        assert attrs["Config"]["User"] == "65534:65534"
        assert host["ReadonlyRootfs"] is True and host["NetworkMode"] == "none" and host["Privileged"] is False
        assert host["CapDrop"] == ["ALL"] and "no-new-privileges:true" in host["SecurityOpt"]
        assert host["Memory"] == host["MemorySwap"] == 512 * 1024**2
        assert host["PidsLimit"] == 128 and host["NanoCpus"] == 10**9
        assert host["Binds"] in (None, [])
        assert all(mount["Type"] != "bind" for mount in attrs["Mounts"])
        assert {"HOME=/tmp"} <= set(attrs["Config"]["Env"])
        assert ref.id in _ours(client)
    await backend.aclose()
    assert _ours(client) == []


async def test_sweep_removes_sandboxes_of_dead_servers_only(client: docker.DockerClient) -> None:
    dead = {**_owner.owner_labels(), _owner.INSTANCE: "dead-server", _owner.PID: "999999999", _owner.STARTED: "1"}
    elsewhere = {**dead, _owner.INSTANCE: "other-host", _owner.HOST: "some-other-machine"}
    stale = client.containers.create("python:3.12-slim", ["sleep", "infinity"], labels=dead, network_mode="none")
    foreign = client.containers.create("python:3.12-slim", ["sleep", "infinity"], labels=elsewhere, network_mode="none")
    backend = load_backend("docker", engine_settings("docker"))
    try:
        mine = await backend.create(Executor(engine_settings("docker"), backend).spec_for(get_language("python")))
        swept = await backend.sweep()
        remaining = {c.id for c in client.containers.list(all=True, ignore_removed=True)}
        assert swept >= 1
        assert stale.id not in remaining
        assert foreign.id in remaining  # another host's server may be alive: never judged dead
        assert mine.id in remaining
    finally:
        await backend.aclose()
        foreign.remove(force=True)


def test_cache_prune_removes_caches_unused_for_long_and_keeps_recent_ones(
    client: docker.DockerClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("BACKEND", "docker")
    old, recent = f"prune-old-{uuid.uuid4().hex[:8]}", f"prune-recent-{uuid.uuid4().hex[:8]}"
    for key, last_used in ((old, time.time() - 48 * 3600), (recent, time.time())):
        client.volumes.create(CACHE_PREFIX + key)
        CacheIndex().record(CacheEntry("docker", key, "python", ("six",), 1024, last_used))
    try:
        assert main(["cache", "prune", "--older-than", "24"]) == 0
        names = {volume.name for volume in client.volumes.list()}
        assert CACHE_PREFIX + old not in names and CACHE_PREFIX + recent in names
        assert [entry.key for entry in CacheIndex().entries("docker")] == [recent]
    finally:
        for key in (old, recent):
            with contextlib.suppress(docker.errors.NotFound):
                client.volumes.get(CACHE_PREFIX + key).remove(force=True)
