"""The slice of docker-py's low-level `APIClient` the double uses, typed.

The stubs leave most of these untyped; one `cast` here keeps the rest of the package strict.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import docker

from .objects import JsonObj


class DockerApi(Protocol):
    def containers(self, *, all: bool = False, filters: dict[str, Any] | None = None) -> list[JsonObj]: ...
    def inspect_container(self, container: str) -> JsonObj: ...
    def wait(self, container: str) -> JsonObj: ...
    def remove_container(self, container: str, v: bool = False, link: bool = False, force: bool = False) -> None: ...
    def put_archive(self, container: str, path: str, data: bytes) -> bool: ...
    def inspect_image(self, image: str) -> JsonObj: ...
    def volumes(self, filters: dict[str, Any] | None = None) -> JsonObj: ...
    def remove_volume(self, name: str, force: bool = False) -> None: ...
    def exec_create(
        self,
        container: str,
        cmd: list[str],
        stdout: bool = True,
        stderr: bool = True,
        stdin: bool = False,
    ) -> JsonObj: ...
    def exec_start(self, exec_id: str, socket: bool = False) -> Any: ...
    def exec_inspect(self, exec_id: str) -> JsonObj: ...


def docker_api(client: docker.DockerClient) -> DockerApi:
    return cast(DockerApi, client.api)
