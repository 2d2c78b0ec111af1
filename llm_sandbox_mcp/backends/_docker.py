"""Docker backend: one hardened container per sandbox, driven through the docker SDK in worker threads."""

# types-docker leaves some low-level API parameters and results unannotated.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any, cast

import docker
import docker.errors
from docker.models import containers as _sdk_containers
from docker.types import LogConfig, Mount, Ulimit

from llm_sandbox_mcp.backends import VANISHED_EXIT, ImageBuild, ImageInfo, _owner
from llm_sandbox_mcp.backends._build import follow
from llm_sandbox_mcp.backends._cgroup_memory import ContainerParent, EngineMemoryLimit
from llm_sandbox_mcp.backends._container import (
    CACHE_PREFIX,
    INIT,
    KILL_SIGNAL,
    Process,
    kill_from_outside,
    oom_score_adj,
    rlimits,
    top_processes,
)
from llm_sandbox_mcp.backends._docker_discovery import discovered
from llm_sandbox_mcp.backends._endpoints import Candidate
from llm_sandbox_mcp.backends._stream import ExecStream, SocketProcess, pump
from llm_sandbox_mcp.backends._threaded import ThreadedBuilder
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import ImageMissing, SandboxFailure
from llm_sandbox_mcp.models import (
    EGRESS_NETWORK,
    WORKDIR,
    ExecResult,
    Limits,
    OutputListener,
    SandboxRef,
    SandboxSpec,
    captures,
)
from llm_sandbox_mcp.proc_masks import MASKED, READ_ONLY
from llm_sandbox_mcp.seccomp import oci
from llm_sandbox_mcp.seccomp.oci import ours_applies

logger = logging.getLogger(__name__)


def container_options(spec: SandboxSpec, labels: Mapping[str, str]) -> dict[str, Any]:
    """The docker SDK create options that turn `spec` into a hardened container."""
    limits: Limits = spec.limits
    uid, gid = limits.uid, limits.gid
    options: dict[str, Any] = {
        "image": spec.image,
        "command": INIT,
        "user": f"{uid}:{gid}",
        "working_dir": str(WORKDIR),
        "environment": {"HOME": "/tmp"},
        "hostname": "sandbox",
        "labels": dict(labels),
        "network_mode": limits.network_mode,
        "read_only": limits.read_only,
        "cap_drop": list(limits.cap_drop),
        "security_opt": security_options(limits, spec.forks),
        "privileged": limits.privileged,
        "mem_limit": limits.memory_bytes,
        "memswap_limit": limits.memory_bytes,
        "nano_cpus": int(limits.cpus * 1e9),
        "pids_limit": limits.pids,
        "oom_score_adj": oom_score_adj(spec.forks),
        # The engine keeps no log of a sandbox: nothing in it can grow a file on the host that way.
        "log_config": LogConfig(type=LogConfig.types.NONE),
        # Not the operator's ~/.docker/config.json proxies: nothing of the host's reaches a sandbox.
        "use_config_proxy": False,
        "ulimits": [Ulimit(name=name, soft=value, hard=value) for name, value in rlimits(limits).items()],
        "tmpfs": {
            str(WORKDIR): f"rw,exec,nosuid,nodev,size={limits.workspace_bytes},uid={uid},gid={gid},mode=0700",
            "/tmp": f"rw,exec,nosuid,nodev,size={limits.tmp_bytes},mode=1777",
        },
    }
    mounts: list[Mount] = []
    if spec.cache is not None:
        mounts.append(
            Mount(
                target=str(spec.cache.target),
                source=CACHE_PREFIX + spec.cache.key,
                type="volume",
                read_only=not spec.cache.writable,
            )
        )
    if mounts:
        options["mounts"] = mounts
    return options


def security_options(limits: Limits, forks: bool = False) -> list[str]:
    """SANDBOX_SECURITY_OPT, plus the project's seccomp profile unless the operator chose one (its template
    variant for a zygote template container, `forks`).

    Docker applies one profile: ours replaces its default, and restates that default's denials. The API takes
    the profile's content, so an operator's `seccomp=PATH` (the CLI's form) is read here.
    """
    options: list[str] = []
    for option in limits.security_opt:
        key, _, value = option.partition("=")
        if key == "seccomp" and value.startswith("/") and os.path.isfile(value):
            with open(value, encoding="utf-8") as profile:
                option = f"seccomp={profile.read()}"
        options.append(option)
    if ours_applies(limits.security_opt, limits.privileged):
        options.append(f"seccomp={oci.TEMPLATE_PROFILE_JSON if forks else oci.PROFILE_JSON}")
    return options


