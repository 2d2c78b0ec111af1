"""Runs code: a validated program, a sandbox lent by one of its sources, one run, one outcome.

Every run goes through `Executor.run`, the one seam: a one-shot call's (`execute`), whatever its sandbox came
from (the warm pool, a zygote child, a zygote template container: `run.leases.Sources` chooses), and a
session's cell (`run.sessions`, in the session's own sandbox). `run` talks to the sandbox's runner, or execs
the program where there is none, and shapes the one outcome, an `Execution`.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from types import TracebackType

import anyio

from llm_sandbox_mcp import images, stages
from llm_sandbox_mcp.backends import Backend, RuntimeProbe, stop_on_cancel
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.egress.proxy import EgressListener
from llm_sandbox_mcp.egress.relay import Relay, start_relay
from llm_sandbox_mcp.errors import InvalidRequest, SandboxFailure
from llm_sandbox_mcp.languages import Language, get_language
from llm_sandbox_mcp.models import (
    EGRESS_NETWORK,
    MAX_CODE_BYTES,
    CacheMount,
    ExecResult,
    Execution,
    Limits,
    Live,
    SandboxSpec,
)
from llm_sandbox_mcp.run.build_cache import RUN_SCRIPTS, Plan
from llm_sandbox_mcp.run.environment import run_env
from llm_sandbox_mcp.run.files import Files
from llm_sandbox_mcp.run.kernel import Kernel, drop_uncollected_files
from llm_sandbox_mcp.run.leases import Lease, WarmKey, pooled
from llm_sandbox_mcp.run.modes import Cell, OneShot, RunMode
from llm_sandbox_mcp.run.outcome import decode, outputs_from_outside, shape
from llm_sandbox_mcp.run.parts import assemble

logger = logging.getLogger(__name__)


# What stderr holds when ./main could not start: a shell's words on it (dash's "sh: 1: exec: ./main: ...",
# bash's "sh: line 1: ./main: ..."), or the dynamic loader's.
_DID_NOT_START = (b": ./main: ", b"./main: error while loading shared libraries")


class _StaleBinary(Exception):
    """A binary from the build cache did not start: the run is made again with a build."""


@dataclass(frozen=True)
class Program:
    """Code to run, validated: a known language, a bounded source, a timeout within the maximum; and whose call
    it is (`owner`: the principal whose library stores and built programs it uses; "" for stdio's one)."""

    language: Language
    source: bytes
    timeout: float
    libraries: list[str]
    owner: str = ""


class Executor:
    """Runs code on one backend: validates a request, has its sandbox lent, runs it, shapes the outcome. What it
    orchestrates (pool, zygote, leases, images, libraries, build cache) comes built (`run.parts.assemble`).

    Use as an async context manager: it owns the background work of those parts.
    """

    def __init__(self, settings: Settings, backend: Backend) -> None:
        self.settings = settings
        self.backend = backend
        parts = assemble(settings, backend, self._switched)
        self.limits = parts.limits
        self.tunnels = parts.tunnels
        self.libraries = parts.libraries
        self.images = parts.images
        self.builds = parts.builds
        self.pool = parts.pool
        self.zygote = parts.zygote
        self.limiter = parts.limiter
        self._leases = parts.leases
        self._sources = parts.sources
        # Languages warmed ahead of calls: warmed again on their project image once it is built.
        self._warmed: set[str] = set()
        self._artifact_limit = settings.sandbox_artifact_limit
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Executor:
        async with contextlib.AsyncExitStack() as stack:
            # Left in reverse: the zygote (which uses the pool's budget) first, the tunnels last.
            await stack.enter_async_context(self.tunnels)
            await stack.enter_async_context(self.pool)
            await stack.enter_async_context(self.zygote)
            await stack.enter_async_context(self.images)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.__aexit__(exc_type, exc, tb)

    async def sweep_leftovers(self) -> int:
        """Remove the sandboxes of servers that are no longer running; how many went."""
        return await self.backend.sweep()

    async def remove_everything(self) -> None:
        """Remove every sandbox this server made, whatever holds it (on a signal, outside the lifespan)."""
        await self.backend.aclose()

    @property
    def engine(self) -> str:
        """The backend's name, as every outcome reports it."""
        return self.backend.name

    @property
    def reaches_egress_proxy(self) -> bool:
        """Whether this engine's sandboxes can reach the server's egress proxy (through a relay)."""
        return self.backend.install_network == EGRESS_NETWORK

    def missing_runtime(self, lang: Language) -> str | None:
        """Why `lang` cannot run in this engine's sandboxes (one that runs the host's runtimes), or None."""
        if isinstance(self.backend, RuntimeProbe):
            return self.backend.missing_runtime(lang.version_argv[0])
        return None

    async def image_of(self, lang: Language) -> str:
        """The image `lang`'s sandboxes run on now (its project image once that is built)."""
        await self.images.prepare(lang.name)
        return self.images.image(lang.name)

    def files(self) -> Files:
        """The workspaces of this executor's sandboxes, and the operator's allowed host directories."""
        return Files(self.settings, self.backend)

    async def relay(self, lease: Lease, listener: EgressListener) -> Relay:
        """Start the relay from a session's sandbox to its egress proxy. Raises SandboxFailure."""
        return await start_relay(self.backend, lease.ref, listener, self.tunnels)

    async def trust(self, lease: Lease, script: str, certificate: bytes) -> None:
        """Write a CA certificate into a session's sandbox (`script` reads it on its input). Raises SandboxFailure."""
        result = await self.backend.exec(
            lease.ref, ["sh", "-c", script], timeout=30, stdin=certificate, output_limit=4096
        )
        if result.exit_code != 0:
            problem = result.stderr.decode("utf-8", errors="replace").strip()[-300:]
            raise SandboxFailure(
                f"could not give the sandbox the proxy's CA certificate: {problem or result.exit_code}"
            )

    async def inspect(self, lease: Lease, argv: list[str], timeout: float, output_limit: int) -> ExecResult:
        """A short command in a leased sandbox, outside any run (what a session uses, say)."""
        return await self.backend.exec(lease.ref, argv, timeout=timeout, output_limit=output_limit)

    def program(
        self, code: str, language: str, libraries: list[str], timeout: float | None, owner: str = ""
    ) -> Program:
        """Validate a request to run code (for `owner`). Raises InvalidRequest saying what to change."""
        lang = get_language(language)
        source = code.encode("utf-8", errors="replace")
        if len(source) > MAX_CODE_BYTES:
            raise InvalidRequest(f"code is {len(source)} bytes; the limit is {MAX_CODE_BYTES} bytes")
        return Program(lang, source, self._timeout(timeout), lang.check_libraries(libraries), owner)

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
        self,
        lang: Language,
        libraries: list[str],
        limits: Limits | None = None,
        live: Live | None = None,
        owner: str = "",
    ) -> SandboxSpec:
        """The sandbox a run needs: on the project image once it is built (the base image meanwhile, and then
        `live` says so), its libraries installed (in `owner`'s store) when it has any."""
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
            key = await self.libraries.ensure(lang, libraries, owner)
        return self.spec_for(lang, key, limits)

    async def warm(self, language: Language) -> None:
        """Have sandboxes for `language` (without libraries) ready before the first call."""
        await self.images.prepare(language.name)
        self._warmed.add(language.name)
        self._sources.warm(language, self.spec_for(language))

    async def execute(
        self,
        code: str,
        language: str = "python",
        libraries: list[str] | None = None,
        timeout: float | None = None,
        live: Live | None = None,
        owner: str = "",
    ) -> Execution:
        """Run code once in a fresh sandbox, which is gone afterwards (also when cancelled)."""
        return await self.execute_program(self.program(code, language, libraries or [], timeout, owner), live)

    async def execute_program(self, program: Program, live: Live | None = None) -> Execution:
        """`execute` for a program already validated (`program`)."""
        live = live or Live()
        live.phase = "waiting for a free slot (SANDBOX_MAX_CONCURRENCY)"
        async with self.limiter:
            stages.mark("wait for a slot")
            spec = await self._spec(program.language, program.libraries, live=live, owner=program.owner)
            stages.mark("the sandbox's spec (image, libraries)")
            for cached in (True, False):
                live.phase = "starting the sandbox"
                loan = await self._sources.lend(program.language, spec, program.source)
                stages.mark("acquire a sandbox")
                execution: Execution | None = None
                try:
                    execution = await self.run(loan.lease, program, OneShot(cached), live)
                    return execution
                except _StaleBinary:
                    logger.info("A cached %s binary did not start; building it again", program.language.title)
                finally:
                    await loan.release(execution)
                    stages.mark("give the sandbox back")
            raise AssertionError("unreachable: a run without the build cache never raises _StaleBinary")

    async def check_zygote(self, lang: Language) -> str:
        """For `doctor`: whether Python one-shot calls fork their sandboxes here (either flavour), or why not."""
        await self.images.prepare(lang.name)
        spec = self.spec_for(lang)
        policy = self.zygote.policy
        if policy.flavour is None:
            return policy.status(spec, False, None, "")
        served = policy.served
        execution = await self.execute("print(1)", lang.name, timeout=30)
        return policy.status(spec, policy.served > served, execution.exit_code, execution.stdout)

    async def open(
        self,
        lang: Language,
        libraries: list[str],
        limits: Limits,
        live: Live | None = None,
        egress: bool = False,
        env: dict[str, str] | None = None,
        owner: str = "",
    ) -> Lease:
        """A sandbox of its own (with its interpreter) for a session, outside the pool; `egress`: whether it may
        reach an egress proxy (through a relay the caller starts); `env`: variables of its own; `owner`: whose
        library stores it mounts."""
        spec = await self._spec(lang, libraries, limits, live, owner)
        spec = replace(spec, egress=egress, env=tuple(sorted((env or {}).items())))
        if live is not None:
            live.phase = "starting the sandbox"
        return await self._leases.make(WarmKey(lang.name, spec), False, one_shot=False)

    async def close(self, lease: Lease) -> None:
        with anyio.CancelScope(shield=True):
            await self._leases.dispose(lease)

    async def run(self, lease: Lease, program: Program, mode: RunMode, live: Live | None = None) -> Execution:
        """Run a program in a leased sandbox: through its runner, or as one exec where it has none.

        A `Cell` (a session) keeps the interpreter's state, starts a lost one again first, and gets back only
        the files that changed since the last cell. A `OneShot` run of a compiled program uses the build cache
        (a hit only when `cached`) and raises _StaleBinary when a cached binary failed to start.

        Output reaches `live` as it arrives. Cancelling the caller stops the run first: a cell is interrupted
        as at a timeout (the session stays usable), and anything else is killed from outside with every process
        in its sandbox.
        """
        lang = program.language
        live = live or Live()
        notes: list[str] = []
        if isinstance(mode, Cell):
            mode.number += 1
            if await self._leases.revive(lease):
                notes.append("[the interpreter had been lost and was restarted: earlier variables are gone]\n")
        live.phase = f"running {lang.name}{mode.label()}"
        if lease.kernel is not None:
            result = await self._in_runner(lease, lease.kernel, program, mode, live)
        else:
            result = await self._as_exec(lease, program, mode, live)
        # A one-shot sandbox is gone after the run anyway: only a session can lose its interpreter.
        lost = result.interpreter_lost and mode.keeps_state
        execution = shape(self.settings, self.images, self.engine, lang, result, program.timeout, lost, lease.ref.spec)
        stages.mark("shape the result")
        if lost:
            execution.stderr += "[the interpreter was stopped; the next call starts a new one (files are kept)]\n"
        execution.stderr = "".join(notes) + execution.stderr
        return execution

    async def _in_runner(self, lease: Lease, kernel: Kernel, program: Program, mode: RunMode, live: Live) -> ExecResult:
        plan = await self._build_plan(lease, program, mode)
        result = await kernel.run(
            (f"{plan.mode}\n" if plan is not None else "") + decode(program.source),
            mode=mode.runner_mode,
            echo=mode.keeps_state,
            filename=mode.filename(program.language),
            timeout=program.timeout,
            output_limit=self.settings.sandbox_output_limit,
            artifact_limit=self.settings.sandbox_artifact_limit,
            live=live,
            binary=plan.binary if plan is not None else None,
            build_limit=plan.limit if plan is not None and plan.mode == "capture" else 0,
        )
        if plan is not None:
            self._keep_build(plan, kernel, result)
        if kernel.collect_outside and not mode.keeps_state:
            if lease.forked:
                # The run's files lived in the sandbox forked for it, gone with it.
                drop_uncollected_files(result)
            else:
                # The runner could not collect with nothing of the program left running; the kernel has killed
                # everything from outside since, so the files are read from outside.
                result.artifacts = await outputs_from_outside(self.backend, lease.ref, result, self._artifact_limit)
                stages.mark("collect outputs from outside")
        return result

    async def _as_exec(self, lease: Lease, program: Program, mode: RunMode, live: Live) -> ExecResult:
        lang, ref = program.language, lease.ref
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
        stages.mark("the program runs (one exec)")
        # Nothing of the program may still run while its files are read: no process swaps them mid-read.
        await self.backend.kill_all(ref)
        stages.mark("kill what is left of it")
        result.artifacts = mode.files(await outputs_from_outside(self.backend, ref, result, self._artifact_limit))
        stages.mark("collect outputs from outside")
        return result

    async def _build_plan(self, lease: Lease, program: Program, mode: RunMode) -> Plan | None:
        """For a compiled language under its warm runner: whether to build, and whether to hand the binary over."""
        if not isinstance(mode, OneShot) or program.language.name not in RUN_SCRIPTS or not lease.one_shot:
            return None
        return await self.builds.plan(
            program.language, lease.ref.spec, program.source, lookup=mode.cached, owner=program.owner
        )

    def _keep_build(self, plan: Plan, kernel: Kernel, result: ExecResult) -> None:
        if plan.key is None:
            return
        if plan.binary is not None:
            # The dynamic loader or exec refused it (126/127 before a byte of output, with their words on
            # stderr): build again instead. A program that ran and chose that status is its result.
            if (
                result.exit_code in (126, 127)
                and not result.stdout
                and not result.artifacts
                and any(sign in result.stderr for sign in _DID_NOT_START)
            ):
                self.builds.forget(plan.key)
                raise _StaleBinary
        elif kernel.built is not None:
            self.builds.put(plan.key, kernel.built, plan.limit, plan.owner)

    async def probe(self, lang: Language) -> tuple[str, dict[str, str]]:
        """The runtime version the configured image really has, and the versions of the project image's
        libraries found in it."""
        await self.images.prepare(lang.name)
        loan = await pooled(self.pool, lang, self.spec_for(lang))
        lease = loan.lease
        try:
            result = await self.backend.exec(lease.ref, list(lang.version_argv), timeout=30, output_limit=4096)
            probe = images.probe_argv(lang.name)
            found = await self.backend.exec(lease.ref, probe, timeout=60, output_limit=16384) if probe else None
        finally:
            await loan.release(None)
        text = (result.stdout or result.stderr).decode("utf-8", errors="replace").strip()
        libraries = images.parse_probe(lang.name, decode(found.stdout)) if found is not None else {}
        return (text.splitlines()[0] if text else "unknown"), libraries

    async def _switched(self, language: str, base: str) -> None:
        """The project image of `language` is built: sandboxes made ready on its base image go (template
        containers included), and those warmed ahead are made again on the project image."""
        self.pool.drop(lambda key: key.language == language and key.spec.image == base)
        if language in self._warmed:
            await self.warm(get_language(language))
