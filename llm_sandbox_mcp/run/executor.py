"""Runs code: a validated program, a sandbox (from the warm pool, or a session's), one run, one outcome.

`Executor.execute` is a one-shot call; `Executor.run` is the single seam every run goes through, one-shot or
a session's cell.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field, replace
from types import TracebackType

import anyio
import anyio.to_thread

from llm_sandbox_mcp import images
from llm_sandbox_mcp.artifacts import Artifact, collect
from llm_sandbox_mcp.backends import Backend, stop_on_cancel
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.egress.tunnel import Tunnels
from llm_sandbox_mcp.errors import InvalidRequest, SandboxFailure
from llm_sandbox_mcp.images.background import ProjectImages
from llm_sandbox_mcp.languages import COMPILE_FAILED_MARKER, Language, get_language
from llm_sandbox_mcp.models import (
    MAX_CODE_BYTES,
    OUTPUT_DIR,
    WORKDIR,
    CacheMount,
    ExecResult,
    Execution,
    Limits,
    Live,
    SandboxRef,
    SandboxSpec,
)
from llm_sandbox_mcp.run.budget import MemoryBudget
from llm_sandbox_mcp.run.build_cache import BUILD_PIPE_ENV, RUN_SCRIPTS, BuildCache, Plan
from llm_sandbox_mcp.run.environment import run_env
from llm_sandbox_mcp.run.forking import READY_SECONDS, Forks, ForksUnavailable
from llm_sandbox_mcp.run.hints import missing_library_hint
from llm_sandbox_mcp.run.kernel import Kernel, KernelDied, SandboxRefused, drop_uncollected_files
from llm_sandbox_mcp.run.libraries import LibraryCache
from llm_sandbox_mcp.run.pool import Pool
from llm_sandbox_mcp.run.transfer import unpack
from llm_sandbox_mcp.run.zygote import Zygotes

logger = logging.getLogger(__name__)


class _StaleBinary(Exception):
    """A binary from the build cache did not start: the run is made again with a build."""


@dataclass(frozen=True)
class Program:
    """Code to run, validated: a known language, a bounded source, a timeout within the maximum."""

    language: Language
    source: bytes
    timeout: float
    libraries: list[str]


@dataclass
class Cell:
    """What a session carries from one run to the next."""

    number: int = 0
    # For languages without a kernel: what the output directory held after the last run.
    seen: dict[str, tuple[int, bytes | None]] = field(default_factory=lambda: {})

    def changed(self, artifacts: list[Artifact]) -> list[Artifact]:
        current = {a.name: (a.size, a.data) for a in artifacts}
        fresh = [a for a in artifacts if self.seen.get(a.name) != current[a.name]]
        self.seen = current
        return fresh


@dataclass(frozen=True)
class WarmKey:
    """What makes two sandboxes interchangeable in the pool."""

    language: str
    spec: SandboxSpec


@dataclass
class Lease:
    """A sandbox ready for runs, with its warm interpreter or runner when the language has one."""

    ref: SandboxRef
    language: Language
    kernel: Kernel | None = None
    # What this sandbox holds of the server's memory budget.
    charged: int = 0
    # From the pool, used by exactly one run and destroyed afterwards (not a session's); a zygote template
    # container (`spec.forks`) may serve more runs, each in a sandbox of its own (`forking`).
    one_shot: bool = True
    calls: int = 0


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


class Executor:
    """Runs code on one backend, through the warm pool, with libraries from the install cache.

    Use as an async context manager: it owns the pool's background work.
    """

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self.backend = backend
        self.limits = settings.limits()
        self.budget = MemoryBudget(settings.memory_budget())
        # Where the egress tunnels of installers and sessions run.
        self.tunnels = Tunnels()
        self.libraries = LibraryCache(settings, backend, self.limits, self.budget, self.tunnels)
        self.pool: Pool[WarmKey, Lease] = Pool(
            self._make_lease,
            self._dispose_lease,
            settings.sandbox_pool_size,
            # Under load a key keeps up to one ready sandbox per call that may run at once.
            max_size=settings.sandbox_max_concurrency,
            can_grow=self._room_to_grow,
        )
        # Sandbox kinds whose image could not start the warm runner (no perl, say): they run one exec per call.
        self._cold: set[WarmKey] = set()
        self.limiter = anyio.CapacityLimiter(settings.sandbox_max_concurrency)
        self.images = ProjectImages(settings, backend, self._switched)
        self.libraries.image_of = self.images.image
        # Languages warmed ahead of calls: warmed again on their project image once it is built.
        self._warmed: set[str] = set()
        self.zygotes = Zygotes(settings, backend, self.budget)
        self.forks = Forks(settings, backend.name)
        self.builds = BuildCache(backend, settings.sandbox_build_cache_size)
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Executor:
        async with contextlib.AsyncExitStack() as stack:
            # Left in reverse: the zygotes (which use the pool's budget) first, the tunnels last.
            await stack.enter_async_context(self.tunnels)
            await stack.enter_async_context(self.pool)
            await stack.enter_async_context(self.zygotes)
            await stack.enter_async_context(self.images)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.__aexit__(exc_type, exc, tb)

    def program(self, code: str, language: str, libraries: list[str], timeout: float | None) -> Program:
        """Validate a request to run code. Raises InvalidRequest saying what to change."""
        lang = get_language(language)
        source = code.encode("utf-8", errors="replace")
        if len(source) > MAX_CODE_BYTES:
            raise InvalidRequest(f"code is {len(source)} bytes; the limit is {MAX_CODE_BYTES} bytes")
        return Program(lang, source, self._timeout(timeout), lang.check_libraries(libraries))

    def _timeout(self, timeout: float | None) -> float:
        if timeout is None:
            return self.settings.sandbox_timeout
        if timeout <= 0:
            raise InvalidRequest("timeout must be a positive number of seconds")
        if timeout > self.settings.sandbox_max_timeout:
            raise InvalidRequest(
                f"timeout {timeout:g} s is above the maximum of {self.settings.sandbox_max_timeout:g} s "
                "(SANDBOX_MAX_TIMEOUT); use a smaller timeout or split the work"
            )
        return timeout

    def spec_for(self, language: Language, cache_key: str | None = None, limits: Limits | None = None) -> SandboxSpec:
        """The sandbox of `language` (on the image `images.prepare` found for it)."""
        cache = CacheMount(cache_key) if cache_key else None
        return SandboxSpec(self.images.image(language.name), limits or self.limits, cache)

    async def _spec(
        self, lang: Language, libraries: list[str], limits: Limits | None = None, live: Live | None = None
    ) -> SandboxSpec:
        """The sandbox a run needs: on the project image once it is built (the base image meanwhile, and then
        `live` says so), its libraries installed when it has any."""
        await self.images.prepare(lang.name)
        if live is not None and self.images.pending(lang.name) is not None:
            base = self.settings.base_image_for(lang.name)

            def note() -> str:
                pending = self.images.pending(lang.name)
                return f" (on the base image {base}: {pending or 'the project image is ready for the next calls'})"

            live.note = note
        key = None
        if self.libraries.needed(lang, libraries):
            if live is not None:
                live.phase = f"installing {', '.join(libraries)}" if libraries else "preparing the build cache"
            key = await self.libraries.ensure(lang, libraries)
        return self.spec_for(lang, key, limits)

    async def warm(self, language: Language) -> None:
        """Have sandboxes for `language` (without libraries) ready before the first call."""
        await self.images.prepare(language.name)
        self._warmed.add(language.name)
        spec = self.spec_for(language)
        if self.zygotes.serves(language, spec):
            self.zygotes.warm(language, spec)
        else:
            self.pool.warm(WarmKey(language.name, self.forks.spec(language, spec)))

    async def execute(
        self,
        code: str,
        language: str = "python",
        libraries: list[str] | None = None,
        timeout: float | None = None,
        live: Live | None = None,
    ) -> Execution:
        """Run code once in a fresh sandbox from the pool, which is destroyed afterwards (also when cancelled)."""
        return await self.execute_program(self.program(code, language, libraries or [], timeout), live)

    async def execute_program(self, program: Program, live: Live | None = None) -> Execution:
        """`execute` for a program already validated (`program`)."""
        live = live or Live()
        live.phase = "waiting for a free slot (SANDBOX_MAX_CONCURRENCY)"
        async with self.limiter:
            spec = await self._spec(program.language, program.libraries, live=live)
            live.phase = "starting the sandbox"
            forked = await self.zygotes.run(program.language, spec, _decode(program.source), program.timeout, live)
            if forked is not None:
                return self._shape(program.language, forked, program.timeout, False, spec)
            for cached in (True, False):
                live.phase = "starting the sandbox"
                key, lease = await self._acquire(program.language, spec)
                again = False
                try:
                    execution = await self.run(lease, program, live=live, cached=cached)
                    lease.calls += 1
                    self.forks.served += key.spec.forks
                    alive = lease.kernel is not None and lease.kernel.alive and not lease.kernel.collect_outside
                    again = self.forks.reusable(lease.ref.spec, execution, lease.calls, alive)
                    return execution
                except _StaleBinary:
                    logger.info("A cached %s binary did not start; building it again", program.language.title)
                finally:
                    if again:
                        await self.pool.recycle(key, lease, self._ready_again)
                    else:
                        await self.pool.release(lease, key if key.spec.forks else None)
            raise AssertionError("unreachable: a run without the build cache never raises _StaleBinary")

    async def _acquire(self, lang: Language, spec: SandboxSpec) -> tuple[WarmKey, Lease]:
        """A sandbox for a one-shot run: a template container's (lent) where one serves this kind, else a pooled
        one, also when the template container could not be had (the call never fails for that)."""
        forking = self.forks.spec(lang, spec)
        if forking.forks:
            key = WarmKey(lang.name, forking)
            try:
                return key, await self.pool.acquire(key, lend=True)
            except ForksUnavailable:
                pass
            except SandboxFailure as exc:
                logger.info("No zygote template container for this call (%s); it takes the pool", exc)
        key = WarmKey(lang.name, spec)
        return key, await self.pool.acquire(key)

    async def _ready_again(self, lease: Lease) -> bool:
        """Whether a template container's kernel has the next call's sandbox ready (the last call's processes
        all gone)."""
        if lease.kernel is None:
            return False
        try:
            await lease.kernel.next_call(READY_SECONDS)
        except SandboxFailure as exc:
            logger.info("A zygote template container is not reused: %s", exc)
            return False
        self.forks.recycled += 1
        return True

    async def check_zygote(self, lang: Language) -> str:
        """For `doctor`: whether Python one-shot calls fork their sandboxes here (bubblewrap or containers)."""
        await self.images.prepare(lang.name)
        spec = self.spec_for(lang)
        if not self.forks.enabled:
            return await self.zygotes.check(lang, spec)
        served = self.forks.served
        execution = await self.execute("print(1)", lang.name, timeout=30)
        forked = self.forks.served > served
        return self.forks.status(spec, forked and execution.exit_code == 0 and execution.stdout == "1\n")

    async def open(
        self, lang: Language, libraries: list[str], limits: Limits, live: Live | None = None, egress: bool = False
    ) -> Lease:
        """A sandbox of its own (with its interpreter) for a session, outside the pool; `egress`: whether it may
        reach an egress proxy (through a relay the caller starts)."""
        spec = replace(await self._spec(lang, libraries, limits, live), egress=egress)
        if live is not None:
            live.phase = "starting the sandbox"
        return await self._make_lease(WarmKey(lang.name, spec), False, one_shot=False)

    async def close(self, lease: Lease) -> None:
        with anyio.CancelScope(shield=True):
            await self._dispose_lease(lease)

    async def run(
        self, lease: Lease, program: Program, cell: Cell | None = None, live: Live | None = None, cached: bool = True
    ) -> Execution:
        """Run a program in a leased sandbox. With a `cell` (a session) the interpreter keeps its state, a lost
        one is started again first, and only files that changed since the last cell come back. A compiled
        program's one-shot run uses the build cache (a hit only when `cached`) and raises _StaleBinary when a
        cached binary failed to start.

        Output reaches `live` as it arrives. Cancelling
        the caller stops the run first: a cell is interrupted as at a timeout (the session stays usable), and
        anything else is killed from outside with every process in the sandbox.
        """
        lang = program.language
        live = live or Live()
        notes: list[str] = []
        if cell is not None:
            cell.number += 1
            if await self._revive(lease):
                notes.append("[the interpreter had been lost and was restarted: earlier variables are gone]\n")
        live.phase = f"running {lang.name}" + (f" (cell {cell.number})" if cell is not None else "")
        kernel = lease.kernel
        if kernel is not None:
            plan = await self._build_plan(lease, program, cached)
            result = await kernel.run(
                (f"{plan.mode}\n" if plan is not None else "") + _decode(program.source),
                mode="fork" if cell is None else "inline",
                echo=cell is not None,
                filename=str(WORKDIR / lang.file_name) if cell is None else f"<cell {cell.number}>",
                timeout=program.timeout,
                output_limit=self.settings.sandbox_output_limit,
                artifact_limit=self.settings.sandbox_artifact_limit,
                live=live,
                binary=plan.binary if plan is not None else None,
                build_limit=plan.limit if plan is not None and plan.mode == "capture" else 0,
            )
            if plan is not None:
                self._keep_build(plan, kernel, result)
            if kernel.collect_outside and cell is None and lease.ref.spec.forks:
                drop_uncollected_files(result)
            elif kernel.collect_outside and cell is None:
                # The runner could not collect with nothing of the program left running; the kernel has killed
                # everything from outside since, so the files are read from outside.
                result.artifacts = await self._outputs_from_outside(lease.ref, result)
        else:
            ref = lease.ref
            result = await stop_on_cancel(
                self.backend,
                ref,
                lambda: self.backend.exec(
                    ref,
                    lang.run_argv(),
                    timeout=program.timeout,
                    stdin=program.source,
                    env=run_env(lang, ref.spec),
                    output_limit=self.settings.sandbox_output_limit,
                    on_output=live.feed,
                ),
            )
            # Nothing of the program may still run while its files are read: no process swaps them mid-read.
            await self.backend.kill_all(lease.ref)
            outputs = await self._outputs_from_outside(lease.ref, result)
            result.artifacts = cell.changed(outputs) if cell is not None else outputs
        # A one-shot sandbox is destroyed after the run anyway: only a session can lose its interpreter.
        lost = result.interpreter_lost and cell is not None
        execution = self._shape(lang, result, program.timeout, lost, lease.ref.spec)
        if lost:
            execution.stderr += "[the interpreter was stopped; the next call starts a new one (files are kept)]\n"
        execution.stderr = "".join(notes) + execution.stderr
        return execution

    async def _build_plan(self, lease: Lease, program: Program, cached: bool) -> Plan | None:
        """For a compiled language under its warm runner: whether to build, and whether to hand the binary over."""
        if program.language.name not in RUN_SCRIPTS or not lease.one_shot:
            return None
        return await self.builds.plan(program.language, lease.ref.spec, program.source, lookup=cached)

    def _keep_build(self, plan: Plan, kernel: Kernel, result: ExecResult) -> None:
        if plan.key is None:
            return
        if plan.binary is not None:
            # The dynamic loader or exec refused it (126/127 before a byte of output): build again instead.
            if result.exit_code in (126, 127) and not result.stdout and not result.artifacts:
                self.builds.forget(plan.key)
                raise _StaleBinary
        elif kernel.built is not None:
            self.builds.put(plan.key, kernel.built, plan.limit)

    async def probe(self, lang: Language) -> tuple[str, dict[str, str]]:
        """The runtime version the configured image really has, and the versions of the project image's
        libraries found in it."""
        await self.images.prepare(lang.name)
        lease = await self.pool.acquire(WarmKey(lang.name, self.spec_for(lang)))
        try:
            result = await self.backend.exec(lease.ref, list(lang.version_argv), timeout=30, output_limit=4096)
            probe = images.probe_argv(lang.name)
            found = await self.backend.exec(lease.ref, probe, timeout=60, output_limit=16384) if probe else None
        finally:
            await self.pool.release(lease)
        text = (result.stdout or result.stderr).decode("utf-8", errors="replace").strip()
        libraries = images.parse_probe(lang.name, _decode(found.stdout)) if found is not None else {}
        return (text.splitlines()[0] if text else "unknown"), libraries

    def _room_to_grow(self, key: WarmKey) -> bool:
        """A larger pool leaves room in the memory budget for one more sandbox (a session, a call)."""
        return self.budget.committed + 2 * key.spec.limits.memory_bytes <= self.budget.total

    async def _make_lease(self, key: WarmKey, ahead: bool, one_shot: bool = True) -> Lease:
        charge = key.spec.limits.memory_bytes
        self.budget.reserve(charge, "a warm sandbox" if ahead else "a sandbox")
        try:
            ref = await self.backend.create(key.spec)
        except BaseException:
            self.budget.release(charge)
            raise
        lease = Lease(ref, get_language(key.language), charged=charge, one_shot=one_shot)
        try:
            await self._start_kernel(lease, preload=ahead)
            if one_shot and lease.kernel is None:
                await self._start_runner(key, lease)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._dispose_lease(lease)
            raise
        return lease

    async def _start_kernel(self, lease: Lease, preload: bool) -> None:
        if not lease.language.kernel:
            return
        env = run_env(lease.language, lease.ref.spec)
        spec = lease.ref.spec
        if not spec.forks:
            lease.kernel = await Kernel.start(self.backend, lease.ref, env, preload=preload)
            return
        # A template container serves many calls: its children inherit the imports, so they are always made.
        lease.kernel = await Kernel.start(
            self.backend, lease.ref, env, preload=True, forks=self.forks.config(spec.limits)
        )
        try:
            await lease.kernel.next_call(READY_SECONDS)
        except SandboxRefused as exc:
            self.forks.mark(spec, str(exc))
            raise ForksUnavailable(str(exc)) from exc

    async def _start_runner(self, key: WarmKey, lease: Lease) -> None:
        """The language's runtime started ahead, waiting for the program; a sandbox that cannot runs cold."""
        warm_argv = lease.language.warm_argv
        if warm_argv is None or key in self._cold:
            return
        env = run_env(lease.language, lease.ref.spec)
        if lease.language.name in RUN_SCRIPTS:
            env.update(BUILD_PIPE_ENV)
        try:
            lease.kernel = await Kernel.supervise(self.backend, lease.ref, warm_argv(), env)
        except KernelDied as exc:
            logger.warning("%s sandboxes run without a warm runner: %s", lease.language.title, exc)
            self._cold.add(key)
            await self.backend.kill_all(lease.ref)

    async def _revive(self, lease: Lease) -> bool:
        """Start a new interpreter where the last one was lost; True when that happened."""
        if lease.kernel is None or lease.kernel.alive:
            return False
        await lease.kernel.aclose()
        lease.kernel = None
        await self._start_kernel(lease, preload=False)
        return True

    async def _dispose_lease(self, lease: Lease) -> None:
        try:
            if lease.kernel is not None:
                await lease.kernel.aclose()
            await self.backend.destroy(lease.ref)
        finally:
            self.budget.release(lease.charged)
            lease.charged = 0

    async def _switched(self, language: str, base: str) -> None:
        """The project image of `language` is built: sandboxes made ready on its base image go (template
        containers included), and those warmed ahead are made again on the project image."""
        self.pool.drop(lambda key: key.language == language and key.spec.image == base)
        if language in self._warmed:
            await self.warm(get_language(language))

    def _shape(
        self, lang: Language, result: ExecResult, seconds: float, lost: bool, spec: SandboxSpec | None = None
    ) -> Execution:
        phase = "run"
        raw_stderr = result.stderr
        if raw_stderr.endswith(COMPILE_FAILED_MARKER):
            phase, raw_stderr = "compile", raw_stderr[: -len(COMPILE_FAILED_MARKER)]
        stderr = _decode(raw_stderr)
        if result.exit_code not in (0, None):
            on_base = spec is not None and spec.image == self.settings.base_image_for(lang.name)
            pending = self.images.pending(lang.name) if on_base else None
            coming = self.images.recipe(lang.name).specs if pending is not None else []
            stderr += missing_library_hint(lang.name, stderr, pending, coming)
        if result.timed_out:
            stderr += (
                f"\n[timed out after {seconds:g} s: every process was killed; raise `timeout` "
                f"(maximum {self.settings.sandbox_max_timeout:g} s) if the work needs longer]\n"
            )
        return Execution(
            exit_code=result.exit_code,
            stdout=_decode(result.stdout),
            stderr=stderr,
            timed_out=result.timed_out,
            truncated=result.truncated,
            duration_ms=round(result.duration_ms),
            language=lang.name,
            backend=self.backend.name,
            phase="compile" if phase == "compile" else "run",
            session_id=None,
            interpreter_lost=lost,
            artifacts=result.artifacts,
        )

    async def _outputs_from_outside(self, ref: SandboxRef, result: ExecResult) -> list[Artifact]:
        """The output files, read after everything in the sandbox was killed from outside."""
        try:
            return await self._collect_outputs(ref)
        except SandboxFailure as exc:  # a kill that could not be proven removed the sandbox, files and all
            logger.info("No outputs of %s: %s", ref.id[:12], exc)
            result.stderr += b"\n[the sandbox was removed before its output files could be read]\n"
            return []

    async def _collect_outputs(self, ref: SandboxRef) -> list[Artifact]:
        """Every file in the output directory (for languages without a kernel, which reports changes itself)."""
        limit = self.settings.sandbox_artifact_limit
        listing = await self.backend.exec(
            ref, ["tar", "-c", "-C", str(OUTPUT_DIR), "."], timeout=30, output_limit=limit * 2
        )
        if listing.exit_code != 0 or listing.truncated:
            if listing.truncated:
                logger.warning("Output directory of %s exceeds %d bytes; artifacts not returned", ref.id[:12], limit)
            return []
        files = await anyio.to_thread.run_sync(unpack, listing.stdout)
        return collect(files, inline_limit=limit)
