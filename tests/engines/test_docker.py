"""What is specific to the Docker backend: labels, the sweep of dead servers' sandboxes, cleanup at shutdown."""

from __future__ import annotations

from collections.abc import Iterator

import docker
import pytest

from llm_sandbox_mcp.backends import _owner, load_backend
from llm_sandbox_mcp.executor import Executor
from llm_sandbox_mcp.languages import get_language
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
    found = client.containers.list(all=True, filters={"label": f"{_owner.INSTANCE}={_owner.INSTANCE_ID}"})
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
        remaining = {c.id for c in client.containers.list(all=True)}
        assert swept >= 1
        assert stale.id not in remaining
        assert foreign.id in remaining  # another host's server may be alive: never judged dead
        assert mine.id in remaining
    finally:
        await backend.aclose()
        foreign.remove(force=True)
