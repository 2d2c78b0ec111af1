"""Fixtures: one `KubeApiDouble` per session on the real Docker engine, driven by the real `kubernetes` client.

Pods run a tiny busybox image (`k8s-double-test:busybox`) imported from the host's static busybox, so
no registry is needed. Each test gets its own namespace, so lists, selectors and policies never see
another test's objects.
"""

from __future__ import annotations

import io
import shutil
import tarfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from kubernetes import client

from tests.support.k8s_double import KubeApiDouble

from .pods import api_client_for

TEST_IMAGE = "k8s-double-test:busybox"
APPLETS = [
    "sh",
    "cat",
    "sleep",
    "tar",
    "echo",
    "id",
    "kill",
    "ls",
    "grep",
    "mkdir",
    "touch",
    "rm",
    "head",
    "wc",
    "env",
    "true",
    "false",
    "dd",
    "ps",
    "printf",
    "seq",
    "sync",
    "df",
    "stat",
    "chmod",
    "tee",
    "pwd",
    "hostname",
    "test",
    "whoami",
    "awk",
    "sed",
    "cut",
    "tr",
    "uname",
    "find",
    "xargs",
    "pidof",
    "pkill",
]


def _required(request: pytest.FixtureRequest) -> bool:
    option = str(request.config.getoption("--require-engines", default=""))
    return bool({"docker", "kubernetes"} & {e.strip() for e in option.split(",")})


@pytest.fixture(scope="session")
def docker_client(request: pytest.FixtureRequest) -> Iterator[docker.DockerClient]:
    try:
        engine = docker.DockerClient.from_env(max_pool_size=64)
        engine.ping()
    except docker.errors.DockerException as exc:
        message = f"the k8s test double needs a Docker engine: {exc}"
        if _required(request):
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield engine
    finally:
        engine.close()


def _busybox_rootfs() -> bytes:
    busybox = shutil.which("busybox") or "/bin/busybox"
    if not Path(busybox).is_file():
        pytest.fail(f"{TEST_IMAGE} is built from a static busybox: run `apt-get install -y busybox-static`")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for directory, mode in (("bin", 0o755), ("etc", 0o755), ("tmp", 0o1777), ("proc", 0o755), ("dev", 0o755)):
            entry = tarfile.TarInfo(directory)
            entry.type, entry.mode = tarfile.DIRTYPE, mode
            archive.addfile(entry)
        archive.add(busybox, "bin/busybox")
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            archive.addfile(link)
        for name, text in (
            ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"),
            ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
        ):
            data = text.encode()
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            archive.addfile(entry, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(scope="session")
def busybox_image(docker_client: docker.DockerClient) -> str:
    """A 2 MB image with a shell and coreutils applets, imported once and kept for later runs."""
    try:
        docker_client.images.get(TEST_IMAGE)
    except docker.errors.ImageNotFound:
        repository, tag = TEST_IMAGE.split(":")
        docker_client.api.import_image_from_data(  # pyright: ignore[reportUnknownMemberType]
            _busybox_rootfs(), repository=repository, tag=tag, changes=["ENV PATH=/bin"]
        )
    return TEST_IMAGE


@pytest.fixture(scope="session")
def kube(docker_client: docker.DockerClient, busybox_image: str) -> Iterator[KubeApiDouble]:
    KubeApiDouble.remove_leftovers(docker_client)
    with KubeApiDouble(docker_client=docker_client, runtime_classes=("gvisor",)) as double:
        yield double


@pytest.fixture(scope="session")
def kubeconfig(kube: KubeApiDouble, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return kube.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")


@pytest.fixture
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = api_client_for(str(kubeconfig))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace (every name exists in the double); its pods are deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield name
    for pod in core.list_namespaced_pod(name).items:
        if pod.metadata is not None and pod.metadata.name:
            core.delete_namespaced_pod(pod.metadata.name, name, grace_period_seconds=0)


PodFactory = Callable[..., dict[str, Any]]


@pytest.fixture
def make_pod(busybox_image: str) -> PodFactory:
    """A pod manifest running busybox `sleep 3600` unless told otherwise."""

    def factory(name: str, *, command: list[str] | None = None, **spec: Any) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "main",
            "image": busybox_image,
            "command": command or ["sleep", "3600"],
            **spec.pop("container", {}),
        }
        labels = spec.pop("labels", {})
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [container], **spec},
        }

    return factory
