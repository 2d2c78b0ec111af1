"""Engines across a filesystem boundary, as Docker Desktop's VM, Colima, a Podman machine or a remote engine are
to the server: a second dockerd, or a second Podman service, in a mount namespace of its own with private /tmp,
/root and /home, sharing only its socket with this machine. A path under the server's /tmp does not exist there.

`LLM_SANDBOX_TEST_BOUNDARY_DOCKER_HOST` / `LLM_SANDBOX_TEST_BOUNDARY_PODMAN_HOST` name such an engine where one
runs already (CI's own); otherwise one is started here and stopped after. The dockerd has its own data root
(images are copied into it from the local engine); the Podman service shares the local image store.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import docker
from docker.errors import DockerException, ImageNotFound

ENV = "LLM_SANDBOX_TEST_BOUNDARY_DOCKER_HOST"
PODMAN_ENV = "LLM_SANDBOX_TEST_BOUNDARY_PODMAN_HOST"
# Everything but the socket's directory is the engine's own, or the host's read-only facts.
_PRIVATE = (
    "mount --make-rprivate / && mount -t tmpfs tmpfs /tmp && mount -t tmpfs tmpfs /root && mount -t tmpfs tmpfs /home"
)
_START_SECONDS = 60.0


def _answers(url: str) -> bool:
    if not os.path.exists(url.removeprefix("unix://")):
        return False  # the SDK leaks its socket when the connection to a missing path fails
    try:
        client = docker.DockerClient(base_url=url, timeout=5)
    except DockerException:
        return False
    try:
        return bool(client.ping())
    except DockerException:
        return False
    finally:
        client.close()


@contextmanager
def boundary_docker(images: list[str]) -> Generator[str]:
    """The DOCKER_HOST of an engine across a filesystem boundary holding `images`. Raises RuntimeError when none
    can be had (no dockerd here, or it does not start)."""
    given = os.environ.get(ENV)
    if given:
        _copy_images(given, images)
        yield given
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise RuntimeError(f"no dockerd to start an engine across a filesystem boundary (or set {ENV})")
    root = Path(tempfile.mkdtemp(prefix="llm-sandbox-boundary-", dir="/srv" if os.path.isdir("/srv") else None))
    run = Path(tempfile.mkdtemp(prefix="llm-sandbox-boundary-", dir="/run"))
    url = f"unix://{run}/docker.sock"
    script = (
        f'{_PRIVATE} && exec "$0" -H {url} --data-root {root}/data --exec-root {run}/exec '
        f"--pidfile {run}/docker.pid --iptables=false --bridge=none"
    )
    log = (root / "dockerd.log").open("wb")
    process = subprocess.Popen(["unshare", "-m", "sh", "-c", script, dockerd], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + _START_SECONDS
        while not _answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (root / "dockerd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the boundary dockerd did not start: {tail}")
            time.sleep(0.2)
        _copy_images(url, images)
        yield url
    finally:
        _stop(process, url)
        log.close()
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)


def _stop(process: subprocess.Popen[bytes], url: str) -> None:
    """Remove what the tests left in the engine, then stop it (the process this module started, by its id)."""
    with contextlib.suppress(DockerException):
        client = docker.DockerClient(base_url=url, timeout=30)
        try:
            for container in client.containers.list(all=True):
                with contextlib.suppress(DockerException):
                    container.remove(force=True)
        finally:
            client.close()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _copy_images(url: str, images: list[str]) -> None:
    """`images` from the local engine into the one at `url`, unless it has them."""
    local = docker.from_env(timeout=300)
    other = docker.DockerClient(base_url=url, timeout=300)
    try:
        for image in images:
            try:
                other.images.get(image)
                continue
            except ImageNotFound:
                pass
            with tempfile.TemporaryFile() as archive:
                for chunk in local.images.get(image).save(named=True):
                    archive.write(chunk)
                archive.seek(0)
                other.images.load(archive)
    finally:
        local.close()
        other.close()


@contextmanager
def boundary_podman() -> Generator[str]:
    """The URL of a Podman service across a filesystem boundary. Raises RuntimeError when none can be had."""
    given = os.environ.get(PODMAN_ENV)
    if given:
        yield given
        return
    podman = shutil.which("podman")
    if podman is None:
        raise RuntimeError(f"no podman to start a service across a filesystem boundary (or set {PODMAN_ENV})")
    run = Path(tempfile.mkdtemp(prefix="llm-sandbox-boundary-", dir="/run"))
    url = f"unix://{run}/podman.sock"
    log = (run / "service.log").open("wb")
    script = f'{_PRIVATE} && exec "$0" system service --time=0 {url}'
    process = subprocess.Popen(["unshare", "-m", "sh", "-c", script, podman], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + _START_SECONDS
        while not _answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (run / "service.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the boundary Podman service did not start: {tail}")
            time.sleep(0.2)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(run, ignore_errors=True)