class DockerEngine:
    """Sandboxes as Docker containers, through the synchronous SDK (`Threaded` makes it a Backend)."""

    name = "docker"
    install_network = EGRESS_NETWORK  # network none; the tunnel to the egress proxy is the only way out
    # `spec.forks` makes a zygote template container (the template seccomp variant, unmasked /proc and /sys).
    template_containers = True

    def __init__(self, base_url: str | None) -> None:
        self._base_url = base_url
        self._client: docker.DockerClient | None = None
        self._found: Candidate | None = None
        self._connect_lock = threading.Lock()
        self._images: set[str] = set()
        self._memory = EngineMemoryLimit("docker")

    def limit_sandboxes_together(self, total: int) -> None:
        self._memory.limit(total)

    def sandboxes_memory(self) -> int | None:
        return self._memory.in_use()

    def _cgroup_driver(self) -> tuple[str, int]:
        info = self._docker().info()
        return str(info.get("CgroupDriver")), int(info.get("CgroupVersion") or 1)

    def _docker(self) -> docker.DockerClient:
        with self._connect_lock:
            if self._client is None:
                self._client, self._found = discovered(self._base_url, sys.platform)
            return self._client

    def create(self, spec: SandboxSpec, track: Callable[[str], None]) -> str:
        client = self._docker()
        self._ensure_image(spec.image)
        if spec.cache is not None and spec.cache.writable:
            self._prepare_cache(spec)
        options = container_options(spec, _owner.owner_labels())
        try:
            parent = self._memory.parent(self._cgroup_driver)
        except OSError as exc:
            raise SandboxFailure(f"Could not make the cgroup over all sandboxes again: {exc}") from exc
        if parent is not None:
            options["cgroup_parent"] = parent.name
        try:
            container_id: str = self._create(options, unmasked=spec.forks)
        except docker.errors.APIError as exc:
            raise SandboxFailure(f"Docker could not create a sandbox from {spec.image!r}: {exc.explanation}") from exc
        track(container_id)
        try:
            client.api.start(container_id)
        except docker.errors.APIError as exc:
            self.remove(container_id)
            raise SandboxFailure(f"Docker could not start a sandbox from {spec.image!r}: {exc.explanation}") from exc
        if parent is not None:
            self._memory.landed(parent, container_id)
        return container_id

    def _create(self, options: dict[str, Any], unmasked: bool) -> str:
        """Create a container from `container_options` with what the other engines mask of /proc and /sys masked
        too (Docker's own list lacks /proc/interrupts), or, `unmasked`, with nothing masked or read-only there
        (the CLI's `systempaths=unconfined`), so that a zygote template's children can mount a /proc of their
        own; each child masks those paths again. The SDK has no option for either."""
        client = self._docker()
        # The SDK's own mapping of these options to the API's: private (and not in its type stubs), but the one
        # `containers.create` uses.
        make_arguments: Callable[[dict[str, Any]], dict[str, Any]] = getattr(  # noqa: B009
            _sdk_containers, "_create_container_args"
        )
        arguments = make_arguments({**options, "version": client.api.api_version})
        if unmasked:
            arguments["host_config"].update({"MaskedPaths": [], "ReadonlyPaths": []})
        else:
            arguments["host_config"].update({"MaskedPaths": list(MASKED), "ReadonlyPaths": list(READ_ONLY)})
        return str(client.api.create_container(**arguments)["Id"])

    def _prepare_cache(self, spec: SandboxSpec) -> None:
        """Create the cache volume owned by the sandbox user, so the installer needs no root."""
        assert spec.cache is not None
        client = self._docker()
        name = CACHE_PREFIX + spec.cache.key
        client.volumes.create(name, labels={_owner.MANAGED: "true", _owner.KIND: "library-cache"})
        owner = f"{spec.limits.uid}:{spec.limits.gid}"
        try:
            client.containers.run(
                spec.image,
                ["chown", owner, "/cache"],
                user="0:0",
                network_mode="none",
                cap_drop=["ALL"],
                cap_add=["CHOWN"],
                security_opt=["no-new-privileges:true"],
                mounts=[Mount(target="/cache", source=name, type="volume")],
                labels=_owner.owner_labels("cache-init"),
                remove=True,
            )
        except docker.errors.DockerException as exc:
            raise SandboxFailure(f"Docker could not prepare the library cache: {exc}") from exc

    def _ensure_image(self, image: str) -> None:
        """Pull a missing image once, so a missing image is a clear error rather than a slow failure later."""
        if image in self._images:
            return
        try:
            self._docker().images.get(image)
        except docker.errors.ImageNotFound:
            self._pull(image)
        self._images.add(image)

    def _pull(self, image: str) -> None:
        logger.info("Image %s is not on the engine; pulling it", image)
        try:
            self._docker().images.pull(image)
        except docker.errors.APIError as exc:
            raise ImageMissing(
                f"Image {image!r} is not on the Docker engine and could not be pulled ({exc.explanation}). "
                f"Pull or build it (`docker pull {image}`), or point the language's SANDBOX_IMAGE_* variable "
                "at an image you have."
            ) from exc

    def image_info(self, image: str) -> ImageInfo | None:
        try:
            found = self._docker().images.get(image)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise SandboxFailure(f"Docker could not inspect image {image!r}: {exc.explanation}") from exc
        return ImageInfo(found.id or "", dict(found.labels or {}), int(found.attrs.get("Size") or 0))

    def build_image(self, build: ImageBuild, on_line: Callable[[str], None]) -> None:
        try:
            chunks = self._docker().api.build(
                fileobj=io.BytesIO(build.context),
                custom_context=True,
                tag=build.tag,
                buildargs=dict(build.args),
                labels=dict(build.labels),
                network_mode=build.network,
                pull=build.pull,
                rm=True,
                forcerm=True,
                decode=True,
            )
            follow(chunks, on_line, f"Docker's build of {build.tag}")
        except docker.errors.DockerException as exc:
            raise SandboxFailure(f"Docker could not build {build.tag}: {exc}") from exc
        self._images.discard(build.tag)

    def exec(
        self,
        ref: SandboxRef,
        argv: list[str],
        timeout: float,
        stdin: bytes,
        env: dict[str, str],
        workdir: PurePosixPath,
        output_limit: int | None,
        on_output: OutputListener | None = None,
    ) -> ExecResult:
        api = self._docker().api
        user = _user(ref)
        started = time.monotonic()
        try:
            exec_id: str = api.exec_create(
                ref.id, argv, stdin=True, stdout=True, stderr=True, user=user, environment=env, workdir=str(workdir)
            )["Id"]
            stream = api.exec_start(exec_id, socket=True)
        except docker.errors.NotFound as exc:
            raise SandboxFailure(f"The sandbox {ref.id[:12]} is gone (killed or removed)") from exc
        except docker.errors.APIError as exc:
            raise SandboxFailure(f"Docker could not run a process in the sandbox: {exc.explanation}") from exc
        sock = _exec_stream(stream)
        out, err = captures(output_limit, on_output)
        try:
            timed_out = pump(sock, out, err, started + timeout, lambda: self._kill_all(ref.id), stdin=stdin)
        finally:
            stream.close()
            sock.close()
        exit_code = self._exit_code(exec_id)
        return ExecResult.captured(exit_code, out, err, timed_out=timed_out, started=started)

    def start(self, ref: SandboxRef, argv: list[str], env: dict[str, str], workdir: PurePosixPath) -> SocketProcess:
        api = self._docker().api
        user = _user(ref)
        try:
            exec_id: str = api.exec_create(
                ref.id, argv, stdin=True, stdout=True, stderr=True, user=user, environment=env, workdir=str(workdir)
            )["Id"]
            stream = api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as exc:
            raise SandboxFailure(f"Docker could not start a process in the sandbox: {exc.explanation}") from exc
        return SocketProcess(_exec_stream(stream), stream.close)

    def _exit_code(self, exec_id: str) -> int:
        api = self._docker().api
        for _ in range(50):
            try:
                info = api.exec_inspect(exec_id)
            except docker.errors.NotFound:
                return VANISHED_EXIT  # removed (the kill fallback): its processes were killed
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.02)
        return -1

    def _kill_all(self, container_id: str) -> None:
        """Every process but PID 1 killed from outside (see `_container.INIT`); failing that, the sandbox removed."""
        api = self._docker().api
        try:
            engine_pid = int(api.inspect_container(container_id)["State"]["Pid"])
            settled = kill_from_outside(
                lambda: api.kill(container_id, KILL_SIGNAL), lambda: self._top(container_id), engine_pid
            )
        except Exception as exc:  # any failure to prove the kill: the sandbox goes instead
            logger.warning("Could not kill the processes in %s (%s); removing it", container_id[:12], exc)
            settled = False
        if not settled:
            self.remove(container_id)

    def _top(self, container_id: str) -> list[Process]:
        return top_processes(self._docker().api.top(container_id, ps_args="-o pid,ppid,args"))

    def kill_all(self, ref: SandboxRef) -> None:
        self._kill_all(ref.id)

    def remove(self, container_id: str) -> None:
        try:
            self._docker().api.remove_container(container_id, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                logger.warning("Could not remove sandbox %s: %s", container_id[:12], exc.explanation)

    def drop_cache(self, key: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self._docker().api.remove_volume(CACHE_PREFIX + key, force=True)

    def sweep(self) -> int:
        api = self._docker().api
        stale = [
            c["Id"]
            for c in api.containers(all=True, filters={"label": f"{_owner.MANAGED}=true"})
            if _owner.owner_is_gone(c.get("Labels") or {})
        ]
        for container_id in stale:
            self.remove(container_id)
        ContainerParent.sweep("docker")
        return len(stale)

    def describe(self) -> str:
        version = self._docker().version()
        assert self._found is not None
        where = f"{self._found.url} (from {self._found.source})"
        return f"Docker Engine {version.get('Version')} (API {version.get('ApiVersion')}) at {where}"

    def close(self) -> None:
        self._memory.close()
        if self._client is not None:
            self._client.close()
            self._client = None


def _exec_stream(stream: object) -> ExecStream:
    """The stream under what `exec_start(socket=True)` returned: a socket, or on Windows the SDK's named pipe."""
    return cast(ExecStream, getattr(stream, "_sock", stream))


def _user(ref: SandboxRef) -> str:
    return f"{ref.spec.limits.uid}:{ref.spec.limits.gid}"


def from_settings(settings: Settings) -> ThreadedBuilder:
    return ThreadedBuilder(DockerEngine(settings.docker_host))
