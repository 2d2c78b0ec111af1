"""MCP glue: the server, its lifespan, and the code and language tools. Each tool body is one call to AppState."""
# No `from __future__ import annotations`: tool signatures use closure values the SDK must evaluate.

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from mcp.server import MCPServer
from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerMiddleware
from mcp.server.mcpserver import Context
from mcp_types import CallToolResult
from pydantic import Field

from llm_sandbox_mcp import __version__
from llm_sandbox_mcp.backends import Backend, select_backend
from llm_sandbox_mcp.config import Settings
from llm_sandbox_mcp.errors import SandboxError
from llm_sandbox_mcp.languages import LANGUAGES, get_language
from llm_sandbox_mcp.models import MAX_CODE_BYTES
from llm_sandbox_mcp.server.metadata import DESCRIPTION, TITLE, hints, icons
from llm_sandbox_mcp.server.results import (
    ExecutionResult,
    JobInfo,
    LanguageDetails,
    LanguagesResult,
    execution_result,
    job_result,
    progress_of,
    tool_errors,
)
from llm_sandbox_mcp.server.session_tools import register_session_tools
from llm_sandbox_mcp.server.stage_trace import StageTrace
from llm_sandbox_mcp.server.state import AppState

if TYPE_CHECKING:
    from llm_sandbox_mcp.run.executor import Executor
    from llm_sandbox_mcp.run.jobs import JobRegistry
    from llm_sandbox_mcp.run.sessions import SessionRegistry

logger = logging.getLogger(__name__)


def _strict(server: MCPServer[Any]) -> None:
    """Reject unknown arguments: a typo in an argument name should fail loudly, not be ignored."""
    for tool in server._tool_manager.list_tools():  # pyright: ignore[reportPrivateUsage]
        tool.parameters["additionalProperties"] = False
        tool.fn_metadata.arg_model.model_config["extra"] = "forbid"
        tool.fn_metadata.arg_model.model_rebuild(force=True)


