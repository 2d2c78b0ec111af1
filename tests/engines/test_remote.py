"""The remote engines are what they stand for: current versions (Docker 26+, Podman 5+) that cannot see the
server's filesystem. Without this, `docker-remote` and `podman-remote` could silently degrade into the
home-ground engines (Debian 12's Docker 20.10 and Podman 4.3, which share the server's files) and every test
on them would pass for the wrong reason."""

# The podman SDK is unannotated.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

from pathlib import Path

import docker
import docker.errors
import podman
import podman.errors
import pytest
from docker.types import Mount

from tests.engines.conftest import REMOTE_ENGINES, engine_settings, require_now

# The oldest major versions that count as current, by backend.
CURRENT = {"docker": 26, "podman": 5}


def _create_with_bind(backend: str, socket: str, image: str, source: Path) -> tuple[str, str]:
    """(the engine's version, why it refused a container bind-mounting `source`, or "" when it created one)."""
    if backend == "docker":
        client = docker.DockerClient(base_url=socket)
        try:
            version = str(client.version()["Version"])
            try:
                container = client.containers.create(image, ["true"], mounts=[Mount("/seen", str(source), "bind")])
            except docker.errors.APIError as exc:
                return version, str(exc)
            container.remove(force=True)
            return version, ""
        finally:
            client.close()
    with podman.PodmanClient(base_url=socket) as client:
        version = str(client.version()["Version"])
        try:
            container = client.containers.create(
                image, ["true"], mounts=[{"type": "bind", "source": str(source), "target": "/seen"}]
            )
        except podman.errors.APIError as exc:
            return version, str(exc)
        container.remove(force=True)
        return version, ""


@pytest.mark.parametrize("engine", [pytest.param(name, marks=getattr(pytest.mark, name)) for name in REMOTE_ENGINES])
def test_the_remote_engine_is_current_and_cannot_see_the_servers_files(
    request: pytest.FixtureRequest, engine: str, tmp_path: Path
) -> None:
    require_now(request, engine)
    backend, socket = REMOTE_ENGINES[engine]
    settings = engine_settings(engine)
    assert (settings.backend, settings.docker_host or settings.podman_host) == (backend, socket)
    version, refusal = _create_with_bind(backend, socket, settings.base_image_for("python"), tmp_path)
    assert int(version.split(".")[0]) >= CURRENT[backend], f"{engine} runs {backend} {version}, not a current one"
    # The directory exists on the server's side; the engine's own filesystem has no such path.
    assert tmp_path.is_dir()
    missing = "bind source path does not exist: {}" if backend == "docker" else "{}: no such file or directory"
    expected = missing.format(tmp_path)
    assert expected in refusal, f"{engine} bind-mounted the server's {tmp_path}: {refusal or 'created'}"
