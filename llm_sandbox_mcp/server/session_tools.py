"""MCP glue for sessions and files: create, list and close sessions; move files in and out.

Each tool body is one call to AppState inside the error boundary.
"""
# No `from __future__ import annotations`: the SDK evaluates the tool signatures.

from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.elicitation import ElicitationResult
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.resolve import Resolve
from mcp_types import CallToolResult
from pydantic import Field

from llm_sandbox_mcp.languages import LANGUAGES
from llm_sandbox_mcp.models import MIN_CPUS
from llm_sandbox_mcp.server.asking import Approval, person_resolver, reply_of
from llm_sandbox_mcp.server.metadata import hints, lifetime
from llm_sandbox_mcp.server.results import (
    Closed,
    Download,
    FileInfo,
    FileList,
    NetworkAnswer,
    SessionInfo,
    SessionList,
    download_result,
    progress_of,
    tool_errors,
)
from llm_sandbox_mcp.server.state import AppState

SessionId = Annotated[str, Field(description="Id returned by create_session", max_length=64)]
WorkspacePath = Annotated[str, Field(description="Path relative to the session's /workspace", max_length=1024)]


def register_session_tools(server: MCPServer[Any], state: AppState) -> None:
    languages = ", ".join(LANGUAGES)
    ask_person = person_resolver(state)

    @server.tool(
        description=(
            "Start a session: a sandbox kept between execute_code calls (pass its session_id). Python keeps "
            "variables, imports and figures like a notebook; other languages keep files. Libraries are installed "
            f"now (sessions have no network later). A session {lifetime(state.settings)}, and does not survive a "
            "server restart; a call with a session_id that is gone is an error: create a new session. Close "
            "sessions when done."
        ),
        title="Create session",
        # Open world: `libraries` are downloaded from package registries.
        annotations=hints("Create session", read_only=False, destructive=False, idempotent=False, open_world=True),
    )
    async def create_session(
        language: Annotated[str, Field(description=f"One of: {languages}")] = "python",
        libraries: Annotated[
            list[Annotated[str, Field(max_length=200)]],
            Field(description="Packages to install, in the language's own syntax", max_length=50),
        ] = [],  # noqa: B006 - pydantic copies defaults
        memory: Annotated[
            str | None, Field(description="Memory limit such as '1g', within the operator's maximum", max_length=16)
        ] = None,
        cpus: Annotated[
            float | None, Field(description="CPU limit, within the operator's maximum", ge=MIN_CPUS)
        ] = None,
        network: Annotated[
            bool | Annotated[list[Annotated[str, Field(max_length=260)]], Field(max_length=50)],
            Field(
                description="Hosts the session may reach over HTTP(S) through the server's proxy, such as "
                "['api.github.com', '*.example.org'] (within the operator's SANDBOX_SESSION_ALLOW_HOSTS, else "
                "refused); [] for none yet (request_network asks for more later). false: no network. true: "
                "unrestricted network, refused unless the operator allows it",
            ),
        ] = False,
        secrets: Annotated[
            list[Annotated[str, Field(max_length=64)]],
            Field(
                description="Names of secrets the operator declared (SANDBOX_SECRETS_FILE), such as ['GITHUB_TOKEN']. "
                "Each becomes an environment variable holding a placeholder; the server's proxy puts the real "
                "value in its place only in HTTPS requests to that secret's hosts, which network must include. "
                "The code never sees the value",
                max_length=20,
            ),
        ] = [],  # noqa: B006 - pydantic copies defaults
        ctx: Context[AppState, Any] | None = None,
    ) -> SessionInfo:
        with tool_errors():
            return await state.create_session(
                language, libraries, memory, cpus, network, progress_of(ctx), secrets or None
            )

    @server.tool(
        description=(
            "Ask for one more host for an open session's proxy (created with network=[...]; [] for none yet), "
            "when a result's network_refused shows the code needs it. Within the operator's allowed hosts the "
            "person is asked, with your reason; the answer applies to that session only, at once."
        ),
        title="Request network",
        annotations=hints("Request network", read_only=False, destructive=False, idempotent=False, open_world=True),
    )
    async def request_network(
        session_id: SessionId,
        host: Annotated[str, Field(description="host, host:port or *.domain", max_length=260)],
        reason: Annotated[str, Field(description="Why the code needs it, shown to the person", max_length=500)],
        person: Annotated[ElicitationResult[Approval], Resolve(ask_person)],
    ) -> NetworkAnswer:
        with tool_errors():
            return await state.request_network(session_id, host, reason, reply_of(person))

    @server.tool(
        description="Close a session and destroy its sandbox. Its variables and files are gone afterwards.",
        title="Close session",
        annotations=hints("Close session", read_only=False, destructive=True, idempotent=True, open_world=False),
    )
    async def close_session(session_id: SessionId) -> Closed:
        with tool_errors():
            return await state.close_session(session_id)

    @server.tool(
        description="List open sessions with language, age, idle time, calls, limits and current resource use.",
        title="List sessions",
        annotations=hints("List sessions", read_only=True, destructive=False, idempotent=True, open_world=False),
    )
    async def list_sessions() -> SessionList:
        with tool_errors():
            return await state.list_sessions()

    @server.tool(
        description=(
            "Put a file into a session's workspace: give `content` (text) or `content_base64` (binary), or "
            "`host_path` to copy a host file (only below directories the operator allows)."
        ),
        title="Upload file",
        # Destructive: replaces a file already at `path`.
        annotations=hints("Upload file", read_only=False, destructive=True, idempotent=True, open_world=False),
    )
    async def upload_file(
        session_id: SessionId,
        path: WorkspacePath,
        content: Annotated[str | None, Field(description="Text content (UTF-8)")] = None,
        content_base64: Annotated[str | None, Field(description="Binary content, base64-encoded")] = None,
        host_path: Annotated[str | None, Field(description="Absolute host path to copy from", max_length=4096)] = None,
    ) -> FileInfo:
        with tool_errors():
            return await state.upload(session_id, path, content, content_base64, host_path)

    @server.tool(
        description=(
            "Get a file from a session's workspace: text comes back as text, images also as images, other "
            "binary as base64. With `host_path` it is written to the host instead (only below allowed directories)."
        ),
        title="Download file",
        # Not read-only and destructive: with `host_path` it writes, and may replace, a file on the host.
        annotations=hints("Download file", read_only=False, destructive=True, idempotent=True, open_world=False),
    )
    async def download_file(
        session_id: SessionId,
        path: WorkspacePath,
        host_path: Annotated[str | None, Field(description="Absolute host path to write to", max_length=4096)] = None,
        overwrite: Annotated[bool, Field(description="Replace an existing file at host_path")] = False,
    ) -> Annotated[CallToolResult, Download]:
        with tool_errors():
            return download_result(*await state.download(session_id, path, host_path, overwrite))

    @server.tool(
        description="List files in a session's workspace (up to four levels deep).",
        title="List files",
        annotations=hints("List files", read_only=True, destructive=False, idempotent=True, open_world=False),
    )
    async def list_files(session_id: SessionId, path: WorkspacePath = ".") -> FileList:
        with tool_errors():
            return await state.list_files(session_id, path)