def build_server(
    settings: Settings,
    backend: Backend | None = None,
    state: AppState | None = None,
    *,
    token_verifier: TokenVerifier | None = None,
    auth: AuthSettings | None = None,
    middleware: Sequence[ServerMiddleware[Any]] = (),
) -> MCPServer[AppState]:
    """The MCP server. `backend` replaces the configured one (tests pass a fake); `state` is shared with the
    caller, which may need to clean up from outside the lifespan. The HTTP face passes how tokens are verified
    and the middleware every request goes through (server/http.py)."""
    state = state or AppState(settings)

    async def start_engine(stop: anyio.Event) -> None:
        """The engine, the executor and the registries, until `stop`; tools wait for `state.started`."""
        async with AsyncExitStack() as stack:
            try:
                executor_class, sessions_class, jobs_class = await anyio.to_thread.run_sync(_engine_side)
                if backend is not None:
                    engine = backend
                else:
                    try:
                        engine, why = await select_backend(settings)
                    except SandboxError as exc:
                        # Serve anyway: engines often start after MCP clients do, and tools then say what is wrong.
                        logger.error("%s", exc)
                        state.failure = str(exc)
                        return
                    logger.info("%s", why)
                stack.push_async_callback(_shielded, engine.aclose)
                state.running = await stack.enter_async_context(executor_class(settings, engine))
                state.registry = sessions_class(settings, state.running)
                stack.push_async_callback(_shielded, state.registry.aclose)
                # Closed first: every job is cancelled, and its run stops, before sessions and sandboxes go.
                state.runs = await stack.enter_async_context(jobs_class(settings))
            finally:
                state.started.set()
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_prepare, state.running)
                tasks.start_soon(state.registry.run_reaper)
                await stop.wait()
                tasks.cancel_scope.cancel()

    @asynccontextmanager
    async def lifespan(_: MCPServer[AppState]) -> AsyncGenerator[AppState]:
        # The engine starts beside the protocol: initialize and tools/list answer before its SDK is imported
        # or it is probed; a tool call waits for it.
        stop = anyio.Event()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(start_engine, stop)
            try:
                yield state
            finally:
                stop.set()

    server: MCPServer[AppState] = MCPServer(
        "llm-sandbox",
        title=TITLE,
        description=DESCRIPTION,
        icons=icons(),
        version=__version__,
        instructions=(
            "Run code in an isolated sandbox with no network access. Each execute_code call starts from a clean "
            "sandbox unless you pass a session_id from create_session, which keeps variables (Python) and files "
            "between calls. Files written to $OUTPUT_DIR (/workspace/outputs) and every matplotlib figure are "
            "returned. For work that may take longer than about a minute, pass background=true: execute_code "
            "returns a job_id at once; poll get_job(job_id, since) for new output and the final result, and stop "
            "it with cancel_job. A call still running after "
            f"{settings.sandbox_foreground_limit:g} s turns into such a job by itself."
        ),
        lifespan=lifespan,
        token_verifier=token_verifier,
        auth=auth,
        middleware=[*middleware, StageTrace()] if settings.sandbox_trace_stages else middleware,
    )
    languages = ", ".join(LANGUAGES)

    @server.tool(
        description=(
            f"Run code in a fresh, isolated sandbox and return exit_code, stdout, stderr and any plots or files. "
            f"Languages: {languages}. The sandbox has no network; list packages in `libraries` and they are "
            f"installed before the run (e.g. ['numpy', 'pandas==2.2.3'] for Python). Each call starts clean. "
            f"Write files to $OUTPUT_DIR (/workspace/outputs) to get them back; matplotlib figures come back "
            f"as images. A non-zero exit_code is a normal result: read stderr. Default timeout "
            f"{settings.sandbox_timeout:g} s, maximum {settings.sandbox_max_timeout:g} s. Long work (installs, "
            f"training, anything past about a minute): pass background=true and poll get_job; a call still running "
            f"after {settings.sandbox_foreground_limit:g} s returns status 'running' with a job_id instead of a "
            f"result."
        ),
        title="Execute code",
        # Destructive: in a session the code may overwrite or delete earlier files. Open world: `libraries` are
        # downloaded from package registries (the code itself has no network unless the operator grants it).
        annotations=hints("Execute code", read_only=False, destructive=True, idempotent=False, open_world=True),
    )
    async def execute_code(
        code: Annotated[str, Field(description="Complete program source", max_length=MAX_CODE_BYTES)],
        language: Annotated[str, Field(description=f"One of: {languages}")] = "python",
        libraries: Annotated[
            list[Annotated[str, Field(max_length=200)]],
            Field(description="Packages to install first, in the language's own syntax", max_length=50),
        ] = [],  # noqa: B006 - pydantic copies defaults
        timeout: Annotated[
            float | None,
            Field(description=f"Seconds before every process is killed (default {settings.sandbox_timeout:g})", gt=0),
        ] = None,
        session_id: Annotated[
            str | None,
            Field(
                description="Run in this session (from create_session): Python keeps variables, imports and "
                "figures like a notebook cell and shows the value of a trailing expression; files persist. "
                "`language` is the session's.",
                max_length=64,
            ),
        ] = None,
        background: Annotated[
            bool,
            Field(description="Return a job_id at once and run on; poll get_job for output and the result"),
        ] = False,
        ctx: Context[AppState, Any] | None = None,
    ) -> Annotated[CallToolResult, ExecutionResult]:
        with tool_errors():
            return execution_result(
                await state.execute(code, language, libraries, timeout, session_id, background, progress_of(ctx))
            )

    @server.tool(
        description=(
            "Status of a background job (from execute_code): its output from offset `since` on (pass the "
            "next_since of the previous answer to get only what is new), what it is doing now, and once finished "
            "its full result with plots. While status is 'running', call again, with `wait` to block until it "
            "finishes (up to the foreground limit)."
        ),
        title="Get job",
        annotations=hints("Get job", read_only=True, destructive=False, idempotent=True, open_world=False),
    )
    async def get_job(
        job_id: Annotated[str, Field(description="Id returned by execute_code", max_length=64)],
        since: Annotated[
            int, Field(description="Output offset to start from (next_since of the last answer)", ge=0)
        ] = 0,
        wait: Annotated[
            float,
            Field(description="Seconds to wait for the job to finish before answering (long poll)", ge=0),
        ] = 0,
    ) -> Annotated[CallToolResult, JobInfo]:
        with tool_errors():
            return job_result(await state.get_job(job_id, since, wait))

    @server.tool(
        description="Stop a background job: every process of its run is killed; a session keeps its state.",
        title="Cancel job",
        annotations=hints("Cancel job", read_only=False, destructive=True, idempotent=True, open_world=False),
    )
    async def cancel_job(
        job_id: Annotated[str, Field(description="Id returned by execute_code", max_length=64)],
    ) -> JobInfo:
        with tool_errors():
            return await state.cancel_job(job_id)

    @server.tool(
        description="List the languages this server can run, with the image each one uses.",
        title="Supported languages",
        annotations=hints("Supported languages", read_only=True, destructive=False, idempotent=True, open_world=False),
    )
    async def get_supported_languages() -> LanguagesResult:
        with tool_errors():
            await state.ready()
            return state.languages()

    @server.tool(
        description=(
            "Details for one language: runtime version in the sandbox image, how libraries are named, "
            "whether plots are captured, and examples that run."
        ),
        title="Language details",
        annotations=hints("Language details", read_only=True, destructive=False, idempotent=True, open_world=False),
    )
    async def get_language_details(
        language: Annotated[str, Field(description=f"One of: {languages}")],
    ) -> LanguageDetails:
        with tool_errors():
            return await state.language_details(language)

    @server.resource("sandbox://languages", name="languages", mime_type="application/json")
    async def languages_resource() -> str:
        await state.ready()
        return state.languages().model_dump_json()

    register_session_tools(server, state)
    _strict(server)
    return server


def _engine_side() -> "tuple[type[Executor], type[SessionRegistry], type[JobRegistry]]":
    """The classes the lifespan builds, imported in a worker thread beside the protocol: with the pool, the
    runners' hosts, the library cache and the egress tunnels behind them, initialize and tools/list need none."""
    from llm_sandbox_mcp.run.executor import Executor
    from llm_sandbox_mcp.run.jobs import JobRegistry
    from llm_sandbox_mcp.run.sessions import SessionRegistry

    return Executor, SessionRegistry, JobRegistry


async def _shielded(close: Callable[[], Awaitable[None]]) -> None:
    with anyio.CancelScope(shield=True):
        await close()


async def _prepare(executor: "Executor") -> None:
    """Start-up work that must not delay serving: sweep leftovers, warm the default language."""
    try:
        swept = await executor.sweep_leftovers()
        if swept:
            logger.info("Removed %d sandboxes left by servers that are no longer running", swept)
        await executor.warm(get_language("python"))
    except SandboxError as exc:
        logger.warning("%s", exc)
