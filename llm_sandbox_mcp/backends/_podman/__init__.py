"""Podman backend: one hardened container per sandbox, through the podman SDK against the Podman API socket.

The SDK's API client carries every call. Two are written in `libpod`, because the SDK cannot express them:
the container spec (libpod SpecGenerator), and exec start, which needs a two-way socket the SDK does not
give and so speaks HTTP on a connection of its own. Sync calls run in worker threads.
"""

# The podman SDK is unannotated.
# pyright: reportUnknownMemberType=false, reportUnknownVariableType=false, reportUnknownArgumentType=false

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import socket
import sys
import tarfile
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, cast

from podman import PodmanClient
from podman.errors.exceptions import APIError, ImageNotFound, NotFound

from llm_sandbox_mcp.backends import VANISHED_EXIT, ImageBuild, ImageInfo, _owner
from llm_sandbox_mcp.backends._build import follow
from llm_sandbox_mcp.backends._cgroup_memory import ContainerParent, EngineMemoryLimit
from llm_sandbox_mcp.backends._container import (
    CACHE_PREFIX,
    KILL_SIGNAL,
    Process,
    kill_from_outside,
    top_processes,
)
from llm_sandbox_mcp.backends._podman.libpod import ExecStartError, container_spec, exec_body, start_exec
from llm_sandbox_mcp.backends._podman.service import LIMITS_HINT, Candidate, Engine, candidates, connect, detail, find
from llm_sandbox_mcp.backends._stopping import draining
from llm_sandbox_mcp.backends._stream import SocketProcess, pump
from llm_sandbox_mcp.backends._threaded import ThreadedBuilder
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import BackendUnavailable, ImageMissing, SandboxFailure
from llm_sandbox_mcp.models import (
    EGRESS_NETWORK,
    ExecResult,
    HeadTail,
    OutputListener,
    SandboxRef,
    SandboxSpec,
    captures,
)
from llm_sandbox_mcp.seccomp import oci as seccomp

logger = logging.getLogger(__name__)

_JSON = {"Content-Type": "application/json"}
# The project's seccomp profiles live in volumes of the Podman service, one per content, written through the API.
_PROFILE_VOLUME_PREFIX = "llm-sandbox-mcp-seccomp-"
_PROFILE_FILE = "seccomp.json"
_PROFILE_HINT = (
    "the Podman service could not read the seccomp profile this server wrote into its volume. Install the profile "
    "on the Podman host instead (`llm-sandbox-mcp seccomp-profile > /etc/containers/llm-sandbox-mcp.json`) and set "
    "SANDBOX_SECURITY_OPT=no-new-privileges:true,seccomp=/etc/containers/llm-sandbox-mcp.json"
)


def drained(argv: list[str]) -> list[str]:
    """`argv`, then read what is left of stdin: if the process exits with input unread, conmon resets the attach
    socket and Podman loses the rest of the output (and reports `connection reset by peer` as stderr).
    """
    return ["sh", "-c", '"$@"; status=$?; cat >/dev/null; exit $status', "sh", *argv]


def dropped_limits(warnings: Sequence[str]) -> list[str]:
    """Create warnings saying the service will not enforce a limit (rootless Podman without cgroup v2 delegation)."""
    return [w for w in warnings if any(word in w.lower() for word in ("limit", "discarded", "ignored"))]


