"""A Backend over an engine whose SDK blocks (Docker, Podman, Kubernetes): every call in a worker thread.

The engines write only what differs between them, synchronously; this adaptor gives them the async Backend
interface and keeps the one record of which sandboxes this process made, so `aclose` removes them all.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Generic, Protocol, TypeVar

import anyio.from_thread
import anyio.to_thread

from llm_sandbox_mcp.backends import ImageBuild, ImageInfo, SandboxProcess, SharedMemoryLimit
from llm_sandbox_mcp.errors import EngineStalled, SandboxFailure
from llm_sandbox_mcp.models import WORKDIR, ExecResult, OutputListener, SandboxRef, SandboxSpec, Stream

# An engine call that runs a process returns by itself once the process's timeout has passed (the engine kills
# it and drains its stream); past this much more it is hung in the engine (an exec that never starts, a request
# write that never completes) and is abandoned, so a call is bounded by its own timeout, not the SDK client's.
ENGINE_GRACE = 15.0
_START_SECONDS = 60.0

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Engine(Protocol):
    """The blocking half of a backend. Same contract as `Backend`, method for method, by sandbox id."""

    name: str
    install_network: str
    template_containers: bool
    """Whether `create` makes a zygote template container for a spec with `forks` (`TemplateContainers`)."""

    def create(self, spec: SandboxSpec, track: Callable[[str], None], /) -> str:
        """Make a running sandbox and return its id; call `track(id)` as soon as it exists on the engine, so
        it is removed at close even when starting it fails or is abandoned."""
        ...

    def exec(
        self,
        ref: SandboxRef,
        argv: list[str],
        timeout: float,
        stdin: bytes,
        env: dict[str, str],
        workdir: PurePosixPath,
        output_limit: int | None,
        on_output: OutputListener | None,
        /,
    ) -> ExecResult:
        """As `Backend.exec`, but `on_output` is called in the worker thread that runs this."""
        ...

    def start(
        self, ref: SandboxRef, argv: list[str], env: dict[str, str], workdir: PurePosixPath
    ) -> SandboxProcess: ...

    def kill_all(self, ref: SandboxRef, /) -> None: ...

    def remove(self, sandbox_id: str, /) -> None:
        """Remove a sandbox and everything in it. Idempotent; logs what it cannot do, never raises."""
        ...

    def drop_cache(self, key: str, /) -> None: ...

    def sweep(self) -> int: ...

    def describe(self) -> str: ...

    def close(self) -> None:
        """Release the engine connection."""
        ...


class Threaded:
    """`Backend` for an `Engine`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.name = engine.name
        self.install_network = engine.install_network
        self.template_containers = engine.template_containers
        self._live: set[str] = set()
        self._lock = threading.Lock()

    def _track(self, sandbox_id: str) -> None:
        with self._lock:
            self._live.add(sandbox_id)

    def _remove(self, sandbox_id: str) -> None:
        with self._lock:
            self._live.discard(sandbox_id)
        self.engine.remove(sandbox_id)

    async def create(self, spec: SandboxSpec) -> SandboxRef:
        sandbox_id = await anyio.to_thread.run_sync(self.engine.create, spec, self._track)
        return SandboxRef(id=sandbox_id, spec=spec)

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
        relay = None if on_output is None else _into_event_loop(on_output)
        work = functools.partial(
            self.engine.exec, ref, list(argv), timeout, stdin, dict(env or {}), workdir, output_limit, relay
        )
        return await self._bounded(ref, timeout + ENGINE_GRACE, f"finish a {timeout:g} s run", work)

    async def start(
        self,
        ref: SandboxRef,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: PurePosixPath = WORKDIR,
    ) -> SandboxProcess:
        work = functools.partial(self.engine.start, ref, list(argv), dict(env or {}), workdir)
        return await self._bounded(ref, _START_SECONDS, "start a process", work, _close_process)

    async def _bounded(
        self,
        ref: SandboxRef,
        bound: float,
        what: str,
        work: Callable[[], T],
        discard: Callable[[T], Awaitable[None]] | None = None,
    ) -> T:
        """Run a blocking engine call on `ref` in a worker thread, for at most `bound` seconds.

        A cancelled caller waits for the call to return, as a call that cannot be interrupted must (whoever runs a
        program kills it meanwhile: `stop_on_cancel`), but not past `bound`; a call its thread had not taken up
        yet never runs. An engine call still running at `bound` is hung (an exec that never starts, a request
        write that never completes): the sandbox's processes are killed so it can return, and the caller goes on
        without it (SandboxFailure, or its cancellation). What a call returns after its caller was cancelled goes
        to `discard` (a started process is closed, not dropped with its stream open).
        """
        call = _Call(work)
        deadline = anyio.current_time() + bound
        try:
            with anyio.move_on_after(bound):
                return await anyio.to_thread.run_sync(call.run, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                if call.started_or_give_up():
                    left = max(0.0, deadline - anyio.current_time())
                    if not await anyio.to_thread.run_sync(call.returned.wait, left, abandon_on_cancel=True):
                        await self._kill_until(ref, call.returned)
                    if discard is not None and call.outcome:
                        await discard(call.outcome[0])
            raise
        if call.started_or_give_up():
            await self._kill_until(ref, call.returned)
            if discard is not None and call.outcome:
                await discard(call.outcome[0])
        raise EngineStalled(f"The {self.name} engine did not {what} within {bound:g} s")

    async def _kill_until(self, ref: SandboxRef, returned: threading.Event) -> None:
        """Kill every process in the sandbox, again each second, until a hung engine call has returned (or a
        grace has passed: an engine that answers nothing cannot be waited for)."""
        with anyio.move_on_after(ENGINE_GRACE):
            while not returned.is_set():
                try:
                    await anyio.to_thread.run_sync(self.engine.kill_all, ref, abandon_on_cancel=True)
                except SandboxFailure as exc:  # the sandbox is gone: so is everything that ran in it
                    logger.info("Could not kill the processes of %s: %s", ref.id[:12], exc)
                await anyio.to_thread.run_sync(returned.wait, 1.0, abandon_on_cancel=True)

    async def kill_all(self, ref: SandboxRef) -> None:
        await anyio.to_thread.run_sync(self.engine.kill_all, ref)

    async def destroy(self, ref: SandboxRef) -> None:
        await anyio.to_thread.run_sync(self._remove, ref.id)

    async def drop_cache(self, key: str) -> None:
        await anyio.to_thread.run_sync(self.engine.drop_cache, key)

    async def sweep(self) -> int:
        return await anyio.to_thread.run_sync(self.engine.sweep)

    async def describe(self) -> str:
        return await anyio.to_thread.run_sync(self.engine.describe)

    def limit_sandboxes_together(self, total: int) -> None:
        """`SharedMemoryLimit`, where the engine has it; a no-op where it has not."""
        if isinstance(self.engine, SharedMemoryLimit):
            self.engine.limit_sandboxes_together(total)

    def sandboxes_memory(self) -> int | None:
        return self.engine.sandboxes_memory() if isinstance(self.engine, SharedMemoryLimit) else None

    async def aclose(self) -> None:
        await anyio.to_thread.run_sync(self._close)

    def _close(self) -> None:
        with self._lock:
            live, self._live = list(self._live), set()
        for sandbox_id in live:
            self.engine.remove(sandbox_id)
        self.engine.close()


class ImageEngine(Engine, Protocol):
    """An engine that also builds images (`ImageBuilder`, blocking)."""

    def image_info(self, image: str, /) -> ImageInfo | None: ...

    def build_image(self, build: ImageBuild, on_line: Callable[[str], None], /) -> None: ...


class ThreadedBuilder(Threaded):
    """`Backend` and `ImageBuilder` for an `ImageEngine`."""

    def __init__(self, engine: ImageEngine) -> None:
        super().__init__(engine)
        self.builder = engine

    async def image_info(self, image: str) -> ImageInfo | None:
        return await anyio.to_thread.run_sync(self.builder.image_info, image)

    async def build_image(self, build: ImageBuild, on_line: Callable[[str], None]) -> None:
        def relay(line: str) -> None:
            anyio.from_thread.run_sync(on_line, line)

        # Not bounded (a build takes minutes), but abandoned on cancellation, so that shutting down does not wait
        # for a build: the engine stops it when its connection closes with the process.
        await anyio.to_thread.run_sync(self.builder.build_image, build, relay, abandon_on_cancel=True)


class _Call(Generic[T]):
    """One blocking engine call handed to a worker thread, which may take it up after its caller gave up."""

    def __init__(self, work: Callable[[], T]) -> None:
        self._work = work
        self._gate = threading.Lock()
        self._started = False
        self._given_up = False
        self.returned = threading.Event()
        # What the call returned, once it has.
        self.outcome: list[T] = []

    def run(self) -> T:
        with self._gate:
            if self._given_up:
                raise SandboxFailure("the engine call was given up before it started")
            self._started = True
        try:
            self.outcome.append(self._work())
            return self.outcome[0]
        finally:
            self.returned.set()

    def started_or_give_up(self) -> bool:
        """True when the call is running or ran; otherwise it never will."""
        with self._gate:
            self._given_up = not self._started
            return self._started


async def _close_process(process: SandboxProcess) -> None:
    await process.aclose()


def _into_event_loop(listener: OutputListener) -> OutputListener:
    """`listener`, callable from a worker thread: each call runs in the event loop's thread."""

    def relay(stream: Stream, data: bytes) -> None:
        anyio.from_thread.run_sync(listener, stream, data)

    return relay