class PodmanEngine:
    """Sandboxes as Podman containers, with the Docker backend's hardening, limits, labels and cache design."""

    name = "podman"
    install_network = EGRESS_NETWORK  # network none; the tunnel to the egress proxy is the only way out
    # `spec.forks` makes a zygote template container (the template seccomp variant, unmask=ALL).
    template_containers = True

    def __init__(self, sockets: Sequence[Candidate]) -> None:
        self._sockets = list(sockets)
        self._client: PodmanClient | None = None
        self._socket: Candidate | None = None
        self._connect_lock = threading.Lock()
        self._images: set[str] = set()
        # Profile content digest -> its path on the Podman host; written once per server.
        self._profiles: dict[str, str] = {}
        self._profile_lock = threading.Lock()
        # Sandbox id -> the processes `start` began in it, while they are in use.
        self._started: dict[str, weakref.WeakSet[SocketProcess]] = {}
        self._memory = EngineMemoryLimit("podman")

    def limit_sandboxes_together(self, total: int) -> None:
        self._memory.limit(total)

    def sandboxes_memory(self) -> int | None:
        return self._memory.in_use()

    def _cgroup_driver(self) -> tuple[str, int]:
        host: dict[str, Any] = self._podman().info().get("host") or {}
        return str(host.get("cgroupManager")), 2 if host.get("cgroupVersion") == "v2" else 1

    def _seccomp_profile(self, image: str, forks: bool) -> str:
        """The path, on the Podman host, of the project's seccomp profile (its zygote template variant for
        `forks`). libpod takes only a path, and the service's filesystem need not be this server's (a Podman
        machine, a remote service): the profile is written through the API into a volume of the service, by
        copying it into a container (from `image`, never started) that mounts the volume, and the path is that
        volume's mount point on the service's host."""
        content = (seccomp.TEMPLATE_PROFILE_JSON if forks else seccomp.PROFILE_JSON).encode()
        digest = hashlib.sha256(content).hexdigest()[:16]
        with self._profile_lock:
            if digest in self._profiles:
                return self._profiles[digest]
            client = self._podman()
            volume = _PROFILE_VOLUME_PREFIX + digest
            labels = {_owner.MANAGED: "true", _owner.KIND: "seccomp-profile"}
            try:
                client.volumes.create(volume, labels=labels)
            except APIError as exc:
                if "already exists" not in str(exc.explanation):  # else another server made it
                    raise
            body = {
                "image": image,
                "command": ["true"],
                "labels": _owner.owner_labels("seccomp-writer"),
                "netns": {"nsmode": "none"},
                "volumes": [{"Name": volume, "Dest": "/profile"}],
            }
            response = client.api.post("/containers/create", data=json.dumps(body), headers=_JSON)
            response.raise_for_status()
            writer = str(response.json()["Id"])
            try:
                archive = io.BytesIO()
                with tarfile.open(fileobj=archive, mode="w") as tar:
                    member = tarfile.TarInfo(_PROFILE_FILE)
                    member.size, member.mode = len(content), 0o644
                    tar.addfile(member, io.BytesIO(content))
                client.api.put(
                    f"/containers/{writer}/archive", params={"path": "/profile"}, data=archive.getvalue()
                ).raise_for_status()
            finally:
                self.remove(writer)
            mountpoint = str(client.volumes.get(volume).inspect()["Mountpoint"])
            self._profiles[digest] = f"{mountpoint.rstrip('/')}/{_PROFILE_FILE}"
            return self._profiles[digest]

    def _podman(self) -> PodmanClient:
        with self._connect_lock:
            if self._client is None:
                self._client, self._socket = find(self._sockets)
            return self._client

    def create(self, spec: SandboxSpec, track: Callable[[str], None]) -> str:
        api = self._podman().api
        with _failing(f"create a sandbox from {spec.image!r}", seccomp_hint=True):
            self._ensure_image(spec.image)
            if spec.cache is not None and spec.cache.writable:
                self._prepare_cache(spec)
            try:
                created = self._create(spec)
            except ImageNotFound as exc:
                self._images.discard(spec.image)
                raise ImageMissing(f"Image {spec.image!r} left Podman's image store: {detail(exc)}") from exc
        container_id = str(created["Id"])
        track(container_id)
        dropped = dropped_limits(created.get("Warnings") or [])
        if dropped:
            self.remove(container_id)
            raise SandboxFailure(
                f"Podman would not enforce this sandbox's limits ({'; '.join(dropped)}); {LIMITS_HINT}"
            )
        try:
            api.post(f"/containers/{container_id}/start").raise_for_status()
        except APIError as exc:
            self.remove(container_id)
            raise SandboxFailure(f"Podman could not start a sandbox from {spec.image!r}: {detail(exc)}") from exc
        parent = self._memory.parent(self._cgroup_driver)
        if parent is not None:
            self._memory.landed(parent, container_id)
        return container_id

    def _create(self, spec: SandboxSpec, again: bool = True) -> dict[str, Any]:
        """Create the container of `spec`; the service's answer. Raises APIError, ImageNotFound."""
        ours = seccomp.ours_applies(spec.limits.security_opt, spec.limits.privileged)
        profile = self._seccomp_profile(spec.image, spec.forks) if ours else None
        try:
            body = container_spec(spec, _owner.owner_labels(), profile)
        except ValueError as exc:
            raise SandboxFailure(str(exc)) from exc
        try:
            parent = self._memory.parent(self._cgroup_driver)
        except OSError as exc:
            raise SandboxFailure(f"Could not make the cgroup over all sandboxes again: {exc}") from exc
        if parent is not None:
            body["cgroup_parent"] = parent.name
        try:
            response = self._podman().api.post("/containers/create", data=json.dumps(body), headers=_JSON)
            response.raise_for_status(not_found=ImageNotFound)
        except ImageNotFound:
            raise
        except APIError as exc:
            # The profile's volume may have gone since (`podman volume prune` finds it unused): write it again.
            if not again or profile is None or "seccomp profile" not in detail(exc):
                raise
            with self._profile_lock:
                self._profiles.clear()
            return self._create(spec, again=False)
        created: dict[str, Any] = response.json()
        return created

    def _prepare_cache(self, spec: SandboxSpec) -> None:
        """Create the cache volume owned by the sandbox user (a volume option), so the installer needs no root."""
        assert spec.cache is not None
        volumes = self._podman().volumes
        name = CACHE_PREFIX + spec.cache.key
        labels = {_owner.MANAGED: "true", _owner.KIND: "library-cache"}
        try:
            if not volumes.exists(name):
                volumes.create(name, labels=labels, driver_opts={"o": f"uid={spec.limits.uid},gid={spec.limits.gid}"})
        except APIError as exc:
            if "already exists" not in str(exc.explanation):  # else another server made it in between
                raise

    def image_info(self, image: str) -> ImageInfo | None:
        with _failing(f"inspect image {image!r}"):
            try:
                found = self._podman().images.get(image)
            except ImageNotFound:
                return None
        return ImageInfo(str(found.id or ""), dict(found.labels or {}), int(found.attrs.get("Size") or 0))

    def build_image(self, build: ImageBuild, on_line: Callable[[str], None]) -> None:
        # The SDK's images.build reads the whole log before it returns; this streams it as the build goes.
        params = {
            "dockerfile": "Dockerfile",
            "t": build.tag,
            "buildargs": json.dumps(dict(build.args)),
            "labels": json.dumps(dict(build.labels)),
            "pull": build.pull,
            "rm": True,
            "forcerm": True,
            "layers": True,
            **({"networkmode": build.network} if build.network else {}),
        }
        with _failing(f"build {build.tag}"):
            response = self._podman().api.post(
                "/build", params=params, data=build.context, headers={"Content-type": "application/x-tar"}, stream=True
            )
            response.raise_for_status()
            follow(response.iter_lines(), on_line, f"Podman's build of {build.tag}")
        self._images.discard(build.tag)

    def _ensure_image(self, image: str) -> None:
        """Pull a missing image once, so a missing image is a clear error rather than a slow failure later."""
        if image in self._images:
            return
        images = self._podman().images
        if not images.exists(image):
            logger.info("Image %s is not in Podman's image store; pulling it", image)
            errors: list[str] = []
            try:
                progress = cast(Iterable[Any], images.pull(image, stream=True, decode=True, policy="missing"))
                errors += [str(line["error"]) for line in progress if isinstance(line, dict) and line.get("error")]
            except APIError as exc:
                errors.append(detail(exc))
            if not images.exists(image):
                raise ImageMissing(
                    f"Image {image!r} is not in Podman's image store and could not be pulled "
                    f"({'; '.join(errors) or 'no reason given'}). Pull or build it (`podman pull {image}`; Podman "
                    f"keeps its own images, so one that only Docker has needs `docker save {image} | podman load`), "
                    "or point the language's SANDBOX_IMAGE_* variable at an image you have."
                )
        self._images.add(image)

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
        user = _user(ref)
        started = time.monotonic()
        out, err = captures(output_limit, on_output)
        exit_code, timed_out = self._run(
            ref.id, argv, user, env, workdir, stdin, started + timeout, out, err, lambda: self._kill_all(ref.id)
        )
        return ExecResult.captured(exit_code, out, err, timed_out=timed_out, started=started)

    def _run(
        self,
        container_id: str,
        argv: list[str],
        user: str,
        env: dict[str, str],
        workdir: PurePosixPath,
        stdin: bytes,
        deadline: float,
        out: HeadTail,
        err: HeadTail,
        on_timeout: Callable[[], None],
    ) -> tuple[int, bool]:
        """Run to completion or `deadline`; return the exit code and whether the deadline passed."""
        exec_id, sock = self._open_exec(container_id, drained(argv) if stdin else argv, user, env, workdir)
        try:
            timed_out = pump(sock, out, err, deadline, on_timeout, stdin=stdin)
        finally:
            sock.close()
        return self._exit_code(exec_id), timed_out

    def _open_exec(
        self, container_id: str, argv: list[str], user: str, env: dict[str, str], workdir: PurePosixPath
    ) -> tuple[str, socket.socket]:
        client = self._podman()
        assert self._socket is not None
        try:
            response = client.api.post(
                f"/containers/{container_id}/exec", data=json.dumps(exec_body(argv, user, env, workdir)), headers=_JSON
            )
            response.raise_for_status()
        except NotFound as exc:
            raise SandboxFailure(f"The sandbox {container_id[:12]} is gone (killed or removed)") from exc
        except APIError as exc:
            raise SandboxFailure(f"Podman could not run a process in the sandbox: {detail(exc)}") from exc
        exec_id = str(response.json()["Id"])
        try:
            sock = connect(self._socket.url, timeout=30)
        except OSError as exc:
            raise SandboxFailure(f"Podman's socket {self._socket.url} stopped answering: {exc}") from exc
        try:
            start_exec(sock, f"{client.api.path_prefix}exec/{exec_id}/start")
        except (OSError, ExecStartError) as exc:
            sock.close()
            raise SandboxFailure(f"Podman could not start a process in the sandbox: {exc}") from exc
        return exec_id, sock

    def _exit_code(self, exec_id: str) -> int:
        api = self._podman().api
        for _ in range(50):
            try:
                response = api.get(f"/exec/{exec_id}/json")
                response.raise_for_status()
            except APIError:  # the sandbox was removed meanwhile: its processes were killed
                return VANISHED_EXIT
            info: dict[str, Any] = response.json()
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            time.sleep(0.02)
        return -1

    def start(self, ref: SandboxRef, argv: list[str], env: dict[str, str], workdir: PurePosixPath) -> SocketProcess:
        _, sock = self._open_exec(ref.id, argv, _user(ref), env, workdir)
        sock.settimeout(None)
        process = SocketProcess(sock, lambda: None)
        self._started.setdefault(ref.id, weakref.WeakSet()).add(process)
        return process

    def _kill_all(self, container_id: str) -> None:
        """Every process but PID 1 killed from outside (see `_container.INIT`); failing that, the sandbox removed."""
        try:
            engine_pid = int(self._get_json(f"/containers/{container_id}/json")["State"]["Pid"])
            # A killed process is gone only once Podman has passed on its output: the started ones' is read on.
            with draining(list(self._started.get(container_id, ()))):
                settled = kill_from_outside(
                    lambda: self._signal(container_id), lambda: self._top(container_id), engine_pid
                )
            if not settled:
                logger.warning("Could not prove the processes in %s were killed; removing it", container_id[:12])
        except Exception as exc:  # any failure to prove the kill: the sandbox goes instead
            why = detail(exc) if isinstance(exc, APIError) else exc
            logger.warning("Could not kill the processes in %s (%s); removing it", container_id[:12], why)
            settled = False
        if not settled:
            self.remove(container_id)

    def _signal(self, container_id: str) -> None:
        self._podman().api.post(f"/containers/{container_id}/kill", params={"signal": KILL_SIGNAL}).raise_for_status()

    def _top(self, container_id: str) -> list[Process]:
        return top_processes(self._get_json(f"/containers/{container_id}/top", {"ps_args": "pid,ppid,args"}))

    def _get_json(self, path: str, params: dict[str, str] | None = None) -> Any:
        """A GET's JSON answer. Podman 4.3 has been seen answering a container's inspect or `top` with an empty
        body while the container's processes were being killed: asked again (three times at most) before a kill
        is given up on and the sandbox removed."""
        api = self._podman().api
        for attempt in range(3):
            response = api.get(path, params=params)
            response.raise_for_status()
            try:
                return response.json()
            except ValueError:
                if attempt == 2:
                    raise
                time.sleep(0.05)
        raise AssertionError("unreachable")

    def kill_all(self, ref: SandboxRef) -> None:
        self._kill_all(ref.id)

    def remove(self, container_id: str) -> None:
        self._started.pop(container_id, None)
        try:
            self._podman().containers.remove(container_id, force=True, v=True)
        except NotFound:
            pass
        except APIError as exc:
            logger.warning("Could not remove sandbox %s: %s", container_id[:12], exc.explanation)

    def drop_cache(self, key: str) -> None:
        try:
            self._podman().volumes.remove(CACHE_PREFIX + key, force=True)
        except NotFound:
            pass
        except APIError as exc:
            logger.warning("Could not remove library cache %s: %s", key, exc.explanation)

    def sweep(self) -> int:
        with _failing("list sandboxes"):
            containers = self._podman().containers.list(all=True, filters={"label": f"{_owner.MANAGED}=true"})
        stale = [str(c.id) for c in containers if _owner.owner_is_gone(c.labels or {})]
        for container_id in stale:
            self.remove(container_id)
        ContainerParent.sweep("podman")
        return len(stale)

    def describe(self) -> str:
        client = self._podman()
        try:
            engine = Engine.from_info(client.info())
        except APIError as exc:
            raise BackendUnavailable(f"The Podman service does not describe itself ({detail(exc)})") from exc
        found = self._socket
        assert found is not None
        line = (
            f"Podman {engine.version} (API {engine.api_version}, {'rootless' if engine.rootless else 'rootful'}, "
            f"cgroup {engine.cgroup}, {engine.runtime}) at {found.url} (from {found.source})"
        )
        problem = engine.limits_problem()
        if problem is not None:
            raise BackendUnavailable(f"{line}: {problem}")
        return line

    def close(self) -> None:
        self._memory.close()
        if self._client is not None:
            self._client.close()
            self._client = None


@contextlib.contextmanager
def _failing(what: str, seccomp_hint: bool = False) -> Generator[None, None, None]:
    """Engine errors, the service going away included, as SandboxFailure."""
    try:
        yield
    except APIError as exc:
        message = detail(exc)
        hint = f"; {_PROFILE_HINT}" if seccomp_hint and "seccomp profile" in message else ""
        raise SandboxFailure(f"Podman could not {what}: {message}{hint}") from exc


def _user(ref: SandboxRef) -> str:
    return f"{ref.spec.limits.uid}:{ref.spec.limits.gid}"


def from_settings(settings: Settings) -> ThreadedBuilder:
    return ThreadedBuilder(
        PodmanEngine(
            candidates(
                settings.podman_host,
                settings.docker_host,
                os.environ,
                os.getuid() if sys.platform == "linux" else None,
                Path.home(),
                sys.platform,
            )
        )
    )
